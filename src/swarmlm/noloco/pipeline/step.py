"""The inner step of an M × S pipeline run: one stage of one replica per process, with NoLoCo's random routing
(NoLoCo, arXiv 2506.10911).

Process (replica d, stage s) has global rank ``d * S + s`` (:mod:`swarmlm.noloco.pipeline.routing`) and holds
stage s of the model (:mod:`swarmlm.noloco.pipeline.stages`). Two kinds of process groups join them:

- **data-parallel peers**: the M processes of one stage (``dist.new_group``). The outer step (NoLoCo's
  pair exchange, DiLoCo's all-reduce) and DDP's gradient all-reduce run within this group, with the
  same :class:`~swarmlm.noloco.comm.exchange.DistributedCommunicator` as an unsplit run. Each stage averages
  its own layers with the same-stage processes of other replicas.
- **pipeline neighbours**: two-rank gloo links between stage s and stage s+1 processes, made on first
  use (:mod:`swarmlm.noloco.comm.links`). With random routing every stage-s process eventually talks to
  every stage-(s+1) process.

The step itself is :class:`~swarmlm.noloco.pipeline.schedule.PipelineSchedule`'s. Gradients are then clipped
at ``inner.clip`` per stage (a global norm would need every stage of a replica, and with random routing there
is no fixed replica to take it over). Every method stops by agreement in the store (DDP's all-reduce is per
stage, so it cannot carry the request). During the outer step and checkpoints, which are long waits that are not
hops, this process keeps its heartbeat moving, so that pipeline neighbours already waiting for its next hop keep
waiting rather than give it up and run steps ahead.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from swarmlm.noloco.comm.base import Communicator
from swarmlm.noloco.comm.links import PIPE_METRIC_NAMES, PIPE_STATE_NAMES, PipeLinks
from swarmlm.noloco.config import TrainConfig
from swarmlm.noloco.inner_step import InnerStep
from swarmlm.noloco.pipeline.routing import position, rank_of
from swarmlm.noloco.pipeline.schedule import PipelineSchedule, StepReport
from swarmlm.noloco.pipeline.stages import build_stage

log = logging.getLogger(__name__)


class PipelineStep(InnerStep):
    """One process of an M × S pipeline run (see the module docstring). Every rank constructs it at the same
    point: it creates the per-stage process groups."""

    def __init__(self, config: TrainConfig, rank: int, world_size: int):
        S = config.stages
        if world_size % S:
            raise ValueError(f"{world_size} processes cannot hold {S} stages per replica (world size must be M × S)")
        if config.network.inject:  # the injected link delays the outer step's messages, not pipeline hops
            raise ValueError("network.inject is not supported with --stages > 1 yet")
        self.config = config
        self.rank = rank
        self.replicas = world_size // S
        self.replica_index, self.stage = position(rank, S)
        # Data-parallel groups, one per stage: every rank creates every group, in the same order.
        self.stage_groups = [dist.new_group([rank_of(d, s, S) for d in range(self.replicas)]) for s in range(S)] \
            if world_size > 1 else [None]
        self.totals = {"failures": 0, "retried": 0, "dropped": 0, "grad_lost": 0}
        self.last_report: StepReport | None = None

    def build_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return build_stage(model, self.stage, self.config.stages, recompute=self.config.pipeline.recompute)

    def attach(self, replica: Any) -> None:
        super().attach(replica)
        config, comm, M = self.config, replica.comm, self.replicas
        self._outer_comm = comm.subgroup(self.stage_groups[self.stage] if M > 1 else None, M)
        p = config.pipeline
        self.links = PipeLinks(store=comm.store, rank=self.rank, key=comm.key, timeout_s=p.timeout_s,
                               max_wait_s=p.max_wait_s, heartbeat=comm.heartbeats)
        self.schedule = PipelineSchedule(replica.model, self.links, replica=self.replica_index, stage=self.stage,
                                         num_replicas=M, num_stages=config.stages, seed=config.seed,
                                         num_micro_batches=config.grad_accum * p.micro_batches,
                                         retry_slots=p.retry_slots, routing=p.routing, device=replica.device,
                                         bf16=replica.bf16)

    @property
    def outer_comm(self) -> Communicator:
        return self._outer_comm

    def load_weights(self, model_dir: Path) -> None:
        self.replica.model.load_saved(model_dir)

    # ----- the step
    def gradients(self, stop_flag: bool) -> tuple[float, bool]:
        replica, config = self.replica, self.config
        faults = config.faults
        if faults.stall_rank == self.rank and replica.step in faults.stall_steps and faults.stall_s > 0:
            log.warning("rank %d: injected stall of %.1fs at inner step %d", self.rank, faults.stall_s, replica.step)
            time.sleep(faults.stall_s)
        micro = None
        if self.stage == 0:
            k = config.pipeline.micro_batches
            micro = []
            for _ in range(config.grad_accum):
                micro.extend(torch.chunk(replica.data.sampler.next_batch(), k, dim=0))
        report = self.schedule.train_step(replica.step, micro)
        self.last_report = report
        for key in self.totals:
            self.totals[key] += getattr(report, key)
        if replica.method == "ddp" and self.replicas > 1:
            replica.all_reduce_gradients(False)
        return report.loss, stop_flag

    def tokens_per_step(self) -> int:
        return super().tokens_per_step() if self.stage == 0 else 0  # a replica's tokens count once, at stage 0

    def validation_loss(self) -> tuple[float, int]:
        replica = self.replica
        return self.schedule.evaluate(replica.val if self.stage == 0 else None, len(replica.val))

    def record(self) -> dict[str, Any]:
        """Pipeline figures for this step's metrics line."""
        r = self.last_report
        if r is None:
            return {}
        record = {"stage": self.stage, "replica": self.replica_index, "pieces_ok": r.pieces_ok,
                  "pipe_failures": r.failures, "pipe_retried": r.retried, "pipe_dropped": r.dropped,
                  "pipe_grad_lost": r.grad_lost, **{f"pipe_{k}_total": v for k, v in self.totals.items()},
                  **self.links.traffic.named(PIPE_METRIC_NAMES)}
        if self.config.pipeline.log_routes:
            record["sent_to"] = r.sent_to
            record["recv_from"] = r.recv_from
        return record

    # ----- checkpoints: the pipeline's counters travel with the rest
    def state_dict(self) -> dict[str, Any]:
        return {"stages": self.config.stages, "pipe_totals": dict(self.totals),
                "pipe_traffic": self.links.traffic.named(PIPE_STATE_NAMES)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.totals.update(state.get("pipe_totals", {}))
        self.links.traffic.load_named(state.get("pipe_traffic", {}), PIPE_STATE_NAMES)

    # ----- waits that are not hops
    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        self.links.keep_alive(True)
        try:
            yield
        finally:
            self.links.keep_alive(False)

    @contextlib.contextmanager
    def stalled(self) -> Iterator[None]:
        self.links.keep_alive(False)  # an injected stall is a stall: no heartbeat
        try:
            yield
        finally:
            self.links.keep_alive(True)
