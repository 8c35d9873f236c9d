"""Where a number was measured: the processor, the thread count and the versions of the numerical libraries.

Training in float32 is not bit-reproducible across processors: matrix products and reductions are summed in an
order that depends on the CPU's vector width and on the BLAS code path it takes, and over hundreds of optimizer
steps those last-bit differences grow into a different model. So every result file names the machine it came from
(:func:`describe_environment`), and a run names the warm start it began from."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

_PACKAGES = ("torch", "transformers", "tokenizers", "reasoning-gym")


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The processor's model name (Linux's ``/proc/cpuinfo``; elsewhere what :mod:`platform` knows)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe_environment() -> dict[str, Any]:
    """The processor, the cores, torch's thread count and vector capability, and the library versions."""
    import torch

    env: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "python": platform.python_version(),
    }
    env.update({name: _version(name) for name in _PACKAGES})
    return env
