"""swarmlm's on-disk cache (warm starts, tokenized corpora) and the lock that guards filling it.

A light module on purpose: NoLoCo workers import it without the task libraries of the warm start.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator


def cache_root() -> Path:
    """``$SWARMLM_CACHE``, or ``~/.cache/swarmlm``."""
    return Path(os.environ.get("SWARMLM_CACHE", Path.home() / ".cache" / "swarmlm"))


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created with its parents), so that concurrent processes fill a cache
    entry once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
