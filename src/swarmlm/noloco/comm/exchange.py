"""Communication of the three methods, with byte and time accounting.

:class:`Communicator` is the one place where replicas talk to each other: NoLoCo's group exchange,
DiLoCo's and DDP's all-reduce, and the (log-only) model-std measurement. A network model that
delays or throttles messages can subclass it and wrap :meth:`Communicator.exchange` and
:meth:`Communicator.all_reduce_mean_`, so that every method pays for the same link.

NoLoCo's exchange is point-to-point only, with a deadline
--------------------------------------------------------
Gloo's receive has no per-operation timeout that leaves the connection usable: a ``wait(timeout)``
that expires closes the pair for good ("Application timeout caused pair closure"). So each pair of
replicas that averages at outer step k gets a link of its own, used once:

1. **Rendezvous with a deadline** through the job's key-value store (the torchrun / c10d store that
   already exists for start-up). In the namespace ``noloco/<run>/x<k>/<a>-<b>/`` both sides
   ``add("arrived", 1)``. The second to arrive claims the link with ``compare_set(status, "", "go")``;
   the first waits for ``status`` until ``exchange.timeout_s`` and, if nobody came, claims it with
   ``compare_set(status, "", "abandoned")``. ``compare_set`` is atomic, so the two sides always agree:
   either both exchange or both skip. A stalled partner that turns up late finds ``abandoned`` and
   skips at once instead of waiting for a peer that has moved on.
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

import datetime
import logging
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

log = logging.getLogger(__name__)

GO = b"go"
ABANDONED = b"abandoned"


class LinkSkipped(RuntimeError):
    """A partner did not arrive or did not finish within the deadline."""


@dataclass
class ExchangeResult:
    received: dict[int, torch.Tensor] = field(default_factory=dict)  # partner rank -> its payload
    skipped: dict[int, str] = field(default_factory=dict)  # partner rank -> why
    bytes_sent: int = 0
    bytes_recv: int = 0
    seconds: float = 0.0


@dataclass
class Traffic:
    """Cumulative totals of one rank's communication."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    seconds: float = 0.0
    skipped: int = 0

    def count_allreduce(self, tensor: torch.Tensor, world_size: int) -> None:
        """Bytes of an all-reduce of ``tensor``, counted as a ring moves them: 2(M−1)/M of it out and in per rank."""
        moved = int(2 * (world_size - 1) / world_size * tensor.numel() * tensor.element_size())
        self.bytes_sent += moved
        self.bytes_recv += moved

    def as_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "bytes_recv": self.bytes_recv, "comm_s": self.seconds,
                "skipped_total": self.skipped}


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(0.001, seconds))


class Communicator:
    """All communication of one rank (see the module docstring)."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float, run_key: str,
                 store: dist.Store | None = None, group: dist.ProcessGroup | None = None):
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.run_key = run_key
        self.store = store if store is not None else c10d._get_default_store()
        self.group = group
        self.traffic = Traffic()

    def key(self, name: str) -> str:
        """A store key private to this launch."""
        return f"swarmlm/noloco/{self.run_key}/{name}"

    # ----- liveness, for a clean end without a collective
    def heartbeat(self) -> None:
        """Tell rank 0 that this rank is still making progress (a counter in the store)."""
        try:
            self.store.add(self.key(f"beat/{self.rank}"), 1)
        except (RuntimeError, dist.DistError):
            pass

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
                beats = [int(self.store.add(self.key(f"beat/{r}"), 0)) for r in range(self.world_size)]
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
        """Send ``payload`` to every other member of ``group`` and receive theirs; partners that do not
        answer within the deadline are skipped. ``payload`` must be the same size on every member."""
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
            result.bytes_sent += host.numel() * host.element_size()
            result.bytes_recv += buffer.numel() * buffer.element_size()
            result.received[peer] = buffer.to(payload.device)
        result.seconds = time.perf_counter() - started
        self.traffic.bytes_sent += result.bytes_sent
        self.traffic.bytes_recv += result.bytes_recv
        self.traffic.seconds += result.seconds
        self.traffic.skipped += len(result.skipped)
        return result

    def _link(self, outer_step: int, low: int, high: int, payload: torch.Tensor) -> torch.Tensor:
        namespace = dist.PrefixStore(self.key(f"x{outer_step}/{low}-{high}/"), self.store)
        deadline = time.monotonic() + self.timeout_s
        status = self._rendezvous(namespace, deadline)
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
                                       _timedelta(self.timeout_s))
            works = self._send_recv(pg, {low: 0, high: 1}, payload, buffer, peer_index)
            for work in works:
                work.wait(_timedelta(transfer_deadline - time.monotonic()))
        except (RuntimeError, dist.DistError) as err:
            raise LinkSkipped(f"transfer failed: {str(err).splitlines()[0][:200]}") from None
        finally:
            c10d._world.pg_group_ranks.pop(pg, None)
            del pg
        return buffer

    def _rendezvous(self, namespace: dist.Store, deadline: float) -> bytes:
        try:
            order = namespace.add("arrived", 1)
            if order == 1:
                try:
                    namespace.wait(["status"], _timedelta(deadline - time.monotonic()))
                except (RuntimeError, dist.DistError):
                    pass  # nobody came: try to close the link below (the partner may still win the race)
                return namespace.compare_set("status", "", ABANDONED)
            if order == 2:
                return namespace.compare_set("status", "", GO)
            return b"crowded"
        except (RuntimeError, dist.DistError) as err:  # the store itself is unreachable
            raise LinkSkipped(f"rendezvous store unreachable: {str(err).splitlines()[0][:200]}") from None

    @staticmethod
    def _send_recv(pg, ranks: dict[int, int], payload: torch.Tensor, buffer: torch.Tensor, peer_index: int):
        # batch_isend_irecv accepts only groups that torch.distributed knows: register this two-rank
        # group (global rank -> group rank) for the duration of the transfer.
        c10d._world.pg_group_ranks[pg] = ranks
        ops = [dist.P2POp(dist.isend, payload, group=pg, group_peer=peer_index),
               dist.P2POp(dist.irecv, buffer, group=pg, group_peer=peer_index)]
        return dist.batch_isend_irecv(ops)

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
        """RMS deviation of the replicas' ``tensor`` from its mean over replicas (a collective)."""
        if self.world_size == 1:
            return 0.0
        x = tensor.detach().to(torch.float32)
        mean = x.clone()
        dist.all_reduce(mean, op=dist.ReduceOp.SUM, group=self.group)
        mean.div_(self.world_size)
        sq = (x - mean).pow_(2).sum().reshape(1)
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.group)
        return float((sq / (self.world_size * x.numel())).sqrt())
