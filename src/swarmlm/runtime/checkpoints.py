"""Resumable checkpoints: the model through ``save_pretrained`` (safetensors), the optimizer state and a
JSON state beside it, and the RNG states.

Layout: ``DIR/step-000042/`` per checkpoint, and ``DIR/latest`` naming the newest complete one.
A checkpoint is written to a temporary directory first and ``latest`` is replaced atomically, so a
process killed at any moment leaves the previous checkpoint intact.

Retention (``keep``): older checkpoints are removed only once the new one is complete and ``latest`` names
it, and each is first renamed out of the ``step-*`` namespace and only then deleted, so a process killed
while deleting never leaves a half-deleted directory that looks like a checkpoint. Re-saving a step moves
the old copy aside (``.old-step-*``, still read as a checkpoint) until the new one is in place.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

LATEST = "latest"


@dataclass
class Checkpoint:
    path: Path
    step: int
    state: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    with open(tmp) as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_model(model: torch.nn.Module, path: Path) -> None:
    """``save_pretrained`` on every rank. Transformers >= 5 writes nothing on ranks other than 0 once
    torch.distributed is initialised, but here each rank checkpoints its own model (NoLoCo replicas,
    SAPO nodes), so that check is lifted for this call."""
    if hasattr(model, "should_save_on_this_rank"):
        model.should_save_on_this_rank = lambda is_main_process: is_main_process  # instance attribute, removed below
        try:
            model.save_pretrained(path, safe_serialization=True)
        finally:
            del model.should_save_on_this_rank
    else:
        model.save_pretrained(path, safe_serialization=True)


def _remove(path: Path) -> None:
    """Delete directory ``path``: renamed first (atomic) to a ``.trash-*`` name no reader looks at, then removed."""
    if not path.exists():
        return
    trash = path.with_name(f".trash-{path.name.lstrip('.')}-{os.getpid()}")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def remove_checkpoints(directory: str | Path) -> None:
    """Delete every checkpoint under ``directory`` (the directory itself), renamed away first like any removal."""
    _remove(Path(directory))


_STEP_DIR = re.compile(r"(?:\.old-)?step-(\d+)")


def _step_of(path: Path) -> int | None:
    match = _STEP_DIR.fullmatch(path.name)
    return int(match.group(1)) if match else None


def _complete(directory: Path) -> dict[int, Path]:
    """Step -> directory of every complete checkpoint under ``directory``: ``step-*``, or the ``.old-step-*`` copy
    of a step whose rewrite was cut short. Read only: nothing is renamed or removed here."""
    found: dict[int, Path] = {}
    for pattern in (".old-step-*", "step-*"):  # a step-* directory wins over the old copy of the same step
        for path in directory.glob(pattern):
            step = _step_of(path)
            if step is not None and (path / "state.json").is_file():
                found[step] = path
    return found


def _fsync_tree(path: Path) -> None:
    """Flush a directory's files, and the directories themselves, to disk (so that a power cut after the rename
    that publishes a checkpoint cannot leave it with empty files while older ones are already gone)."""
    for item in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True) + [path]:
        if os.name == "nt" and item.is_dir():  # Windows opens no directory this way
            continue
        fd = os.open(item, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _tidy(directory: Path) -> None:
    """Before writing: remove what a killed writer left (temporary and trash directories, and old copies of
    steps whose new copy landed); an old copy whose new copy never landed takes its place again."""
    for path in list(directory.glob(".tmp-step-*")) + list(directory.glob(".trash-*")):
        shutil.rmtree(path, ignore_errors=True)
    for old in directory.glob(".old-step-*"):
        if _step_of(old) is None:
            continue
        new = directory / old.name[len(".old-"):]
        if (new / "state.json").is_file() or not (old / "state.json").is_file():
            _remove(old)
        else:
            _remove(new)  # an incomplete leftover, if any
            os.replace(old, new)


def prune_checkpoints(directory: str | Path, keep: int, *, protect: Path | None = None) -> list[int]:
    """Remove all but the newest ``keep`` complete checkpoints (by step) under ``directory``; ``keep`` 0 keeps
    all. ``protect`` (the one just written) is never removed. Returns the steps removed."""
    if keep < 0:
        raise ValueError(f"keep must be >= 0 (0 = keep all), not {keep}")
    if keep == 0:
        return []
    directory = Path(directory)
    steps = sorted((_step_of(p), p) for p in directory.glob("step-*")
                   if _step_of(p) is not None and (p / "state.json").is_file())
    removed = []
    for step, path in steps[:-keep]:
        if protect is None or path != protect:
            _remove(path)
            removed.append(step)
    return removed


def save_checkpoint(directory: str | Path, step: int, *, model: torch.nn.Module | None = None, tokenizer: Any = None,
                    optimizer: torch.optim.Optimizer | None = None, state: dict[str, Any] | None = None,
                    tensors: dict[str, Any] | None = None, keep: int = 2) -> Path:
    """Write checkpoint ``step`` under ``directory``, then keep only the newest ``keep`` of them (0 = all).

    Older checkpoints go only after the new one is complete and ``latest`` names it, so there is a complete
    checkpoint at every moment, whatever ``keep`` is."""
    if keep < 0:
        raise ValueError(f"keep must be >= 0 (0 = keep all), not {keep}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _tidy(directory)
    final = directory / f"step-{step:06d}"
    tmp = directory / f".tmp-step-{step:06d}"
    tmp.mkdir()
    if model is not None:
        save_model(model, tmp / "model")
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    if tensors:
        torch.save(tensors, tmp / "tensors.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=1))
    _fsync_tree(tmp)
    old = directory / f".old-{final.name}"
    if final.exists():  # re-saving a step: its old copy stays readable, aside, until the new one is in place
        os.replace(final, old)
    os.replace(tmp, final)
    _atomic_write_text(directory / LATEST, final.name)
    _remove(old)
    prune_checkpoints(directory, keep, protect=final)
    return final


def _read(path: Path) -> Checkpoint | None:
    """The checkpoint in directory ``path``, or None where it is not a complete one (no ``state.json``)."""
    state_file = path / "state.json"
    if not state_file.is_file():
        return None
    state = json.loads(state_file.read_text())
    return Checkpoint(path=path, step=int(state["step"]), state=state)


def checkpoint_steps(directory: str | Path) -> list[int]:
    """The steps of the complete checkpoints under ``directory``, in increasing order."""
    return sorted(_complete(Path(directory)))


def checkpoint_at(directory: str | Path, step: int) -> Checkpoint:
    """The checkpoint of ``step`` under ``directory`` (see :func:`checkpoint_steps`)."""
    path = _complete(Path(directory)).get(step)
    checkpoint = _read(path) if path is not None else None
    if checkpoint is None:
        raise FileNotFoundError(f"no complete checkpoint of step {step} in {directory}")
    return checkpoint


def latest_checkpoint(directory: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint under ``directory``, or None.

    ``latest`` names it. If that directory is gone (killed while the same step was being rewritten) or the
    pointer was never written (killed right after the first checkpoint landed), the newest complete
    ``step-*`` directory is used: a step directory only appears, by rename, once it is complete.
    """
    directory = Path(directory)
    pointer = directory / LATEST
    candidates = [directory / pointer.read_text().strip()] if pointer.exists() else []
    complete = _complete(directory) if directory.is_dir() else {}
    candidates += [complete[step] for step in sorted(complete, reverse=True)]
    for path in candidates:
        checkpoint = _read(path)
        if checkpoint is not None:
            return checkpoint
    return None


def load_optimizer_state(checkpoint: Checkpoint, optimizer: torch.optim.Optimizer) -> None:
    file = checkpoint.path / "optimizer.pt"
    if file.exists():
        optimizer.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))


def load_tensors(checkpoint: Checkpoint) -> dict[str, Any]:
    file = checkpoint.path / "tensors.pt"
    return torch.load(file, map_location="cpu", weights_only=True) if file.exists() else {}


def load_rng_state(checkpoint: Checkpoint) -> None:
    file = checkpoint.path / "rng.pt"
    if file.exists():
        restore_rng_state(torch.load(file, weights_only=False))
