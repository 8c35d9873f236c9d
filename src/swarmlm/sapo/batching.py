"""Training batches for the policy update: prompt, completion and EOS laid out with no gap.

Each row is ``[prompt][completion][EOS][padding…]`` (right padding), with position ids counting
from 0 over the real tokens, so no padding ever sits between prompt and completion. Only
completion tokens (EOS included) carry loss.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from swarmlm.sapo.prefill import cache_argument, plain_layers, prefill, takes_logits_to_keep


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
    """The completion cut to ``max_tokens`` and terminated by exactly one EOS, so that the policy learns to stop.

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


# Elements of float32 logits handled at once by selective_log_softmax when chunk_rows is not given (64 MB).
LOGITS_CHUNK_ELEMENTS = 1 << 24


def selective_log_softmax(logits: torch.Tensor, ids: torch.Tensor, chunk_rows: int | None = None) -> torch.Tensor:
    """``log_softmax(logits)[..., ids]`` without materialising the full log-softmax for large vocabularies.

    ``logits`` is [..., V] and ``ids`` has its shape without the last dimension. The work goes in chunks of
    ``chunk_rows`` rows of the first dimension (by default as many as fit in ``LOGITS_CHUNK_ELEMENTS``).
    """
    if chunk_rows is None:
        per_row = max(1, logits[0].numel()) if logits.shape[0] else 1
        chunk_rows = max(1, LOGITS_CHUNK_ELEMENTS // per_row)
    out = []
    for lg, tok in zip(logits.split(chunk_rows), ids.split(chunk_rows)):
        lg = lg.float()
        picked = torch.gather(lg, -1, tok.unsqueeze(-1)).squeeze(-1)
        out.append(picked - torch.logsumexp(lg, dim=-1))
    return torch.cat(out) if out else logits.new_zeros(ids.shape, dtype=torch.float32)


# Model classes whose forward computes logits only where a boolean ``logits_to_keep`` [B, T] mask says
# (transformers >= 5 for most causal LMs): True = supported, False = not (full logits are used).
_KEEP_MASK_SUPPORT: dict[type, bool] = {}

# The completion-only output layer is used when the output layer holds at least this share of the parameters
# (SmolLM2-135M: 21%, update 17% faster measured; the tiny presets' byte vocabulary: 2%, no measurable gain).
OUTPUT_LAYER_SHARE = 0.05
_LARGE_OUTPUT: "weakref.WeakKeyDictionary[PreTrainedModel, bool]" = weakref.WeakKeyDictionary()


def _large_output_layer(model: PreTrainedModel) -> bool:
    if model not in _LARGE_OUTPUT:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        weight = getattr(head, "weight", None)
        total = sum(p.numel() for p in model.parameters())
        _LARGE_OUTPUT[model] = weight is not None and weight.numel() >= OUTPUT_LAYER_SHARE * total
    return _LARGE_OUTPUT[model]


def _forward(model: PreTrainedModel, input_ids, attention_mask, position_ids, **extra):
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **extra)


def token_logprobs(model: PreTrainedModel, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each next token, and the mask of completion tokens: both [B, T-1].

    Only completion tokens get a log-probability (0 elsewhere). Where the output layer is a good part of the model
    (a large vocabulary) and the model supports it, the output layer and the log-softmax run on the completion
    positions only, not on the prompt and padding.
    """
    device = next(model.parameters()).device
    input_ids = batch["input_ids"].to(device)
    attention = batch["attention_mask"].to(device)
    positions = batch["position_ids"].to(device)
    mask = batch["completion_mask"][:, 1:].to(device)
    targets = input_ids[:, 1:]
    kind = type(model)
    if _KEEP_MASK_SUPPORT.get(kind, True) and _large_output_layer(model) and takes_logits_to_keep(model):
        keep = torch.zeros_like(input_ids, dtype=torch.bool)
        keep[:, :-1] = mask  # the position before each completion token predicts it
        try:
            logits = _forward(model, input_ids, attention, positions, logits_to_keep=keep).logits
        except (TypeError, IndexError, RuntimeError, ValueError):
            logits = None
        n = int(mask.sum())
        if logits is not None and logits.dim() == 2 and logits.shape[0] == n:
            _KEEP_MASK_SUPPORT[kind] = True
            picked = selective_log_softmax(logits, targets[mask])
            logp = torch.zeros(mask.shape, dtype=picked.dtype, device=device).masked_scatter(mask, picked)
            return logp, mask
        _KEEP_MASK_SUPPORT[kind] = False
        if logits is not None and logits.dim() == 3 and logits.shape[1] == input_ids.shape[1]:
            return selective_log_softmax(logits[:, :-1], targets), mask  # the mask was ignored: full logits
    logits = _forward(model, input_ids, attention, positions).logits[:, :-1]
    return selective_log_softmax(logits, targets), mask


# ----------------------------------------------------------------------------- shared prompts
# Model classes whose KV cache cannot be shared between rows (see shared_prompt_logprobs).
_SHARED_SUPPORT: dict[type, bool] = {}


def has_shared_prompts(samples: list[TrainSample]) -> bool:
    """Whether some samples have the same prompt (the L completions of a group do)."""
    return len({tuple(s.prompt_ids) for s in samples}) < len(samples)


def shared_prompt_logprobs(model: PreTrainedModel, samples: list[TrainSample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Completion-token log-probs with each distinct prompt run once: [B, C] values and mask, C the longest completion.

    The prompts go through the model once per distinct prompt (left-padded, explicit positions), their KV cache is
    repeated for the rows that share it, and the completions run on top of it with positions continuing each
    prompt. The gradient reaches the prompt's forward pass through the cache, so loss and gradient are those of
    :func:`token_logprobs` on the full sequences, with the prompt's share of the compute done once instead of L
    times. Returns None where the model's cache cannot be shared this way (the caller uses :func:`token_logprobs`).
    """
    if not _SHARED_SUPPORT.get(type(model), True):
        return None
    device = next(model.parameters()).device
    keys = [tuple(s.prompt_ids) for s in samples]
    groups: dict[tuple[int, ...], int] = {}
    for k in keys:
        groups.setdefault(k, len(groups))
    prompts = list(groups)
    prompt_pass = prefill(model, [list(p) for p in prompts], pad_id)  # each distinct prompt once, left-padded
    cache, prompt_attn = prompt_pass.cache, prompt_pass.attention
    if cache is None or not plain_layers(cache):
        _SHARED_SUPPORT[type(model)] = False
        return None
    first_logits = prompt_pass.last_logits  # [G, V]: the last prompt position predicts the first completion token
    rows = torch.tensor([groups[k] for k in keys], device=device)
    cache.batch_select_indices(rows)  # differentiable: the rows' gradients add up on their prompt

    comp_len = max(len(s.completion_ids) for s in samples)
    comp_ids = torch.full((len(samples), comp_len), pad_id, dtype=torch.long)
    comp_mask = torch.zeros((len(samples), comp_len), dtype=torch.bool)
    for r, s in enumerate(samples):
        comp_ids[r, :len(s.completion_ids)] = torch.tensor(s.completion_ids, dtype=torch.long)
        comp_mask[r, :len(s.completion_ids)] = True
    comp_ids, comp_mask = comp_ids.to(device), comp_mask.to(device)
    attention = torch.cat([prompt_attn.to(device)[rows], comp_mask.long()], dim=1)
    positions = torch.tensor([len(k) for k in keys], device=device).unsqueeze(1) + torch.arange(comp_len, device=device)
    first = selective_log_softmax(first_logits[rows], comp_ids[:, 0])  # [B]
    if comp_len == 1:
        return first.unsqueeze(1), comp_mask
    # completion position j predicts completion token j+1; the last position predicts nothing
    rest_mask = comp_mask[:, 1:]
    extra: dict = {}
    big = _large_output_layer(model)
    if big:
        keep = torch.zeros_like(comp_mask)
        keep[:, :-1] = rest_mask
        extra["logits_to_keep"] = keep
    out = model(input_ids=comp_ids[:, :-1] if not big else comp_ids, attention_mask=attention[:, :-1] if not big else attention,
                position_ids=positions[:, :-1] if not big else positions, use_cache=True, **{cache_argument(model): cache}, **extra)
    logits = out.logits
    if big and logits.dim() == 2:
        picked = selective_log_softmax(logits, comp_ids[:, 1:][rest_mask])
        rest = torch.zeros(rest_mask.shape, dtype=picked.dtype, device=device).masked_scatter(rest_mask, picked)
    else:
        if big:  # the mask was ignored
            logits = logits[:, :-1]
        rest = selective_log_softmax(logits, comp_ids[:, 1:])
    return torch.cat([first.unsqueeze(1), rest], dim=1), comp_mask


def sample_logprobs(model: PreTrainedModel, samples: list[TrainSample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Completion-token log-probs and their mask (any layout, rows in the order of ``samples``): each shared prompt
    run once where samples share prompts (:func:`shared_prompt_logprobs`), else :func:`token_logprobs`."""
    if len(samples) > 1 and has_shared_prompts(samples):
        out = shared_prompt_logprobs(model, samples, pad_id)
        if out is not None:
            return out
    return token_logprobs(model, collate(samples, pad_id))


def micro_batch_order(samples: list[TrainSample], indices: list[int]) -> list[int]:
    """``indices`` in the order micro-batches are cut from: by total length (little padding), or, where prompts
    are shared, by prompt (a group's rows stay together, so its prompt runs once) and then length."""
    chosen = [samples[i] for i in indices]
    if has_shared_prompts(chosen):
        return sorted(indices, key=lambda i: (len(samples[i].prompt_ids), samples[i].prompt_ids, samples[i].num_completion_tokens))
    return sorted(indices, key=lambda i: len(samples[i].prompt_ids) + samples[i].num_completion_tokens)
