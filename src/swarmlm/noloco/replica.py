"""One replica's training loop: inner Adam(W) steps, and NoLoCo's or DiLoCo's outer step every H.

NoLoCo (arXiv 2506.10911) and DiLoCo (Douillard et al., arXiv 2311.08105) both train each
replica with its own inner optimizer and take an *outer* step every H inner steps; data parallel (DDP) is the
baseline that averages gradients every step. One :class:`Replica` is one process of a run, started by
:func:`swarmlm.noloco.launch.worker_main`. Every rank builds the same initial model from the shared seed, trains
on its own shard, and takes an outer step every ``outer.every`` inner steps:

- ``noloco``: exchange with this outer step's group (point-to-point, with a deadline), then the
  NoLoCo update of φ and Δ, and θ ← φ;
- ``diloco``: all-reduce of the pseudo-gradient φ − θ, then outer SGD on φ, and θ ← φ;
- ``ddp``: gradients are all-reduced at every inner step instead (no outer step).

φ and Δ are flat fp32 vectors beside the model. How a step's gradients come about (the whole model here, or one
pipeline stage) is the replica's :class:`~swarmlm.noloco.inner_step.InnerStep`; how replicas talk, its
:class:`~swarmlm.noloco.comm.base.Communicator`: torch.distributed with one process per rank, or the in-process
backend with M replicas in one process (:mod:`swarmlm.noloco.comm.in_process`, a thread per replica); the loop
is the same code either way. Rank 0 writes ``DIR/metrics.jsonl``, rank k ``DIR/rank-k/metrics.jsonl``;
checkpoints go to ``DIR/checkpoints/rank-k/``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from swarmlm.noloco.comm import make_communicator
from swarmlm.noloco.comm.base import Communicator
from swarmlm.noloco.comm.clock import clock_of
from swarmlm.noloco.compress import MessageCodec
from swarmlm.noloco.config import InnerSection, TrainConfig
from swarmlm.noloco.data import replica_data, validation_batches
from swarmlm.noloco.faults import FaultInjector
from swarmlm.noloco.groups import group_of, make_groups
from swarmlm.noloco.hooks import ClockHook, OuterStepDone, ReplicaHook, StepDone
from swarmlm.noloco.inner_step import DataParallelStep, InnerStep
from swarmlm.noloco.observer import ReplicaObserver
from swarmlm.noloco.outer import DiLoCoOuter, group_means, noloco_step, noloco_step_fast
from swarmlm.runtime.checkpoints import (
    checkpoint_at,
    checkpoint_steps,
    load_optimizer_state,
    load_rng_state,
    load_tensors,
    save_checkpoint,
)
from swarmlm.runtime.devices import resolve_device
from swarmlm.runtime.interrupts import StopFlag, graceful_interrupt

log = logging.getLogger(__name__)


def rank_dir(out: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its metrics: the run directory itself for rank 0."""
    return Path(out) if rank == 0 else Path(out) / f"rank-{rank}"


def checkpoint_dir(out: str | Path, rank: int) -> Path:
    return Path(out) / "checkpoints" / f"rank-{rank}"


def lr_factor(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def inner_optimizer(params: list[torch.nn.Parameter], inner: InnerSection) -> torch.optim.Optimizer:
    """The replica's inner optimizer, Adam or AdamW, as ``inner`` configures it."""
    if inner.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=inner.lr, betas=(inner.beta1, inner.beta2), eps=inner.eps,
                                 weight_decay=inner.weight_decay)
    return torch.optim.Adam(params, lr=inner.lr, betas=(inner.beta1, inner.beta2), eps=inner.eps)


def standard_hooks(replica: "Replica", metrics_dir: str | Path) -> list[ReplicaHook]:
    """The hooks of every run (:mod:`swarmlm.noloco.hooks`): the clock outermost (a simulated clock charges all the
    rest of the step), then the observer writing ``metrics_dir``, then fault injection."""
    clock = clock_of(replica.comm)
    return [ClockHook(clock), ReplicaObserver(replica, clock, metrics_dir), FaultInjector(replica, clock)]


class Replica:
    """The state and loop of one rank. ``inner_step`` is how this rank computes gradients (default: the whole
    model, :class:`~swarmlm.noloco.inner_step.DataParallelStep`); ``comm`` how it talks to the others (default:
    torch.distributed, :func:`~swarmlm.noloco.comm.make_communicator`); ``hooks`` what runs around its loop
    (default: :func:`standard_hooks`, the clock, the metrics and fault injection)."""

    def __init__(self, config: TrainConfig, rank: int, world_size: int, local_rank: int = 0,
                 inner_step: InnerStep | None = None, comm: Communicator | None = None,
                 hooks: Sequence[ReplicaHook] | None = None):
        from swarmlm.models import load_model

        self.config = config
        self.rank = rank
        self.world = world_size
        self.method = config.method
        # Pipeline layout (swarmlm.noloco.pipeline.routing): rank = replica * stages + stage; one stage per replica unless
        # --stages > 1 (PipelineStep).
        self.stages = config.stages
        self.replica, self.stage = divmod(rank, self.stages)
        self.replicas = world_size // self.stages
        self.inner_step = inner_step if inner_step is not None else DataParallelStep(self.method)
        self.device = self._device(local_rank)
        self.bf16 = config.precision == "bfloat16" or (
            config.precision == "auto" and self.device.type == "cuda" and torch.cuda.is_bf16_supported())
        torch.manual_seed(config.seed)
        loaded = load_model(config.model, seed=config.seed)
        self.model = self.inner_step.build_model(loaded.model).to(self.device)
        self.model.train()
        self.tokenizer = loaded.tokenizer
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.phi = self.theta()
        self.delta = torch.zeros_like(self.phi)
        x = config.exchange
        self.codec = MessageCodec(x.compress, x.block, x.error_feedback) if x.compress != "none" else None
        self.diloco = None
        if self.method == "diloco":
            d = config.diloco
            self.diloco = DiLoCoOuter(self.phi, lr=d.lr, momentum=d.momentum, nesterov=d.nesterov)
        inner = config.inner
        self.optimizer = inner_optimizer(self.params, inner)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, warmup=inner.warmup_steps, total=config.steps, min_ratio=inner.min_lr_ratio))
        self.data = replica_data(config.data, self.tokenizer, replica=self.replica, num_replicas=self.replicas, seq_len=config.seq_len,
                                 batch_size=config.batch_size, seed=config.seed)
        self.val = validation_batches(self.data.val_tokens, seq_len=config.seq_len, batch_size=config.batch_size,
                                      num_batches=config.eval_batches)
        self.comm = comm if comm is not None else make_communicator(
            config.network, rank=rank, world_size=world_size, timeout_s=config.exchange.timeout_s)
        self.inner_step.attach(self)
        self.outer_comm = self.inner_step.outer_comm  # the outer step's communicator: the stage's replica group in a pipeline
        self.step = 0
        self._stop_at: int | None = None
        self.saved_step: int | None = None
        self.tokens = 0
        self.last_val: dict[str, float] = {}
        self.show_progress = True  # run(progress=False) turns the hooks' progress bar off
        self.hooks = list(hooks) if hooks is not None else standard_hooks(self, rank_dir(config.out, rank))

    # ----- set-up helpers
    def _device(self, local_rank: int) -> torch.device:
        device = resolve_device(self.config.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        return device

    # ----- flat views of the weights
    def theta(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in self.params])

    def set_theta(self, flat: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    # ----- checkpoints
    def resume(self) -> int | None:
        """Load the checkpoint to resume from (the newest step every rank holds); returns its step."""
        directory = checkpoint_dir(self.config.out, self.rank)
        mine = checkpoint_steps(directory)
        if self.config.resume == "never":
            return None
        everyone = self.comm.gather_objects(mine)
        common = set(everyone[0]).intersection(*everyone[1:])
        if isinstance(self.config.resume, int):
            if self.config.resume not in common:
                raise RuntimeError(f"resume step {self.config.resume} is not held by every rank (common: {sorted(common)})")
            target = self.config.resume
        elif common:
            target = max(common)
        else:
            if any(everyone):
                log.warning("rank %d: no checkpoint step is common to all ranks; starting over", self.rank)
            return None
        checkpoint = checkpoint_at(directory, target)
        state = checkpoint.state
        if state.get("method") != self.method:
            raise RuntimeError(f"{checkpoint.path} was written by method '{state.get('method')}', not "
                               f"'{self.method}': use another --out, or --resume never to start over")
        if state.get("stages", 1) != self.stages:
            raise RuntimeError(f"the checkpoint was written with {state.get('stages', 1)} pipeline stage(s), not "
                               f"{self.stages}")
        self.inner_step.load_weights(checkpoint.model_dir)
        load_optimizer_state(checkpoint, self.optimizer)
        tensors = load_tensors(checkpoint)
        self.phi.copy_(tensors["phi"])
        self.delta.copy_(tensors["delta"])  # DiLoCo: its outer optimizer's momentum buffer
        if self.codec is not None and "residual" in tensors:  # the compressed exchange's error feedback
            self.codec.residual = tensors["residual"].to(self.phi.device)
        if self.diloco is not None:
            self.diloco.load_momentum_buffer(self.delta)
        self.scheduler.load_state_dict(state["scheduler"])
        self.data.sampler.load_state_dict(state["sampler"])
        self.tokens = state["tokens"]
        self.inner_step.load_state_dict(state)
        for hook in self.hooks:
            hook.load_state_dict(state)
        load_rng_state(checkpoint)
        self.step = self.saved_step = target
        log.info("rank %d resumed from step %d", self.rank, target)
        return target

    def save(self) -> None:
        with self.inner_step.waiting():
            delta = self.delta
            if self.diloco is not None:
                buffer = self.diloco.momentum_buffer()
                delta = buffer if buffer is not None else torch.zeros_like(self.phi)
            state = {"method": self.method, "scheduler": self.scheduler.state_dict(), "sampler": self.data.sampler.state_dict(),
                     "tokens": self.tokens, **self.inner_step.state_dict()}
            for hook in self.hooks:
                state.update(hook.state_dict())
            self.saved_step = self.step
            save_checkpoint(checkpoint_dir(self.config.out, self.rank), self.step, model=self.model,
                            optimizer=self.optimizer, state=state, tensors=self._tensors(delta),
                            keep=self.config.keep_checkpoints)

    def _tensors(self, delta: torch.Tensor) -> dict[str, torch.Tensor]:
        tensors = {"phi": self.phi.cpu(), "delta": delta.cpu()}
        if self.codec is not None and self.codec.residual is not None:
            tensors["residual"] = self.codec.residual.cpu()
        return tensors

    # ----- the inner step
    def train_step(self, stop_flag: bool) -> tuple[float, float, bool]:
        """One optimizer step; returns (loss, lr, whether any rank asked to stop)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss, stop = self.inner_step.gradients(stop_flag)
        torch.nn.utils.clip_grad_norm_(self.params, self.config.inner.clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.tokens += self.inner_step.tokens_per_step()
        return loss, lr, stop

    def all_reduce_gradients(self, stop_flag: bool) -> bool:
        """DDP: average the gradients over the replicas, with the stop request riding along; returns whether any
        replica asked to stop."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flag = torch.tensor([1.0 if stop_flag else 0.0], device=self.device)
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads] + [flag])
        self.outer_comm.all_reduce_mean_(flat)
        offset = 0
        for p, g in zip(self.params, grads):
            n = g.numel()
            p.grad = flat[offset:offset + n].view_as(g).to(g.dtype)
            offset += n
        return bool(flat[-1] > 0)

    # ----- the outer steps
    def outer_step(self, outer_step: int) -> OuterStepDone:
        with self.inner_step.waiting():
            theta = self.theta()
            for hook in self.hooks:
                hook.before_outer(outer_step, theta)
            done = OuterStepDone(outer_step)
            if self.method == "noloco":
                done = self._noloco(outer_step, theta)
            elif self.method == "diloco":
                pseudo = self.phi - theta
                self.outer_comm.all_reduce_mean_(pseudo)
                self.diloco.step(pseudo)
            self.set_theta(self.phi)
            for hook in self.hooks:
                hook.after_outer(done)
            return done

    def _noloco(self, outer_step: int, theta: torch.Tensor) -> OuterStepDone:
        c = self.config.noloco
        groups = make_groups(self.replicas, c.group_size, self.config.seed, outer_step, c.leftover)
        group = group_of(self.replica, groups)  # replica indices; the same-stage processes of those replicas average
        fast = c.beta == c.gamma
        payload = theta if fast else torch.cat([theta, self.phi])
        wire = self.codec.encode(payload) if self.codec is not None else payload
        result = self.outer_comm.exchange(outer_step, [r * self.stages + self.stage for r in group], wire)
        received = [result.received[p] for p in sorted(result.received)]
        if self.codec is not None:
            received = [self.codec.decode(m, payload.numel()).to(payload.device) for m in received]
        if fast:
            mean_theta, _ = group_means(theta, None, received, fast=True)
            noloco_step_fast(self.phi, self.delta, mean_theta=mean_theta, alpha=c.alpha, beta=c.beta, momentum=c.momentum)
        else:
            mean_pseudo, mean_phi = group_means(theta, self.phi, received, fast=False)
            noloco_step(self.phi, self.delta, mean_pseudo_grad=mean_pseudo, mean_phi=mean_phi, alpha=c.alpha, beta=c.beta,
                        gamma=c.gamma, momentum=c.momentum)
        return OuterStepDone(outer_step, group=group, partners_ok=sorted(r // self.stages for r in result.received),
                             skipped_ranks=sorted(r // self.stages for r in result.skipped))

    def agreed_stop(self, requested: bool) -> bool:
        """Whether every rank stops after this step. DDP carries the request in its gradient all-reduce;
        NoLoCo and DiLoCo have no per-step collective, so a rank asked to stop (Ctrl+C, SIGTERM) proposes
        "two steps from now" in the store, the first proposal wins, and every rank reads it each step.
        All ranks then stop, and checkpoint, at the same step."""
        if self.world == 1:
            return requested
        try:
            if self._stop_at is None:
                self._stop_at = self.comm.agree_stop(self.step + 2 if requested else None)
        except RuntimeError:  # no store: stop on our own
            return requested
        return self._stop_at is not None and self.step >= self._stop_at

    # ----- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        try:
            total, tokens = self.inner_step.validation_loss()
        finally:
            self.model.train()
        val_loss = total / tokens if tokens else math.nan
        self.last_val = {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0)) if tokens else math.nan}
        return self.last_val

    # ----- the loop
    def run(self, progress: bool = True, interrupt: StopFlag | None = None) -> dict[str, Any]:
        """Train to the end (or an agreed stop) and return this rank's final figures. ``interrupt``: a stop flag shared
        with the caller (the in-process backend's replicas share the main thread's); by default this rank's own
        Ctrl+C handler."""
        config = self.config
        self.show_progress = progress
        started_from = self.resume()
        stopped_early = False
        try:
            initial = self.evaluate() if self.step == 0 else None
            for hook in self.hooks:
                hook.started(self, started_from, initial)
            with contextlib.nullcontext(interrupt) if interrupt is not None else graceful_interrupt() as interrupt:
                while self.step < (config.stop_after or config.steps):
                    done = self._step(interrupt)
                    if config.checkpoint_every and self.step % config.checkpoint_every == 0:
                        self.save()
                    if done.stop:
                        stopped_early = self.step < config.steps
                        break
            if self.saved_step != self.step:
                self.save()
            self.comm.finish(grace_s=2 * config.exchange.timeout_s)
        finally:
            for hook in self.hooks:
                hook.close()
        result = {"rank": self.rank, "step": self.step, "completed": self.step >= config.steps and not stopped_early,
                  "val_loss": self.last_val.get("val_loss"), "val_ppl": self.last_val.get("val_ppl"),
                  "tokens": self.tokens}
        for hook in self.hooks:
            result.update(hook.summary())
        return result

    def _step(self, interrupt: StopFlag) -> StepDone:
        """One inner step, the outer step after it when due, and the evaluation when due."""
        config, H = self.config, self.config.outer.every
        self.step += 1
        with contextlib.ExitStack() as around:
            for hook in self.hooks:
                around.enter_context(hook.around_step(self.step))
            loss, lr, stop = self.train_step(interrupt.requested)
            if self.inner_step.stop_in_store:
                stop = self.agreed_stop(interrupt.requested)
            if self.method == "noloco":
                self.comm.heartbeat()
            for hook in self.hooks:
                hook.trained(self.step)
            outer = None
            if self.method != "ddp" and (self.step % H == 0 or self.step == config.steps):
                outer = self.outer_step((self.step + H - 1) // H)
        if config.stop_after is not None and self.step >= config.stop_after:
            stop = True
        val = None
        if (config.eval_every and self.step % config.eval_every == 0) or self.step == config.steps or stop:
            val = self.evaluate()
        done = StepDone(self.step, loss, lr, outer=outer, val=val, stop=stop)
        for hook in self.hooks:
            hook.step_done(done)
        return done
