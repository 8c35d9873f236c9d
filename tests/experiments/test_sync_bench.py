"""The simulated clock (by hand), the analytic model of the sync step, and a miniature of
``swarmlm noloco sync-bench``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from swarmlm.experiments.sim_clock import simulate_clock, sync_steps
from swarmlm.experiments.sync_bench import (
    SyncBenchConfig,
    analytic_row,
    expected_max_normal,
    fit_overheads,
    summarize_cells,
    targets,
)
from swarmlm.noloco.comm.link_model import LinkModel

LINK = LinkModel(0.1, 125e6)  # 100 ms and 1 Gbit/s
N = 12.5e6  # a 12.5 MB message: 0.1 s on the wire

# 100 ms and 1 Gbit/s (125e6 bytes/s); a 12.5 MB message takes 0.1 s on the wire: 0.2 s in all
LINK = LinkModel(0.1, 125e6)
N = 12.5e6


def test_simulated_clock_by_hand():
    c = 0.5  # the all-reduce of a message of 1 byte on a 0.5 s, unlimited link at M = 2 (ring: 2 messages)
    link = LinkModel(0.25, math.inf)
    assert link.allreduce_s(1, 2) == pytest.approx(c)
    compute = np.array([[1.0, 1.0, 1.0], [2.0, 1.0, 1.0]])
    # ddp: every step all ranks wait for the slowest, then pay the all-reduce
    ddp = simulate_clock("ddp", compute, link=link, every=2, nbytes=1)
    assert ddp[:, 0].tolist() == [2 + c] * 2 and ddp[:, 2].tolist() == [4 + 3 * c] * 2
    # diloco every 2 steps, and at the last step
    assert sync_steps("diloco", 3, 2) == [2, 3]
    dil = simulate_clock("diloco", compute, link=link, every=2, nbytes=1)
    assert dil[:, 0].tolist() == [1, 2] and dil[:, 1].tolist() == [3 + c] * 2 and dil[:, 2].tolist() == [4 + 2 * c] * 2
    # noloco: only partners wait for each other; a pair exchange is one message (0.25 s)
    p = link.pair_exchange_s(1)
    slow0 = np.array([[3.0], [1.0], [1.0], [1.0]])
    clock = simulate_clock("noloco", slow0, link=link, every=1, nbytes=1, groups=lambda k: [[0, 1], [2, 3]])
    assert clock[:, 0].tolist() == [3 + p, 3 + p, 1 + p, 1 + p]
    # a group of three processes its links in (low, high) order: (0,1), (0,2), (1,2)
    clock = simulate_clock("noloco", np.zeros((3, 1)), link=link, every=1, nbytes=1, groups=lambda k: [[0, 1, 2]])
    assert clock[:, 0].tolist() == pytest.approx([2 * p, 3 * p, 3 * p])


def test_analytic_model_and_fit():
    assert expected_max_normal(1) == 0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-4)
    assert expected_max_normal(1024) == pytest.approx(3.2414, abs=0.02)
    row = analytic_row(LINK, N, 1024, jitter_s=0.05)
    assert row["pair_s"] == pytest.approx(0.2)
    assert row["tree_s"] == pytest.approx(20 * 0.2)
    assert row["halving_doubling_s"] == pytest.approx(20 * 0.1 + 2 * 1023 / 1024 * 0.1)
    assert row["best"] == "halving_doubling" and row["speedup"] == pytest.approx(row["halving_doubling_s"] / 0.2)
    assert row["pair_wait_s"] == pytest.approx(0.05 / math.sqrt(math.pi), rel=1e-3)
    # the all-reduce waits for the slowest of 1024, a pair for the slower of 2
    assert row["allreduce_wait_s"] / row["pair_wait_s"] == pytest.approx(expected_max_normal(1024) / expected_max_normal(2))
    assert row["speedup_with_wait"] == pytest.approx((row["best_s"] + row["allreduce_wait_s"]) / (0.2 + row["pair_wait_s"]))
    # fitting: latency-0 all-reduce times of 2 ms per message, pairs of 1 ms; the injected runs are the model + these
    link = LinkModel(0.05, 125e6)
    nbytes = 4096
    rows = []
    for m, alg in ((2, "ring"), (4, "halving_doubling"), (8, "tree")):
        hops = link.hops(m, alg)
        rows += [{"M": m, "op": "allreduce", "latency_ms": 0.0, "straggler": False, "step_s": 0.002 * hops, "algorithm": alg},
                 {"M": m, "op": "allreduce", "latency_ms": 50.0, "straggler": False, "algorithm": alg,
                  "step_s": link.allreduce_s(nbytes, m, alg) + 0.002 * hops},
                 {"M": m, "op": "pair-persistent", "latency_ms": 0.0, "straggler": False, "step_s": 0.001, "algorithm": None},
                 {"M": m, "op": "pair-persistent", "latency_ms": 50.0, "straggler": False, "algorithm": None,
                  "step_s": link.pair_exchange_s(nbytes) + 0.001}]
    fit = fit_overheads(rows, link, nbytes)
    assert fit["allreduce_per_hop_s"] == pytest.approx(0.002) and fit["pair_persistent_s"] == pytest.approx(0.001)
    assert fit["max_abs_error"] == pytest.approx(0, abs=1e-9) and len(fit["checks"]) == 6


def test_straggler_summary_finds_partner_and_others():
    """Four ranks, rank 0 straggles 0.5 s; pairs (0,2) and (1,3): the partner waits, the others do not."""
    def rec(op, rank, seconds, group, straggler=True):
        return {"op": op, "latency_ms": 0.0, "straggler": straggler, "repeat": 1, "rank": rank, "M": 4, "seconds": seconds,
                "group": group, "ok": True}
    pairs = {0: [0, 2], 2: [0, 2], 1: [1, 3], 3: [1, 3]}
    records = [rec("pair", r, {0: 0.51, 2: 0.52, 1: 0.01, 3: 0.012}[r], pairs[r]) for r in range(4)]
    records += [rec("pair", r, 0.01, pairs[r], straggler=False) for r in range(4)]
    records += [rec("allreduce", r, 0.5 + 0.01 * (r > 0), [0, 1, 2, 3]) for r in range(4)]
    records += [rec("allreduce", r, 0.02, [0, 1, 2, 3], straggler=False) for r in range(4)]
    rows = summarize_cells(records, straggler_rank=0, straggler_s=0.5)
    pair = next(r for r in rows if r["op"] == "pair" and r["straggler"])
    assert pair["partner_s"] == pytest.approx(0.52) and pair["others_s"] == pytest.approx(0.011)
    assert pair["straggler_own_s"] == pytest.approx(0.01)
    ar = next(r for r in rows if r["op"] == "allreduce" and r["straggler"])
    assert ar["partner_s"] is None and ar["others_s"] == pytest.approx(0.51)
    t = targets(rows, SyncBenchConfig(replicas=[4], straggler_s=0.5))
    assert t["straggler"]["only_partner_waits"] and t["straggler"]["allreduce_everyone_waits"]


def test_config_lists():
    assert SyncBenchConfig(replicas="16,2,4").replicas == [2, 4, 16]
    with pytest.raises(ValueError):
        SyncBenchConfig(replicas=[1, 2])


@pytest.mark.slow
def test_sync_bench_miniature(tmp_path):
    """The command end to end at M = 4: files, fields, exact transfers, the injected latency, and the straggler."""
    from swarmlm.cli import main

    out = tmp_path / "sync"
    assert main(["--log-level", "WARNING", "noloco", "sync-bench", "--out", str(out), "--replicas", "4", "--numel", "1024",
                 "--repeats", "1", "--straggler-repeats", "1", "--latency-ms", "40", "--straggler-s", "0.3",
                 "--analytic-replicas", "64,1024"]) == 0
    for name in ("sync.md", "sync.png", "sync.json", "records.jsonl"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "sync.json").read_text())
    cells = report["cells"]
    assert {(c["M"], c["op"], c["latency_ms"], c["straggler"]) for c in cells} >= {
        (4, op, lat, s) for op in ("allreduce", "pair", "pair-persistent") for lat in (0.0, 40.0)
        for s in (False, True)}
    assert all(c["ok"] for c in cells)

    def cell(m, op, lat, s=False):
        return next(c for c in cells if (c["M"], c["op"], c["latency_ms"], c["straggler"]) == (m, op, lat, s))

    # the injected link: a persistent pair costs at least one latency, the all-reduce at least its messages'
    link = LinkModel(0.04, 125e6)
    assert cell(4, "pair-persistent", 40.0)["step_s"] >= 0.04 - 0.005
    alg = cell(4, "allreduce", 40.0)["algorithm"]
    assert cell(4, "allreduce", 40.0)["step_s"] >= link.allreduce_s(4096, 4, alg) - 0.005 >= 4 * 0.04 - 0.005
    # the straggler: everyone waits in the all-reduce; with pairs at M = 4, only the partner does
    assert cell(4, "allreduce", 0.0, True)["others_s"] >= 0.25
    assert cell(4, "pair-persistent", 0.0, True)["partner_s"] >= 0.25
    assert cell(4, "pair-persistent", 0.0, True)["others_s"] < 0.25
    assert report["fit"]["allreduce_per_hop_s"] >= 0 and report["fit"]["checks"]
    sizes = {r["size"] for r in report["analytic"]}
    assert sizes == {"bench tensor", "12.9 MB", "500 MB"}
    assert {r["M"] for r in report["analytic"]} == {4, 64, 1024}
    text = (out / "sync.md").read_text()
    for heading in ("## Measured", "## One straggler", "## Analytic model", "## Targets"):
        assert heading in text
