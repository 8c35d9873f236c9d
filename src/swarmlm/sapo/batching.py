"""Training batches for the policy update: prompt, completion and EOS laid out with no gap.

Each row is ``[prompt][completion][EOS][padding…]`` (right padding), with position ids counting
from 0 over the real tokens, so no padding ever sits between prompt and completion. Only
completion tokens (EOS included) carry loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel


@dataclass
class TrainSample:
    """One completion to learn from."""

    prompt_ids: list[int]
    completion_ids: list[int]  # EOS already appended
    advantage: float
    external: bool = False
    weight: float = 1.0

    @property
    def num_completion_tokens(self) -> int:
        return len(self.completion_ids)


def with_eos(completion_ids: list[int], eos_id: int, max_tokens: int) -> list[int]:
    """The completion cut to ``max_tokens`` and terminated by exactly one EOS (SPEC A.3).

    A completion that already holds an EOS (a peer's text containing the EOS string re-tokenizes to it)
    ends there, as generation would have.
    """
    ids = list(completion_ids)
    if eos_id in ids:
        ids = ids[:ids.index(eos_id)]
    return ids[:max_tokens] + [eos_id]


def collate(samples: list[TrainSample], pad_id: int) -> dict[str, torch.Tensor]:
    """Tensors for a forward pass: ``input_ids``, ``attention_mask``, ``position_ids``, ``completion_mask``."""
    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    rows = len(samples)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    positions = torch.zeros((rows, width), dtype=torch.long)
    completion = torch.zeros((rows, width), dtype=torch.bool)
    for row, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        input_ids[row, :p + c] = torch.tensor(s.prompt_ids + s.completion_ids, dtype=torch.long)
        attention[row, :p + c] = 1
        positions[row, :p + c] = torch.arange(p + c)
        completion[row, p:p + c] = True
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions, "completion_mask": completion}


def selective_log_softmax(logits: torch.Tensor, ids: torch.Tensor, chunk_rows: int = 8) -> torch.Tensor:
    """``log_softmax(logits)[..., ids]`` without materialising the full log-softmax for large vocabularies."""
    out = []
    for lg, tok in zip(logits.split(chunk_rows), ids.split(chunk_rows)):
        lg = lg.float()
        picked = torch.gather(lg, -1, tok.unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(lg, dim=-1))
    return torch.cat(out)


def token_logprobs(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each next token, and the mask of completion tokens: both [B, T-1]."""
    device = next(model.parameters()).device
    input_ids = batch["input_ids"].to(device)
    logits = model(
        input_ids=input_ids,
        attention_mask=batch["attention_mask"].to(device),
        position_ids=batch["position_ids"].to(device),
        use_cache=False,
    ).logits[:, :-1]
    logp = selective_log_softmax(logits, input_ids[:, 1:])
    return logp, batch["completion_mask"][:, 1:].to(device)
