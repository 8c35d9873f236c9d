"""``benchmarks/gpu/sapo_experiment.sh``, the reduced SAPO sharing experiment for one GPU: its dry run (the same
command at tiny sizes on a CPU, its nodes in one process; torch.distributed nodes are tested with sapo simulate) ends with the experiment's files."""

from __future__ import annotations

import json

import pytest

from tests.experiments.gpu_scripts import ROOT, dry_run



@pytest.mark.slow
def test_dry_run_on_cpu(tmp_path):
    """The specialists' script, which runs sapo_experiment.sh with SCENARIO=specialists: one dry run covers both
    scripts (the homogeneous scenario differs only in leaving node_families empty, tested in
    tests/sapo/test_specialists.py)."""
    out = tmp_path / "gpu"
    run = dry_run(ROOT / "benchmarks" / "gpu" / "sapo_specialists.sh", out, timeout=900)
    assert "| 1/1 |" in run.stdout and "unseen end vs 2/0" in run.stdout and "total time:" in run.stdout
    results = json.loads((out / "results.json").read_text())
    assert set(results["configurations"]) == {"2/0", "1/1"}
    for row in results["configurations"].values():
        for seed in row["seeds"].values():
            assert seed["rounds"] == 2 and 0 <= seed["final_eval_pass1"] <= 1 and seed["first_eval_pass1"] is not None
    assert results["settings"]["scenario"] == "specialists"
    assert results["settings"]["node_families"] == ["chain_sum", "basic_arithmetic"]
    for row in results["specialists"]["configurations"].values():
        for seed in row["seeds"].values():
            assert 0 <= seed["pass1_unseen_start"] <= 1 and 0 <= seed["pass1_unseen_end"] <= 1
    config = (out / "runs" / "1-1" / "seed-0" / "config.yaml").read_text()
    assert "transport: in_process" in config and "device: cpu" in config
    for name in ("environment.txt", "results.md", "reward.png", "eval.png", "unseen.png", "experiment.log"):
        assert (out / name).exists(), name
