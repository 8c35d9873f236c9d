"""M replicas in one process, on one device: the in-process backend (``swarmlm noloco train --backend in_process``).

Each replica is a :class:`~swarmlm.noloco.replica.Replica`, exactly as in a torch.distributed run, running in a thread
of its own; only its :class:`~swarmlm.noloco.comm.base.Communicator` differs. The outer steps, the groups and the
maths are the same code; what the transport does is done here, through memory:

* **Turns.** One replica runs at a time (:class:`Turns`). A replica gives up its turn only inside a communication
  call: when it must wait for others (an all-reduce, a partner), and once per inner step (the stop check of NoLoCo
  and DiLoCo), so the replicas advance step by step, in rank order, on one core or one GPU. Each replica keeps its
  own torch random state across turns, as it would in its own process. A wait that nobody can end (every replica
  waiting) is an error, not a hang.
* **Messages.** An exchange posts a copy of the payload under its link (outer step, low rank, high rank) and reads
  the partner's; an all-reduce sums the replicas' tensors in rank order and divides by M, the formula of the
  torch.distributed backend (whose summation order may differ in the last bits).
* **Time.** Nothing sleeps. Each replica has a simulated clock (:class:`SimulatedClock`): the real
  time it computes inside :meth:`SimulatedClock.on_clock` (one replica at a time, so nothing else runs
  meanwhile; on a GPU each charge first synchronises the device), plus the link model's cost of every message
  (:class:`~swarmlm.noloco.comm.link_model.LinkModel`: ``--network.latency-ms``, ``--network.bandwidth-gbit``,
  ``--network.allreduce``). At a synchronisation a replica first waits, on the simulated clock, for those it
  synchronises with: all of them for an all-reduce, the partner for NoLoCo's pair link, with the deadline of the
  real rendezvous (``--exchange.timeout-s``: a partner later than that is skipped by both sides, as over gloo). An
  injected stall (``--faults.stall-rank``) only advances the stalled replica's clock, so a straggler makes exactly
  its partners wait. ``comm_s`` in the metrics is simulated seconds of communication, waiting included; ``sim_s``
  is the replica's simulated wall-clock.

What is not simulated: the bytes do not cross a network, so no packet is lost, reordered or corrupted and the
link is the same between every two replicas; a replica cannot die alone (``--faults.exit-rank`` is refused);
evaluation, checkpoints and the model-std measurement are off the clock.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from swarmlm.noloco.comm.base import Communicator, ExchangeResult, Traffic
from swarmlm.noloco.comm.clock import RunClock
from swarmlm.noloco.comm.link_model import LinkModel

log = logging.getLogger(__name__)


class InProcessAborted(Exception):
    """Another replica of the process failed, so this one stops too. (Not a RuntimeError: the replica's loop
    treats those from its stop check as a missing store and carries on.)"""


class InProcessDeadlock(Exception):
    """Every replica waits for another: the replicas called mismatched collectives or groups."""


class Turns:
    """Cooperative turns between M threads: exactly one holds the turn and runs; the others wait.

    A thread gives up its turn with :meth:`wait_until`, naming what it waits for (a predicate on the shared state,
    evaluated by whoever holds the turn); the turn goes to the next thread in rank order that can run. So the
    shared state changes only under the turn, and needs no locks of its own.
    """

    def __init__(self, m: int):
        self.m = m
        self._lock = threading.Lock()
        self._wake = [threading.Condition(self._lock) for _ in range(m)]
        self.holder = 0
        self.waiting: dict[int, Callable[[], bool] | None] = {}
        self.done: set[int] = set()
        self.error: BaseException | None = None
        self._rng: dict[int, tuple[torch.Tensor, Any]] = {}

    # ----- the random state travels with the turn, as if every replica had its own process
    def _save_rng(self, rank: int) -> None:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        self._rng[rank] = (torch.get_rng_state(), cuda)

    def _restore_rng(self, rank: int) -> None:
        saved = self._rng.pop(rank, None)
        if saved is not None:
            torch.set_rng_state(saved[0])
            if saved[1] is not None:
                torch.cuda.set_rng_state_all(saved[1])

    def _runnable(self, rank: int) -> bool:
        if rank in self.done:
            return False
        ready = self.waiting.get(rank)
        return ready is None or bool(ready())

    def _next(self, rank: int) -> int | None:
        """The next rank after ``rank`` (``rank`` itself last) that can run, or None."""
        for k in range(1, self.m + 1):
            r = (rank + k) % self.m
            if self._runnable(r):
                return r
        return None

    def _deadlock(self) -> InProcessDeadlock:
        stuck = sorted(r for r in range(self.m) if r not in self.done)
        return InProcessDeadlock(f"in-process backend: replicas {stuck} all wait for each other (mismatched collectives or "
                            "groups)")

    def _await(self, rank: int) -> None:
        """Wait, holding the lock, until the turn is ``rank``'s."""
        while self.holder != rank and self.error is None:
            self._wake[rank].wait()
        if self.error is not None:
            raise InProcessAborted(f"replica {rank} stops: {type(self.error).__name__}: {self.error}")
        self.waiting.pop(rank, None)

    def _pass(self, rank: int, nxt: int | None) -> None:
        if nxt is None:
            self.error = self._deadlock()
            for cond in self._wake:
                cond.notify()
            raise self.error
        self.holder = nxt
        self._wake[nxt].notify()

    def begin(self, rank: int) -> None:
        """A replica's thread starts: it waits for its first turn."""
        with self._lock:
            self.waiting[rank] = None
            self._await(rank)

    def wait_until(self, rank: int, ready: Callable[[], bool] | None) -> None:
        """Give up the turn until ``ready()`` holds (None: only let the others run once) and the turn is back."""
        self._save_rng(rank)
        with self._lock:
            self.waiting[rank] = ready
            self._pass(rank, self._next(rank))
            self._await(rank)
        self._restore_rng(rank)

    def finish(self, rank: int) -> None:
        """A replica's thread ends: the turn goes on to the others."""
        with self._lock:
            self.done.add(rank)
            self.waiting.pop(rank, None)
            if len(self.done) < self.m and self.error is None:
                self._pass(rank, self._next(rank))

    def fail(self, rank: int, err: BaseException) -> None:
        """A replica's thread raised: every other one stops at its next wait."""
        with self._lock:
            if self.error is None:
                self.error = err
            self.done.add(rank)
            for cond in self._wake:
                cond.notify()


@dataclass
class _Collective:
    kind: str
    contributions: dict[int, Any] = field(default_factory=dict)
    arrivals: dict[int, float] = field(default_factory=dict)
    result: Any = None
    reduced: bool = False
    taken: int = 0


@dataclass
class _Link:
    posted: dict[int, tuple[float, torch.Tensor]] = field(default_factory=dict)  # rank -> (arrival, payload copy)
    reads: int = 0


class InProcessHub:
    """What the M replicas of one process share: their turns, the messages in flight, the agreed stop step, and the
    link model. ``device``: where they train (a CUDA device is synchronised before each time measurement)."""

    def __init__(self, m: int, *, link: LinkModel | None = None, timeout_s: float = math.inf,
                 device: torch.device | None = None):
        self.m = m
        self.link = link if link is not None else LinkModel()
        self.timeout_s = timeout_s
        self.turns = Turns(m)
        self.collectives: dict[int, _Collective] = {}
        self.links: dict[tuple[int, int, int], _Link] = {}
        self.stop_at: int | None = None
        self.cuda = device is not None and device.type == "cuda"
        self.device = device

    def communicator(self, rank: int) -> "InProcessCommunicator":
        return InProcessCommunicator(self, rank)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def run(self, body: Callable[[int], Any], poll_s: float = 0.2) -> dict[int, Any]:
        """``body(rank)`` for every rank, each in a thread of its own, one at a time in turn; returns rank -> result.
        The first failure is raised once every thread has stopped."""
        results: dict[int, Any] = {}

        def main(rank: int) -> None:
            try:
                self.turns.begin(rank)
                results[rank] = body(rank)
                self.turns.finish(rank)
            except InProcessAborted:
                with self.turns._lock:
                    self.turns.done.add(rank)
            except BaseException as err:  # noqa: BLE001 - handed to the caller's thread below
                self.turns.fail(rank, err)

        threads = [threading.Thread(target=main, args=(r,), name=f"replica-{r}", daemon=True) for r in range(self.m)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # a bounded join keeps the main thread responsive to Ctrl+C
                t.join(poll_s)
        if self.turns.error is not None:
            raise self.turns.error
        return results


class SimulatedClock(RunClock):
    """One replica's simulated wall-clock (see the module docstring): :attr:`now` advances by the real compute
    inside :meth:`on_clock` (one replica at a time, so nothing else runs meanwhile) and by what the communicator
    charges for its messages; the real seconds spent inside the communicator's calls (the others' turns) are not
    compute."""

    def __init__(self, comm: "InProcessCommunicator"):
        super().__init__(comm)
        self.hub = comm.hub
        self.now = 0.0  # simulated seconds
        self._blocked = 0.0  # real seconds inside the communicator's calls
        self._busy_since: float | None = None

    @property
    def blocked_s(self) -> float:
        return self._blocked

    @property
    def sim_s(self) -> float:
        return self.now

    @contextlib.contextmanager
    def on_clock(self) -> Iterator[None]:
        self.hub.sync()
        self._busy_since = time.perf_counter()
        try:
            yield
        finally:
            self.charge()
            self._busy_since = None

    def charge(self) -> None:
        """Add the compute since the last charge to the clock (inside on_clock only)."""
        if self._busy_since is not None:
            self.hub.sync()
            now = time.perf_counter()
            self.now += now - self._busy_since
            self._busy_since = now

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Around every communicator call: compute so far is charged; the real time inside is not compute."""
        self.charge()
        started = time.perf_counter()
        try:
            yield
        finally:
            now = time.perf_counter()
            self._blocked += now - started
            if self._busy_since is not None:
                self._busy_since = now

    def resume(self, seconds: float) -> None:
        self.now = float(seconds)

    def stall(self, seconds: float) -> None:
        self.charge()
        self.now += seconds


class InProcessCommunicator(Communicator):
    """One replica's view of the :class:`InProcessHub` (see the module docstring); its time is
    :attr:`sim_clock`."""

    def __init__(self, hub: InProcessHub, rank: int):
        self.hub = hub
        self.rank = rank
        self.world_size = hub.m
        self.traffic = Traffic()
        self.sim_clock = SimulatedClock(self)
        self._sequence = 0  # collectives called so far (every replica calls them in the same order)
        self._computed_together = False  # whether this step's computation already let the others run

    def _wait(self, ready: Callable[[], bool] | None) -> None:
        self.hub.turns.wait_until(self.rank, ready)

    # ----- collectives: every replica contributes, the first to go on reduces, each takes the result
    def _collective(self, kind: str, contribution: Any, reduce: Callable[[list[Any]], Any]) -> _Collective:
        seq = self._sequence
        self._sequence += 1
        slot = self.hub.collectives.setdefault(seq, _Collective(kind))
        if slot.kind != kind:
            raise RuntimeError(f"in-process backend: replica {self.rank} called {kind} where another replica called "
                               f"{slot.kind} (collective {seq})")
        slot.contributions[self.rank] = contribution
        slot.arrivals[self.rank] = self.sim_clock.now
        self._wait(lambda: len(slot.arrivals) == self.world_size)
        if not slot.reduced:
            slot.result = reduce([slot.contributions[r] for r in range(self.world_size)])
            slot.reduced = True
            slot.contributions.clear()  # the result is all the others need
        slot.taken += 1
        if slot.taken == self.world_size:
            del self.hub.collectives[seq]
        return slot

    def gather_objects(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        with self.sim_clock.call():
            return list(self._collective("gather_objects", obj, list).result)

    def all_reduce_mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average over the replicas, in place: the sum in rank order, divided by M; the simulated clock waits for
        the last replica, then pays the link model's all-reduce."""
        if self.world_size == 1:
            return tensor
        with self.sim_clock.call():
            def mean(tensors: list[torch.Tensor]) -> torch.Tensor:
                total = tensors[0].detach().clone()
                for t in tensors[1:]:
                    total.add_(t)
                return total.div_(self.world_size)

            slot = self._collective("all_reduce", tensor, mean)
            tensor.copy_(slot.result)
            end = self.hub.link.allreduce_end_s([slot.arrivals[r] for r in range(self.world_size)],
                                                tensor.numel() * tensor.element_size())
            self.traffic.seconds += end - self.sim_clock.now
            self.sim_clock.now = end
            self.traffic.count_allreduce(tensor, self.world_size)
        return tensor

    def compute_together(self, part: Any, compute: Callable[[list[Any]], Any], on_clock: bool = True) -> Any:
        """One computation for all replicas, cheaper done at once (the stacked inner step,
        :mod:`swarmlm.noloco.stacked_step`): every replica hands in its ``part``, the first to go on runs
        ``compute`` over the parts in rank order, and each gets the result. Not communication: with ``on_clock``
        each replica's simulated clock is charged an equal share of the computation's time, as if it had computed
        its part alone (off it, as evaluation is, nothing)."""
        with self.sim_clock.call():
            def timed(parts: list[Any]) -> tuple[Any, float]:
                self.hub.sync()
                started = time.perf_counter()
                result = compute(parts)
                self.hub.sync()
                return result, time.perf_counter() - started

            result, seconds = self._collective("compute_together", part, timed).result
            if on_clock:
                self.sim_clock.now += seconds / self.world_size
                self._computed_together = True
        return result

    def replica_std(self, tensor: torch.Tensor) -> float:
        """A measurement, as in the torch.distributed backend: not on the clock, not counted as traffic."""
        if self.world_size == 1:
            return 0.0
        with self.sim_clock.call():
            def std(tensors: list[torch.Tensor]) -> float:
                mean = tensors[0].clone()
                for t in tensors[1:]:
                    mean.add_(t)
                mean.div_(self.world_size)
                sq = sum(float((t - mean).pow_(2).sum()) for t in tensors)
                return math.sqrt(sq / (self.world_size * mean.numel()))

            return self._collective("replica_std", tensor.detach().to(torch.float32), std).result

    # ----- NoLoCo: pair links within a group
    def exchange(self, outer_step: int, group: list[int], payload: torch.Tensor) -> ExchangeResult:
        result = ExchangeResult()
        with self.sim_clock.call():
            started = self.sim_clock.now
            sent = payload.detach().clone()  # what travels: the partner reads this copy
            nbytes = sent.numel() * sent.element_size()
            partners = [p for p in group if p != self.rank]
            # one global order of the links, as over gloo: a group of three cannot deadlock
            for low, high in sorted((min(self.rank, p), max(self.rank, p)) for p in partners):
                peer = high if low == self.rank else low
                key = (outer_step, low, high)
                link = self.hub.links.setdefault(key, _Link())
                link.posted[self.rank] = (self.sim_clock.now, sent)
                # a partner whose thread has ended never comes: the real rendezvous would time out
                self._wait(lambda: peer in link.posted or peer in self.hub.turns.done)
                if peer in link.posted:
                    arrival, theirs = link.posted[peer]
                else:
                    arrival, theirs = math.inf, None
                mine, _, ok = self.hub.link.pair_end_s(self.sim_clock.now, arrival, nbytes, self.hub.timeout_s)
                if ok:
                    if theirs.shape != sent.shape:
                        raise RuntimeError(f"in-process backend: replica {peer} sent {tuple(theirs.shape)} to replica "
                                           f"{self.rank}, which sent {tuple(sent.shape)}")
                    result.received[peer] = theirs
                    result.traffic.bytes_sent += nbytes
                    result.traffic.bytes_recv += theirs.numel() * theirs.element_size()
                else:
                    late = "never came" if math.isinf(arrival) else f"came {abs(arrival - self.sim_clock.now):.1f} s apart"
                    result.skipped[peer] = (f"partner did not arrive within the timeout ({late} on the simulated "
                                            "clock)")
                    log.warning("outer step %d: replica %d skips partner %d: %s", outer_step, self.rank, peer,
                                result.skipped[peer])
                self.sim_clock.now = mine
                link.reads += 1
                if link.reads == 2 or peer not in link.posted:
                    self.hub.links.pop(key, None)
            result.traffic.seconds = self.sim_clock.now - started
            result.traffic.skipped = len(result.skipped)
            self.traffic.add(result.traffic)
        return result

    # ----- stopping together: a stop proposed by any replica is the stop of all
    def agree_stop(self, propose: int | None) -> int | None:
        """Also the per-step turn: the replica lets the others take their step before it goes on (unless it already
        did in this step, in :meth:`compute_together`)."""
        with self.sim_clock.call():
            if propose is not None and self.hub.stop_at is None:
                self.hub.stop_at = propose
            if not self._computed_together:
                self._wait(None)
            self._computed_together = False
            return self.hub.stop_at
