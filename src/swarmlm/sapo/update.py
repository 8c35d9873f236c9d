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

import math
import random

import torch
from transformers import PreTrainedModel

from swarmlm.sapo.batching import TrainSample, micro_batch_order, sample_logprobs
from swarmlm.sapo.config import GRPOSection
from swarmlm.sapo.grpo import grpo_loss


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
        self.ref_model = ref_model

    @torch.no_grad()
    def logprobs(self, model: PreTrainedModel, samples: list[TrainSample]) -> list[torch.Tensor]:
        """Per-sample completion-token log-probs under ``model`` (1-D, aligned with each sample's completion)."""
        out: list[torch.Tensor | None] = [None] * len(samples)
        mb = self.section.micro_batch_size
        order = micro_batch_order(samples, list(range(len(samples))))  # little padding, shared prompts run once
        for start in range(0, len(order), mb):
            idx = order[start:start + mb]
            logp, mask = sample_logprobs(model, [samples[i] for i in idx], self.pad_id)
            values = logp[mask].float().split(mask.sum(dim=1).tolist())
            for i, v in zip(idx, values):
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
        single = cfg.ppo_epochs == 1 and cfg.num_minibatches == 1
        truncated = cfg.external_weight == "truncated"
        trains = [cfg.beta > 0 or s.advantage != 0.0 for s in samples]  # the others add exactly 0 (module docstring)
        order = list(range(len(samples)))
        rng.shuffle(order)  # the first pass's order
        per_mb = math.ceil(len(order) / cfg.num_minibatches)
        old: list[torch.Tensor | None] | None = None
        # one pass of one step with truncated weights: the own samples train first, and their forward passes give the
        # weights' reference; only the own samples that do not train need a pass of their own (module docstring)
        fused = truncated and single
        if truncated and not fused:  # the weights need every old log-prob before the first loss
            old = self.logprobs(self.model, samples)
            truncated_external_weights(samples, old)
        elif not single:
            # The first minibatch of the first pass runs on the unchanged policy: its forward pass gives its old
            # log-probs (kept below). Only the samples after it need a separate pass before the first step.
            old = [None] * len(samples)
            rest = [i for i in order[per_mb:] if trains[i]]
            for i, lp in zip(rest, self.logprobs(self.model, [samples[i] for i in rest]) if rest else []):
                old[i] = lp
        ref = self.logprobs(self.ref_model, samples) if self.ref_model is not None else None  # beta > 0: all train
        losses, clip_fracs, kls, grad_norms, nlls = [], [], [], [], []
        for epoch in range(cfg.ppo_epochs):
            if epoch > 0:
                rng.shuffle(order)
            for mb_start in range(0, len(order), per_mb):
                mb = order[mb_start:mb_start + per_mb]
                n_tokens = float(sum(samples[i].num_completion_tokens for i in mb))
                self.optimizer.zero_grad(set_to_none=True)
                mb_loss = 0.0
                # sorted so that micro-batches waste little padding and a group's shared prompt runs once; fused, the
                # own samples first, then the external ones, weighted against the own samples' forward passes
                if fused:
                    own_first = [micro_batch_order(samples, [i for i in mb if trains[i] and not samples[i].external]),
                                 micro_batch_order(samples, [i for i in mb if trains[i] and samples[i].external])]
                    chunks = [part[mi:mi + cfg.micro_batch_size] for part in own_first
                              for mi in range(0, len(part), cfg.micro_batch_size)]
                    own_logp: list[torch.Tensor] = []
                    reference = None
                else:
                    mb_sorted = micro_batch_order(samples, [i for i in mb if trains[i]])
                    chunks = [mb_sorted[mi:mi + cfg.micro_batch_size] for mi in range(0, len(mb_sorted), cfg.micro_batch_size)]
                if not chunks:  # the step all samples would have given: a zero gradient (Adam's moments still move)
                    for param in self.model.parameters():
                        if param.requires_grad:
                            param.grad = torch.zeros_like(param)
                for idx in chunks:
                    chunk = [samples[i] for i in idx]
                    logp, mask = sample_logprobs(self.model, chunk, self.pad_id)
                    if fused:
                        per_sample = logp.detach()[mask].float().split(mask.sum(dim=1).tolist())
                        if not chunk[0].external:  # own samples: weight 1, their log-probs join the reference
                            own_logp.extend(per_sample)
                        else:
                            if reference is None:  # the own samples that did not train, on the unchanged policy
                                idle = [s for s, t in zip(samples, trains) if not s.external and not t]
                                reference = own_reference(own_logp + (self.logprobs(self.model, idle) if idle else []))
                            if reference is not None:
                                for sample, lp in zip(chunk, per_sample):
                                    sample.weight = truncated_weight(lp, reference)
                    if old is None:  # one pass, one step: the old policy is the current one (ρ ≡ 1)
                        old_lp = logp.detach()
                    else:
                        if any(old[i] is None for i in idx):  # first minibatch of the first pass (see above)
                            current = logp.detach()[mask].float().split(mask.sum(dim=1).tolist())
                            for i, lp in zip(idx, current):
                                if old[i] is None:
                                    old[i] = lp
                        old_lp = torch.zeros_like(logp).masked_scatter(mask, torch.cat([old[i] for i in idx]).to(logp))
                    ref_lp = None
                    if ref is not None:
                        ref_lp = torch.zeros_like(logp).masked_scatter(mask, torch.cat([ref[i] for i in idx]).to(logp))
                    adv = torch.tensor([s.advantage for s in chunk], device=logp.device)
                    w = torch.tensor([s.weight for s in chunk], device=logp.device)
                    loss, stats = grpo_loss(logp, old_lp, adv, mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                                            beta=cfg.beta, ref_logp=ref_lp, weights=w, num_tokens=n_tokens)
                    loss.backward()
                    mb_loss += loss.item()
                    tokens = float(mask.sum())  # per-token statistics, weighted by each micro-batch's tokens
                    clip_fracs.append((stats["clip_frac"].item(), tokens))
                    if epoch == 0:  # −log p of the sampled tokens before any step: a Monte Carlo estimate of entropy
                        nlls.append((-float((logp.detach() * mask).sum()) / max(1.0, tokens), tokens))
                    if "kl" in stats:
                        kls.append((stats["kl"].item(), tokens))
                grad_norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)))
                self.optimizer.step()
                losses.append(mb_loss)

        def token_mean(pairs: list[tuple[float, float]]) -> float:
            return sum(v * n for v, n in pairs) / max(1.0, sum(n for _, n in pairs))

        out = {"loss": sum(losses) / len(losses), "clip_frac": token_mean(clip_fracs),
               "grad_norm": sum(grad_norms) / len(grad_norms), "token_nll": token_mean(nlls) if nlls else None,
               "trained_samples": sum(trains) / len(samples)}
        if kls:
            out["kl"] = token_mean(kls)
        external = [s.weight for s, t in zip(samples, trains) if s.external and t]
        if external:  # how much the external completions that trained counted (1 each without truncated weights)
            out["external_weight"] = sum(external) / len(external)
        out["external_loss_share"] = external_loss_share(samples)
        return out

