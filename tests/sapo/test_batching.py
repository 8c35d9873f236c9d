"""Training batches: layout without gaps, explicit positions, EOS once, and padding-invariant log-probs."""

from __future__ import annotations

import pytest
import torch

from swarmlm.models import build_preset
from swarmlm.sapo.batching import TrainSample, collate, selective_log_softmax, token_logprobs, with_eos

PAD, EOS = 257, 256


@pytest.fixture(scope="module")
def tiny():
    loaded = build_preset("tiny-qwen2", seed=3)
    loaded.model.eval()
    return loaded


def _samples(seed: int = 0, n: int = 5, eos: int = EOS) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(0, 256, (2 + (3 * i) % 7,), generator=g).tolist()
        completion = with_eos(torch.randint(0, 256, (1 + (5 * i) % 6,), generator=g).tolist(), eos, 64)
        out.append(TrainSample(prompt, completion, advantage=float(i) - 2))
    return out


# ----------------------------------------------------------------------------- with_eos
def test_with_eos_appends_exactly_one_eos():
    assert with_eos([5, 6, 7], EOS, 10) == [5, 6, 7, EOS]
    assert with_eos([], EOS, 10) == [EOS]
    assert with_eos([5, 6, 7, 8], EOS, 2) == [5, 6, EOS]  # cut to max_tokens, then EOS
    # a completion that already ends in (or holds) EOS is not terminated twice
    assert with_eos([5, 6, EOS], EOS, 10) == [5, 6, EOS]
    assert with_eos([5, EOS, 6, 7], EOS, 10) == [5, EOS]
    ids = [1, 2, 3]
    with_eos(ids, EOS, 10)
    assert ids == [1, 2, 3]  # the input is not modified


# ----------------------------------------------------------------------------- collate
def test_collate_layout_has_no_gap_and_explicit_positions():
    samples = _samples()
    batch = collate(samples, PAD)
    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    assert batch["input_ids"].shape == (len(samples), width)
    for row, s in enumerate(samples):
        p, c = len(s.prompt_ids), len(s.completion_ids)
        ids = batch["input_ids"][row]
        # prompt immediately followed by completion, padding only on the right
        assert ids[:p + c].tolist() == s.prompt_ids + s.completion_ids
        assert ids[p + c:].tolist() == [PAD] * (width - p - c)
        assert batch["attention_mask"][row].tolist() == [1] * (p + c) + [0] * (width - p - c)
        assert batch["position_ids"][row, :p + c].tolist() == list(range(p + c))
        assert batch["completion_mask"][row].tolist() == [False] * p + [True] * c + [False] * (width - p - c)
        assert ids[p + c - 1].item() == EOS and (ids[:p + c] == EOS).sum().item() == 1
    assert batch["completion_mask"].dtype == torch.bool
    assert int(batch["completion_mask"].sum()) == sum(s.num_completion_tokens for s in samples)


# ----------------------------------------------------------------------------- log-probs
def test_selective_log_softmax_matches_full_log_softmax():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(19, 7, 50, generator=g)  # more rows than one chunk
    ids = torch.randint(0, 50, (19, 7), generator=g)
    expected = torch.gather(torch.log_softmax(logits, -1), -1, ids.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(selective_log_softmax(logits, ids, chunk_rows=4), expected)
    # bf16 logits are computed in float32
    out = selective_log_softmax(logits.bfloat16(), ids)
    assert out.dtype == torch.float32


def test_token_logprobs_of_one_sample_are_the_next_token_log_probs(tiny):
    s = _samples(n=1, eos=tiny.tokenizer.eos_token_id)[0]
    batch = collate([s], tiny.tokenizer.pad_token_id)
    with torch.no_grad():
        logp, mask = token_logprobs(tiny.model, batch)
        ids = torch.tensor([s.prompt_ids + s.completion_ids])
        full = torch.log_softmax(tiny.model(input_ids=ids).logits.float(), -1)[0]
    p = len(s.prompt_ids)
    expected = [full[t - 1, ids[0, t]].item() for t in range(p, ids.shape[1])]
    assert logp[0][mask[0]].tolist() == pytest.approx(expected, abs=1e-5)
    assert mask.shape == logp.shape == (1, ids.shape[1] - 1)


def test_padded_batch_log_probs_equal_each_sample_alone(tiny):
    samples = _samples(seed=4, n=6, eos=tiny.tokenizer.eos_token_id)
    pad = tiny.tokenizer.pad_token_id
    with torch.no_grad():
        logp, mask = token_logprobs(tiny.model, collate(samples, pad))
        for row, s in enumerate(samples):
            alone, alone_mask = token_logprobs(tiny.model, collate([s], pad))
            assert int(mask[row].sum()) == s.num_completion_tokens
            torch.testing.assert_close(logp[row][mask[row]], alone[0][alone_mask[0]], rtol=1e-5, atol=1e-5)


def test_positions_matter(tiny):
    """The explicit position ids are used: a gap in positions between prompt and completion (what padding
    between them would cause) changes the completion's log-probs. RoPE is shift-invariant, so a uniform
    shift would not."""
    s = _samples(seed=5, n=1, eos=tiny.tokenizer.eos_token_id)[0]
    batch = collate([s], tiny.tokenizer.pad_token_id)
    gap = batch["position_ids"].clone()
    gap[0, len(s.prompt_ids):] += 3
    shifted = dict(batch, position_ids=gap)
    with torch.no_grad():
        a, m = token_logprobs(tiny.model, batch)
        b, _ = token_logprobs(tiny.model, shifted)
    assert (a[m] - b[m]).abs().max() > 1e-4
