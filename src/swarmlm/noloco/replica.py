"""One replica's training loop: inner Adam(W) steps, and NoLoCo's or DiLoCo's outer step every H.

:func:`worker_main` is the entry point of one rank, started by ``launch_local`` or by the user's own
``torchrun``. Every rank builds the same initial model from the shared seed, trains on its own shard,
and takes an outer step every ``outer.every`` inner steps:

- ``noloco``: exchange with this outer step's group (point-to-point, with a deadline), then the
  NoLoCo update of φ and Δ, and θ ← φ;
- ``diloco``: all-reduce of the pseudo-gradient φ − θ, then outer SGD on φ, and θ ← φ;
- ``ddp``: gradients are all-reduced at every inner step instead (no outer step).

φ and Δ are flat fp32 vectors beside the model. Rank 0 writes ``DIR/metrics.jsonl``, rank k
``DIR/rank-k/metrics.jsonl``; checkpoints go to ``DIR/checkpoints/rank-k/``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from swarmlm.checkpoints import (Checkpoint, load_optimizer_state, load_rng_state, load_tensors,
                                 save_checkpoint)
from swarmlm.devices import autocast, resolve_device
from swarmlm.distributed import destroy_process_group, init_process_group
from swarmlm.interrupts import graceful_interrupt
from swarmlm.metrics import MetricsWriter
from swarmlm.noloco.config import TrainConfig
from swarmlm.noloco.data import replica_data, validation_batches
from swarmlm.noloco.emulation import make_communicator
from swarmlm.noloco.groups import group_of, make_groups
from swarmlm.noloco.outer import DiLoCoOuter, group_means, noloco_step, noloco_step_fast

log = logging.getLogger(__name__)

EXIT_CODE_INJECTED = 17


def rank_dir(out: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its metrics: the run directory itself for rank 0."""
    return Path(out) if rank == 0 else Path(out) / f"rank-{rank}"


def checkpoint_dir(out: str | Path, rank: int) -> Path:
    return Path(out) / "checkpoints" / f"rank-{rank}"


def available_checkpoints(directory: Path) -> list[int]:
    steps = []
    for path in directory.glob("step-*"):
        if (path / "state.json").exists():
            steps.append(int(path.name.split("-")[1]))
    return sorted(steps)


def checkpoint_at(directory: Path, step: int) -> Checkpoint:
    path = directory / f"step-{step:06d}"
    state = json.loads((path / "state.json").read_text())
    return Checkpoint(path=path, step=int(state["step"]), state=state)


def lr_factor(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to ``min_ratio`` at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def _load_model_weights(model: torch.nn.Module, model_dir: Path) -> None:
    from safetensors.torch import load_file

    index = model_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(model_dir / name)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"checkpoint {model_dir} does not fit the model: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()


class Replica:
    """The state and loop of one rank."""

    def __init__(self, config: TrainConfig, rank: int, world_size: int, local_rank: int = 0):
        from swarmlm.models import load_model

        self.config = config
        self.rank = rank
        self.world = world_size
        self.method = config.method
        # Pipeline layout (swarmlm.noloco.routing): rank = replica * stages + stage; one stage per replica unless
        # --stages > 1 (PipelineReplica).
        self.stages = config.stages
        self.replica, self.stage = divmod(rank, self.stages)
        self.replicas = world_size // self.stages
        self.store_stop = self.method != "ddp"  # DDP agrees on stopping through its gradient all-reduce
        self.device = self._device(local_rank)
        self.bf16 = config.precision == "bfloat16" or (
            config.precision == "auto" and self.device.type == "cuda" and torch.cuda.is_bf16_supported())
        torch.manual_seed(config.seed)
        loaded = load_model(config.model, seed=config.seed)
        self.model = self._build_model(loaded.model).to(self.device)
        self.model.train()
        self.tokenizer = loaded.tokenizer
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.phi = self.theta()
        self.delta = torch.zeros_like(self.phi)
        self.diloco = None
        if self.method == "diloco":
            d = config.diloco
            self.diloco = DiLoCoOuter(self.phi, lr=d.lr, momentum=d.momentum, nesterov=d.nesterov)
        inner = config.inner
        if inner.optimizer == "adamw":
            self.optimizer = torch.optim.AdamW(self.params, lr=inner.lr, betas=(inner.beta1, inner.beta2), eps=inner.eps,
                                               weight_decay=inner.weight_decay)
        else:
            self.optimizer = torch.optim.Adam(self.params, lr=inner.lr, betas=(inner.beta1, inner.beta2), eps=inner.eps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, warmup=inner.warmup_steps, total=config.steps, min_ratio=inner.min_lr_ratio))
        self.data = replica_data(config.data, self.tokenizer, replica=self.replica, num_replicas=self.replicas, seq_len=config.seq_len,
                                 batch_size=config.batch_size, seed=config.seed)
        self.val = validation_batches(self.data.val_tokens, seq_len=config.seq_len, batch_size=config.batch_size,
                                      num_batches=config.eval_batches)
        self.comm = make_communicator(config.network, rank=rank, world_size=world_size,
                                      timeout_s=config.exchange.timeout_s, run_key=self._run_key())
        self.outer_comm = self.comm  # the outer step's communicator: the stage's replica group in a pipeline
        self.step = 0
        self._stop_at: int | None = None
        self.saved_step: int | None = None
        self.compute_s = 0.0
        self.tokens = 0
        self.last_val: dict[str, float] = {}

    # ----- set-up helpers
    def _device(self, local_rank: int) -> torch.device:
        device = resolve_device(self.config.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
        return device

    def _run_key(self) -> str:
        """A key shared by all ranks of this launch, so that store keys never collide with an earlier run."""
        key = [uuid.uuid4().hex[:12] if self.rank == 0 else None]
        if self.world > 1:
            dist.broadcast_object_list(key, src=0)
        return str(key[0])

    # ----- hooks that a pipeline stage (swarmlm.noloco.pipeline_train.PipelineReplica) overrides
    def _build_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def _load_weights(self, model_dir: Path) -> None:
        _load_model_weights(self.model, model_dir)

    def checkpoint_state(self) -> dict[str, Any]:
        return {}

    def restore_state(self, state: dict[str, Any]) -> None:
        if state.get("stages", 1) != self.stages:
            raise RuntimeError(f"the checkpoint was written with {state.get('stages', 1)} pipeline stages, not {self.stages}")

    def step_record(self) -> dict[str, Any]:
        return {}

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
        mine = available_checkpoints(directory)
        if self.config.resume == "never":
            return None
        everyone: list[Any] = [mine]
        if self.world > 1:
            everyone = [None] * self.world
            dist.all_gather_object(everyone, mine)
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
        if checkpoint.state.get("method") != self.method:
            raise RuntimeError(f"{checkpoint.path} was written by method '{checkpoint.state.get('method')}', not "
                               f"'{self.method}': use another --out, or --resume never to start over")
        self._load_weights(checkpoint.model_dir)
        load_optimizer_state(checkpoint, self.optimizer)
        tensors = load_tensors(checkpoint)
        self.phi.copy_(tensors["phi"])
        self.delta.copy_(tensors["delta"])
        if self.diloco is not None:
            self.diloco.optimizer.state[self.diloco.phi]["momentum_buffer"] = self.delta.clone()
        state = checkpoint.state
        self.scheduler.load_state_dict(state["scheduler"])
        self.data.sampler.load_state_dict(state["sampler"])
        self.comm.traffic.bytes_sent = state["bytes_sent"]
        self.comm.traffic.bytes_recv = state["bytes_recv"]
        self.comm.traffic.seconds = state["comm_s"]
        self.comm.traffic.skipped = state["skipped_total"]
        self.compute_s = state["compute_s"]
        self.tokens = state["tokens"]
        self.restore_state(state)
        load_rng_state(checkpoint)
        self.step = self.saved_step = target
        log.info("rank %d resumed from step %d", self.rank, target)
        return target

    def save(self) -> None:
        delta = self.delta
        if self.diloco is not None:
            buffer = self.diloco.momentum_buffer()
            delta = buffer if buffer is not None else torch.zeros_like(self.phi)
        state = {"method": self.method, "scheduler": self.scheduler.state_dict(), "sampler": self.data.sampler.state_dict(),
                 "bytes_sent": self.comm.traffic.bytes_sent, "bytes_recv": self.comm.traffic.bytes_recv,
                 "comm_s": self.comm.traffic.seconds, "skipped_total": self.comm.traffic.skipped,
                 "compute_s": self.compute_s, "tokens": self.tokens, **self.checkpoint_state()}
        self.saved_step = self.step
        save_checkpoint(checkpoint_dir(self.config.out, self.rank), self.step, model=self.model, optimizer=self.optimizer,
                        state=state, tensors={"phi": self.phi.cpu(), "delta": delta.cpu()}, keep=self.config.keep_checkpoints)

    # ----- the inner step
    def inner_step(self, stop_flag: bool) -> tuple[float, float, bool]:
        """One optimizer step (with gradient accumulation); returns (loss, lr, whether any rank asked to stop)."""
        config = self.config
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(config.grad_accum):
            batch = self.data.sampler.next_batch().to(self.device)
            with autocast(self.device, self.bf16):
                loss = self.model(input_ids=batch, labels=batch).loss / config.grad_accum
            loss.backward()
            total += float(loss.detach())
        stop = stop_flag
        if self.method == "ddp" and self.world > 1:
            stop = self._all_reduce_gradients(stop_flag)
        torch.nn.utils.clip_grad_norm_(self.params, config.inner.clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.scheduler.step()
        self.tokens += config.grad_accum * config.batch_size * config.seq_len
        return total, lr, stop

    def _all_reduce_gradients(self, stop_flag: bool) -> bool:
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
    def _inject_faults(self, outer_step: int) -> None:
        faults = self.config.faults
        if faults.exit_rank == self.rank and faults.exit_outer_step == outer_step:
            log.error("rank %d: injected exit at outer step %d", self.rank, outer_step)
            logging.shutdown()
            os._exit(EXIT_CODE_INJECTED)
        if faults.stall_rank == self.rank and outer_step in faults.stall_outer_steps and faults.stall_s > 0:
            log.warning("rank %d: injected stall of %.1fs at outer step %d", self.rank, faults.stall_s, outer_step)
            time.sleep(faults.stall_s)

    def outer_step(self, outer_step: int) -> dict[str, Any]:
        record: dict[str, Any] = {"outer_step": outer_step}
        theta = self.theta()
        if self.config.log.model_std:
            record["model_std_fast"] = self.outer_comm.replica_std(theta)
        self._inject_faults(outer_step)
        comm_before = self.comm.traffic.seconds
        if self.method == "noloco":
            record.update(self._noloco(outer_step, theta))
        elif self.method == "diloco":
            pseudo = self.phi - theta
            self.outer_comm.all_reduce_mean_(pseudo)
            self.diloco.step(pseudo)
        self.set_theta(self.phi)
        record["outer_comm_s"] = self.comm.traffic.seconds - comm_before
        if self.config.log.model_std:
            record["model_std"] = self.outer_comm.replica_std(self.theta())
        return record

    def _noloco(self, outer_step: int, theta: torch.Tensor) -> dict[str, Any]:
        c = self.config.noloco
        groups = make_groups(self.replicas, c.group_size, self.config.seed, outer_step, c.leftover)
        group = group_of(self.replica, groups)  # replica indices; the same-stage processes of those replicas average
        fast = c.beta == c.gamma
        payload = theta if fast else torch.cat([theta, self.phi])
        result = self.outer_comm.exchange(outer_step, [r * self.stages + self.stage for r in group], payload)
        received = [result.received[p] for p in sorted(result.received)]
        if fast:
            mean_theta, _ = group_means(theta, None, received, fast=True)
            noloco_step_fast(self.phi, self.delta, mean_theta=mean_theta, alpha=c.alpha, beta=c.beta, momentum=c.momentum)
        else:
            mean_pseudo, mean_phi = group_means(theta, self.phi, received, fast=False)
            noloco_step(self.phi, self.delta, mean_pseudo_grad=mean_pseudo, mean_phi=mean_phi, alpha=c.alpha, beta=c.beta,
                        gamma=c.gamma, momentum=c.momentum)
        return {"group": group, "partners_ok": sorted(r // self.stages for r in result.received),
                "skipped_partners": len(result.skipped), "skipped_ranks": sorted(r // self.stages for r in result.skipped)}

    def agreed_stop(self, requested: bool) -> bool:
        """Whether every rank stops after this step. DDP carries the request in its gradient all-reduce;
        NoLoCo and DiLoCo have no per-step collective, so a rank asked to stop (Ctrl+C, SIGTERM) proposes
        "two steps from now" in the store, the first proposal wins, and every rank reads it each step.
        All ranks then stop, and checkpoint, at the same step."""
        if self.world == 1:
            return requested
        key = self.comm.key("stop")
        try:
            if requested and self._stop_at is None:
                self._stop_at = int(self.comm.store.compare_set(key, "", str(self.step + 2)))
            elif self._stop_at is None and self.comm.store.check([key]):
                self._stop_at = int(self.comm.store.get(key))
        except (RuntimeError, dist.DistError):  # no store: stop on our own
            return requested
        return self._stop_at is not None and self.step >= self._stop_at

    # ----- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        total, count = 0.0, 0
        for batch in self.val:
            batch = batch.to(self.device)
            with autocast(self.device, self.bf16):
                loss = self.model(input_ids=batch, labels=batch).loss
            tokens = batch.numel() - batch.shape[0]  # predictions per sequence: seq_len - 1
            total += float(loss) * tokens
            count += tokens
        self.model.train()
        val_loss = total / count
        self.last_val = {"val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0))}
        return self.last_val

    # ----- the loop
    def run(self, progress: bool = True) -> dict[str, Any]:
        config = self.config
        started_from = self.resume()
        end = config.stop_after or config.steps
        writer = MetricsWriter(rank_dir(config.out, self.rank), resume_from=started_from, tensorboard=config.log.tensorboard)
        H = config.outer.every
        bar = tqdm(total=config.steps, initial=self.step, desc=f"{self.method} M={self.replicas}" + (f" S={self.stages}" if self.stages > 1 else ""), unit="step",
                   disable=not (progress and config.progress and self.rank == 0))
        wall_start = time.perf_counter()
        stopped_early = False
        try:
            if self.step == 0:
                record = {"step": 0, **self.evaluate()}
                writer.log(record)
            with graceful_interrupt() as interrupt:
                while self.step < end:
                    self.step += 1
                    started = time.perf_counter()
                    comm_before = self.comm.traffic.seconds
                    loss, lr, stop = self.inner_step(interrupt.requested)
                    if self.store_stop:
                        stop = self.agreed_stop(interrupt.requested)
                    if self.method == "noloco":
                        self.comm.heartbeat()
                    step_time = time.perf_counter() - started
                    record: dict[str, Any] = {"step": self.step, "loss": loss, "lr": lr,
                                              "tokens_per_s": config.grad_accum * config.batch_size * config.seq_len / step_time}
                    outer_due = self.method != "ddp" and (self.step % H == 0 or self.step == config.steps)
                    if self.method == "ddp" and self.step % H == 0 and config.log.model_std:
                        record["model_std"] = self.outer_comm.replica_std(self.theta())
                    if outer_due:
                        outer_started = time.perf_counter()
                        record.update(self.outer_step((self.step + H - 1) // H))
                        step_time += time.perf_counter() - outer_started
                    comm = self.comm.traffic.seconds - comm_before
                    self.compute_s += max(0.0, step_time - comm)
                    if (config.eval_every and self.step % config.eval_every == 0) or self.step == config.steps:
                        record.update(self.evaluate())
                    if config.stop_after is not None and self.step >= config.stop_after:
                        stop = True
                    if stop and self.step < config.steps and "val_loss" not in record:
                        record.update(self.evaluate())
                    record.update(self.comm.traffic.as_dict())
                    record.update(self.step_record())
                    record.update({"compute_s": self.compute_s, "tokens": self.tokens,
                                   "elapsed_s": time.perf_counter() - wall_start})
                    if self.step % config.log.every == 0 or outer_due or "val_loss" in record or stop:
                        writer.log(record)
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss:.3f}", **({"val_ppl": f"{self.last_val['val_ppl']:.1f}"} if self.last_val else {}))
                    if config.checkpoint_every and self.step % config.checkpoint_every == 0:
                        self.save()
                    if stop:
                        stopped_early = self.step < config.steps
                        break
            if self.saved_step != self.step:
                self.save()
            self.comm.finish(grace_s=2 * config.exchange.timeout_s)
        finally:
            bar.close()
            writer.close()
        return {"rank": self.rank, "step": self.step, "completed": self.step >= config.steps and not stopped_early,
                "val_loss": self.last_val.get("val_loss"), "val_ppl": self.last_val.get("val_ppl"),
                "skipped_total": self.comm.traffic.skipped, "bytes_sent": self.comm.traffic.bytes_sent,
                "bytes_recv": self.comm.traffic.bytes_recv, "comm_s": self.comm.traffic.seconds,
                "compute_s": self.compute_s, "tokens": self.tokens}


def worker_main(config_json: str) -> dict[str, Any]:
    """Entry point of one rank (``launch_local`` or the user's ``torchrun``)."""
    config = TrainConfig.model_validate_json(config_json)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(os, "setpgrp") and os.getpgrp() != os.getpid():
        # Leave the terminal's process group: a Ctrl+C then reaches the launcher (torchrun or launch_local)
        # alone, which forwards exactly one SIGINT to every worker; one SIGINT is a graceful stop
        # (graceful_interrupt), whereas the terminal's and the launcher's together would be an abort.
        os.setpgrp()
    rank, world = init_process_group(backend=config.backend, timeout_s=max(300.0, 4 * config.exchange.timeout_s))
    if world % config.stages:
        raise ValueError(f"the world size ({world}) is not a multiple of --stages ({config.stages})")
    replicas = world // config.stages
    if config.method == "noloco" and config.noloco.group_size > replicas > 1:
        raise ValueError(f"noloco.group_size ({config.noloco.group_size}) is larger than the number of replicas ({replicas})")
    try:
        if config.stages > 1:
            from swarmlm.noloco.pipeline_train import PipelineReplica as replica_class
        else:
            replica_class = Replica
        replica = replica_class(config, rank, world, local_rank=int(os.environ.get("LOCAL_RANK", 0)))
        return replica.run()
    finally:
        destroy_process_group()
