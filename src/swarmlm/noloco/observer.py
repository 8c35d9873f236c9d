"""What a replica's run reports, measured from outside its method: :class:`ReplicaObserver`.

From the replica's events (:mod:`swarmlm.noloco.hooks`) it measures each step's time and the part of it spent
communicating, reads the communicator's traffic totals, measures how far the replicas' weights are apart
(``--log.model-std``, a collective outside the algorithm), and writes one line per step to ``metrics.jsonl``
(with TensorBoard events beside it, :class:`~swarmlm.runtime.metrics.MetricsWriter`) and the progress bar.

A line's fields: ``step``, ``loss``, ``lr``, ``tokens_per_s`` (this replica's tokens per second of its own step,
without the others' turns in one process); at an outer step ``outer_step``, ``model_std_fast`` (the spread before
it), NoLoCo's ``group``, ``partners_ok``, ``skipped_partners``, ``skipped_ranks``, then ``outer_comm_s`` and
``model_std`` (after it); ``val_loss`` and ``val_ppl`` when evaluated; the totals ``bytes_sent``, ``bytes_recv``,
``comm_s``, ``skipped_total``, the layout's own figures, ``compute_s``, ``tokens``, ``elapsed_s``, and ``sim_s`` on
a simulated clock.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from tqdm.auto import tqdm

from swarmlm.noloco.comm.base import OUTER_STEP_NAMES
from swarmlm.noloco.comm.clock import ReplicaSpread
from swarmlm.noloco.hooks import OuterStepDone, ReplicaHook, StepDone
from swarmlm.runtime.metrics import MetricsWriter

if TYPE_CHECKING:
    import torch

    from swarmlm.noloco.comm.clock import RunClock


class ReplicaObserver(ReplicaHook):
    """Timing, traffic and spread of one rank, written as it trains (see the module docstring)."""

    def __init__(self, replica: Any, clock: "RunClock", metrics_dir: str | Path):
        self.replica = replica
        self.clock = clock
        self.metrics_dir = Path(metrics_dir)
        self.config = replica.config
        self.compute_s = 0.0  # seconds of this rank's own work (its steps, outer steps included), over the run
        self.writer: MetricsWriter | None = None
        self.bar: tqdm | None = None
        self._wall_start = 0.0
        self._fields: dict[str, Any] = {}

    # ----- start and end
    def started(self, replica: Any, resumed_from: int | None, val: dict[str, float] | None) -> None:
        config = self.config
        self.writer = MetricsWriter(self.metrics_dir, resume_from=resumed_from, tensorboard=config.log.tensorboard,
                                    fsync=config.log.fsync)
        label = f"{replica.method} M={replica.replicas}" + (f" S={replica.stages}" if replica.stages > 1 else "")
        self.bar = tqdm(total=config.steps, initial=replica.step, desc=label, unit="step",
                        disable=not (config.progress and replica.show_progress and replica.rank == 0))
        self._wall_start = time.perf_counter()
        if val is not None:
            self.writer.log({"step": replica.step, **val})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()

    # ----- one step
    @contextlib.contextmanager
    def around_step(self, step: int) -> Iterator[None]:
        self._started = time.perf_counter()
        self._blocked_before = self.clock.blocked_s
        self._outer_s = 0.0
        self._fields = {}
        yield
        comm = self.clock.blocked_s - self._blocked_before
        self.compute_s += max(0.0, self._step_s + self._outer_s - comm)

    def trained(self, step: int) -> None:
        replica, config = self.replica, self.config
        self._step_s = time.perf_counter() - self._started
        # in one process, a wait is the other replicas' turns, not this replica's step
        turns = self.clock.blocked_s - self._blocked_before if self.clock.sim_s is not None else 0.0
        self._fields["tokens_per_s"] = (config.grad_accum * config.batch_size * config.seq_len
                                        / max(self._step_s - turns, 1e-9))
        if replica.method == "ddp" and step % config.outer.every == 0:
            self._spread("model_std", replica.theta)

    def before_outer(self, outer_step: int, theta: "torch.Tensor") -> None:
        self._outer_started = time.perf_counter()
        self._spread("model_std_fast", lambda: theta)
        self._outer_comm_before = self.replica.comm.traffic.seconds

    def after_outer(self, outer: OuterStepDone) -> None:
        self._fields.update(outer.fields())
        self._fields["outer_comm_s"] = self.replica.comm.traffic.seconds - self._outer_comm_before
        self._spread("model_std", self.replica.theta)
        self._outer_s = time.perf_counter() - self._outer_started

    def _spread(self, key: str, theta: Callable[[], "torch.Tensor"]) -> None:
        """The replicas' spread under ``key``, when measured (``theta``: the weights, flattened only then)."""
        comm = self.replica.outer_comm
        if self.config.log.model_std and isinstance(comm, ReplicaSpread):
            self._fields[key] = comm.replica_std(theta())

    def step_done(self, done: StepDone) -> None:
        replica = self.replica
        record: dict[str, Any] = {"step": done.step, "loss": done.loss, "lr": done.lr}
        record.update(self._fields)
        record.update(done.val or {})
        record.update(replica.comm.traffic.named(OUTER_STEP_NAMES))
        record.update(replica.inner_step.record())
        record.update({"compute_s": self.compute_s, "tokens": replica.tokens,
                       "elapsed_s": time.perf_counter() - self._wall_start})
        if self.clock.sim_s is not None:
            record["sim_s"] = self.clock.sim_s
        if done.step % self.config.log.every == 0 or done.outer is not None or done.val or done.stop:
            self.writer.log(record)
        self.bar.update(1)
        last = replica.last_val
        self.bar.set_postfix(loss=f"{done.loss:.3f}", **({"val_ppl": f"{last['val_ppl']:.1f}"} if last else {}))

    # ----- totals, in checkpoints and the final result
    def state_dict(self) -> dict[str, Any]:
        return {**self.replica.comm.traffic.named(OUTER_STEP_NAMES), "compute_s": self.compute_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.replica.comm.traffic.load_named(state, OUTER_STEP_NAMES)
        self.compute_s = state["compute_s"]

    summary = state_dict
