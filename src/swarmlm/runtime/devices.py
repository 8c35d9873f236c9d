"""Device and precision choice, shared by both methods: CUDA, Apple MPS or CPU."""

from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` picks CUDA, then MPS, then CPU; anything else is passed to :class:`torch.device`."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device '{name}' requested but CUDA is not available; use 'cpu' or 'auto'")
    return device


def supports_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu"


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively: a CUDA GPU that supports it, or a CPU with AVX512-BF16 or AMX
    instructions (read from ``/proc/cpuinfo``; False where it cannot be read). Elsewhere bf16 is emulated and
    slower than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    try:
        flags = next((line for line in open("/proc/cpuinfo", encoding="utf-8") if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags.split()))


def use_bf16(precision: str, device: torch.device, option: str) -> bool:
    """Whether a part that ``option`` sets to ``precision`` (float32, bfloat16 or auto) computes in bf16 on
    ``device``: auto = where the device computes bf16 natively (:func:`native_bf16`), said once in the log per
    option and device type where it falls back to float32."""
    if precision == "bfloat16":
        return True
    if precision == "auto":
        if native_bf16(device):
            return True
        if (option, device.type) not in _FELL_BACK:
            _FELL_BACK.add((option, device.type))
            log.info("%s auto: %s does not compute in bf16 natively; float32 instead", option, device)
    return False


_FELL_BACK: set[tuple[str, str]] = set()


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on devices that support it; a no-op context otherwise."""
    if not enabled or not supports_bf16(device):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
