"""The policy update of one SAPO round: GRPO's clipped objective over the round's own and external groups.

SAPO trains each node with GRPO (DeepSeekMath, arXiv 2402.03300), its loss aggregated as a token mean with
asymmetric clipping as in DAPO (arXiv 2503.14476); the maths is in :mod:`swarmlm.sapo.grpo`. This module
runs it: ``ppo_epochs`` passes over the samples, each cut into ``num_minibatches`` optimizer steps, each step
accumulated over micro-batches of ``micro_batch_size`` sequences.

* **Old log-probs.** With one pass of one step the policy that sampled is the one being trained, so the
  probability ratio is 1 and nothing needs computing beforehand. Otherwise the old log-probs are those of the
  policy before the first step: the first minibatch's come from its own forward pass, and only the others need a
  separate pass.
* **External completions** were sampled by other nodes' policies. With ``external_weight: truncated`` each
  external completion is weighted by ``min(1, exp(mean logp_ext − mean logp_own))`` under this node's policy
  before the update, so that text this policy finds much less likely than its own counts less. With one pass of one
  step the own samples train first and their forward passes give ``logp_own``; only the own samples that do not
  train take a separate (no-grad) pass, and the external ones are weighted from their own training forward. With
  more passes or steps every sample's old log-prob is computed first.
* **Reference model.** With ``beta`` > 0 the loss adds β·KL to a frozen copy of the initial policy.
* **Zero advantage costs nothing.** With ``beta`` = 0 a completion whose advantage is 0 (every completion of a
  group whose rewards are all equal, the common case for a weak policy) adds 0 to the loss and its gradient, clipped
  or not: it takes no forward or backward pass. Its tokens still count in the token mean's denominator, so the
  update is exactly the one over all samples (DAPO, arXiv 2503.14476, instead drops such groups from the batch,
  which changes the step).
"""

from __future__ import annotations

import logging
import math
import random

import torch
from transformers import PreTrainedModel

from swarmlm.runtime.devices import autocast, use_bf16
from swarmlm.sapo.batching import TrainSample, micro_batch_order, sample_logprobs
from swarmlm.sapo.config import GRPOSection
from swarmlm.sapo.grpo import grpo_loss

log = logging.getLogger(__name__)


def external_loss_share(samples: list[TrainSample]) -> float | None:
    """The external samples' share of the policy-gradient term's mass, sum |weight * advantage| over a sample's
    completion tokens: at one pass and one step the gradient is -sum_i w_i A_i grad log p_i over tokens / N, so
    this is how much of the round's update other nodes' text directs. None when no sample has an advantage."""
    mass = [(s.external, abs(s.weight * s.advantage) * s.num_completion_tokens) for s in samples]
    total = sum(m for _, m in mass)
    return sum(m for ext, m in mass if ext) / total if total > 0 else None


def own_reference(own: list[torch.Tensor]) -> torch.Tensor | None:
    """The mean over the node's own samples of each one's mean token log-prob (None without own samples): what an
    external sample's likelihood is measured against."""
    means = [lp.mean() for lp in own if lp.numel()]
    return torch.stack(means).mean() if means else None


def truncated_weight(logp: torch.Tensor, reference: torch.Tensor) -> float:
    """``min(1, exp(mean logp(ext) - reference))``: an external sample's weight from its token log-probs."""
    return float(torch.clamp(torch.exp(logp.mean() - reference), max=1.0))


def truncated_external_weights(samples: list[TrainSample], old: list[torch.Tensor]) -> None:
    """Set each external sample's ``weight`` to ``min(1, exp(mean logp(ext) - mean logp(own)))`` (in place)."""
    reference = own_reference([lp for s, lp in zip(samples, old) if not s.external])
    if reference is None:
        return
    for s, lp in zip(samples, old):
        if s.external and lp.numel():
            s.weight = truncated_weight(lp, reference)


class GRPOUpdate:
    """The update of one node's policy (see the module docstring). ``ref_model`` is needed where ``beta`` > 0."""

    def __init__(self, model: PreTrainedModel, optimizer: torch.optim.Optimizer, section: GRPOSection, pad_id: int,
                 ref_model: PreTrainedModel | None = None):
        self.model = model
        self.optimizer = optimizer
        self.section = section
        self.pad_id = pad_id
        self.ref_model = ref_model  # on the policy's device
        self.device = next(model.parameters()).device
        self.bf16 = use_bf16(section.precision, self.device, "grpo.precision")

    @torch.no_grad()
    def logprobs(self, model: PreTrainedModel, samples: list[TrainSample]) -> list[torch.Tensor]:
        """Per-sample completion-token log-probs under ``model`` (1-D, aligned with each sample's completion)."""
        out: list[torch.Tensor | None] = [None] * len(samples)
        mb = self.section.micro_batch_size
        order = micro_batch_order(samples, list(range(len(samples))))  # little padding, shared prompts run once
        for start in range(0, len(order), mb):
            idx = order[start:start + mb]
            with autocast(self.device, self.bf16):
                logp, mask = sample_logprobs(model, [samples[i] for i in idx], self.pad_id)
            for i, v in zip(idx, _per_sample(logp, mask)):
                out[i] = v
        return out

    def update(self, samples: list[TrainSample], rng: random.Random) -> dict[str, float]:
        """``ppo_epochs`` × ``num_minibatches`` optimizer steps on ``samples``, in an order drawn from ``rng``;
        returns the loss, the clipped fraction, the gradient norm, the mean −log p of the trained samples' tokens
        (an entropy estimate), the share of samples that trained (non-zero advantage), the KL where ``beta`` > 0 and
        the mean weight of the external samples that trained, where some did."""
        cfg = self.section
        if not samples:
            return {"loss": None}
        trains = [cfg.beta > 0 or s.advantage != 0.0 for s in samples]  # the others add exactly 0 (module docstring)
        order = list(range(len(samples)))
        rng.shuffle(order)  # the first pass's order
        per_mb = math.ceil(len(order) / cfg.num_minibatches)
        old = self._old_logprobs(samples, trains, order[per_mb:])
        ref = self.logprobs(self.ref_model, samples) if self.ref_model is not None else None  # beta > 0: all train
        stats = _UpdateStats()
        for epoch in range(cfg.ppo_epochs):
            if epoch > 0:
                rng.shuffle(order)
            for mb_start in range(0, len(order), per_mb):
                self._step(samples, trains, order[mb_start:mb_start + per_mb], old, ref, first_pass=epoch == 0,
                           stats=stats)
        return stats.summary(samples, trains)

    @property
    def _fused(self) -> bool:
        """One pass of one step with truncated weights: the own samples train first, and their forward passes give
        the weights' reference; only the own samples that do not train need a pass of their own (module docstring)."""
        return self.section.external_weight == "truncated" and self._single

    @property
    def _single(self) -> bool:
        return self.section.ppo_epochs == 1 and self.section.num_minibatches == 1

    def _old_logprobs(self, samples: list[TrainSample], trains: list[bool],
                      after_first: list[int]) -> list[torch.Tensor | None] | None:
        """The old policy's log-probs that must be computed before the first step: None where the old policy is
        the one each forward pass runs on (one pass, one step: ρ ≡ 1). With truncated weights over several steps,
        every sample's, and the weights set from them. Otherwise those of the samples that train after the first
        minibatch (``after_first``); the first minibatch's come from its own forward pass (:meth:`_step`)."""
        if self._single:
            return None
        if self.section.external_weight == "truncated":  # the weights need every old log-prob before the first loss
            old = self.logprobs(self.model, samples)
            truncated_external_weights(samples, old)
            return old
        old: list[torch.Tensor | None] = [None] * len(samples)
        rest = [i for i in after_first if trains[i]]
        for i, lp in zip(rest, self.logprobs(self.model, [samples[i] for i in rest]) if rest else []):
            old[i] = lp
        return old

    def _micro_batches(self, samples: list[TrainSample], trains: list[bool], mb: list[int]) -> list[list[int]]:
        """The minibatch ``mb``'s samples that train, in micro-batches sorted so that they waste little padding and a
        group's shared prompt runs once; fused, the own samples' micro-batches first, then the external ones."""
        size = self.section.micro_batch_size
        if self._fused:
            parts = [micro_batch_order(samples, [i for i in mb if trains[i] and not samples[i].external]),
                     micro_batch_order(samples, [i for i in mb if trains[i] and samples[i].external])]
        else:
            parts = [micro_batch_order(samples, [i for i in mb if trains[i]])]
        return [part[k:k + size] for part in parts for k in range(0, len(part), size)]

    def _step(self, samples: list[TrainSample], trains: list[bool], mb: list[int], old: list | None,
              ref: list[torch.Tensor] | None, first_pass: bool, stats: "_UpdateStats") -> None:
        """One optimizer step on minibatch ``mb``: the loss of its micro-batches, summed over the minibatch's tokens."""
        cfg = self.section
        n_tokens = float(sum(samples[i].num_completion_tokens for i in mb))
        self.optimizer.zero_grad(set_to_none=True)
        chunks = self._micro_batches(samples, trains, mb)
        if not chunks:  # the step all samples would have given: a zero gradient (Adam's moments still move)
            for param in self.model.parameters():
                if param.requires_grad:
                    param.grad = torch.zeros_like(param)
        weights = _FusedWeights(self, samples, trains) if self._fused else None
        mb_loss = 0.0
        for idx in chunks:
            chunk = [samples[i] for i in idx]
            with autocast(self.device, self.bf16):
                logp, mask = sample_logprobs(self.model, chunk, self.pad_id)
            if weights is not None:
                weights.observe(chunk, logp, mask)
            loss, loss_stats = grpo_loss(
                logp, self._old_for(old, idx, logp, mask), torch.tensor([s.advantage for s in chunk], device=logp.device),
                mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high, beta=cfg.beta,
                ref_logp=None if ref is None else _scatter(ref, idx, logp, mask),
                weights=torch.tensor([s.weight for s in chunk], device=logp.device), num_tokens=n_tokens)
            loss.backward()
            mb_loss += loss.item()
            stats.add_micro_batch(loss_stats, logp, mask, first_pass)
        stats.grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)))
        self.optimizer.step()
        stats.losses.append(mb_loss)

    @staticmethod
    def _old_for(old: list | None, idx: list[int], logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The old log-probs of micro-batch ``idx``, shaped as ``logp``: the current ones, detached, where the old
        policy is the current one; the first minibatch of the first pass keeps its current ones as its old ones."""
        if old is None:
            return logp.detach()
        if any(old[i] is None for i in idx):
            for i, lp in zip(idx, _per_sample(logp, mask)):
                if old[i] is None:
                    old[i] = lp
        return _scatter(old, idx, logp, mask)


def _per_sample(logp: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A micro-batch's completion-token log-probs, detached, one 1-D tensor per sample."""
    return logp.detach()[mask].float().split(mask.sum(dim=1).tolist())


def _scatter(values: list[torch.Tensor], idx: list[int], logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample 1-D log-probs of samples ``idx`` laid out as the micro-batch's ``logp`` (0 off the mask)."""
    return torch.zeros_like(logp).masked_scatter(mask, torch.cat([values[i] for i in idx]).to(logp))


class _FusedWeights:
    """The fused update's truncated weights: the own samples' micro-batches (first) collect their log-probs as the
    reference; at the first external micro-batch the own samples that do not train add theirs from a no-grad pass
    on the unchanged policy, and each external sample is weighted from its own training forward pass."""

    def __init__(self, update: GRPOUpdate, samples: list[TrainSample], trains: list[bool]):
        self.update, self.samples, self.trains = update, samples, trains
        self.own_logp: list[torch.Tensor] = []
        self.reference: torch.Tensor | None = None
        self.closed = False

    def observe(self, chunk: list[TrainSample], logp: torch.Tensor, mask: torch.Tensor) -> None:
        per_sample = _per_sample(logp, mask)
        if not chunk[0].external:  # own samples: weight 1, their log-probs join the reference
            self.own_logp.extend(per_sample)
            return
        if not self.closed:
            idle = [s for s, t in zip(self.samples, self.trains) if not s.external and not t]
            self.reference = own_reference(self.own_logp + (self.update.logprobs(self.update.model, idle) if idle else []))
            self.closed = True
        if self.reference is not None:
            for sample, lp in zip(chunk, per_sample):
                sample.weight = truncated_weight(lp, self.reference)


class _UpdateStats:
    """What :meth:`GRPOUpdate.update` reports, gathered step by step (per-token statistics weighted by tokens)."""

    def __init__(self):
        self.losses: list[float] = []
        self.grad_norms: list[float] = []
        self.clip_fracs: list[tuple[float, float]] = []
        self.kls: list[tuple[float, float]] = []
        self.nlls: list[tuple[float, float]] = []

    def add_micro_batch(self, loss_stats: dict[str, torch.Tensor], logp: torch.Tensor, mask: torch.Tensor,
                        first_pass: bool) -> None:
        tokens = float(mask.sum())
        self.clip_fracs.append((loss_stats["clip_frac"].item(), tokens))
        if first_pass:  # −log p of the sampled tokens before any step: a Monte Carlo estimate of entropy
            self.nlls.append((-float((logp.detach() * mask).sum()) / max(1.0, tokens), tokens))
        if "kl" in loss_stats:
            self.kls.append((loss_stats["kl"].item(), tokens))

    @staticmethod
    def _token_mean(pairs: list[tuple[float, float]]) -> float:
        return sum(v * n for v, n in pairs) / max(1.0, sum(n for _, n in pairs))

    def summary(self, samples: list[TrainSample], trains: list[bool]) -> dict[str, float]:
        out = {"loss": sum(self.losses) / len(self.losses), "clip_frac": self._token_mean(self.clip_fracs),
               "grad_norm": sum(self.grad_norms) / len(self.grad_norms),
               "token_nll": self._token_mean(self.nlls) if self.nlls else None,
               "trained_samples": sum(trains) / len(samples)}
        if self.kls:
            out["kl"] = self._token_mean(self.kls)
        external = [s.weight for s, t in zip(samples, trains) if s.external and t]
        if external:  # how much the external completions that trained counted (1 each without truncated weights)
            out["external_weight"] = sum(external) / len(external)
        out["external_loss_share"] = external_loss_share(samples)
        return out
