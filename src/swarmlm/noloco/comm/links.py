"""Point-to-point hops between pipeline neighbours, each with a deadline that can never hang a stage.

A *hop* moves one message (a small JSON header, plus zero or more tensors) from one process to one
other, under a name that both sides derive from the schedule (step, slot, direction, ranks). It has
the two phases of NoLoCo's pair exchange (:mod:`swarmlm.noloco.exchange`), adapted to a pipeline:

1. **Rendezvous with a deadline** in the job's key-value store, under ``pp/<name>/``. The sender
   writes its header, the receiver a reply (its link epoch, see below); both ``add("arrived", 1)``.
   The second to arrive claims the hop with ``compare_set(status, "", "go")``; the first waits for
   ``status`` and, if it gives up, claims ``"abandoned"``. ``compare_set`` is atomic, so both sides
   always agree whether the message moves. A late peer finds ``abandoned`` and moves on at once.

   In a pipeline a healthy peer can be late for a good reason: it may itself be waiting, up to the
   deadline, for a stalled process further along. So the first to arrive does not give up after a
   fixed time, but when its peer has shown **no progress for** ``timeout_s``: every process bumps a
   heartbeat counter in the store (``beat/<rank>``, the key :class:`Communicator` uses too) on every
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

import datetime
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

GO = b"go"
ABANDONED = b"abandoned"
_KEYS = ("hdr", "rep", "arrived", "status", "done")


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=max(0.001, seconds))


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


@dataclass
class HopTraffic:
    """Cumulative totals of one process's pipeline hops."""

    hops: int = 0
    abandoned: int = 0
    transfer_failures: int = 0
    bytes_sent: int = 0
    bytes_recv: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"pipe_hops": self.hops, "pipe_abandoned": self.abandoned, "pipe_transfer_failures": self.transfer_failures,
                "pipe_bytes_sent": self.bytes_sent, "pipe_bytes_recv": self.bytes_recv, "pipe_comm_s": self.seconds}

    def state_dict(self) -> dict:
        return dict(self.__dict__)

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            if k in self.__dict__:
                setattr(self, k, v)


class PipeLinks:
    """All pipeline hops of one process (see the module docstring).

    ``key`` maps a name to a store key private to this launch (:meth:`Communicator.key`).
    """

    BEAT_EVERY_S = 0.5

    def __init__(self, *, store: dist.Store, rank: int, key: Callable[[str], str], timeout_s: float,
                 max_wait_s: float | None = None, dead_after_s: float | None = None):
        self.store = store
        self.rank = rank
        self.key = key
        self.timeout_s = timeout_s
        self.max_wait_s = max_wait_s if max_wait_s is not None else 8 * timeout_s
        self.dead_after_s = dead_after_s if dead_after_s is not None else 4 * timeout_s
        self.traffic = HopTraffic()
        self._links: dict[int, tuple[int, dist.ProcessGroup]] = {}  # peer -> (epoch, two-rank gloo group)
        self._epochs: dict[int, int] = {}  # peer -> epoch this side is at
        # peer -> (its heartbeat when it was given up on for silence, since when that heartbeat has not moved)
        self._silent: dict[int, tuple[int, float]] = {}
        self._last_beat = 0.0
        self._waiting = threading.Event()  # set while this process waits for a peer (see _wait_for_peer)
        self._beater: threading.Thread | None = None

    # ----- liveness
    def beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_beat >= self.BEAT_EVERY_S:
            self._last_beat = now
            try:
                self.store.add(self.key(f"beat/{self.rank}"), 1)
            except (RuntimeError, dist.DistError):
                pass

    def _peer_beat(self, peer: int) -> int:
        return int(self.store.add(self.key(f"beat/{peer}"), 0))

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
        self.beat(force=True)
        ns = dist.PrefixStore(self.key(f"pp/{name}/"), self.store)
        try:
            ns.set("hdr" if sender else "rep", json.dumps(meta))
            order = ns.add("arrived", 1)
            if order == 1:
                status = self._wait_for_peer(ns, peer)
            elif order == 2:
                status = ns.compare_set("status", "", GO)
            else:
                status = b"crowded"
            if status != GO:
                self.traffic.abandoned += 1
                self._done(ns)
                return self._finish(HopResult(False, reason="abandoned" if status == ABANDONED else f"state {status!r}"),
                                    started)
            other = json.loads(ns.get("rep" if sender else "hdr"))
        except (RuntimeError, dist.DistError) as err:  # the store itself failed
            self.traffic.abandoned += 1
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

    def _wait_for_peer(self, ns: dist.Store, peer: int) -> bytes:
        """First to arrive: wait for the peer while it makes progress; then claim the hop as abandoned
        (the peer may win that race, and then the answer is go).

        The wait blocks in the store in windows of ``timeout_s``; after a window the peer's heartbeat is
        read, and if it has not moved in the whole window, the peer is given up. Meanwhile a helper thread
        keeps this process's own heartbeat moving (over its own store connection), so that whoever waits
        for *this* process knows that it is alive and waiting, not stalled."""
        start = time.monotonic()
        last_beat = self._peer_beat(peer)
        silent = self._silent.get(peer)
        if silent is not None and silent[0] == last_beat and start - silent[1] >= self.dead_after_s:
            # Silent for dead_after_s: presumed dead; do not wait for it again until its heartbeat moves.
            return ns.compare_set("status", "", ABANDONED)
        since = silent[1] if silent is not None and silent[0] == last_beat else start
        self.keep_alive(True)
        try:
            while True:
                budget = min(self.timeout_s, start + self.max_wait_s - time.monotonic())
                if budget <= 0:
                    break
                try:
                    ns.wait(["status"], _timedelta(budget))
                    break
                except (RuntimeError, dist.DistError):
                    pass  # a whole window without an answer: is the peer still making progress?
                beat = self._peer_beat(peer)
                if beat == last_beat:
                    self._silent[peer] = (beat, since)
                    break
                last_beat, since = beat, time.monotonic()
        finally:
            self.keep_alive(False)
        status = ns.compare_set("status", "", ABANDONED)
        if status == GO:
            self._silent.pop(peer, None)
        return status

    def keep_alive(self, on: bool) -> None:
        """Keep this process's heartbeat moving from a helper thread (``on``) or stop (``off``): for waits in
        which the main thread is blocked on someone else, such as a hop or the outer step's exchange."""
        if not on:
            self._waiting.clear()
            return
        if self._beater is None:
            try:
                store = self.store.clone()  # a second connection: the main one is blocked in wait()
            except (RuntimeError, AttributeError, dist.DistError):
                store = self.store
            key = self.key(f"beat/{self.rank}")

            def beat_while_waiting() -> None:
                while True:
                    self._waiting.wait()
                    try:
                        store.add(key, 1)
                    except (RuntimeError, dist.DistError):
                        return
                    time.sleep(self.BEAT_EVERY_S)

            self._beater = threading.Thread(target=beat_while_waiting, name="pipeline-heartbeat", daemon=True)
            self._beater.start()
        self._waiting.set()

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
        pg = dist.ProcessGroupGloo(prefix, 0 if self.rank == low else 1, 2, _timedelta(self.timeout_s))
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
            if not work.wait(_timedelta(deadline - time.monotonic())):
                raise RuntimeError("transfer did not complete in time")
        return out

    def close(self) -> None:
        self._links.clear()
