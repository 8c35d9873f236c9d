"""GRPO as SAPO uses it: group-normalised advantages and the clipped, token-mean policy loss.

GRPO (Group Relative Policy Optimization) is from DeepSeekMath (Shao et al., arXiv 2402.03300): each completion's
advantage is its reward normalised within its group of L completions to the same question, and the policy loss is
PPO's clipped surrogate with that advantage. Two choices follow DAPO (arXiv 2503.14476): an upper clip bound wider
than the lower ("clip-higher", ε_low = 0.2, ε_high = 0.28) and a token-level loss (the sum over every completion
token of the batch divided by their number, rather than a mean per sequence first). The KL penalty to a reference
model is GRPO's, with the k3 estimator. (Dr. GRPO, arXiv 2503.20783, drops the division by the group's std; this
keeps GRPO's.)

All functions are pure tensor maths, checked against TRL's implementation in the tests.
"""

from __future__ import annotations

import random

import torch


def group_advantages(rewards: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``A_i = (r_i - mean(r)) / (std(r) + eps)`` within each group (row) of ``rewards`` [G, L].

    ``std`` is the sample standard deviation (Bessel-corrected), as in TRL. A group whose rewards
    are all equal gets zero advantage.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [groups, completions], got shape {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)


def family_baselines(families: list[str], rewards: list[list[float]]) -> dict[str | None, float]:
    """A node's mean reward per task family over its own groups (``families[i]`` is group ``i``'s), and under
    ``None`` its mean over all of them: the baseline an external completion's reward is measured against under
    ``external_advantage: own_baseline`` (:func:`baseline_advantages`). Empty without own groups."""
    sums: dict[str | None, list[float]] = {}
    for family, group in zip(families, rewards):
        for key in (family, None):
            total = sums.setdefault(key, [0.0, 0.0])
            total[0] += sum(group)
            total[1] += len(group)
    return {key: total / count for key, (total, count) in sums.items() if count}


def baseline_advantages(rewards: list[float], baselines: dict[str | None, float], family: str) -> list[float]:
    """``A_i = r_i - b``, with ``b`` the receiver's own mean reward on ``family`` (its mean over every family where
    it has none of this one; 0 without any own group): an external group's advantages measured against what the
    receiver itself achieves, not against the sender's group mean, and not normalised (Dr. GRPO, arXiv 2503.20783)."""
    b = baselines.get(family, baselines.get(None, 0.0))
    return [r - b for r in rewards]


def permuted_within_groups(advantages: list[list[float]], rng: random.Random) -> list[list[float]]:
    """Each group's advantages in a random order: the control of a reward-learning claim (what a run gains when
    the update sees exactly the same advantages, group by group, with no link to what each completion says)."""
    return [rng.sample(group, len(group)) for group in advantages]


def is_zero_advantage(rewards: torch.Tensor | list[float], tol: float = 1e-9) -> bool:
    """True when every reward in the group is equal, so GRPO would learn nothing from it."""
    values = torch.as_tensor(rewards, dtype=torch.float64)
    return bool((values.max() - values.min()).abs() <= tol)


def per_token_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The k3 estimator of KL(π‖π_ref) per token: ``exp(ref - logp) - (ref - logp) - 1`` (always ≥ 0).

    With ``mask``, positions outside it are 0 *before* the exponential: there (padding, the prompt) the two
    log-probs can be far apart, and ``exp`` of the gap overflows to inf, which a later multiplication by a zero
    mask turns into NaN, in the loss and in every gradient."""
    delta = ref_logp - logp
    if mask is not None:
        delta = torch.where(mask.bool(), delta, torch.zeros_like(delta))
    return torch.exp(delta) - delta - 1


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
    num_tokens: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped GRPO loss, aggregated as the sum over completion tokens divided by their count.

    Shapes: ``logp``, ``old_logp``, ``ref_logp``, ``mask`` are [B, T]; ``advantages`` is [B];
    ``weights`` (importance weights for off-policy completions, no gradient) is [B] or [B, T].
    ``num_tokens`` overrides the denominator, so that micro-batches of one optimiser step add up
    to the token mean of the whole step.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1).to(logp.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    per_token = -torch.min(unclipped, clipped)
    kl = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp from a reference model")
        kl = per_token_kl(logp, ref_logp, mask)
        per_token = per_token + beta * kl
    if weights is not None:
        w = weights.detach().to(logp.dtype)
        per_token = per_token * (w.unsqueeze(1) if w.dim() == 1 else w)
    denom = mask.sum().clamp(min=1.0) if num_tokens is None else torch.as_tensor(num_tokens, dtype=logp.dtype).clamp(min=1.0)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        is_clipped = ((ratio < 1.0 - eps_low) & (adv < 0)) | ((ratio > 1.0 + eps_high) & (adv > 0))
        n = mask.sum().clamp(min=1.0)
        stats = {"clip_frac": (is_clipped.to(mask.dtype) * mask).sum() / n}
        if kl is not None:
            stats["kl"] = (kl * mask).sum() / n
    return loss, stats
