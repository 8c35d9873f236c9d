"""The :class:`~swarmlm.noloco.comm.base.Communicator` of one process per replica, over torch.distributed.

NoLoCo's group exchange, DiLoCo's and DDP's all-reduce, and the (log-only) model-std measurement, with byte and
time accounting. The injected network model (:mod:`swarmlm.noloco.comm.emulated`) subclasses it and delays every
message, so that every method pays for the same link.

NoLoCo's exchange is point-to-point only, with a deadline
--------------------------------------------------------
Gloo's receive has no per-operation timeout that leaves the connection usable: a ``wait(timeout)``
that expires closes the pair for good ("Application timeout caused pair closure"). So each pair of
replicas that averages at outer step k gets a link of its own, used once:

1. **Rendezvous with a deadline** (:mod:`swarmlm.noloco.comm.rendezvous`) through the job's key-value store
   (the torchrun / c10d store that already exists for start-up), in the namespace ``noloco/<run>/x<k>/<a>-<b>/``.
   The first to arrive waits until ``exchange.timeout_s``. Both sides always agree whether to exchange, and a
   stalled partner that turns up late skips at once instead of waiting for a peer that has moved on.
2. **Transfer** over a fresh two-rank gloo process group (its own TCP connection, made with the same
   deadline), with ``dist.batch_isend_irecv``: one isend and one irecv of the flat parameter vector,
   never a collective. Each work handle is waited on with the time left; a peer that dies mid-transfer
   makes the wait fail, and the link is dropped. Nothing carries over to the next outer step.

Groups larger than two (the leftover replica joining a pair) exchange over each of their pair links in
one global order (sorted by (low rank, high rank)), which cannot deadlock; every link succeeds or is
skipped on its own, and a replica averages over itself and the partners it heard from.

On GPUs the exchange still runs over gloo and TCP from host memory (the partner's tensor is copied
back to the device afterwards): that keeps the per-link deadline, which NCCL lacks.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from swarmlm.noloco.comm.base import Communicator, ExchangeResult, Traffic
from swarmlm.noloco.comm.rendezvous import ABANDONED, GO, Heartbeat, rendezvous, timedelta, wait_until

log = logging.getLogger(__name__)


class LinkSkipped(RuntimeError):
    """A partner did not arrive or did not finish within the deadline."""


def launch_key(rank: int, world_size: int) -> str:
    """A key shared by all ranks of this launch (rank 0's, broadcast), so that store keys never collide with an
    earlier run's."""
    key = [uuid.uuid4().hex[:12] if rank == 0 else None]
    if world_size > 1:
        dist.broadcast_object_list(key, src=0)
    return str(key[0])


def send_recv(pg, ranks: dict[int, int], payload: torch.Tensor, buffer: torch.Tensor, peer_index: int) -> list:
    """Start sending ``payload`` to and receiving ``buffer`` from the other rank of the two-rank group ``pg``
    (``ranks``: global rank -> group rank); returns the work handles."""
    # batch_isend_irecv accepts only groups that torch.distributed knows: register this two-rank
    # group (global rank -> group rank) for the duration of the transfer.
    c10d._world.pg_group_ranks[pg] = ranks
    ops = [dist.P2POp(dist.isend, payload, group=pg, group_peer=peer_index),
           dist.P2POp(dist.irecv, buffer, group=pg, group_peer=peer_index)]
    return dist.batch_isend_irecv(ops)


def forget_pair_group(pg) -> None:
    """Undo :func:`send_recv`'s registration of the two-rank group ``pg`` (once its transfers are done)."""
    c10d._world.pg_group_ranks.pop(pg, None)


class DistributedCommunicator(Communicator):
    """All communication of one rank (see the module docstring). ``group``: the process group of the averages
    (None: all ranks), of ``world_size`` ranks; ``store``: the job's store (None: the default group's)."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float, run_key: str,
                 store: dist.Store | None = None, group: dist.ProcessGroup | None = None):
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.run_key = run_key
        self.store = store if store is not None else c10d._get_default_store()
        self.group = group
        self.traffic = Traffic()
        self.heartbeats = Heartbeat(self.store, self.key, rank)

    def key(self, name: str) -> str:
        """A store key private to this launch."""
        return f"swarmlm/noloco/{self.run_key}/{name}"

    def subgroup(self, group: dist.ProcessGroup | None, world_size: int) -> "DistributedCommunicator":
        """A communicator whose averages run within ``group`` (of ``world_size`` ranks), sharing this one's store,
        launch key, heartbeat and traffic counters (a pipeline stage's data-parallel peers)."""
        sub = type(self).__new__(type(self))
        sub.__dict__.update(self.__dict__)
        sub.group, sub.world_size = group, world_size
        return sub

    # ----- start, stop and end together
    def gather_objects(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, obj, group=self.group)
        return everyone

    def agree_stop(self, propose: int | None) -> int | None:
        key = self.key("stop")
        if propose is not None:
            return int(self.store.compare_set(key, "", str(propose)))
        if self.store.check([key]):
            return int(self.store.get(key))
        return None

    def heartbeat(self) -> None:
        """Tell rank 0 that this rank is still making progress (a counter in the store)."""
        self.heartbeats.beat()

    def finish(self, grace_s: float) -> None:
        """Announce that this rank is done. Rank 0 then waits for the others, because under a plain env://
        launch it hosts the store that their last rendezvous need; it stops waiting for ranks whose
        heartbeat has not moved for ``grace_s`` seconds (they died)."""
        try:
            self.store.add(self.key("done"), 1)
            if self.rank != 0 or self.world_size == 1:
                return
            last: list[int] = []
            changed = time.monotonic()
            while int(self.store.add(self.key("done"), 0)) < self.world_size:
                beats = [self.heartbeats.of(r) for r in range(self.world_size)]
                if beats != last:
                    last, changed = beats, time.monotonic()
                elif time.monotonic() - changed > grace_s:
                    log.warning("rank 0: %d rank(s) did not finish and show no progress; not waiting for them",
                                self.world_size - int(self.store.add(self.key("done"), 0)))
                    return
                time.sleep(0.2)
        except (RuntimeError, dist.DistError) as err:
            log.warning("rank %d: could not report the end of training: %s", self.rank, err)

    # ----- NoLoCo: point-to-point within a group
    def exchange(self, outer_step: int, group: list[int], payload: torch.Tensor) -> ExchangeResult:
        started = time.perf_counter()
        self.heartbeat()
        result = ExchangeResult()
        host = payload.detach().to("cpu").contiguous()
        partners = [p for p in group if p != self.rank]
        links = sorted((min(self.rank, p), max(self.rank, p)) for p in partners)
        for low, high in links:
            peer = high if low == self.rank else low
            try:
                buffer = self._link(outer_step, low, high, host)
            except LinkSkipped as err:
                result.skipped[peer] = str(err)
                log.warning("outer step %d: rank %d skips partner %d: %s", outer_step, self.rank, peer, err)
                continue
            result.traffic.bytes_sent += host.numel() * host.element_size()
            result.traffic.bytes_recv += buffer.numel() * buffer.element_size()
            result.received[peer] = buffer.to(payload.device)
        result.traffic.seconds = time.perf_counter() - started
        result.traffic.skipped = len(result.skipped)
        self.traffic.add(result.traffic)
        return result

    def _link(self, outer_step: int, low: int, high: int, payload: torch.Tensor) -> torch.Tensor:
        namespace = dist.PrefixStore(self.key(f"x{outer_step}/{low}-{high}/"), self.store)
        deadline = time.monotonic() + self.timeout_s
        try:
            status = rendezvous(namespace, lambda: wait_until(namespace, deadline))
        except (RuntimeError, dist.DistError) as err:  # the store itself is unreachable
            raise LinkSkipped(f"rendezvous store unreachable: {str(err).splitlines()[0][:200]}") from None
        if status != GO:
            raise LinkSkipped("partner did not arrive within the timeout" if status == ABANDONED
                              else f"link in unexpected state {status!r}")
        peer_index = 1 if self.rank == low else 0
        buffer = torch.empty_like(payload)
        pg = None
        try:
            # The transfer gets its own deadline, measured from the moment both sides said go.
            transfer_deadline = time.monotonic() + self.timeout_s
            pg = dist.ProcessGroupGloo(dist.PrefixStore("pg/", namespace), 0 if self.rank == low else 1, 2,
                                       timedelta(self.timeout_s))
            works = self.pair_transfer(pg, {low: 0, high: 1}, payload, buffer, peer_index)
            for work in works:
                work.wait(timedelta(transfer_deadline - time.monotonic()))
        except (RuntimeError, dist.DistError) as err:
            raise LinkSkipped(f"transfer failed: {str(err).splitlines()[0][:200]}") from None
        finally:
            forget_pair_group(pg)
            del pg
        return buffer

    def pair_transfer(self, pg, ranks: dict[int, int], payload: torch.Tensor, buffer: torch.Tensor, peer_index: int) -> list:
        """The transfer of one pair link (:func:`send_recv`); the emulated link delays it."""
        return send_recv(pg, ranks, payload, buffer, peer_index)

    # ----- DiLoCo and DDP: all-reduce
    def all_reduce_mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average ``tensor`` over all ranks, in place. Bytes are counted as a ring all-reduce moves them:
        2(M−1)/M of the tensor out and in per rank."""
        started = time.perf_counter()
        if self.world_size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
            tensor.div_(self.world_size)
            self.traffic.count_allreduce(tensor, self.world_size)
        self.traffic.seconds += time.perf_counter() - started
        return tensor

    # ----- measurement only (not part of any method, not counted as traffic)
    def replica_std(self, tensor: torch.Tensor) -> float:
        if self.world_size == 1:
            return 0.0
        x = tensor.detach().to(torch.float32)
        mean = x.clone()
        dist.all_reduce(mean, op=dist.ReduceOp.SUM, group=self.group)
        mean.div_(self.world_size)
        sq = (x - mean).pow_(2).sum().reshape(1)
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.group)
        return float((sq / (self.world_size * x.numel())).sqrt())
