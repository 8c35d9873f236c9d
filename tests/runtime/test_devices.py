"""Device and precision choice (``swarmlm.runtime.devices``)."""

from __future__ import annotations

import io

import pytest
import torch

from swarmlm.runtime import devices


@pytest.mark.parametrize("flags, native", [
    ("fpu avx2 avx512f avx512_bf16", True),  # AMD EPYC (Zen 4), Intel Cooper Lake
    ("fpu avx2 avx512f amx_bf16 amx_tile", True),  # Intel Sapphire Rapids
    ("fpu avx2 avx512f", False),  # bf16 emulated: slower than float32
])
def test_native_bf16_on_cpu_is_read_from_the_cpu_flags(monkeypatch, flags, native):
    monkeypatch.setattr(devices, "open", lambda *a, **k: io.StringIO(f"processor\t: 0\nflags\t\t: {flags}\n"),
                        raising=False)
    assert devices.native_bf16(torch.device("cpu")) is native


def test_native_bf16_is_false_where_the_flags_cannot_be_read(monkeypatch):
    def unreadable(*a, **k):
        raise OSError("no /proc here")

    monkeypatch.setattr(devices, "open", unreadable, raising=False)
    assert devices.native_bf16(torch.device("cpu")) is False
    assert devices.native_bf16(torch.device("meta")) is False
