"""Ctrl+C that leaves a resumable state: the first press asks the loop to stop at the next safe
point (after the current round or step, with a checkpoint); a second press aborts at once."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading


class StopFlag:
    def __init__(self) -> None:
        self.requested = False
        self._presses = 0

    def _handler(self, signum, frame) -> None:
        self._presses += 1
        self.requested = True
        if self._presses == 1:
            print("\nstopping after the current step and saving a checkpoint (Ctrl+C again to abort)", file=sys.stderr, flush=True)
        else:
            raise KeyboardInterrupt


@contextlib.contextmanager
def graceful_interrupt():
    """Yield a :class:`StopFlag` that SIGINT and SIGTERM set; handlers are restored on exit."""
    flag = StopFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, flag._handler)
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
