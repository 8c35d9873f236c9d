"""``benchmarks/gpu/sapo_experiment.sh``, the reduced SAPO sharing experiment for one GPU: its dry run (the same
command at tiny sizes on a CPU, its nodes in one process; torch.distributed nodes are tested with sapo simulate) ends with the experiment's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "sapo_experiment.sh"


@pytest.mark.slow
def test_dry_run_on_cpu(tmp_path):
    out = tmp_path / "gpu"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "| 1/1 |" in run.stdout and "total time:" in run.stdout
    results = json.loads((out / "results.json").read_text())
    assert set(results["configurations"]) == {"2/0", "1/1"}
    for row in results["configurations"].values():
        for seed in row["seeds"].values():
            assert seed["rounds"] == 2 and 0 <= seed["final_eval_pass1"] <= 1 and seed["first_eval_pass1"] is not None
    config = (out / "runs" / "1-1" / "seed-0" / "config.yaml").read_text()
    assert "transport: in_process" in config and "device: cpu" in config
    for name in ("environment.txt", "results.md", "reward.png", "eval.png", "experiment.log"):
        assert (out / name).exists(), name
