"""GRPO advantages and loss, checked against TRL's GRPOTrainer on the same batch, and SAPONode.update.

TRL (a test-only dependency) is the independent oracle: a real ``GRPOTrainer`` is built on the same tiny
model, its rollouts come from ``rollout_func`` (TRL's hook for custom generation) returning fixed token ids,
its rewards from a reward function that reads a dataset column, and its advantages and loss are computed by
its own ``_generate_and_score_completions`` and ``_compute_loss``, i.e. model forward, advantage, clipping,
KL and aggregation are all TRL's code. Our side runs ``collate`` + ``token_logprobs`` + ``grpo_loss``.

Convention differences between TRL 1.16 and the SPEC (A.3), and what we do:

* advantage denominator: TRL uses ``std + 1e-4``; the SPEC says ``std + 1e-8``. Both use the
  Bessel-corrected (sample) std. ``group_advantages`` defaults to the SPEC's 1e-8 and takes ``eps``, so the
  comparison with TRL passes ``eps=1e-4``; ``test_advantages_default_eps_is_the_specs`` pins the default.
* loss aggregation: the SPEC's token mean over the whole batch is TRL's ``loss_type="dapo"`` (TRL's default),
  not TRL's ``"grpo"`` (mean per sequence, then over sequences), which differs when lengths differ.
* KL: TRL 1.16 defaults to ``use_bias_correction_kl=True`` (the KL term multiplied by the ratio ρ, from
  DeepSeek-V3.2). The SPEC's plain GRPO penalty is β·k3 with no ratio, so the oracle runs with it off.
* importance weights for external completions: ours scale the whole per-token loss of a completion, KL
  included (the weight says how much the sample counts); TRL's vLLM importance-sampling correction leaves the
  KL term unweighted. The test below builds the reference from TRL's per-row losses.
* TRL left-pads prompts and passes no position ids, so prompts in the oracle batches all have one length
  (then TRL's layout is exactly ours: prompt, completion, right padding, positions 0..n-1).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.trainer.utils import split_tensor_dict  # noqa: E402

from swarmlm.models import build_preset, load_model  # noqa: E402
from swarmlm.sapo.batching import TrainSample, collate, token_logprobs  # noqa: E402
from swarmlm.sapo.grpo import group_advantages, grpo_loss, is_zero_advantage, per_token_kl  # noqa: E402

# TRL and transformers deprecation notices about their own internals
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

PROMPT_LEN = 6
L = 4
# three groups: mixed 0/1, all equal (zero advantage), partial credit
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.0, 0.25, 1.0, 0.5]
GROUPS = len(REWARDS) // L


# ----------------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny preset saved once; TRL and our side both load it, so their weights are identical."""
    path = tmp_path_factory.mktemp("grpo-model")
    build_preset("tiny-qwen2", seed=7).model.save_pretrained(path)
    build_preset("tiny-qwen2", seed=7).tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def batch():
    """Equal-length prompts (one per group), completions of 1 to 6 tokens ending in EOS."""
    tok = build_preset("tiny-qwen2").tokenizer
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 256, (PROMPT_LEN,), generator=g).tolist() for _ in range(GROUPS)]
    completions = []
    for _ in range(GROUPS * L):
        n = int(torch.randint(0, 6, (1,), generator=g))
        completions.append(torch.randint(0, 256, (n,), generator=g).tolist() + [tok.eos_token_id])
    return {"prompts": prompts, "completions": completions, "pad": tok.pad_token_id, "eos": tok.eos_token_id}


def _reward_from_column(completions, reward, **kwargs):
    return [float(r) for r in reward]


def make_trl(model_dir, batch, out_dir, *, loss_type="dapo", beta=0.0, eps_low=0.2, eps_high=0.28,
             grad_accum=1, num_iterations=1):
    """A real GRPOTrainer on the saved model, and TRL's processed batch (advantages, masks, old/ref log-probs)."""
    prompts, completions = batch["prompts"], batch["completions"]

    def rollout(prompt_texts, trainer):
        return {"prompt_ids": [prompts[i // L] for i in range(len(prompt_texts))],
                "completion_ids": [completions[i] for i in range(len(prompt_texts))], "logprobs": None}

    n = len(REWARDS)
    args = GRPOConfig(
        output_dir=str(out_dir), per_device_train_batch_size=n // grad_accum, gradient_accumulation_steps=grad_accum,
        num_generations=L, num_iterations=num_iterations, loss_type=loss_type, beta=beta, epsilon=eps_low,
        epsilon_high=eps_high, use_bias_correction_kl=False, scale_rewards="group", use_cpu=True, bf16=False,
        report_to=[], seed=0,
    )
    tok = load_model(str(model_dir)).tokenizer
    dataset = Dataset.from_dict({"prompt": [f"q{k}" for k in range(GROUPS)], "reward": [0.0] * GROUPS})
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=_reward_from_column, args=args, train_dataset=dataset,
                          processing_class=tok, rollout_func=rollout)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = grad_accum  # what Trainer's loop sets during accumulation
    inputs = trainer._generate_and_score_completions(
        [{"prompt": f"q{i // L}", "reward": r} for i, r in enumerate(REWARDS)])
    return trainer, inputs


def our_model(model_dir):
    return load_model(str(model_dir)).model.train()


def samples_for(batch, advantages) -> list[TrainSample]:
    return [TrainSample(batch["prompts"][i // L], batch["completions"][i], float(a)) for i, a in enumerate(advantages)]


def to_trl_layout(per_token: torch.Tensor, batch) -> torch.Tensor:
    """Our [B, T-1] next-token values → TRL's [B, C] completion-aligned layout (zeros where padded)."""
    width = max(len(c) for c in batch["completions"])
    out = torch.zeros(per_token.shape[0], width, dtype=per_token.dtype)
    for row, c in enumerate(batch["completions"]):
        out[row, :len(c)] = per_token[row, PROMPT_LEN - 1:PROMPT_LEN - 1 + len(c)]
    return out


def perturb_(model, scale: float, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


def copy_weights(src, dst) -> None:
    dst.load_state_dict(src.state_dict())


def assert_same_grads(a, b, rtol=1e-4):
    ga = dict(a.named_parameters())
    scale = max(float(p.grad.abs().max()) for p in b.parameters() if p.grad is not None)
    assert scale > 0, "no gradient at all: the test would be vacuous"
    for name, p in b.named_parameters():
        assert p.grad is not None and ga[name].grad is not None, name
        diff = float((p.grad - ga[name].grad).abs().max())
        assert diff <= rtol * scale + 1e-7, f"{name}: grads differ by {diff} (scale {scale})"


# ----------------------------------------------------------------------------- advantages
def test_advantages_match_trl(model_dir, batch, tmp_path):
    _, inputs = make_trl(model_dir, batch, tmp_path)
    trl_adv = inputs["advantages"].double()
    ours = group_advantages(torch.tensor(REWARDS, dtype=torch.float64).view(GROUPS, L), eps=1e-4).flatten()
    torch.testing.assert_close(ours, trl_adv, rtol=1e-5, atol=1e-6)
    # the all-equal group has exactly zero advantage in both
    assert torch.all(ours[L:2 * L] == 0) and torch.all(trl_adv[L:2 * L] == 0)
    assert is_zero_advantage(REWARDS[L:2 * L]) and not is_zero_advantage(REWARDS[:L])
    # and the other groups are not trivially zero
    assert ours[:L].abs().min() > 0.5


def test_advantages_default_eps_is_the_specs():
    # r = [1, 0, 0, 0]: mean 0.25, sample std 0.5 -> A_0 = 0.75 / (0.5 + eps)
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64))
    assert adv[0, 0].item() == pytest.approx(1.5, abs=1e-7)  # eps = 1e-8 (SPEC), Bessel-corrected std
    assert adv[0, 1].item() == pytest.approx(-0.5, abs=1e-7)
    trl_like = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64), eps=1e-4)
    assert abs(trl_like[0, 0].item() - 1.5) > 1e-4  # TRL's 1e-4 is visibly different
    # each group is normalised on its own, and a constant group gives 0, not NaN
    both = group_advantages(torch.tensor([[2.0, 2.0, 2.0], [0.0, 3.0, 6.0]]))
    assert torch.all(both[0] == 0) and torch.isfinite(both).all()
    assert both[1].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 0.0]))


# ----------------------------------------------------------------------------- loss, on-policy
def test_token_mean_loss_and_gradient_match_trl_dapo(model_dir, batch, tmp_path):
    trainer, inputs = make_trl(model_dir, batch, tmp_path, loss_type="dapo")
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()

    model = our_model(model_dir)
    samples = samples_for(batch, inputs["advantages"])
    logp, mask = token_logprobs(model, collate(samples, batch["pad"]))
    adv = torch.tensor([s.advantage for s in samples])
    loss, stats = grpo_loss(logp, logp.detach(), adv, mask)
    loss.backward()

    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-7)
    assert abs(loss.item()) > 1e-3
    assert_same_grads(trainer.model, model)
    assert stats["clip_frac"].item() == 0.0  # one pass: ρ ≡ 1, clipping never acts
    assert trainer._metrics["train"]["clip_ratio/region_mean"][-1] == 0.0


def test_token_mean_is_not_trls_per_sequence_grpo_aggregation(model_dir, batch, tmp_path):
    """SPEC: sum over all completion tokens / their count. TRL's 'grpo' type averages per sequence first."""
    trainer, inputs = make_trl(model_dir, batch, tmp_path, loss_type="grpo")
    with torch.no_grad():
        trl_grpo = trainer._compute_loss(trainer.model, inputs).item()
        model = our_model(model_dir)
        samples = samples_for(batch, inputs["advantages"])
        logp, mask = token_logprobs(model, collate(samples, batch["pad"]))
        ours, _ = grpo_loss(logp, logp, torch.tensor([s.advantage for s in samples]), mask)
    lengths = {len(c) for c in batch["completions"]}
    assert len(lengths) > 1
    assert abs(ours.item() - trl_grpo) > 1e-3


# ----------------------------------------------------------------------------- loss, off-policy (ppo_epochs > 1)
RATIO_PATTERN = [0.5, 0.7, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0]


def test_clipping_both_sides_matches_trl(model_dir, batch, tmp_path):
    """Old log-probs chosen so that ρ takes values on both sides of [1-ε_low, 1+ε_high], for A > 0 and A < 0.

    ρ = 1.25 with A > 0 is inside ε_high = 0.28 but would be clipped by a symmetric 0.2: it checks that the
    upper bound really is ε_high.
    """
    trainer, inputs = make_trl(model_dir, batch, tmp_path, eps_low=0.2, eps_high=0.28)
    model = our_model(model_dir)
    samples = samples_for(batch, inputs["advantages"])
    collated = collate(samples, batch["pad"])
    with torch.no_grad():
        current, mask = token_logprobs(model, collated)
    ratio = torch.ones_like(current)
    k = 0
    for row in range(ratio.shape[0]):
        for col in mask[row].nonzero().flatten().tolist():
            ratio[row, col] = RATIO_PATTERN[(k + row) % len(RATIO_PATTERN)]
            k += 1
    old = current - torch.log(ratio)
    inputs["old_per_token_logps"] = to_trl_layout(old, batch)

    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()
    logp, mask = token_logprobs(model, collated)
    adv = torch.tensor([s.advantage for s in samples])
    loss, stats = grpo_loss(logp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    loss.backward()

    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-5, abs=1e-7)
    assert_same_grads(trainer.model, model)
    metrics = trainer._metrics["train"]
    assert metrics["clip_ratio/low_mean"][-1] > 0 and metrics["clip_ratio/high_mean"][-1] > 0
    assert stats["clip_frac"].item() == pytest.approx(metrics["clip_ratio/region_mean"][-1], abs=1e-6)
    # the batch really exercises all four regions
    a = adv.unsqueeze(1).expand_as(ratio)[mask]
    r = ratio[mask]
    assert ((a > 0) & (r > 1.28)).any() and ((a < 0) & (r < 0.8)).any()  # clipped: no gradient
    assert ((a > 0) & (r < 0.8)).any() and ((a < 0) & (r > 1.28)).any()  # min keeps the unclipped term
    assert ((a > 0) & (r > 1.2) & (r < 1.28)).any()


def test_second_ppo_epoch_matches_trl_num_iterations(model_dir, batch, tmp_path):
    """TRL with num_iterations=2 computes the old log-probs once itself; after a first-pass optimizer step the
    second pass (ratio ≠ 1, clipping live) must give the same loss and gradient as ours."""
    trainer, inputs = make_trl(model_dir, batch, tmp_path, num_iterations=2)
    assert "old_per_token_logps" in inputs  # TRL's own old log-probs, computed before any step

    model = our_model(model_dir)
    samples = samples_for(batch, inputs["advantages"])
    collated = collate(samples, batch["pad"])
    adv = torch.tensor([s.advantage for s in samples])
    with torch.no_grad():
        old, _ = token_logprobs(model, collated)
    torch.testing.assert_close(to_trl_layout(old, batch) * inputs["completion_mask"],
                               inputs["old_per_token_logps"] * inputs["completion_mask"], rtol=1e-4, atol=1e-5)

    # first pass: one Adam step on our model, copied into TRL's
    opt = torch.optim.Adam(model.parameters(), lr=3e-2)
    logp, mask = token_logprobs(model, collated)
    grpo_loss(logp, old, adv, mask)[0].backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    copy_weights(model, trainer.model)

    # second pass
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()
    logp, mask = token_logprobs(model, collated)
    loss, stats = grpo_loss(logp, old, adv, mask)
    loss.backward()
    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-4, abs=1e-6)
    assert_same_grads(trainer.model, model, rtol=1e-3)
    assert stats["clip_frac"].item() > 0
    assert stats["clip_frac"].item() == pytest.approx(trainer._metrics["train"]["clip_ratio/region_mean"][-1], abs=1e-6)


# ----------------------------------------------------------------------------- KL
def test_kl_term_matches_trl(model_dir, batch, tmp_path):
    """β > 0: TRL builds its reference model from the saved weights and computes the reference log-probs
    itself; the policy has then moved away (same perturbation on both sides)."""
    beta = 0.3
    trainer, _ = make_trl(model_dir, batch, tmp_path, beta=beta)
    model = our_model(model_dir)
    ref_model = our_model(model_dir).eval()
    perturb_(model, 0.05, seed=3)
    copy_weights(model, trainer.model)
    inputs = trainer._generate_and_score_completions(
        [{"prompt": f"q{i // L}", "reward": r} for i, r in enumerate(REWARDS)])  # ref log-probs from TRL's ref model
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()

    samples = samples_for(batch, inputs["advantages"])
    collated = collate(samples, batch["pad"])
    with torch.no_grad():
        ref, _ = token_logprobs(ref_model, collated)
    logp, mask = token_logprobs(model, collated)
    adv = torch.tensor([s.advantage for s in samples])
    loss, stats = grpo_loss(logp, logp.detach(), adv, mask, beta=beta, ref_logp=ref)
    loss.backward()

    assert loss.item() == pytest.approx(trl_loss.item(), rel=1e-4, abs=1e-6)
    assert_same_grads(trainer.model, model, rtol=1e-3)
    assert stats["kl"].item() > 1e-3
    assert stats["kl"].item() == pytest.approx(trainer._metrics["train"]["kl"][-1], rel=1e-4)
    # without β the KL term is gone (and needs no reference)
    no_kl, _ = grpo_loss(logp.detach(), logp.detach(), adv, mask)
    assert loss.item() - no_kl.item() == pytest.approx(beta * stats["kl"].item(), rel=1e-4)
    with pytest.raises(ValueError):
        grpo_loss(logp, logp.detach(), adv, mask, beta=beta)


def test_per_token_kl_is_nonnegative_and_zero_at_equality():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(50, generator=g), torch.randn(50, generator=g)
    kl = per_token_kl(a, b)
    assert (kl >= 0).all() and (kl > 0).any()
    assert torch.all(per_token_kl(a, a) == 0)


def test_kl_outside_the_mask_cannot_make_the_loss_nan():
    """A peaked policy: outside the completion mask (padding) the policy's and the reference's log-probs are far
    apart, and exp of the gap overflows. The loss and its gradient must stay finite, and equal to the loss of the
    masked positions alone."""
    logp = torch.tensor([[-0.1, -0.2, -200.0, -300.0], [-0.3, -150.0, -400.0, -500.0]], requires_grad=True)
    ref = torch.tensor([[-0.2, -0.1, 0.0, 0.0], [-0.2, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    loss, stats = grpo_loss(logp, logp.detach(), adv, mask, beta=0.04, ref_logp=ref)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and torch.isfinite(stats["kl"])
    assert (logp.grad[mask == 0] == 0).all()
    kept = mask.bool()
    delta = ref[kept] - logp.detach()[kept]
    expected_kl = (torch.exp(delta) - delta - 1).sum() / kept.sum()
    expected = (-(adv.unsqueeze(1).expand_as(logp)[kept])).sum() / kept.sum() + 0.04 * expected_kl
    assert torch.allclose(loss, expected, atol=1e-6)


# ----------------------------------------------------------------------------- micro-batching
def test_num_tokens_makes_micro_batches_add_up_to_the_full_batch(model_dir, batch, tmp_path):
    """Our micro-batches with ``num_tokens`` = the step's token count give the full-batch gradient, and TRL's
    DAPO gradient accumulation (same batch split in 3, normalised by the global token count) agrees."""
    chunks = 3
    trainer, inputs = make_trl(model_dir, batch, tmp_path, grad_accum=chunks)
    for part in split_tensor_dict(inputs, chunks):
        trainer._compute_loss(trainer.model, part).backward()

    samples = samples_for(batch, inputs["advantages"])
    adv = torch.tensor([s.advantage for s in samples])
    n_tokens = sum(s.num_completion_tokens for s in samples)
    assert int(inputs["num_items_in_batch"]) == n_tokens

    full = our_model(model_dir)
    logp, mask = token_logprobs(full, collate(samples, batch["pad"]))
    full_loss, _ = grpo_loss(logp, logp.detach(), adv, mask)
    full_loss.backward()

    micro = our_model(model_dir)
    micro_naive = our_model(model_dir)
    size = len(samples) // chunks
    total = 0.0
    for start in range(0, len(samples), size):
        part = samples[start:start + size]
        part_adv = adv[start:start + size]
        lp, m = token_logprobs(micro, collate(part, batch["pad"]))
        loss, _ = grpo_loss(lp, lp.detach(), part_adv, m, num_tokens=n_tokens)
        loss.backward()
        total += loss.item()
        lp, m = token_logprobs(micro_naive, collate(part, batch["pad"]))
        (grpo_loss(lp, lp.detach(), part_adv, m)[0] / chunks).backward()  # per-micro-batch token mean

    assert total == pytest.approx(full_loss.item(), rel=1e-5, abs=1e-7)
    assert_same_grads(full, micro)
    assert_same_grads(trainer.model, micro)
    with pytest.raises(AssertionError):  # without the override the micro-batches weight tokens unevenly
        assert_same_grads(full, micro_naive)


# ----------------------------------------------------------------------------- importance weights
def test_importance_weights_scale_each_completion(model_dir, batch, tmp_path):
    """Reference from TRL: under DAPO normalisation the batch loss is a sum of per-row terms, so the weighted
    loss is Σ_i w_i · TRL_loss(row i, normaliser = batch token count). β > 0, so the KL term is weighted too."""
    beta = 0.2
    trainer, _ = make_trl(model_dir, batch, tmp_path, beta=beta)
    perturb_(trainer.model, 0.05, seed=5)
    inputs = trainer._generate_and_score_completions(
        [{"prompt": f"q{i // L}", "reward": r} for i, r in enumerate(REWARDS)])
    weights = torch.linspace(0.1, 1.0, len(REWARDS))
    reference = 0.0
    for row in range(len(REWARDS)):
        one = {k: (v[row:row + 1] if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in inputs.items()}
        with torch.no_grad():
            reference += weights[row].item() * trainer._compute_loss(trainer.model, one).item()

    model = our_model(model_dir)
    copy_weights(trainer.model, model)
    samples = samples_for(batch, inputs["advantages"])
    collated = collate(samples, batch["pad"])
    ref_model = our_model(model_dir)
    with torch.no_grad():
        ref, _ = token_logprobs(ref_model, collated)
        logp, mask = token_logprobs(model, collated)
        adv = torch.tensor([s.advantage for s in samples])
        weighted, _ = grpo_loss(logp, logp, adv, mask, beta=beta, ref_logp=ref, weights=weights)
        per_token_w, _ = grpo_loss(logp, logp, adv, mask, beta=beta, ref_logp=ref,
                                   weights=weights.unsqueeze(1).expand_as(logp))
        unweighted, _ = grpo_loss(logp, logp, adv, mask, beta=beta, ref_logp=ref)
    assert weighted.item() == pytest.approx(reference, rel=1e-4, abs=1e-6)
    assert per_token_w.item() == pytest.approx(weighted.item(), rel=1e-6)
    assert abs(weighted.item() - unweighted.item()) > 1e-4
    # weights carry no gradient of their own
    w = weights.clone().requires_grad_(True)
    lp = logp.clone().requires_grad_(True)
    grpo_loss(lp, logp, adv, mask, weights=w)[0].backward()
    assert w.grad is None and lp.grad is not None


def test_empty_mask_gives_zero_loss_not_nan():
    logp = torch.randn(2, 5, requires_grad=True)
    loss, stats = grpo_loss(logp, logp.detach(), torch.tensor([1.0, -1.0]), torch.zeros(2, 5, dtype=torch.bool))
    assert loss.item() == 0.0 and stats["clip_frac"].item() == 0.0
    loss.backward()
    assert torch.isfinite(logp.grad).all()


# ----------------------------------------------------------------------------- SAPONode.update
def _node(tmp_path, name, rounds=100, **grpo):
    from swarmlm.sapo.config import SAPOConfig
    from swarmlm.sapo.node import SAPONode
    from swarmlm.sapo.transports.in_process import InProcessHub

    grpo = {"external_weight": "none", **grpo}  # the reference update unless a test asks for the weights
    config = SAPOConfig(model={"warmstart": "never", "device": "cpu"}, grpo=grpo, tasks={"eval_size": 2}, external=0,
                        rounds=rounds)
    return SAPONode(config, 0, InProcessHub(1).endpoint("node-0"), tmp_path / name, "tiny-qwen2",
                    resume=False, tensorboard=False)


def _update_samples(eos: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(2)
    out = []
    for i in range(8):
        prompt = torch.randint(0, 256, (4 + i % 3,), generator=g).tolist()
        completion = torch.randint(0, 256, (2 + i % 4,), generator=g).tolist() + [eos]
        out.append(TrainSample(prompt, completion, 1.0 if i % 2 else -1.0))
    return out


def test_node_update_single_pass_has_ratio_one(tmp_path):
    node = _node(tmp_path, "one", lr=0.05, ppo_epochs=1, num_minibatches=1)
    samples = _update_samples(node.tokenizer.eos_token_id)
    before = [p.detach().clone() for p in node.model.parameters()]
    stats = node.update(samples)
    assert stats["clip_frac"] == 0.0
    # ρ ≡ 1, so the loss is the token mean of -A
    n = sum(s.num_completion_tokens for s in samples)
    expected = -sum(s.advantage * s.num_completion_tokens for s in samples) / n
    assert stats["loss"] == pytest.approx(expected, abs=1e-6)
    assert any(not torch.equal(a, b) for a, b in zip(before, node.model.parameters()))  # a step was taken
    assert node.update([]) == {"loss": None}


def test_node_update_ppo_epochs_make_clipping_live(tmp_path):
    node = _node(tmp_path, "multi", lr=0.05, ppo_epochs=2, num_minibatches=2, micro_batch_size=3)
    samples = _update_samples(node.tokenizer.eos_token_id)
    stats = node.update(samples)
    assert stats["clip_frac"] > 0  # later passes see ρ ≠ 1 against the old log-probs taken once
    assert math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])


def test_node_update_truncated_external_weights(tmp_path):
    node = _node(tmp_path, "weights", lr=1e-3, external_weight="truncated")
    samples = _update_samples(node.tokenizer.eos_token_id)
    for s in samples[4:]:
        s.external = True
    stats = node.update(samples)
    assert all(s.weight == 1.0 for s in samples[:4])
    ext = [s.weight for s in samples[4:]]
    assert all(0.0 < w <= 1.0 for w in ext) and min(ext) < 1.0
    # the round's metric: the mean weight of the external samples that trained (non-zero advantage)
    trained = [s.weight for s in samples[4:] if s.advantage != 0.0]
    assert trained and stats["external_weight"] == pytest.approx(sum(trained) / len(trained))
    # none, the reference behaviour: external samples count fully
    plain = _node(tmp_path, "plain", lr=1e-3, external_weight="none")
    samples = _update_samples(plain.tokenizer.eos_token_id)
    for s in samples[4:]:
        s.external = True
    assert plain.update(samples)["external_weight"] == 1.0
    assert all(s.weight == 1.0 for s in samples)
    assert "external_weight" not in plain.update(_update_samples(plain.tokenizer.eos_token_id))  # none external


def _sgd_step_of_the_whole_batch(model, samples: list[TrainSample], pad_id: int, weighted: bool = False) -> None:
    """The update's step computed here over every sample at once: the loss at ρ ≡ 1, clipping, SGD with momentum."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    logp, mask = token_logprobs(model, collate(samples, pad_id))
    weights = torch.tensor([s.weight for s in samples]) if weighted else None
    grpo_loss(logp, logp.detach(), torch.tensor([s.advantage for s in samples]), mask, weights=weights)[0].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def _record_forwarded(monkeypatch) -> list[TrainSample]:
    """The samples the update passes through the model from now on (training and no-grad passes alike)."""
    import swarmlm.sapo.update as update_module

    forwarded: list[TrainSample] = []
    real = update_module.sample_logprobs
    monkeypatch.setattr(update_module, "sample_logprobs",
                        lambda model, chunk, pad: forwarded.extend(chunk) or real(model, chunk, pad))
    return forwarded


def test_fused_truncated_weights_take_the_step_of_weights_computed_beforehand(tmp_path, monkeypatch):
    """One pass of one step with truncated weights: the external samples are weighted from their own training
    forward against the own samples' (taken from theirs, plus one no-grad pass of the own samples that do not train),
    and the step is the one of the weights computed by a separate pass over every sample first."""
    import copy

    from swarmlm.sapo.update import truncated_external_weights

    node = _node(tmp_path, "fused", external_weight="truncated", micro_batch_size=2)
    node.updater.optimizer = node.optimizer = torch.optim.SGD(node.model.parameters(), lr=0.1, momentum=0.9)
    samples = _update_samples(node.tokenizer.eos_token_id)
    for s in samples[4:]:
        s.external = True
    samples[0].advantage = samples[4].advantage = 0.0  # an own and an external sample that do not train
    reference = copy.deepcopy(node.model)
    expected = copy.deepcopy(samples)
    with torch.no_grad():
        logp, mask = token_logprobs(reference, collate(expected, node.tokenizer.pad_token_id))
    truncated_external_weights(expected, list(logp[mask].split(mask.sum(dim=1).tolist())))
    _sgd_step_of_the_whole_batch(reference, expected, node.tokenizer.pad_token_id, weighted=True)
    forwarded = _record_forwarded(monkeypatch)
    stats = node.update(samples)
    # 6 samples train, and the one own sample that does not is the only extra pass (the separate pass took all 8)
    assert len(forwarded) == 7 and sum(s.advantage == 0 and not s.external for s in forwarded) == 1
    trained = [i for i in range(4, 8) if samples[i].advantage != 0]
    assert [samples[i].weight for i in trained] == pytest.approx([expected[i].weight for i in trained], rel=1e-5)
    assert min(samples[i].weight for i in trained) < 1.0
    assert stats["external_weight"] == pytest.approx(sum(expected[i].weight for i in trained) / len(trained), rel=1e-5)
    for p, q in zip(node.model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_node_update_gradient_does_not_depend_on_micro_batch_size(tmp_path):
    """micro_batch_size is memory only: the same update with 1 or 32 sequences per forward."""
    a = _node(tmp_path, "mb32", lr=1e-3, ppo_epochs=1, num_minibatches=1, micro_batch_size=32)
    b = _node(tmp_path, "mb3", lr=1e-3, ppo_epochs=1, num_minibatches=1, micro_batch_size=3)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)
    samples = _update_samples(a.tokenizer.eos_token_id)
    sa, sb = a.update(samples), b.update(samples)
    assert sa["grad_norm"] == pytest.approx(sb["grad_norm"], rel=1e-4)
    assert sa["loss"] == pytest.approx(sb["loss"], rel=1e-4, abs=1e-6)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_node_update_skips_zero_advantage_samples_and_takes_the_same_step(tmp_path, monkeypatch):
    """Samples with advantage 0 take no forward or backward pass, yet the step is the one over all samples: their
    tokens stay in the token mean's denominator (checked against the loss of the whole batch, computed here)."""
    import copy

    node = _node(tmp_path, "skip")
    # SGD with momentum here (Adam would magnify float noise in near-zero gradients into visible differences)
    node.updater.optimizer = node.optimizer = torch.optim.SGD(node.model.parameters(), lr=0.1, momentum=0.9)
    samples = _update_samples(node.tokenizer.eos_token_id)
    for s in samples[:5]:
        s.advantage = 0.0
    reference = copy.deepcopy(node.model)
    _sgd_step_of_the_whole_batch(reference, samples, node.tokenizer.pad_token_id)
    forwarded = _record_forwarded(monkeypatch)
    stats = node.update(samples)
    assert len(forwarded) == 3 and all(s.advantage != 0 for s in forwarded)
    assert stats["trained_samples"] == pytest.approx(3 / 8)
    for p, q in zip(node.model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
    # nothing to train on: no pass at all, and the optimizer's step with a zero gradient (momentum still moves)
    forwarded.clear()
    for s in samples:
        s.advantage = 0.0
    before = [p.detach().clone() for p in node.model.parameters()]
    stats = node.update(samples)
    assert forwarded == [] and stats["grad_norm"] == 0.0 and stats["loss"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, node.model.parameters()))  # momentum from the first step


def test_warmup_lr_is_linear_then_flat():
    from swarmlm.sapo.node import round_lr

    assert [round_lr(1e-3, r, 4) for r in (1, 2, 4, 5, 100)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3, 1e-3])
    assert round_lr(1e-3, 1, 0) == 1e-3  # off


def test_cosine_lr_decays_from_the_peak_after_warm_up_to_a_tenth_at_the_last_round():
    from swarmlm.sapo.node import round_lr

    def cosine(r):
        return round_lr(1e-3, r, 4, schedule="cosine", rounds=24)

    assert [cosine(r) for r in (1, 2, 4)] == pytest.approx([2.5e-4, 5e-4, 1e-3])  # the same warm-up
    assert cosine(14) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # half-way through the decay: (peak + floor) / 2
    assert cosine(24) == pytest.approx(1e-4) and cosine(30) == pytest.approx(1e-4)  # the floor, and past the end
    lrs = [cosine(r) for r in range(4, 25)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))  # strictly decreasing after the warm-up
    assert round_lr(1e-3, 10, 0, schedule="cosine", rounds=10) == pytest.approx(1e-4)  # without a warm-up too


def test_node_update_warms_up_lr_by_round(tmp_path):
    """A node's round r steps at lr * r / warmup_rounds (a function of the round only: a resumed node continues
    the schedule), and Adam's first step moves each weight by about that lr, so the step grows with the round."""
    lr = 1e-3
    sizes = []
    for r in (1, 8):
        node = _node(tmp_path, f"warm{r}", lr=lr, warmup_rounds=8)
        before = [p.detach().clone() for p in node.model.parameters()]
        stats = node.update(_update_samples(node.tokenizer.eos_token_id), round=r)
        assert node.optimizer.param_groups[0]["lr"] == pytest.approx(lr * r / 8)
        assert stats["loss"] is not None
        sizes.append(max(float((p.detach() - b).abs().max()) for p, b in zip(node.model.parameters(), before)))
    assert sizes[0] == pytest.approx(lr / 8, rel=0.05) and sizes[1] == pytest.approx(lr, rel=0.05)


def test_node_decays_lr_to_a_tenth_by_its_last_round_under_the_cosine_schedule(tmp_path):
    """The cosine schedule's horizon is the node's own ``rounds``: its last round steps at a tenth of the peak."""
    lr = 1e-3
    for r, expected in ((4, lr), (12, lr * 0.55), (20, lr / 10)):
        node = _node(tmp_path, f"cos{r}", rounds=20, lr=lr, warmup_rounds=4, lr_schedule="cosine")
        node.update(_update_samples(node.tokenizer.eos_token_id), round=r)
        assert node.optimizer.param_groups[0]["lr"] == pytest.approx(expected)
    node = _node(tmp_path, "const", rounds=20, lr=lr, warmup_rounds=4, lr_schedule="constant")
    node.update(_update_samples(node.tokenizer.eos_token_id), round=20)
    assert node.optimizer.param_groups[0]["lr"] == pytest.approx(lr)


def test_truncated_reward_zero_pays_nothing_for_a_completion_that_does_not_end(tmp_path):
    """Under --grpo.truncated-reward zero a completion at the token limit earns 0 (no format bonus either) and is
    trained as sampled, without the EOS it never produced; under task (default) it is paid and ended like any."""
    texts = ["<answer>7</answer>", "<answer>7</answer>wer>wer>", "<answer>3</answer>"]
    scores, max_new = [1.0, 1.0, 0.0], 32
    lengths = [18, max_new, 18]
    task = _node(tmp_path, "task", format_reward=0.1)
    zero = _node(tmp_path, "zero", format_reward=0.1, truncated_reward="zero")
    assert task.config.generation.max_new_tokens == max_new
    assert task._training_rewards(texts, scores, lengths) == pytest.approx([1.1, 1.1, 0.1])
    assert zero._training_rewards(texts, scores, lengths) == pytest.approx([1.1, 0.0, 0.1])
    eos = task.tokenizer.eos_token_id
    cut, ended = list(range(40, 40 + max_new)), [40, 41, 42]
    assert task._trained_ids(cut) == cut + [eos] and zero._trained_ids(cut) == cut
    assert task._trained_ids(ended) == zero._trained_ids(ended) == ended + [eos]


def test_default_format_bonus_gives_an_all_wrong_group_a_push_away_from_malformed_replies(tmp_path):
    """By default (--grpo.format-reward 0.1) a group whose replies are all wrong still has an advantage where some
    lost the format: the well-formed ones rise and the malformed ones fall. Without the bonus (0, the paper's
    reward) the same group has none, however many lost the format."""
    texts = ["<answer>3</answer>", "<answer>wer>", "<answer>5</answer>", "<an"]
    scores, lengths = [0.0] * 4, [18, 12, 18, 3]
    node = _node(tmp_path, "default")
    assert node.config.grpo.format_reward == pytest.approx(0.1)
    rewards = node._training_rewards(texts, scores, lengths)
    assert rewards == pytest.approx([0.1, 0.0, 0.1, 0.0])
    adv = group_advantages(torch.tensor([rewards], dtype=torch.float64))[0].tolist()
    assert adv[0] == adv[2] > 0 > adv[1] == adv[3]
    off = _node(tmp_path, "off", format_reward=0.0)._training_rewards(texts, scores, lengths)
    assert group_advantages(torch.tensor([off], dtype=torch.float64))[0].tolist() == [0.0] * 4


def test_permuted_within_groups_keeps_each_groups_advantages_and_moves_them():
    import random

    from swarmlm.sapo.grpo import permuted_within_groups

    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0, 0.5], [0.0] * 6, [3.0, 2.0, 1.0, 0.0, -1.0, -2.0]],
                                        dtype=torch.float64)).tolist()
    out = permuted_within_groups(adv, random.Random(7))
    assert [sorted(g) for g in out] == [sorted(g) for g in adv]  # the same values, group by group
    assert out[1] == adv[1]  # a group without signal stays without signal
    assert out[2] != adv[2]  # six distinct values: an order is moved (probability 1/720 it is not, and seeded)
    assert out == permuted_within_groups(adv, random.Random(7))  # seeded


def test_node_shuffle_advantages_trains_the_same_advantages_on_other_completions(tmp_path):
    """--grpo.shuffle-advantages (the reward control): every own and external group reaches the update with the
    advantages it would have had, assigned to its completions in another order; off (the default), in order."""
    from swarmlm.sapo.engines.base import Generated
    from swarmlm.sapo.rollouts import OwnRollouts
    from swarmlm.sapo.records import RolloutRecord
    from swarmlm.sapo.selection import ScoredGroup

    rewards = [[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]]
    completions = [[[10 + i] for i in range(8)], [[30 + i] for i in range(8)]]
    own = OwnRollouts(round=3, generated=[Generated([1, 2], ids, ["x"] * 8, [True] * 8) for ids in completions],
                      scores=rewards)
    record = RolloutRecord("node-1", 3, 0, "chain_sum", "q", None, ["y"] * 8, "tiny-qwen2")
    external = [ScoredGroup(record, [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0], prompt="What is 1 + 1?",
                            completion_ids=[[50 + i] for i in range(8)])]
    plain, shuffled = _node(tmp_path, "plain"), _node(tmp_path, "shuffled", shuffle_advantages=True)
    a, b = plain._samples(own, rewards, external), shuffled._samples(own, rewards, external)
    assert [s.completion_ids for s in a] == [s.completion_ids for s in b]  # the same completions, in the same order
    assert [s.external for s in a] == [s.external for s in b] == [False] * 16 + [True] * 8
    expected = group_advantages(torch.tensor(rewards + [external[0].rewards], dtype=torch.float64)).tolist()
    assert [s.advantage for s in a] == pytest.approx([x for g in expected for x in g])
    for k in range(3):
        got = [s.advantage for s in b[8 * k: 8 * k + 8]]
        assert sorted(got) == pytest.approx(sorted(expected[k]))
    assert [s.advantage for s in b] != pytest.approx([s.advantage for s in a])
    assert [s.advantage for s in b] == [s.advantage for s in shuffled._samples(own, rewards, external)]  # seeded


def test_external_loss_share_is_the_external_samples_share_of_weighted_advantage_mass():
    from swarmlm.sapo.batching import TrainSample
    from swarmlm.sapo.update import external_loss_share

    own = [TrainSample([1], [5, 6, 7], 0.5), TrainSample([1], [5], -0.5)]  # mass 0.5 * 3 + 0.5 * 1 = 2
    ext = [TrainSample([1], [5, 6], 1.0, external=True, weight=0.25),  # 0.25 * 1 * 2 = 0.5
           TrainSample([1], [5, 6, 7, 8], -2.0, external=True, weight=0.75)]  # 0.75 * 2 * 4 = 6
    assert external_loss_share(own + ext) == pytest.approx(6.5 / 8.5)
    assert external_loss_share(own) == 0.0
    assert external_loss_share([TrainSample([1], [5], 0.0)]) is None  # nothing has an advantage


def test_family_baselines_and_baseline_advantages_match_hand_computation():
    from swarmlm.sapo.grpo import baseline_advantages, family_baselines

    baselines = family_baselines(["products", "chain_sum", "products"], [[0.0, 0.1], [1.1, 0.1], [0.1, 0.1]])
    assert baselines == pytest.approx({"products": 0.3 / 4, "chain_sum": 0.6, None: 1.5 / 6})
    assert baseline_advantages([1.1, 0.1], baselines, "products") == pytest.approx([1.1 - 0.075, 0.1 - 0.075])
    assert baseline_advantages([1.0], baselines, "basic_arithmetic") == pytest.approx([1.0 - 0.25])  # no own group of it
    assert family_baselines([], []) == {} and baseline_advantages([1.0, 0.0], {}, "products") == [1.0, 0.0]


def test_own_baseline_trains_a_peers_all_right_group_on_a_family_this_node_fails_at(tmp_path):
    """--grpo.external-advantage own_baseline: an external group's advantages are its rewards minus this node's own
    mean reward on the family this round. A peer's group answered right 8 times of 8 has no GRPO advantage, and is
    never chosen under group (the default); measured against a node that fails the family it trains, pushed up."""
    import random

    from swarmlm.sapo.engines.base import Generated
    from swarmlm.sapo.rollouts import OwnRollouts
    from swarmlm.sapo.records import RolloutRecord
    from swarmlm.sapo.selection import ScoredGroup, select_external

    own_rewards = [[0.1] * 8, [1.1, 0.1, 1.1, 0.1, 0.1, 0.1, 0.1, 0.1]]  # products all wrong; chain_sum 2 of 8
    own = OwnRollouts(round=3, generated=[Generated([1, 2], [[10 + i] for i in range(8)], ["<answer>9</answer>"] * 8,
                                                    [True] * 8)] * 2,
                      scores=[[0.0] * 8, [1.0, 0, 1.0, 0, 0, 0, 0, 0]],
                      families=["products", "chain_sum"])

    def group(family, rewards):
        record = RolloutRecord("node-1", 3, 0, family, "q", None, ["y"] * 8, "tiny-qwen2")
        return ScoredGroup(record, rewards, prompt="What is 2 * 3?", completion_ids=[[50 + i] for i in range(8)])

    # a peer's rewards carry no format bonus (--grpo.external-format-reward false), and the baselines are the own
    # rewards counted the same way (without the bonus their spans earn in own_rewards): products 0, chain_sum 0.25
    right, wrong = group("products", [1.0] * 8), group("chain_sum", [0.0] * 8)
    node = _node(tmp_path, "group")
    assert select_external([right, wrong], 4, "uniform", random.Random(0), node._external_advantages(own)) == []
    measured = _node(tmp_path, "own", external_advantage="own_baseline")
    advantages = measured._external_advantages(own)
    assert advantages(right) == pytest.approx([1.0] * 8) and advantages(wrong) == pytest.approx([-0.25] * 8)
    chosen = select_external([right, wrong], 4, "uniform", random.Random(0), advantages)
    assert {id(g) for g in chosen} == {id(right), id(wrong)}
    samples = measured._samples(own, own_rewards, [right], advantages)
    assert [s.advantage for s in samples if s.external] == pytest.approx([1.0] * 8)
    # the own groups keep GRPO's advantages
    expected = group_advantages(torch.tensor(own_rewards, dtype=torch.float64)).flatten().tolist()
    assert [s.advantage for s in samples if not s.external] == pytest.approx(expected)


def test_bf16_update_keeps_float32_weights_and_nearly_the_float32_step(tmp_path):
    """--grpo.precision bfloat16: the passes run under bf16 autocast (the linear layers compute in bf16), the
    weights, gradients and optimizer state stay float32, and one step lands close to float32's (not equal)."""
    moved = {}
    for precision in ("float32", "bfloat16"):
        node = _node(tmp_path, precision, lr=1e-3, precision=precision)
        assert node.updater.bf16 == (precision == "bfloat16")
        seen = []
        handle = node.model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        before = [p.detach().clone() for p in node.model.parameters()]
        stats = node.update(_update_samples(node.tokenizer.eos_token_id), round=8)
        handle.remove()
        assert set(seen) == {torch.bfloat16 if precision == "bfloat16" else torch.float32}
        assert all(p.dtype == torch.float32 for p in node.model.parameters())
        assert math.isfinite(stats["loss"])
        moved[precision] = torch.cat([(p.detach() - b).flatten() for p, b in zip(node.model.parameters(), before)])
    a, b = moved["float32"], moved["bfloat16"]
    assert not torch.equal(a, b)
    assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) > 0.9


def test_precision_auto_is_bf16_only_where_the_device_computes_it_natively(monkeypatch, caplog):
    import logging

    import swarmlm.runtime.devices as devices

    cpu = torch.device("cpu")
    monkeypatch.setattr(devices, "native_bf16", lambda device: True)
    assert devices.use_bf16("auto", cpu, "grpo.precision") and devices.use_bf16("bfloat16", cpu, "grpo.precision")
    assert not devices.use_bf16("float32", cpu, "grpo.precision")
    monkeypatch.setattr(devices, "native_bf16", lambda device: False)
    monkeypatch.setattr(devices, "_FELL_BACK", set())
    with caplog.at_level(logging.INFO, logger="swarmlm.runtime.devices"):
        assert not devices.use_bf16("auto", cpu, "grpo.precision") and not devices.use_bf16("auto", cpu, "grpo.precision")
        assert not devices.use_bf16("auto", cpu, "generation.precision")
    said = [r.message for r in caplog.records if "does not compute in bf16 natively" in r.message]
    assert len(said) == 2 and "grpo.precision" in said[0] and "generation.precision" in said[1]  # once per option
    assert devices.use_bf16("bfloat16", cpu, "grpo.precision")  # asked for, it is used (emulated where not native)
