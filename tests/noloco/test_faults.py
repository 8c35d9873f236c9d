"""A NoLoCo training run in which one worker stalls during an outer step and later dies.

The four workers are started the way a cluster launcher without torchrun's supervision does it
(RANK, WORLD_SIZE, MASTER_ADDR/PORT; rank 0 hosts the store), so that a dead worker does not take
the others down with it. Its partners must time out, skip it, and finish their training."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest

from swarmlm.config import dump_config
from swarmlm.noloco.config import TrainConfig
from swarmlm.noloco.groups import make_groups
from swarmlm.noloco.faults import EXIT_CODE_INJECTED
from swarmlm.noloco.replica import rank_dir
from swarmlm.runtime.distributed import free_port
from swarmlm.runtime.metrics import read_jsonl

REPLICAS = 4
TIMEOUT_S = 3.0
STALL_S = 8.0
SEED = 5
H = 2
STEPS = 12


@pytest.mark.slow
def test_stalled_then_killed_worker_is_skipped_and_others_finish(tmp_path):
    out = tmp_path / "run"
    port = free_port()
    config = TrainConfig(
        method="noloco", replicas=REPLICAS, out=str(out), steps=STEPS, seq_len=32, batch_size=4, eval_every=0,
        eval_batches=2, checkpoint_every=0, progress=False, seed=SEED,
        inner={"warmup_steps": 2}, outer={"every": H}, exchange={"timeout_s": TIMEOUT_S},
        log={"model_std": False, "tensorboard": False},
        faults={"stall_rank": 3, "stall_outer_steps": [1], "stall_s": STALL_S, "exit_rank": 3, "exit_outer_step": 4})
    dump_config(config, tmp_path / "config.yaml")
    # What `swarmlm noloco train --config config.yaml` runs, without building the whole command line.
    code = ("import sys; from swarmlm.config import load_yaml; from swarmlm.noloco.config import TrainConfig;"
            "from swarmlm.noloco.launch import train_command;"
            "sys.exit(train_command(TrainConfig.model_validate(load_yaml(sys.argv[1]))))")
    args = [sys.executable, "-c", code, str(tmp_path / "config.yaml")]
    procs = []
    logs = []
    for rank in range(REPLICAS):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(REPLICAS),
               "LOCAL_WORLD_SIZE": str(REPLICAS), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        fh = open(tmp_path / f"log-{rank}.txt", "w")
        logs.append(fh)
        procs.append(subprocess.Popen(args, env=env, stdout=fh, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 240
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for fh in logs:
            fh.close()
    tails = {r: (tmp_path / f"log-{r}.txt").read_text()[-3000:] for r in range(REPLICAS)}
    assert codes == [0, 0, 0, EXIT_CODE_INJECTED], tails

    records = {r: read_jsonl(rank_dir(out, r) / "metrics.jsonl") for r in range(REPLICAS)}
    outer = {r: {row["outer_step"]: row for row in rows if "outer_step" in row} for r, rows in records.items()}

    # The survivors trained to the end, with finite and falling loss, and no exchange ever hung.
    for rank in range(3):
        losses = [row["loss"] for row in records[rank] if "loss" in row]
        assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
        assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
        assert sorted(outer[rank]) == list(range(1, STEPS // H + 1))
        assert all(row["outer_comm_s"] < 2 * TIMEOUT_S + 10 for row in outer[rank].values())

    # Outer step 1: rank 3 stalls. Its partner waits for the timeout and skips it; the other pair averages.
    groups = make_groups(REPLICAS, 2, SEED, 1)
    partner = next(r for g in groups if 3 in g for r in g if r != 3)
    others = next(g for g in groups if 3 not in g)
    assert outer[partner][1]["skipped_ranks"] == [3] and outer[partner][1]["partners_ok"] == []
    assert outer[partner][1]["outer_comm_s"] >= TIMEOUT_S - 0.5
    for rank in others:
        assert outer[rank][1]["skipped_ranks"] == [] and len(outer[rank][1]["partners_ok"]) == 1
    # The stalled worker, arriving late, skips at once instead of waiting for a partner who has moved on,
    # and keeps training.
    assert outer[3][1]["skipped_ranks"] == [partner] and outer[3][1]["outer_comm_s"] < TIMEOUT_S
    assert max(outer[3]) == 3  # it died at outer step 4

    # Outer steps 4 to 6: rank 3 is dead; whoever is paired with it skips it and goes on.
    for k in range(4, STEPS // H + 1):
        mate = next(r for g in make_groups(REPLICAS, 2, SEED, k) if 3 in g for r in g if r != 3)
        assert 3 in outer[mate][k]["skipped_ranks"]
    skipped = sum(outer[r][STEPS // H]["skipped_total"] for r in range(3))
    assert skipped >= 1 + (STEPS // H - 3)
