"""What the replicas of a run need from each other, as one small interface: :class:`Communicator`.

The outer step of every method goes through it: NoLoCo's exchange within a group (:meth:`~Communicator.exchange`)
and DiLoCo's and DDP's average over all replicas (:meth:`~Communicator.all_reduce_mean_`); every byte and second
it spends is counted in its :class:`Traffic`. A few more calls let a run start, stop and end together.
Implementations:

* :class:`~swarmlm.noloco.comm.exchange.DistributedCommunicator`: one process per replica, torch.distributed
  (gloo or NCCL) with a deadline on every pair exchange;
* :class:`~swarmlm.noloco.comm.emulated.EmulatedCommunicator`: the same, with every message delayed by a
  modelled link;
* :class:`~swarmlm.noloco.comm.in_process.InProcessCommunicator`: M replicas in one process, stepped in turn,
  exchanging through memory, with a simulated clock instead of real waiting.

:func:`swarmlm.noloco.comm.make_communicator` picks the implementation; the replica's outer step is the same code
whatever the backend. Time (real or simulated) and the measurement of the replicas' spread are not part of this
interface: they sit beside it, in :mod:`swarmlm.noloco.comm.clock`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import torch


@dataclass
class Traffic:
    """Cumulative totals of one process's communication on one channel (the outer step's, or the pipeline's)."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    seconds: float = 0.0
    skipped: int = 0  # exchanges or hops that did not happen: the peer did not come in time (or its transfer failed)
    hops: int = 0  # pipeline hops attempted
    transfer_failures: int = 0  # pipeline hops whose transfer failed after both sides had said go

    def count_allreduce(self, tensor: torch.Tensor, world_size: int) -> None:
        """Bytes of an all-reduce of ``tensor``, counted as a ring moves them: 2(M−1)/M of it out and in per rank."""
        moved = int(2 * (world_size - 1) / world_size * tensor.numel() * tensor.element_size())
        self.bytes_sent += moved
        self.bytes_recv += moved

    def add(self, other: "Traffic") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def named(self, names: Mapping[str, str]) -> dict[str, Any]:
        """The fields ``names`` lists, under the names it gives them (metrics and checkpoint keys)."""
        return {key: getattr(self, name) for name, key in names.items()}

    def load_named(self, data: Mapping[str, Any], names: Mapping[str, str]) -> None:
        """Set the fields ``names`` lists from ``data``, where it has them (the inverse of :meth:`named`)."""
        for name, key in names.items():
            if key in data:
                setattr(self, name, data[key])


#: the outer step's totals in a replica's metrics and checkpoints
OUTER_STEP_NAMES = {"bytes_sent": "bytes_sent", "bytes_recv": "bytes_recv", "seconds": "comm_s", "skipped": "skipped_total"}


@dataclass
class ExchangeResult:
    """One exchange within a group: what each partner sent, which partners were skipped and why, and its traffic."""

    received: dict[int, torch.Tensor] = field(default_factory=dict)  # partner rank -> its payload
    skipped: dict[int, str] = field(default_factory=dict)  # partner rank -> why
    traffic: Traffic = field(default_factory=Traffic)


class Communicator(ABC):
    """All communication of one replica's process with the others (see the module docstring).

    Ranks are the processes of the run; ``world_size`` of them take part in this communicator's averages.
    """

    rank: int
    world_size: int
    traffic: Traffic

    @abstractmethod
    def exchange(self, outer_step: int, group: list[int], payload: torch.Tensor) -> ExchangeResult:
        """Send ``payload`` to every other member of ``group`` (ranks) and receive theirs; partners that do not
        answer within the deadline are skipped. ``payload`` has the same size on every member."""

    @abstractmethod
    def all_reduce_mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average ``tensor`` over all ranks, in place."""

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (to agree on a checkpoint to resume from)."""
        return [obj]

    def agree_stop(self, propose: int | None) -> int | None:
        """The step after which every rank stops, once one has proposed one (the first proposal wins), else None.
        ``propose`` is this rank's proposal, or None to only read."""
        return propose

    def heartbeat(self) -> None:
        """Tell the others that this rank still makes progress."""

    def finish(self, grace_s: float) -> None:
        """Announce that this rank is done (a rank that others depend on waits for them, at most ``grace_s`` past
        their last sign of life)."""
