"""What runs around a replica's training loop without being part of its method.

:class:`~swarmlm.noloco.replica.Replica` does the method: inner steps, outer steps, evaluation, checkpoints. It
tells its hooks what happened, as small events, and they do the rest:

* :class:`ClockHook`: the replica's :class:`~swarmlm.noloco.comm.clock.RunClock` around every step (the in-process
  backend's simulated clock charges the step's compute);
* :class:`~swarmlm.noloco.observer.ReplicaObserver`: timing, traffic and the replicas' spread, turned into
  ``metrics.jsonl``, TensorBoard events and the progress bar;
* :class:`~swarmlm.noloco.faults.FaultInjector`: the injected exit or stall of ``--faults.*``.

A hook's :meth:`~ReplicaHook.state_dict` goes into the replica's checkpoints and comes back on resume, so a resumed
run continues its clocks and totals. :func:`swarmlm.noloco.replica.standard_hooks` is the set every run uses.

A hook receives the replica itself (typed ``Any`` here: the replica module imports this one, never the reverse).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager

if TYPE_CHECKING:
    import torch

    from swarmlm.noloco.comm.clock import RunClock


@dataclass
class OuterStepDone:
    """What one outer step did. NoLoCo fills in its group and which partners answered; DiLoCo's all-reduce has
    no partners to name."""

    outer_step: int
    group: list[int] | None = None  # replica indices of this step's group (NoLoCo)
    partners_ok: list[int] = field(default_factory=list)
    skipped_ranks: list[int] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        if self.group is None:
            return {"outer_step": self.outer_step}
        return {"outer_step": self.outer_step, "group": self.group, "partners_ok": self.partners_ok,
                "skipped_partners": len(self.skipped_ranks), "skipped_ranks": self.skipped_ranks}


@dataclass
class StepDone:
    """One inner step, from its loss to whether the run stops after it."""

    step: int
    loss: float
    lr: float
    outer: OuterStepDone | None = None  # the outer step taken after it, if one was due
    val: dict[str, float] | None = None  # the evaluation after it, if one ran
    stop: bool = False


class ReplicaHook:
    """The events of a replica's loop, each a no-op here (see the module docstring)."""

    def started(self, replica: Any, resumed_from: int | None, val: dict[str, float] | None) -> None:
        """The loop begins at ``replica.step`` (``resumed_from``: the checkpoint's step, or None); ``val``: the
        evaluation before the first step of a fresh run."""

    def around_step(self, step: int) -> ContextManager:
        """Around inner step ``step`` and the outer step after it (not its evaluation or checkpoint)."""
        return contextlib.nullcontext()

    def trained(self, step: int) -> None:
        """Step ``step``'s gradients are applied; its outer step, if due, comes next."""

    def before_outer(self, outer_step: int, theta: "torch.Tensor") -> None:
        """Outer step ``outer_step`` is about to average; ``theta``: this replica's weights after its inner steps."""

    def after_outer(self, outer: OuterStepDone) -> None:
        """The outer step is done and the model holds its result."""

    def step_done(self, done: StepDone) -> None:
        """The step is complete, evaluation included (the checkpoint, if due, comes next)."""

    def state_dict(self) -> dict[str, Any]:
        """What this hook adds to a checkpoint's ``state.json``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's ``state.json``."""

    def summary(self) -> dict[str, Any]:
        """This hook's figures in the rank's final result."""
        return {}

    def close(self) -> None:
        """The loop has ended (also on an error)."""


class ClockHook(ReplicaHook):
    """The replica's clock around each step, and a simulated clock's reading in checkpoints and results."""

    def __init__(self, clock: "RunClock"):
        self.clock = clock

    def around_step(self, step: int) -> ContextManager:
        return self.clock.on_clock()

    def state_dict(self) -> dict[str, Any]:
        return {"sim_s": self.clock.sim_s} if self.clock.sim_s is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "sim_s" in state:
            self.clock.resume(state["sim_s"])

    summary = state_dict
