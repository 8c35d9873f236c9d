"""What ``swarmlm noloco compare`` needs for its two-stage NoLoCo variant: the run's configuration, its curves
read from stage 0 of each replica, and the modelled time of a GPipe step."""

from __future__ import annotations

import json

import pytest

from swarmlm.experiments.gpipe_time import gpipe_step_s


def test_compare_includes_a_two_stage_noloco_run(tmp_path):
    from swarmlm.config import ConfigError
    from swarmlm.experiments.noloco_compare import CompareConfig, finished, load_run, train_config

    config = CompareConfig(out=str(tmp_path), backend="auto", replicas="2", methods="noloco,noloco-pp2", steps=3)
    plain, piped = train_config(config, 2, 0, "noloco"), train_config(config, 2, 0, "noloco-pp2")
    a, b = plain.model_dump(), piped.model_dump()
    assert {k for k in a if a[k] != b[k]} == {"stages", "out"} and piped.stages == 2 and piped.pipeline.routing == "random"
    with pytest.raises(ConfigError, match="pipeline hops"):
        train_config(CompareConfig(out=str(tmp_path), backend="auto", network={"inject": True}), 2, 0, "noloco-pp2")

    # A finished 2 x 2 run: four ranks in its summary; the curves are read from stage 0 of each replica.
    out = tmp_path / "pp"
    for rank in range(4):
        directory = out if rank == 0 else out / f"rank-{rank}"
        directory.mkdir(parents=True, exist_ok=True)
        rows = [{"step": s, "stage": rank % 2, "replica": rank // 2, "val_loss": 3.0 - s / 10 + rank} for s in range(4)]
        (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"steps": 3, "ranks": {f"rank-{r}": {"completed": True} for r in range(4)}}
    (out / "summary.json").write_text(json.dumps(summary))
    run = piped.model_copy(update={"out": str(out), "steps": 3})
    assert finished(run)
    records = load_run(run)
    assert sorted(records) == [0, 1]
    assert [r["val_loss"] for r in records[1]] == [3.0 - s / 10 + 2 for s in range(4)]  # rank 2 = replica 1, stage 0


def test_modelled_pipeline_step():
    assert gpipe_step_s(1.0, 1, 4, 0.5) == 1.0  # no pipeline, no hand-overs
    assert gpipe_step_s(1.0, 2, 2, 0.0) == pytest.approx(0.75)  # (n + S - 1) / (S n) of the compute: the bubble
    assert gpipe_step_s(1.0, 2, 2, 0.1) == pytest.approx(0.75 + 3 * 2 * 0.1)  # a hand-over each way per period
    assert gpipe_step_s(1.0, 4, 64, 0.0) == pytest.approx(67 / 256)
