"""The default ``hf`` generation engine: L completions per prompt from a batched decode loop on the training
model's own KV cache.

What makes the ``hf`` engine fast (each point measured with ``benchmarks/sapo_throughput.py``):

* **one prefill per prompt, shared by its L completions**: the prompt is run once and its KV cache is repeated
  L times, where Hugging Face ``generate`` (and so TRL) runs the prompt L times;
* **prompts sorted by length** before they are cut into batches, so left padding wastes little;
* **a preallocated KV cache**: each decode step writes one position in place, where the default cache
  concatenates (copies) the whole cache at every step;
* **finished rows leave the batch**: once a quarter of the rows have emitted EOS they are dropped from the batch
  and its cache, so short completions stop costing compute;
* logits of the last position only, sampling and bookkeeping as whole-batch tensor operations (no Python loop
  over completions inside the decode loop).

Sampling is plain temperature sampling (no top-k / top-p / repetition penalty, whatever the model's own
generation config says), so that the policy-gradient maths sees the true policy.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swarmlm.sapo.engines.base import Generated, GenerationEngine
from swarmlm.sapo.prefill import DynamicLayer, cache_argument, prefill


class HFEngine(GenerationEngine):
    """Generation with the training model itself (so its weights are always current): :func:`generate_completions`.

    With ``bf16`` (``--generation.precision``) it decodes with a bf16 copy of the model's parameters instead (its
    buffers, the rotary frequencies among them, stay as they are), refreshed from the model after every update
    (:meth:`sync_weights`): half the bytes read per decode step, and bf16 matrix units where the processor has
    them. The update still trains the model in its own dtype, on the tokens sampled, and greedy decoding (the
    evaluation) uses the model itself."""

    name = "hf"

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, bf16: bool = False):
        self.model = model
        self.tokenizer = tokenizer
        self.decoder = model
        if bf16 and next(model.parameters()).dtype != torch.bfloat16:
            self.decoder = copy.deepcopy(model).eval().requires_grad_(False)
            for param in self.decoder.parameters():
                param.data = param.data.to(torch.bfloat16)

    def generate(self, prompt_ids, *, num_completions, max_new_tokens, temperature=1.0, max_batch=64, greedy=False):
        # greedy decoding (the held-out evaluation) is the policy's own, in its dtype: a measurement must not
        # depend on the precision the node samples in (in bf16, SmolLM2-135M's greedy pass@1 read 0.375 where the
        # same weights give 0.414)
        return generate_completions(self.model if greedy else self.decoder, self.tokenizer, prompt_ids,
                                    num_completions=num_completions, max_new_tokens=max_new_tokens,
                                    temperature=temperature, max_batch=max_batch, greedy=greedy)

    @torch.no_grad()
    def sync_weights(self) -> None:
        if self.decoder is not self.model:
            for mine, theirs in zip(self.decoder.parameters(), self.model.parameters()):
                mine.copy_(theirs)


# ----------------------------------------------------------------------------- the hf engine's decode loop
if DynamicLayer is not None:
    class _PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values live in buffers sized for the whole generation: ``update``
        writes the new positions in place and returns views of the filled part."""

        @classmethod
        def from_layer(cls, layer: Any, extra: int) -> "_PreallocatedLayer":
            new = cls()
            b, h, t, _ = layer.keys.shape
            new._k = layer.keys.new_empty((b, h, t + extra, layer.keys.shape[-1]))
            new._v = layer.values.new_empty((b, h, t + extra, layer.values.shape[-1]))
            new._k[:, :, :t] = layer.keys
            new._v[:, :, :t] = layer.values
            new._len = t
            new.device = layer.keys.device
            new.is_initialized = True
            new._views()
            return new

        def _views(self) -> None:
            self.keys = self._k[:, :, :self._len]
            self.values = self._v[:, :, :self._len]

        def update(self, key_states, value_states, *args, **kwargs):
            n = key_states.shape[-2]
            if self._len + n > self._k.shape[2]:  # more than was reserved: grow like a DynamicLayer
                self._k = torch.cat([self._k[:, :, :self._len], key_states], dim=-2)
                self._v = torch.cat([self._v[:, :, :self._len], value_states], dim=-2)
            else:
                self._k[:, :, self._len:self._len + n] = key_states
                self._v[:, :, self._len:self._len + n] = value_states
            self._len += n
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self._len

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            self._k = self._k[indices]
            self._v = self._v[indices]
            self._views()

        def batch_repeat_interleave(self, repeats: int) -> None:
            self._k = self._k.repeat_interleave(repeats, dim=0)
            self._v = self._v.repeat_interleave(repeats, dim=0)
            self._views()

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            self.batch_select_indices(beam_idx.to(self._k.device))

        def crop(self, tokens_to_remove: int) -> None:
            if tokens_to_remove < 0:
                self._len = max(0, self._len + tokens_to_remove)
                self._views()

        def reset(self) -> None:
            self._len = 0
            self._views()


def _preallocate(cache: Any, extra: int) -> None:
    """Give every plain attention layer of a transformers ``DynamicCache`` room for ``extra`` more positions, so
    decode steps write in place instead of concatenating. Layers of any other kind are left as they are."""
    layers = getattr(cache, "layers", None)
    if DynamicLayer is None or layers is None:
        return
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.keys is not None and layer.keys.dim() == 4:
            layers[i] = _PreallocatedLayer.from_layer(layer, extra)


# Drop finished rows from the batch once they are at least this fraction of it (dropping copies the KV cache,
# so it is not done for every single finished row).
SHRINK_FRACTION = 0.25


def _next_tokens(logits: torch.Tensor, temperature: float, greedy: bool) -> torch.Tensor:
    """One token per row of ``logits`` [B, V]: argmax, or a sample from ``softmax(logits / temperature)`` by
    inverting its distribution function with one uniform draw per row (the first token whose cumulative
    probability exceeds it; a token of probability 0 is never drawn). On CPU, ``torch.multinomial`` over a 49,152-token
    vocabulary took 56 ms for 32 rows, a fifth of SmolLM2-135M's decoding; this takes about 3 ms."""
    if greedy:
        return logits.argmax(dim=-1)
    cdf = torch.softmax(logits.float() / temperature, dim=-1).double().cumsum(dim=-1)
    u = torch.rand(cdf.shape[0], 1, dtype=cdf.dtype, device=cdf.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)


@torch.no_grad()
def _sample_chunk(model: PreTrainedModel, prompts: list[list[int]], num_completions: int, max_new_tokens: int,
                  temperature: float, greedy: bool, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Completions for a few prompts: tokens [P·L, max_new_tokens] (rows of prompt p are p·L … p·L+L-1) and each
    row's length before EOS [P·L], or ``max_new_tokens`` where it never emitted EOS (the row is then unfinished)."""
    device = next(model.parameters()).device
    cache_arg = cache_argument(model)
    first = prefill(model, prompts, pad_id)  # each prompt once (left-padded: every prompt ends where generation starts)
    cache, logits, attention, positions, width = first.cache, first.last_logits, first.attention, first.positions, first.width
    del first

    rows = len(prompts) * num_completions
    if num_completions > 1:  # the L completions of a prompt share its prefill
        cache.batch_repeat_interleave(num_completions)
        logits = logits.repeat_interleave(num_completions, dim=0)
    _preallocate(cache, max_new_tokens)
    mask = torch.zeros((rows, width + max_new_tokens), dtype=torch.long, device=device)
    mask[:, :width] = attention.repeat_interleave(num_completions, dim=0).to(device)
    next_pos = positions[:, -1].repeat_interleave(num_completions).to(device) + 1

    tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    lengths = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)
    alive = torch.arange(rows, device=device)  # which output row each batch row is
    done = torch.zeros(rows, dtype=torch.bool, device=device)  # batch rows that emitted EOS
    for step in range(max_new_tokens):
        tok = _next_tokens(logits, temperature, greedy)
        tok = torch.where(done, pad_id, tok)
        tokens[alive, step] = tok
        new_eos = (tok == eos_id) & ~done
        if bool(new_eos.any()):
            lengths[alive[new_eos]] = step
            done |= new_eos
            n_done = int(done.sum())
            if n_done == done.numel():
                break
            if n_done >= SHRINK_FRACTION * done.numel():
                keep = (~done).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                alive, mask, next_pos, tok, done = alive[keep], mask[keep], next_pos[keep], tok[keep], done[keep]
        if step == max_new_tokens - 1:
            break
        mask[:, width + step] = 1
        out = model(input_ids=tok.unsqueeze(1), attention_mask=mask[:, :width + step + 1],
                    position_ids=next_pos.unsqueeze(1), use_cache=True, **{cache_arg: cache})
        logits = out.logits[:, -1, :]
        del out
        next_pos += 1
    return tokens, lengths


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
    """``num_completions`` samples per prompt, in batches of at most ``max_batch`` sequences (see the module docstring)."""
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    if pad_id is None:
        pad_id = eos_id
    per_chunk = max(1, max_batch // num_completions)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # similar lengths share a batch
    completions: list[list[list[int]] | None] = [None] * len(prompt_ids)
    finished: list[list[bool] | None] = [None] * len(prompt_ids)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), per_chunk):
            chunk = order[start:start + per_chunk]
            tokens, lengths = _sample_chunk(model, [prompt_ids[i] for i in chunk], num_completions, max_new_tokens,
                                            temperature, greedy, eos_id, pad_id)
            token_rows, length_list = tokens.tolist(), lengths.tolist()
            for k, i in enumerate(chunk):
                span = range(k * num_completions, (k + 1) * num_completions)
                completions[i] = [token_rows[r][:length_list[r]] for r in span]
                finished[i] = [length_list[r] < max_new_tokens for r in span]
    finally:
        model.train(was_training)
    flat = [c for group in completions for c in group]
    texts = tokenizer.batch_decode(flat, skip_special_tokens=True) if flat else []
    out = []
    for i, ids in enumerate(prompt_ids):
        group_texts = texts[i * num_completions:(i + 1) * num_completions]
        out.append(Generated(prompt_ids=ids, completion_ids=completions[i], texts=group_texts, finished=finished[i]))
    return out
