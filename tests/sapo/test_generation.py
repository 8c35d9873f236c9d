"""The generation engines and the fast log-prob paths, each checked against an independent reference.

* ``generate_completions`` (shared prefill, preallocated cache, finished rows leaving the batch) against
  Hugging Face ``generate`` greedy, on a model whose EOS comes at data-dependent steps, and its sampling
  against the model's own next-token distribution;
* ``shared_prompt_logprobs`` (each prompt run once) and the completion-only output layer against
  ``token_logprobs`` on the full sequences: values and gradients;
* ``SAPONode.update`` on groups with shared prompts against the same update computed the plain way;
* the vLLM engine: a clear error where vLLM is absent; where it is installed (GPU), generation and weight sync.
"""

from __future__ import annotations

import copy
import importlib.util
import math

import pytest
import torch
from transformers import GenerationConfig

from swarmlm.models import build_preset
from swarmlm.sapo import batching
from swarmlm.sapo.batching import TrainSample, collate, sample_logprobs, shared_prompt_logprobs, token_logprobs
from swarmlm.sapo.engines import hf
from swarmlm.sapo.engines.hf import HFEngine, generate_completions
from swarmlm.sapo.grpo import grpo_loss


@pytest.fixture(scope="module")
def tiny():
    loaded = build_preset("tiny-qwen2", seed=5)
    loaded.model.eval()
    return loaded


def _prompts(n: int, seed: int = 0, lengths=(5, 11, 8, 14, 3)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 250, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


def _eos_every_few_steps(model, eos: int, modulus: int = 6):
    """A forward hook on the output layer making EOS the top token wherever a (chaotic, deterministic) function of
    the logits is 0 modulo ``modulus``: the same model for both sides, with completions that end at different
    steps (greedy decoding of a random model tends to repeat one token, so the top token alone would not do)."""
    def hook(module, inputs, logits):
        trigger = torch.floor(logits[..., :1] * 100) % modulus == 0
        boost = torch.where(trigger, logits.max(-1, keepdim=True).values + 1.0, logits[..., eos:eos + 1])
        logits = logits.clone()
        logits[..., eos:eos + 1] = boost
        return logits
    return model.get_output_embeddings().register_forward_hook(hook)


def _hf_greedy(model, tok, prompt: list[int], max_new: int) -> list[int]:
    out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         generation_config=GenerationConfig(do_sample=False, max_new_tokens=max_new,
                                                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    new = out[0, len(prompt):].tolist()
    return new[:new.index(tok.eos_token_id)] if tok.eos_token_id in new else new


@pytest.mark.parametrize("shrink", [0.0, hf.SHRINK_FRACTION, 2.0])
def test_greedy_matches_hf_generate_with_early_eos(tiny, monkeypatch, shrink):
    """Left-padded prompts of different lengths in one batch, L = 3, EOS at different steps: every completion is
    what HF greedy decoding gives for its prompt alone. shrink 0 drops finished rows at once, 2.0 never."""
    monkeypatch.setattr(hf, "SHRINK_FRACTION", shrink)
    model, tok = tiny.model, tiny.tokenizer
    handle = _eos_every_few_steps(model, tok.eos_token_id)
    try:
        prompts = _prompts(5)
        out = generate_completions(model, tok, prompts, num_completions=3, max_new_tokens=12, greedy=True, max_batch=9)
        expected = [_hf_greedy(model, tok, p, 12) for p in prompts]
    finally:
        handle.remove()
    lengths = set()
    for gen, exp, p in zip(out, expected, prompts):
        assert gen.prompt_ids == p
        assert gen.completion_ids == [exp] * 3
        assert gen.finished == [len(exp) < 12] * 3
        assert gen.texts == [tok.decode(exp, skip_special_tokens=True)] * 3
        lengths.add(len(exp))
    assert len(lengths) >= 3 and any(n < 12 for n in lengths)  # EOS really came at different steps


def test_sampling_follows_the_models_distribution(tiny):
    """The first and second sampled tokens of many completions of one prompt follow softmax(logits / T)."""
    model, tok = tiny.model, tiny.tokenizer
    prompt = _prompts(1, seed=3)[0]
    temperature = 0.1  # a peaked distribution: sampling noise small against a wrong temperature or position
    torch.manual_seed(0)
    n = 4000
    out = generate_completions(model, tok, [prompt], num_completions=n, max_new_tokens=2, temperature=temperature,
                               max_batch=n)[0]
    firsts = torch.tensor([c[0] for c in out.completion_ids if c])
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1] / temperature, -1)
    empirical = torch.bincount(firsts, minlength=probs.numel()).float() / len(firsts)
    tv = 0.5 * (empirical - probs).abs().sum().item()
    assert tv < 0.08, tv
    # second token, conditioned on the most frequent first token: the cache and positions carry the prompt
    top = int(torch.mode(firsts).values)
    seconds = torch.tensor([c[1] for c in out.completion_ids if len(c) > 1 and c[0] == top])
    assert len(seconds) > 100
    with torch.no_grad():
        probs2 = torch.softmax(model(input_ids=torch.tensor([prompt + [top]])).logits[0, -1] / temperature, -1)
    empirical2 = torch.bincount(seconds, minlength=probs2.numel()).float() / len(seconds)
    assert 0.5 * (empirical2 - probs2).abs().sum().item() < 0.2


def test_the_sampler_draws_each_token_with_its_probability():
    """Against the exact distribution, over a vocabulary of SmolLM2's size: a peaked row, a flat row and a row
    whose mass sits on its last token; tokens of probability 0 are never drawn."""
    torch.manual_seed(0)
    vocab, n = 49_152, 2_000
    logits = torch.full((3, vocab), -1e4)
    logits[0, :5] = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    logits[1] = 0.0
    logits[2, -2:] = torch.tensor([0.0, 2.0])
    draws = torch.cat([hf._next_tokens(logits.repeat(500, 1), 1.0, greedy=False).view(500, 3)
                       for _ in range(n // 500)])  # [n, 3]: 500 copies of each row at a time
    probs = torch.softmax(logits.double(), -1)
    for row in (0, 2):
        empirical = torch.bincount(draws[:, row], minlength=vocab).double() / n
        assert 0.5 * (empirical - probs[row]).abs().sum().item() < 0.04
        assert set(draws[:, row].tolist()) <= set(torch.nonzero(probs[row] > 1e-12).flatten().tolist())
    flat = torch.bincount(draws[:, 1], minlength=vocab).double()
    assert flat.max().item() <= 3 and (flat > 0).sum().item() > 0.035 * vocab  # spread over the whole vocabulary
    assert draws[:, 1].min().item() < 500 and draws[:, 1].max().item() > vocab - 500


def test_sampled_completions_are_cut_at_eos(tiny):
    model, tok = tiny.model, tiny.tokenizer
    handle = _eos_every_few_steps(model, tok.eos_token_id, modulus=4)
    try:
        torch.manual_seed(1)
        out = HFEngine(model, tok).generate(_prompts(4), num_completions=4, max_new_tokens=10, max_batch=8)
    finally:
        handle.remove()
    assert [len(g.completion_ids) for g in out] == [4] * 4
    flat = [(c, f) for g in out for c, f in zip(g.completion_ids, g.finished)]
    assert all(tok.eos_token_id not in c and len(c) <= 10 for c, _ in flat)
    assert all(f == (len(c) < 10) for c, f in flat)
    assert any(f for _, f in flat) and model.training is False


def test_generation_restores_training_mode(tiny):
    model = copy.deepcopy(tiny.model).train()
    generate_completions(model, tiny.tokenizer, _prompts(2), num_completions=2, max_new_tokens=3)
    assert model.training


# ----------------------------------------------------------------------------- log-probs
def _groups(eos: int, seed: int = 0) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    samples = []
    for gi, plen in enumerate([7, 12, 9]):
        prompt = torch.randint(0, 250, (plen,), generator=g).tolist()
        for j in range(3):
            comp = torch.randint(0, 250, ((gi * 3 + j) % 5,), generator=g).tolist() + [eos]
            samples.append(TrainSample(prompt, comp, float(j - 1)))
    return samples


def _values_and_grads(model, fn):
    model.zero_grad(set_to_none=True)
    logp, mask = fn()
    vals = logp[mask]
    (vals * torch.linspace(-1, 1, vals.numel())).sum().backward()
    return vals.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("completion_only_output", [False, True])
def test_shared_prompt_logprobs_equal_full_sequences(monkeypatch, completion_only_output):
    if completion_only_output:  # the large-vocabulary path, forced on the tiny model
        monkeypatch.setattr(batching, "OUTPUT_LAYER_SHARE", 0.0)
        monkeypatch.setattr(batching, "_LARGE_OUTPUT", batching.weakref.WeakKeyDictionary())
    loaded = build_preset("tiny-qwen2", seed=1)
    model = loaded.model.train()
    samples = _groups(loaded.tokenizer.eos_token_id)
    pad = loaded.tokenizer.pad_token_id
    monkeypatch.setattr(batching, "_LARGE_OUTPUT", batching.weakref.WeakKeyDictionary())
    ref_vals, ref_grads = _values_and_grads(model, lambda: token_logprobs(model, collate(samples, pad)))
    vals, grads = _values_and_grads(model, lambda: shared_prompt_logprobs(model, samples, pad))
    torch.testing.assert_close(vals, ref_vals, rtol=1e-5, atol=1e-5)
    scale = max(g.abs().max().item() for g in ref_grads)
    assert scale > 0
    for a, b in zip(grads, ref_grads):
        assert (a - b).abs().max().item() <= 1e-5 * scale
    # and the dispatcher takes that path for groups
    torch.testing.assert_close(sample_logprobs(model, samples, pad)[0][sample_logprobs(model, samples, pad)[1]], ref_vals,
                               rtol=1e-5, atol=1e-5)


def test_completion_only_output_layer_equals_full_logits(monkeypatch):
    loaded = build_preset("tiny-qwen2", seed=2)
    model = loaded.model.train()
    samples = _groups(loaded.tokenizer.eos_token_id, seed=4)
    batch = collate(samples, loaded.tokenizer.pad_token_id)
    full_vals, full_grads = _values_and_grads(model, lambda: token_logprobs(model, batch))
    monkeypatch.setattr(batching, "OUTPUT_LAYER_SHARE", 0.0)
    monkeypatch.setattr(batching, "_LARGE_OUTPUT", batching.weakref.WeakKeyDictionary())
    keep_vals, keep_grads = _values_and_grads(model, lambda: token_logprobs(model, batch))
    assert batching._KEEP_MASK_SUPPORT.get(type(model)) is True  # the mask path really ran
    torch.testing.assert_close(keep_vals, full_vals, rtol=1e-5, atol=1e-6)
    for a, b in zip(keep_grads, full_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- the node's update
def _node(tmp_path, name, **grpo):
    from swarmlm.sapo.config import SAPOConfig
    from swarmlm.sapo.node import SAPONode
    from swarmlm.sapo.transports.in_process import InProcessHub

    grpo = {"external_weight": "none", **grpo}  # the reference update unless a test asks for the weights
    config = SAPOConfig(model={"warmstart": "never", "device": "cpu"}, grpo=grpo, tasks={"eval_size": 2}, external=0)
    return SAPONode(config, 0, InProcessHub(1).endpoint("node-0"), tmp_path / name, "tiny-qwen2",
                    resume=False, tensorboard=False)


def test_update_on_groups_matches_the_plain_computation(tmp_path):
    """One pass: the loss is the token mean of -A and the gradient norm is that of the plain full-sequence
    computation (each completion with its own copy of the prompt)."""
    node = _node(tmp_path, "groups", lr=1e-3, micro_batch_size=4)
    samples = _groups(node.tokenizer.eos_token_id, seed=7)
    reference = copy.deepcopy(node.model)
    batch = collate(samples, node.tokenizer.pad_token_id)
    logp, mask = token_logprobs(reference, batch)
    n = float(mask.sum())
    loss, _ = grpo_loss(logp, logp.detach(), torch.tensor([s.advantage for s in samples]), mask, num_tokens=n)
    loss.backward()
    norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in reference.parameters()))
    stats = node.update(samples)
    assert stats["loss"] == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert stats["grad_norm"] == pytest.approx(norm, rel=1e-4)


def test_ppo_epochs_reuse_the_first_forward_as_old_logprobs(tmp_path, monkeypatch):
    """ppo_epochs = 2, one minibatch: no separate old-log-prob pass (the first pass's forward gives them), and the
    clipping statistics are those of the separate-pass computation."""
    node = _node(tmp_path, "epochs", lr=0.05, ppo_epochs=2, num_minibatches=1)
    calls = []
    original = node.updater.logprobs
    monkeypatch.setattr(node.updater, "logprobs", lambda model, s: calls.append(len(s)) or original(model, s))
    samples = _groups(node.tokenizer.eos_token_id, seed=8)
    stats = node.update(samples)
    assert calls == []
    assert stats["clip_frac"] > 0 and math.isfinite(stats["loss"])
    # two minibatches: only the second needs the separate pass
    node2 = _node(tmp_path, "epochs2", lr=0.05, ppo_epochs=2, num_minibatches=2)
    calls2 = []
    original2 = node2.updater.logprobs
    monkeypatch.setattr(node2.updater, "logprobs", lambda model, s: calls2.append(len(s)) or original2(model, s))
    node2.update(_groups(node2.tokenizer.eos_token_id, seed=8))
    assert calls2 == [len(samples) - math.ceil(len(samples) / 2)]


# ----------------------------------------------------------------------------- vLLM
def test_vllm_engine_absent_gives_a_clear_error(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    from swarmlm.sapo.engines.vllm import VLLMUnavailable

    with pytest.raises(VLLMUnavailable, match="pip install vllm"):
        from swarmlm.sapo.config import SAPOConfig
        from swarmlm.sapo.node import SAPONode
        from swarmlm.sapo.transports.in_process import InProcessHub

        config = SAPOConfig(model={"warmstart": "never", "device": "cpu"}, generation={"engine": "vllm"}, external=0)
        SAPONode(config, 0, InProcessHub(1).endpoint("node-0"), tmp_path / "v", "tiny-qwen2", resume=False,
                 tensorboard=False)


def test_vllm_engine_generates_and_follows_weight_updates(tmp_path):
    pytest.importorskip("vllm")
    if not torch.cuda.is_available():
        pytest.skip("vLLM needs a CUDA GPU")
    from swarmlm.sapo.engines.vllm import VLLMEngine

    loaded = build_preset("tiny-qwen2", seed=9)
    model, tok = loaded.model.cuda(), loaded.tokenizer
    engine = VLLMEngine(model, tok, gpu_memory_utilization=0.2, max_model_len=256)
    try:
        prompts = _prompts(3)
        out = engine.generate(prompts, num_completions=4, max_new_tokens=8)
        assert [len(g.completion_ids) for g in out] == [4] * 3
        assert all(len(c) <= 8 and tok.eos_token_id not in c for g in out for c in g.completion_ids)
        before = engine.generate(prompts, num_completions=1, max_new_tokens=6, greedy=True)
        # an update that makes every logit equal: greedy then picks token 0 everywhere, once vLLM has the weights
        with torch.no_grad():
            model.model.norm.weight.zero_()
        stale = engine.generate(prompts, num_completions=1, max_new_tokens=6, greedy=True)
        assert [g.completion_ids for g in stale] == [g.completion_ids for g in before]
        engine.sync_weights()
        after = engine.generate(prompts, num_completions=1, max_new_tokens=6, greedy=True)
        assert all(g.completion_ids == [[0] * 6] for g in after)
    finally:
        engine.close()


def test_bf16_decoding_uses_a_copy_that_follows_weight_updates():
    """--generation.precision bfloat16: the engine samples with bf16 parameters (buffers as they were) and the
    training model stays float32; it samples as the model cast to bf16 does, and after an update it changes only
    once the weights are synced. Greedy decoding (the evaluation) is the float32 model's own."""
    loaded = build_preset("tiny-qwen2", seed=9)
    model, tok = loaded.model, loaded.tokenizer
    engine = HFEngine(model, tok, bf16=True)
    assert {p.dtype for p in engine.decoder.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert [b.dtype for b in engine.decoder.buffers()] == [b.dtype for b in model.buffers()]
    prompts = _prompts(3)
    cast = copy.deepcopy(model)
    for p in cast.parameters():
        p.data = p.data.to(torch.bfloat16)

    def sampled(e: HFEngine) -> list:
        torch.manual_seed(5)
        return [g.completion_ids for g in e.generate(prompts, num_completions=3, max_new_tokens=6)]

    before = sampled(engine)
    assert before == sampled(HFEngine(cast, tok))
    greedy = engine.generate(prompts, num_completions=1, max_new_tokens=6, greedy=True)
    assert [g.completion_ids for g in greedy] == [g.completion_ids for g in HFEngine(model, tok).generate(
        prompts, num_completions=1, max_new_tokens=6, greedy=True)]
    with torch.no_grad():  # an update that makes every logit equal: the samples then change
        model.model.norm.weight.zero_()
    assert sampled(engine) == before  # not synced yet
    engine.sync_weights()
    assert sampled(engine) != before
    cast_after = copy.deepcopy(model)
    for p in cast_after.parameters():
        p.data = p.data.to(torch.bfloat16)
    assert sampled(engine) == sampled(HFEngine(cast_after, tok))
