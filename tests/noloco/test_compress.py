"""NoLoCo's compressed exchange (swarmlm.noloco.compress): the blockwise codes against an independent numpy
reference, the message sizes, error feedback's bounded drift, and a training run in 8 and 4 bits against fp32."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from swarmlm.cli import main
from swarmlm.noloco.compress import MessageCodec, decode, encode, encoded_bytes
from swarmlm.noloco.config import TrainConfig
from swarmlm.noloco.replica import rank_dir
from swarmlm.runtime.metrics import read_jsonl


def reference(x: np.ndarray, bits: int, block: int) -> np.ndarray:
    """Blockwise absmax quantization written from its definition, in float64 numpy."""
    q = 2 ** (bits - 1) - 1
    out = np.empty_like(x, dtype=np.float64)
    for start in range(0, len(x), block):
        chunk = x[start:start + block].astype(np.float64)
        scale = np.float32(np.abs(chunk).max() / q) or 1.0
        out[start:start + block] = np.clip(np.round(chunk / scale), -q, q) * scale
    return out


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n", [1, 63, 64, 1000])
def test_codes_match_the_reference(bits, n):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.1
    x[0] = 0.0
    message = encode(x, bits, 64)
    assert message.dtype == torch.uint8 and message.numel() == encoded_bytes(n, bits, 64)
    np.testing.assert_allclose(decode(message, n, bits, 64).numpy(), reference(x.numpy(), bits, 64), rtol=1e-6, atol=1e-9)


def test_a_zero_block_and_the_extremes_survive():
    x = torch.zeros(128)
    x[64:] = torch.linspace(-3, 3, 64)
    for bits in (8, 4):
        y = decode(encode(x, bits, 64), 128, bits, 64)
        assert torch.equal(y[:64], torch.zeros(64)) and y[64] == -3 and y[127] == 3


def test_messages_are_four_and_eight_times_smaller():
    n = 1 << 20
    assert 4 * n / encoded_bytes(n, 8, 64) == pytest.approx(3.76, abs=0.01)
    assert 4 * n / encoded_bytes(n, 4, 64) == pytest.approx(7.11, abs=0.01)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        encode(torch.ones(4), 3, 64)


def test_error_feedback_keeps_the_sum_of_messages_on_the_sum_of_values():
    """A replica sending slowly changing weights: with error feedback what the partners received over T messages
    is off by at most one rounding step; without, the rounding bias of every message adds up."""
    x = torch.full((64,), 0.3)
    x[0] = 1.0  # the block's scale: 4-bit step 1/7, so 0.3 rounds to 2/7 every time
    for feedback, bound in ((True, 1 / 14 + 1e-6), (False, None)):
        codec = MessageCodec("int4", 64, error_feedback=feedback)
        total = sum(codec.decode(codec.encode(x), 64) for _ in range(50))
        drift = float((total - 50 * x).abs().max())
        if bound:
            assert drift <= bound
        else:
            assert drift == pytest.approx(50 * (0.3 - 2 / 7), rel=1e-4)


def test_only_noloco_compresses():
    with pytest.raises(ValueError, match="exchange.compress: 'int8' compresses NoLoCo's pair exchange.*allowed: none"):
        TrainConfig(method="diloco", exchange={"compress": "int8"})


TINY = ["--log-level", "ERROR", "noloco", "train", "--backend", "in_process", "--replicas", "4", "--steps", "12",
        "--seq-len", "32", "--batch-size", "2", "--outer.every", "4", "--eval-every", "0", "--eval-batches", "2",
        "--progress", "false", "--model", "nano-llama", "--inner.lr", "1e-2", "--checkpoint-every", "0"]


@pytest.mark.slow
def test_training_in_8_and_4_bits(tmp_path):
    """The same run in fp32, 8 and 4 bits: the compressed exchanges send 3.8x and 7.1x fewer bytes and end near
    the fp32 run's validation loss; a compressed run stopped and resumed (its residual in the checkpoint) ends
    where the uninterrupted one does."""
    finals, sent = {}, {}
    for compress in ("none", "int8", "int4"):
        out = tmp_path / compress
        assert main([*TINY, "--out", str(out), "--exchange.compress", compress]) == 0
        last = read_jsonl(rank_dir(out, 1) / "metrics.jsonl")[-1]
        finals[compress], sent[compress] = last["val_loss"], last["bytes_sent"]
    assert sent["none"] / sent["int8"] == pytest.approx(3.76, abs=0.05)
    assert sent["none"] / sent["int4"] == pytest.approx(7.1, abs=0.1)
    assert finals["int8"] == pytest.approx(finals["none"], rel=0.01)
    assert finals["int4"] == pytest.approx(finals["none"], rel=0.05)

    parts = tmp_path / "parts"
    assert main([*TINY, "--out", str(parts), "--exchange.compress", "int4", "--stop-after", "6"]) == 0
    assert main([*TINY, "--out", str(parts), "--exchange.compress", "int4"]) == 0
    assert read_jsonl(rank_dir(parts, 1) / "metrics.jsonl")[-1]["val_loss"] == pytest.approx(finals["int4"], rel=1e-5)
