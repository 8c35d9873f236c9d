"""NoLoCo's point-to-point exchange in real processes over gloo: correct payloads, a group of three,
a stalled partner (skipped after the timeout, and the late one skips at once), a link that works again
afterwards, and a partner that dies."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

TIMEOUT_S = 3.0
STALL_S = 7.5  # rank 3 reaches outer steps 3, 4 and 5 at ~7.5 s (skipping 3 and 4 at once)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from swarmlm.noloco.comm.exchange import DistributedCommunicator

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    comm = DistributedCommunicator(rank=rank, world_size=world, timeout_s=TIMEOUT_S, run_key="test")
    payload = torch.full((50_000,), float(rank))
    rounds = {
        1: [[0, 1], [2, 3]],
        2: [[0, 1, 2], [3]],
        3: [[0, 1], [2, 3]],  # rank 3 stalls before this one: rank 2 gives up at ~3 s
        4: [[0, 1], [2, 3]],  # rank 2 waits from ~3 s to ~6 s; rank 3 is still late
        5: [[0, 1], [2, 3]],  # rank 1 is gone; rank 2 (from ~6 s) and rank 3 (~7.5 s) meet again
    }
    log = []
    for step, groups in rounds.items():
        if step == 3 and rank == 3:
            time.sleep(STALL_S)
        if step == 5 and rank == 1:
            os._exit(17)
        group = next(g for g in groups if rank in g)
        started = time.monotonic()
        result = comm.exchange(step, group, payload)
        log.append({"step": step, "seconds": time.monotonic() - started,
                    "received": {str(p): float(t.mean()) for p, t in result.received.items()},
                    "exact": all(bool((t == float(p)).all()) for p, t in result.received.items()),
                    "skipped": sorted(result.skipped), "bytes_sent": result.traffic.bytes_sent, "bytes_recv": result.traffic.bytes_recv})
        Path(out, f"rank-{rank}.json").write_text(json.dumps(log))
    finished = time.monotonic()
    comm.finish(grace_s=2 * TIMEOUT_S)  # rank 0 hosts the store: it waits for 2 and 3, not for dead rank 1
    Path(out, f"rank-{rank}-finish.json").write_text(json.dumps({"waited": time.monotonic() - finished}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_exchange_with_stalled_and_dead_partners(tmp_path):
    from swarmlm.runtime.distributed import free_port

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, 4, port, str(tmp_path))) for r in range(4)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 150
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "an exchange hung"
    assert [p.exitcode for p in procs] == [0, 17, 0, 0]
    logs = {r: {e["step"]: e for e in json.loads((tmp_path / f"rank-{r}.json").read_text())} for r in range(4)}

    # 1: plain pairs, exact payloads both ways, bytes counted
    nbytes = 50_000 * 4
    for r, partner in ((0, 1), (1, 0), (2, 3), (3, 2)):
        entry = logs[r][1]
        assert entry["received"] == {str(partner): float(partner)} and entry["exact"] and not entry["skipped"]
        assert entry["bytes_sent"] == entry["bytes_recv"] == nbytes
    # 2: a group of three hears from both others; the lone replica exchanges nothing
    for r in (0, 1, 2):
        assert set(logs[r][2]["received"]) == {str(p) for p in (0, 1, 2) if p != r} and logs[r][2]["exact"]
        assert logs[r][2]["bytes_sent"] == 2 * nbytes
    assert logs[3][2]["received"] == {} and logs[3][2]["skipped"] == [] and logs[3][2]["bytes_sent"] == 0
    # 3: rank 2 waits about the timeout and skips its stalled partner; rank 3, late, skips at once
    assert logs[2][3]["skipped"] == [3] and logs[2][3]["received"] == {}
    assert TIMEOUT_S - 0.5 <= logs[2][3]["seconds"] < TIMEOUT_S + 10
    assert logs[3][3]["skipped"] == [2] and logs[3][3]["seconds"] < TIMEOUT_S
    assert logs[0][3]["received"] == {"1": 1.0} and logs[1][3]["received"] == {"0": 0.0}  # the others are unaffected
    # 4: rank 3 is still behind: rank 2 waits and skips again, rank 3 skips at once; 0 and 1 exchange
    assert logs[2][4]["skipped"] == [3] and logs[2][4]["seconds"] >= TIMEOUT_S - 0.5
    assert logs[3][4]["skipped"] == [2] and logs[3][4]["seconds"] < TIMEOUT_S
    assert logs[0][4]["received"] == {"1": 1.0} and logs[1][4]["received"] == {"0": 0.0}
    # 5: rank 1 died; rank 0 skips it after the timeout; the pair 2-3, on a fresh link, exchanges again
    assert logs[0][5]["skipped"] == [1] and logs[0][5]["seconds"] < TIMEOUT_S + 10
    assert 5 not in logs[1]
    assert logs[2][5]["received"] == {"3": 3.0} and logs[3][5]["received"] == {"2": 2.0}
    # rank 0 finished first and waited for the living ranks (it hosts the store), then gave up on dead rank 1
    waited = {r: json.loads((tmp_path / f"rank-{r}-finish.json").read_text())["waited"] for r in (0, 2, 3)}
    assert waited[0] > 2 * TIMEOUT_S and waited[2] < 2 and waited[3] < 2
