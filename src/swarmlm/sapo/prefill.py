"""Running a batch of prompts through a causal LM once, keeping its KV cache: what generation (each prompt
decoded L times) and the update (each shared prompt scored once for its L completions) both start with.

Prompts are **left**-padded so that every prompt ends at the same position, where its continuation starts;
position ids count from 0 over each prompt's real tokens, so padding changes no prompt's positions.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

try:
    from transformers.cache_utils import DynamicLayer
except ImportError:  # pragma: no cover - a transformers without per-layer caches
    DynamicLayer = None


def forward_parameters(model: PreTrainedModel) -> Any:
    return inspect.signature(model.forward).parameters


def cache_argument(model: PreTrainedModel) -> str:
    """The name under which this model's forward takes the KV cache (transformers renamed it in 5.x)."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def takes_logits_to_keep(model: PreTrainedModel) -> bool:
    """Whether this model's forward can compute the logits of chosen positions only."""
    return "logits_to_keep" in forward_parameters(model)


def returned_cache(out: Any) -> Any:
    """The KV cache a forward pass returned, under either of its names."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def plain_layers(cache: Any) -> bool:
    """Whether ``cache`` is made of plain full-attention layers only (no sliding window, no linear attention), so
    that selecting and repeating its rows is all that sharing a prompt's cache between rows needs."""
    layers = getattr(cache, "layers", None)
    return DynamicLayer is not None and bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)``, each [P, W]: the prompts left-padded to the longest one."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids):] = 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention, positions


@dataclass
class Prefill:
    """The prompts' pass: the KV cache, the logits of each prompt's last position [P, V], and the padded
    layout (attention mask and positions, [P, W], on the CPU)."""

    cache: Any
    last_logits: torch.Tensor
    attention: torch.Tensor
    positions: torch.Tensor

    @property
    def width(self) -> int:
        return self.attention.shape[1]


def prefill(model: PreTrainedModel, prompts: list[list[int]], pad_id: int) -> Prefill:
    """One forward pass over the left-padded ``prompts`` with the cache on, logits of the last position only
    (where the model supports it). Gradients flow through it unless the caller disables them."""
    device = next(model.parameters()).device
    input_ids, attention, positions = left_pad(prompts, pad_id)
    padded = bool((attention == 0).any())
    out = model(input_ids=input_ids.to(device), attention_mask=attention.to(device) if padded else None,
                position_ids=positions.to(device), use_cache=True,
                **({"logits_to_keep": 1} if takes_logits_to_keep(model) else {}))
    return Prefill(returned_cache(out), out.logits[:, -1, :], attention, positions)
