"""Batched sampling of L completions per prompt with the model's KV cache (Hugging Face ``generate``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class Generated:
    """Completions for one prompt: token ids (without EOS) and decoded text, L of each."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    texts: list[str]
    finished: list[bool]  # whether the completion ended with EOS (not cut at max_new_tokens)


def tokenize_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str], max_prompt_tokens: int) -> list[list[int]]:
    """Token ids per prompt, keeping the *last* ``max_prompt_tokens`` (the question's end and the instruction)."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    return [seq[-max_prompt_tokens:] for seq in ids]


def _cut_at_eos(ids: list[int], eos_id: int) -> tuple[list[int], bool]:
    """Tokens before the first EOS (``generate`` pads finished rows after it), and whether there was one."""
    if eos_id in ids:
        return ids[: ids.index(eos_id)], True
    return ids, False


@torch.no_grad()
def generate_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: list[list[int]],
    *,
    num_completions: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    max_batch: int = 64,
    greedy: bool = False,
) -> list[Generated]:
    """``num_completions`` samples per prompt, in batches of at most ``max_batch`` sequences.

    Sampling is plain temperature sampling (no top-k / top-p / repetition penalty, whatever the
    model's own generation config says), so that the policy-gradient maths sees the true policy.
    """
    device = next(model.parameters()).device
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    gen_config = GenerationConfig(
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_k=0 if not greedy else None,
        top_p=1.0 if not greedy else None,
        max_new_tokens=max_new_tokens,
        num_return_sequences=num_completions,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    per_chunk = max(1, max_batch // num_completions)
    out: list[Generated] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(prompt_ids), per_chunk):
            chunk = prompt_ids[start:start + per_chunk]
            width = max(len(p) for p in chunk)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(chunk):  # left padding: every prompt ends where generation starts
                input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
                attention[row, width - len(ids):] = 1
            sequences = model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=gen_config
            )
            new_tokens = sequences[:, width:].tolist()
            for row, ids in enumerate(chunk):
                stripped = [_cut_at_eos(seq, eos_id) for seq in new_tokens[row * num_completions:(row + 1) * num_completions]]
                completion_ids = [s for s, _ in stripped]
                out.append(Generated(
                    prompt_ids=ids,
                    completion_ids=completion_ids,
                    texts=tokenizer.batch_decode(completion_ids, skip_special_tokens=True),
                    finished=[f for _, f in stripped],
                ))
    finally:
        model.train(was_training)
    return out
