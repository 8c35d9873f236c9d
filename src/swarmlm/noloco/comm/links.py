"""Point-to-point hops between pipeline neighbours, each with a deadline that can never hang a stage.

A *hop* moves one message (a small JSON header, plus zero or more tensors) from one process to one
other, under a name that both sides derive from the schedule (step, slot, direction, ranks). It has
the two phases of NoLoCo's pair exchange (:mod:`swarmlm.noloco.comm.exchange`), adapted to a pipeline:

1. **Rendezvous with a deadline** in the job's key-value store, under ``pp/<name>/``
   (:mod:`swarmlm.noloco.comm.rendezvous`). The sender writes its header, the receiver a reply (its link
   epoch, see below), and both arrive; both sides always agree whether the message moves, and a late peer
   finds the hop abandoned and moves on at once.

   In a pipeline a healthy peer can be late for a good reason: it may itself be waiting, up to the
   deadline, for a stalled process further along. So the first to arrive does not give up after a
   fixed time, but when its peer has shown **no progress for** ``timeout_s``: every process bumps a
   heartbeat counter in the store (:class:`~swarmlm.noloco.comm.rendezvous.Heartbeat`, shared with the outer step) on every
   hop and about twice a second while it waits. A stalled or dead peer stops beating and is abandoned
   after ``timeout_s``; a peer that waits for someone else keeps beating, and its wait is itself
   bounded. ``max_wait_s`` caps any one wait regardless. A peer that has been silent for
   ``dead_after_s`` (4 timeouts) is presumed dead and not waited for again until its heartbeat moves, so
   a dead process costs each neighbour a few timeouts, not one per hop. (Giving up at once on a peer that
   was silent only briefly would let the healthy processes race steps ahead of one that was merely
   slow, and lose all the micro-batches it should have handled.)

2. **Transfer** over a two-rank gloo process group per pair of neighbours (a *link*), created on first
   use and then kept (a fresh group per message would cost ~20 ms; a message on a kept link ~1 ms
   on loopback). Every ``send``/``recv`` work is waited on with the time left of a ``timeout_s``
   transfer deadline. Gloo closes a pair for good when such a wait expires, so a link that failed
   once is dropped, and the side that dropped it bumps its *epoch* for that peer. Both sides put
   their epoch in the rendezvous; the transfer uses the larger one, and a side that is behind drops
   its old link, so the two always connect to the same new group (``link/<low>-<high>/e<epoch>/``).

Headers travel through the store (they are tiny: row counts, piece ids, losses, tensor shapes);
tensors go point to point. On GPUs the tensors travel through host memory over gloo, which keeps the
deadline (NCCL has none).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

from swarmlm.noloco.comm.base import Traffic
from swarmlm.noloco.comm.rendezvous import ABANDONED, GO, Heartbeat, rendezvous, timedelta

log = logging.getLogger(__name__)

_KEYS = ("hdr", "rep", "arrived", "status", "done")
#: the pipeline's totals (:class:`~swarmlm.noloco.comm.base.Traffic`) in the metrics, and in a checkpoint
PIPE_METRIC_NAMES = {"hops": "pipe_hops", "skipped": "pipe_abandoned", "transfer_failures": "pipe_transfer_failures",
                     "bytes_sent": "pipe_bytes_sent", "bytes_recv": "pipe_bytes_recv", "seconds": "pipe_comm_s"}
PIPE_STATE_NAMES = {"hops": "hops", "skipped": "abandoned", "transfer_failures": "transfer_failures",
                    "bytes_sent": "bytes_sent", "bytes_recv": "bytes_recv", "seconds": "seconds"}


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


@dataclass
class HopResult:
    ok: bool  # the message moved (both sides said go, and the transfer finished on this side)
    header: dict = field(default_factory=dict)  # the sender's header (receiver side)
    tensors: list[torch.Tensor] = field(default_factory=list)  # received tensors, on the CPU (receiver side)
    reason: str = ""  # why not ok: "abandoned" (peer did not come in time) or "transfer: ..."
    waited_s: float = 0.0


class PipeLinks:
    """All pipeline hops of one process (see the module docstring).

    ``key`` maps a name to a store key private to this launch
    (:meth:`swarmlm.noloco.comm.exchange.DistributedCommunicator.key`).
    """

    def __init__(self, *, store: dist.Store, rank: int, key: Callable[[str], str], timeout_s: float,
                 max_wait_s: float | None = None, dead_after_s: float | None = None, heartbeat: Heartbeat | None = None):
        self.store = store
        self.rank = rank
        self.key = key
        self.timeout_s = timeout_s
        self.max_wait_s = max_wait_s if max_wait_s is not None else 8 * timeout_s
        self.dead_after_s = dead_after_s if dead_after_s is not None else 4 * timeout_s
        self.heartbeat = heartbeat if heartbeat is not None else Heartbeat(store, key, rank)
        self.traffic = Traffic()
        self._links: dict[int, tuple[int, dist.ProcessGroup]] = {}  # peer -> (epoch, two-rank gloo group)
        self._epochs: dict[int, int] = {}  # peer -> epoch this side is at
        # peer -> (its heartbeat when it was given up on for silence, since when that heartbeat has not moved)
        self._silent: dict[int, tuple[int, float]] = {}

    def keep_alive(self, on: bool) -> None:
        """Keep this process's heartbeat moving while it waits on something other than a hop (``on``), or stop."""
        self.heartbeat.keep_alive(on)

    # ----- the two sides of a hop
    def send(self, name: str, peer: int, header: dict, tensors: list[torch.Tensor] | None = None) -> HopResult:
        """Deliver ``header`` and ``tensors`` to ``peer``, which calls :meth:`recv` with the same name."""
        tensors = [t.detach().to("cpu").contiguous() for t in (tensors or [])]
        message = dict(header)
        message["tensors"] = [[list(t.shape), str(t.dtype)] for t in tensors]
        message["epoch"] = self._epochs.get(peer, 0)
        return self._hop(name, peer, sender=True, meta=message, tensors=tensors)

    def recv(self, name: str, peer: int) -> HopResult:
        """Receive what ``peer`` sends under ``name``; ``ok`` is False when it did not come in time."""
        return self._hop(name, peer, sender=False, meta={"epoch": self._epochs.get(peer, 0)}, tensors=[])

    def abandon(self, name: str) -> None:
        """Close hop ``name`` before it happens: a peer that arrives finds it abandoned at once."""
        try:
            dist.PrefixStore(self.key(f"pp/{name}/"), self.store).compare_set("status", "", ABANDONED)
        except (RuntimeError, dist.DistError):
            pass

    def _hop(self, name: str, peer: int, *, sender: bool, meta: dict, tensors: list[torch.Tensor]) -> HopResult:
        started = time.perf_counter()
        self.heartbeat.beat()
        ns = dist.PrefixStore(self.key(f"pp/{name}/"), self.store)
        try:
            ns.set("hdr" if sender else "rep", json.dumps(meta))
            status = rendezvous(ns, lambda: self._wait_for_peer(ns, peer))
            if status == GO:
                self._silent.pop(peer, None)
            else:
                self.traffic.skipped += 1
                self._done(ns)
                return self._finish(HopResult(False, reason="abandoned" if status == ABANDONED else f"state {status!r}"),
                                    started)
            other = json.loads(ns.get("rep" if sender else "hdr"))
        except (RuntimeError, dist.DistError) as err:  # the store itself failed
            self.traffic.skipped += 1
            return self._finish(HopResult(False, reason=f"store: {str(err).splitlines()[0][:200]}"), started)
        header = meta if sender else other
        result = HopResult(True, header={k: v for k, v in header.items() if k not in ("tensors", "epoch")})
        specs = header["tensors"]
        if specs:
            epoch = max(int(meta["epoch"]), int(other["epoch"]))
            try:
                result.tensors = self._transfer(peer, epoch, tensors if sender else None, specs)
            except (RuntimeError, dist.DistError, ValueError) as err:
                self._drop_link(peer, epoch + 1)
                self.traffic.transfer_failures += 1
                result = HopResult(False, reason=f"transfer: {str(err).splitlines()[0][:200]}")
            else:
                nbytes = sum(t.numel() * t.element_size() for t in (tensors if sender else result.tensors))
                if sender:
                    self.traffic.bytes_sent += nbytes
                else:
                    self.traffic.bytes_recv += nbytes
        self._done(ns)
        return self._finish(result, started)

    def _finish(self, result: HopResult, started: float) -> HopResult:
        result.waited_s = time.perf_counter() - started
        self.traffic.hops += 1
        self.traffic.seconds += result.waited_s
        return result

    def _wait_for_peer(self, ns: dist.Store, peer: int) -> None:
        """First to arrive: wait for the peer while it makes progress (the rendezvous then claims the hop as
        abandoned, a race the peer may still win).

        The wait blocks in the store in windows of ``timeout_s``; after a window the peer's heartbeat is
        read, and if it has not moved in the whole window, the peer is given up. Meanwhile a helper thread
        keeps this process's own heartbeat moving (over its own store connection), so that whoever waits
        for *this* process knows that it is alive and waiting, not stalled."""
        start = time.monotonic()
        last_beat = self.heartbeat.of(peer)
        silent = self._silent.get(peer)
        if silent is not None and silent[0] == last_beat and start - silent[1] >= self.dead_after_s:
            return  # silent for dead_after_s: presumed dead; not waited for again until its heartbeat moves
        since = silent[1] if silent is not None and silent[0] == last_beat else start
        self.keep_alive(True)
        try:
            while True:
                budget = min(self.timeout_s, start + self.max_wait_s - time.monotonic())
                if budget <= 0:
                    break
                try:
                    ns.wait(["status"], timedelta(budget))
                    break
                except (RuntimeError, dist.DistError):
                    pass  # a whole window without an answer: is the peer still making progress?
                beat = self.heartbeat.of(peer)
                if beat == last_beat:
                    self._silent[peer] = (beat, since)
                    break
                last_beat, since = beat, time.monotonic()
        finally:
            self.keep_alive(False)

    def _done(self, ns: dist.Store) -> None:
        """The second side to finish a hop deletes its keys (the store would otherwise grow every step)."""
        try:
            if ns.add("done", 1) == 2:
                for k in _KEYS:
                    ns.delete_key(k)
        except (RuntimeError, dist.DistError):
            pass

    # ----- links
    def _link(self, peer: int, epoch: int) -> dist.ProcessGroup:
        held = self._links.get(peer)
        if held is not None and held[0] == epoch:
            return held[1]
        if held is not None:
            self._drop_link(peer, epoch)
        low, high = min(self.rank, peer), max(self.rank, peer)
        prefix = dist.PrefixStore(self.key(f"link/{low}-{high}/e{epoch}/"), self.store)
        pg = dist.ProcessGroupGloo(prefix, 0 if self.rank == low else 1, 2, timedelta(self.timeout_s))
        self._links[peer] = (epoch, pg)
        self._epochs[peer] = epoch
        return pg

    def _drop_link(self, peer: int, next_epoch: int) -> None:
        held = self._links.pop(peer, None)
        self._epochs[peer] = max(self._epochs.get(peer, 0), next_epoch)
        del held

    def _transfer(self, peer: int, epoch: int, tensors: list[torch.Tensor] | None, specs: list) -> list[torch.Tensor]:
        deadline = time.monotonic() + self.timeout_s
        pg = self._link(peer, epoch)
        index = 1 if self.rank < peer else 0  # the peer's rank inside the two-rank group
        if tensors is not None:
            works = [pg.send([t], index, tag) for tag, t in enumerate(tensors)]
            out: list[torch.Tensor] = []
        else:
            out = [torch.empty(shape, dtype=_dtype(dtype)) for shape, dtype in specs]
            works = [pg.recv([t], index, tag) for tag, t in enumerate(out)]
        for work in works:
            if not work.wait(timedelta(deadline - time.monotonic())):
                raise RuntimeError("transfer did not complete in time")
        return out
