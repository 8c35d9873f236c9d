"""Resumable checkpoints: the model through ``save_pretrained`` (safetensors), the optimizer state and a
JSON state beside it, and the RNG states.

Layout: ``DIR/step-000042/`` per checkpoint, and ``DIR/latest`` naming the newest complete one.
A checkpoint is written to a temporary directory first and ``latest`` is replaced atomically, so a
process killed at any moment leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
import random
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


def _save_model(model: torch.nn.Module, path: Path) -> None:
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


def save_checkpoint(directory: str | Path, step: int, *, model: torch.nn.Module | None = None, tokenizer: Any = None,
                    optimizer: torch.optim.Optimizer | None = None, state: dict[str, Any] | None = None,
                    tensors: dict[str, Any] | None = None, keep: int = 2) -> Path:
    """Write checkpoint ``step`` under ``directory`` and keep the newest ``keep`` of them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:06d}"
    tmp = directory / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if model is not None:
        _save_model(model, tmp / "model")
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    if tensors:
        torch.save(tensors, tmp / "tensors.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **(state or {})}, indent=1))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _atomic_write_text(directory / LATEST, final.name)
    for old in sorted(directory.glob("step-*"))[:-keep]:
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
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
    return sorted(int(path.name.split("-")[1]) for path in Path(directory).glob("step-*")
                  if (path / "state.json").exists())


def checkpoint_at(directory: str | Path, step: int) -> Checkpoint:
    """The checkpoint of ``step`` under ``directory`` (see :func:`checkpoint_steps`)."""
    checkpoint = _read(Path(directory) / f"step-{step:06d}")
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
    candidates += sorted(directory.glob("step-*"), reverse=True)
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
