"""Running a ``benchmarks/gpu`` script's ``--dry-run`` (tiny sizes on a CPU) from the tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dry_run(script: Path, out: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run ``script --dry-run`` with its outputs under ``out`` and this interpreter; assert it succeeded."""
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run = subprocess.run(["bash", str(script), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run
