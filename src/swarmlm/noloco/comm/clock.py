"""A replica's time, kept beside its :class:`~swarmlm.noloco.comm.base.Communicator` rather than inside it.

The outer step needs only the communicator's algorithmic calls. How long a step took, how much of it was spent
waiting on the others, and what an injected stall costs depend on whether time is real or simulated; that is a
:class:`RunClock`:

* the real clock (this class, for the torch.distributed backends): seconds are wall-clock seconds, a stall sleeps,
  and the time spent waiting on the others is what the communicator's :class:`~swarmlm.noloco.comm.base.Traffic`
  counted;
* :class:`~swarmlm.noloco.comm.in_process.SimulatedClock` (the in-process backend): a clock per replica, charged
  with the real compute inside :meth:`RunClock.on_clock` and with the link model's cost of every message.

:func:`clock_of` gives the clock of a communicator. The measurement of how far the replicas' weights have drifted
apart (``replica_std``) is likewise not a method's call: the backends that can measure it implement
:class:`ReplicaSpread`, and only the run's observer calls it.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, ContextManager, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from swarmlm.noloco.comm.base import Communicator


class RunClock:
    """Real time: what the replica measures around a communicator that waits for real (see the module docstring)."""

    def __init__(self, comm: "Communicator"):
        self.comm = comm

    @property
    def blocked_s(self) -> float:
        """Real seconds this rank has spent inside communication calls so far, waiting included (the replica counts
        the rest of a step as compute)."""
        return self.comm.traffic.seconds

    @property
    def sim_s(self) -> float | None:
        """This rank's simulated wall-clock (compute plus modelled communication), or None for real time."""
        return None

    def on_clock(self) -> ContextManager:
        """Around one inner step's work, its outer step included: a simulated clock charges the real time spent
        inside, outside the communicator's calls, as this rank's compute. Evaluation and checkpoints stay outside."""
        return contextlib.nullcontext()

    def resume(self, seconds: float) -> None:
        """Set a simulated clock to a checkpoint's; real time has nothing to set."""

    def stall(self, seconds: float) -> None:
        """An injected stall of this rank (fault injection): real time sleeps; a simulated clock just advances."""
        time.sleep(seconds)


@runtime_checkable
class ReplicaSpread(Protocol):
    """A backend that can measure how far the ranks' weights are apart, outside the traffic it counts."""

    def replica_std(self, tensor: "torch.Tensor") -> float:
        """RMS deviation of the ranks' ``tensor`` from its mean over ranks (a collective: every rank calls it at
        the same point)."""


def clock_of(comm: "Communicator") -> RunClock:
    """The clock of ``comm``: its own simulated clock when it has one (``comm.sim_clock``), else real time."""
    simulated = getattr(comm, "sim_clock", None)
    return simulated if simulated is not None else RunClock(comm)
