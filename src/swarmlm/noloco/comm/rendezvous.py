"""The deadline rendezvous: how two processes agree, through the job's key-value store, whether a point-to-point
transfer between them happens, so that neither ever waits for a peer that will not come.

Gloo's receive has no per-operation timeout that leaves the connection usable (a ``wait(timeout)`` that
expires closes the pair for good), so a transfer is only started once both sides are known to be there:

* both sides ``add("arrived", 1)`` in a namespace of the store that they derive alike (the outer step's pair,
  or the pipeline hop's name);
* the second to arrive claims the transfer with ``compare_set(status, "", "go")``;
* the first waits for ``status`` (for how long is the caller's policy: a fixed deadline for the outer step's
  exchange, "while the peer makes progress" for pipeline hops) and, if it gives up, claims
  ``compare_set(status, "", "abandoned")``.

``compare_set`` is atomic, so the two sides always agree: either both transfer or both skip, and a peer that
turns up late finds ``abandoned`` and moves on at once.

Liveness travels through the same store: every process bumps its heartbeat counter ``beat/<rank>``
(:class:`Heartbeat`), so that whoever waits for it can tell a live but busy peer from a stalled or dead one.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

GO = b"go"
ABANDONED = b"abandoned"
CROWDED = b"crowded"  # a third arrival: the namespace was not private to a pair


def timedelta(seconds: float) -> datetime.timedelta:
    """A store or gloo timeout of ``seconds`` (at least a millisecond: zero would mean no timeout)."""
    return datetime.timedelta(seconds=max(0.001, seconds))


def rendezvous(namespace: dist.Store, wait: Callable[[], None]) -> bytes:
    """Arrive in ``namespace`` and return the agreed status: :data:`GO`, :data:`ABANDONED` or :data:`CROWDED`.

    The first to arrive calls ``wait()``, which returns once ``status`` is set or once it gives up (it must not
    raise for a timeout); the first then tries to close the namespace, which the second may still win. Errors of
    the store itself propagate."""
    order = namespace.add("arrived", 1)
    if order == 1:
        wait()
        return namespace.compare_set("status", "", ABANDONED)
    if order == 2:
        return namespace.compare_set("status", "", GO)
    return CROWDED


def wait_until(namespace: dist.Store, deadline: float) -> None:
    """Wait for ``status`` in ``namespace`` until ``deadline`` (``time.monotonic()``), without raising on timeout."""
    try:
        namespace.wait(["status"], timedelta(deadline - time.monotonic()))
    except (RuntimeError, dist.DistError):
        pass  # nobody came: the caller closes the namespace (the partner may still win that race)


class Heartbeat:
    """This process's liveness counter in the store (``beat/<rank>``), and its peers'. ``key`` maps a name to a
    store key private to this launch."""

    EVERY_S = 0.5  # how often the helper thread beats while this process waits (see keep_alive)

    def __init__(self, store: dist.Store, key: Callable[[str], str], rank: int):
        self.store = store
        self.key = key
        self.rank = rank
        self._waiting = threading.Event()  # set while this process waits on someone else
        self._beater: threading.Thread | None = None

    def beat(self) -> None:
        """One beat (a store that cannot be reached is ignored: the next beat will tell)."""
        try:
            self.store.add(self.key(f"beat/{self.rank}"), 1)
        except (RuntimeError, dist.DistError):
            pass

    def of(self, rank: int) -> int:
        """``rank``'s beats so far."""
        return int(self.store.add(self.key(f"beat/{rank}"), 0))

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
                    time.sleep(self.EVERY_S)

            self._beater = threading.Thread(target=beat_while_waiting, name="pipeline-heartbeat", daemon=True)
            self._beater.start()
        self._waiting.set()
