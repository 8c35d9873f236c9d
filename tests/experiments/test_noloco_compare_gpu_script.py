"""``benchmarks/gpu/noloco_compare.sh``, the reduced NoLoCo study for one GPU: its dry run (the same commands at tiny
sizes on a CPU) ends with the study's files for all four methods at M = 8 with the in-process backend, and its
step budget behaves on hand-made cases."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.experiments.gpu_scripts import ROOT, dry_run

SCRIPT = ROOT / "benchmarks" / "gpu" / "noloco_compare.sh"


def _budget():
    spec = importlib.util.spec_from_file_location("noloco_budget", ROOT / "benchmarks" / "gpu" / "noloco_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_steps_fit_the_budget():
    steps_for_budget = _budget().steps_for_budget
    # 0.02 s a step, x1.5 overhead, 32 replica-runs: 330 s hold 343 steps, so 340 at H = 20
    assert steps_for_budget(0.02, replica_runs=32, budget_s=330, every=20) == 340
    assert steps_for_budget(0.02, replica_runs=32, budget_s=330, every=20, overhead=1.0) == 500
    assert steps_for_budget(10.0, replica_runs=32, budget_s=330, every=20) == 40  # never fewer than 2 outer steps
    assert steps_for_budget(1e-6, replica_runs=1, budget_s=330, every=50) == 5000  # nor more than the cap
    with pytest.raises(ValueError):
        steps_for_budget(0.0, replica_runs=1, budget_s=1, every=1)


@pytest.mark.slow
def test_dry_run_on_cpu(tmp_path):
    out = tmp_path / "gpu"
    run = dry_run(SCRIPT, out, timeout=600)
    assert "steps per replica: 4" in run.stdout and "| 2 | 8 | noloco |" in run.stdout
    results = json.loads((out / "results.json").read_text())
    settings = results["settings"]
    assert settings["backend"] == "in_process" and settings["replicas"] == [8] and settings["device"] == "cpu"
    assert settings["model"] == "nano-llama" and settings["steps"] == 4 and settings["outer"]["every"] == [2]
    rows = results["table"]["H2"]["M8"]
    assert set(rows) == {"ddp", "diloco", "diloco-hb", "noloco"}
    assert all(row["final_val_ppl"] > 1 for row in rows.values())
    assert results["calibration"]["key"]["device"] == "cpu"
    for name in ("environment.txt", "results.md", "ppl-H2.png", "ratio.png", "std.png", "compare.log"):
        assert (out / name).exists(), name
    assert "torch" in (out / "environment.txt").read_text()
