"""The SAPO prompt and answer format: reason, then put the final answer in ``<answer>…</answer>``."""

from __future__ import annotations

import re
from typing import Literal

from transformers import PreTrainedTokenizerBase

PromptStyle = Literal["plain", "chat", "auto"]

INSTRUCTION = "Think step by step, then give the final answer inside <answer></answer>."
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(completion: str) -> str | None:
    """The content of the **last** ``<answer>…</answer>`` span, stripped; None when there is none."""
    spans = _ANSWER_RE.findall(completion)
    return spans[-1].strip() if spans else None


def format_answer(answer: str) -> str:
    """A completion in the expected format (used to teach the format during the warm start)."""
    return f"<answer>{answer}</answer>"


def build_prompt(question: str, tokenizer: PreTrainedTokenizerBase, style: PromptStyle = "auto") -> str:
    """The text a model is asked to continue. ``auto`` uses the tokenizer's chat template when it has one."""
    use_chat = style == "chat" or (style == "auto" and getattr(tokenizer, "chat_template", None))
    if use_chat:
        messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{question}\n{INSTRUCTION}\n"
