"""End-to-end training over gloo with 4 local worker processes: each method trains (finite, falling
loss), and resuming from a checkpoint reproduces the next steps exactly."""

from __future__ import annotations

import math

import pytest

from swarmlm.cli import main
from swarmlm.noloco.groups import make_groups
from swarmlm.noloco.replica import rank_dir
from swarmlm.runtime.metrics import read_jsonl

REPLICAS = 4
STEPS = 8
H = 4
TINY = ["--nproc", str(REPLICAS), "--steps", str(STEPS), "--seq-len", "32", "--batch-size", "4", "--outer.every", str(H),
        "--eval-every", "4", "--eval-batches", "2", "--checkpoint-every", "4", "--inner.warmup-steps", "2",
        "--progress", "false", "--exchange.timeout-s", "60", "--seed", "3"]


def _train(out, method: str, *extra: str) -> None:
    assert main(["noloco", "train", "--method", method, "--out", str(out), *TINY, *extra]) == 0


def _records(out) -> dict[int, list[dict]]:
    return {r: read_jsonl(rank_dir(out, r) / "metrics.jsonl") for r in range(REPLICAS)}


def _by_step(rows: list[dict]) -> dict[int, dict]:
    return {row["step"]: row for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["noloco", "diloco", "ddp"])
def test_four_process_training_and_exact_resume(tmp_path, method):
    out = tmp_path / method
    _train(out, method)
    first = _records(out)
    for rank, rows in first.items():
        steps = _by_step(rows)
        assert sorted(s for s in steps if s > 0) == list(range(1, STEPS + 1))
        losses = [steps[s]["loss"] for s in range(1, STEPS + 1)]
        assert all(math.isfinite(x) for x in losses)
        assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.3, f"rank {rank}: loss did not go down: {losses}"
        assert steps[STEPS]["val_loss"] < steps[0]["val_loss"] - 0.3
        assert math.isfinite(steps[STEPS]["val_ppl"])

    numel = None
    if method == "noloco":
        for k in (1, 2):  # every rank logged the shared groups, and heard from its partner
            expected = make_groups(REPLICAS, 2, seed=3, outer_step=k)
            for rank, rows in first.items():
                row = _by_step(rows)[k * H]
                assert row["outer_step"] == k and row["group"] == next(g for g in expected if rank in g)
                assert row["skipped_partners"] == 0 and len(row["partners_ok"]) == 1
                assert row["model_std_fast"] > 0 and row["model_std"] > 0
        numel = first[0][-1]["bytes_sent"] // (2 * 4)  # two exchanges of one fp32 vector
        assert numel > 1_000_000
    elif method == "diloco":
        for rows in first.values():
            row = _by_step(rows)[H]
            assert row["model_std_fast"] > 0 and row["model_std"] < 1e-6  # the all-reduce makes the replicas identical
    else:
        for rows in first.values():
            assert _by_step(rows)[H]["model_std"] < 1e-6
            assert _by_step(rows)[STEPS]["bytes_sent"] > 0

    # Resume from the step-4 checkpoint: the next steps are the same as in the uninterrupted run.
    _train(out, method, "--resume", str(H))
    second = _records(out)
    for rank in range(REPLICAS):
        a, b = _by_step(first[rank]), _by_step(second[rank])
        assert sorted(b) == sorted(a)
        for step in range(H + 1, STEPS + 1):
            assert b[step]["loss"] == pytest.approx(a[step]["loss"], rel=1e-5, abs=1e-6), (rank, step)
        assert b[STEPS]["val_loss"] == pytest.approx(a[STEPS]["val_loss"], rel=1e-5)
        assert b[STEPS]["bytes_sent"] == a[STEPS]["bytes_sent"]
