"""The SAPO prompt and answer format: reason, then put the final answer in ``<answer>…</answer>``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # transformers is slow to import; the scoring workers import this package without it
    from transformers import PreTrainedTokenizerBase

PromptStyle = Literal["plain", "chat", "auto"]

INSTRUCTION = "Think step by step, then give the final answer inside <answer></answer>."
_OPEN, _CLOSE = "<answer>", "</answer>"
MAX_COMPLETION_CHARS = 1_000_000  # longer text has no answer (far beyond any completion a node generates or accepts)


def extract_answer(completion: str, max_chars: int = MAX_COMPLETION_CHARS) -> str | None:
    """The content of the **last** ``<answer>…</answer>`` span, stripped; None when there is none.

    Spans are read left to right as a non-greedy regular expression would (each ``<answer>`` is closed by the
    first ``</answer>`` after it; the next span starts after that), with ``str.find`` in one linear pass: hostile
    text cannot make it backtrack. Text longer than ``max_chars`` has no answer.
    """
    if not isinstance(completion, str) or len(completion) > max_chars:
        return None
    last = None
    pos = 0
    while (start := completion.find(_OPEN, pos)) >= 0:
        end = completion.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            break
        last = (start + len(_OPEN), end)
        pos = end + len(_CLOSE)
    return completion[last[0]:last[1]].strip() if last else None


def format_answer(answer: str) -> str:
    """A completion in the expected format (used to teach the format during the warm start)."""
    return f"<answer>{answer}</answer>"


def build_prompt(question: str, tokenizer: "PreTrainedTokenizerBase", style: PromptStyle = "auto") -> str:
    """The text a model is asked to continue. ``auto`` uses the tokenizer's chat template when it has one."""
    use_chat = style == "chat" or (style == "auto" and getattr(tokenizer, "chat_template", None))
    if use_chat:
        messages = [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": question}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{question}\n{INSTRUCTION}\n"
