"""Run metrics: one JSON object per line in ``metrics.jsonl`` plus TensorBoard events beside it.

On resume, :class:`MetricsWriter` drops lines whose step is past the checkpoint being resumed, so
that a run interrupted between a log line and its checkpoint never reports a step twice.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterator


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else str(value)
    if hasattr(value, "item") and callable(value.item):
        return _jsonable(value.item())
    return value


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All records of a JSONL file; a torn last line (a crash mid-write) is ignored."""
    out = []
    path = Path(path)
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


class MetricsWriter:
    """Append metrics for one run (or one node / rank) to ``DIR/metrics.jsonl`` and TensorBoard."""

    def __init__(self, directory: str | Path, *, step_key: str = "step", resume_from: int | None = None,
                 filename: str = "metrics.jsonl", tensorboard: bool = True, fsync: bool = True):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / filename
        self.step_key = step_key
        self.fsync = fsync  # force every line to disk (off: the OS writes it later; a crash may lose the last lines)
        kept = [r for r in read_jsonl(self.path) if resume_from is not None and r.get(step_key, -1) <= resume_from]
        with open(self.path, "w") as fh:
            for record in kept:
                fh.write(json.dumps(record) + "\n")
        self._fh = open(self.path, "a", buffering=1)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # imports torch: here, not with read_jsonl's users
        self._tb = SummaryWriter(str(self.directory / "tensorboard"), purge_step=None if resume_from is None else resume_from + 1) if tensorboard else None

    def log(self, record: dict[str, Any]) -> None:
        clean = {k: _jsonable(v) for k, v in record.items()}
        self._fh.write(json.dumps(clean) + "\n")
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        if self._tb is not None:
            step = int(clean.get(self.step_key, 0))
            for key, value in _scalars({k: v for k, v in clean.items() if k != self.step_key}):
                self._tb.add_scalar(key, value, step)

    def records(self) -> Iterator[dict[str, Any]]:
        return iter(read_jsonl(self.path))

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _scalars(record: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, float]]:
    """The record's numbers as TensorBoard scalars; a nested dict's as ``key/subkey``."""
    for key, value in record.items():
        if isinstance(value, dict):
            yield from _scalars(value, f"{prefix}{key}/")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value
