"""``swarmlm noloco compare``: the runs differ only in the method's outer step, the helpers behave on
hand-made cases, and a miniature of the command (with the link injected) writes its files, fields and
plots, and reuses its finished runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from swarmlm.config import ConfigError
from swarmlm.experiments.noloco_compare import CompareConfig, _same_run, measured_compute, train_config
from swarmlm.experiments.noloco_compare_report import time_to_reach
from swarmlm.noloco.comm.link_model import LinkModel


def test_runs_share_everything_but_the_outer_step(tmp_path):
    config = CompareConfig(out=str(tmp_path), replicas="2,4", methods="ddp,diloco,diloco-hb,noloco", steps=50,
                           inner={"lr": 1e-3})
    assert config.replicas == [2, 4] and config.methods == ["ddp", "diloco", "diloco-hb", "noloco"]
    runs = {v: train_config(config, 4, 0, v).model_dump() for v in config.methods}
    differ = {v: {k for k in runs[v] if runs[v][k] != runs["noloco"][k]} for v in runs}
    assert differ["ddp"] == {"method", "out"}
    assert differ["diloco"] == {"method", "out"} and differ["diloco-hb"] == {"method", "out", "diloco"}
    assert runs["diloco"]["diloco"] == {"lr": 0.7, "momentum": 0.9, "nesterov": True}  # the DiLoCo paper
    assert runs["diloco-hb"]["diloco"] == {"lr": 0.7, "momentum": 0.3, "nesterov": False}  # the NoLoCo reference
    assert runs["noloco"]["noloco"]["alpha"] == 0.5 and runs["noloco"]["noloco"]["beta"] == runs["noloco"]["noloco"]["gamma"] == 0.7
    assert all(r["inner"]["lr"] == 1e-3 and r["steps"] == 50 and r["seed"] == 0 for r in runs.values())
    # the link is only modelled unless injected: the runs then do not depend on it
    assert runs["noloco"]["network"]["inject"] is False and runs["noloco"]["network"]["latency_ms"] == 0
    assert config.network.latency_ms == 100 and config.network.bandwidth_gbit == 1
    injected = CompareConfig(out=str(tmp_path), network={"inject": True, "latency_ms": 5})
    assert train_config(injected, 2, 0, "ddp").network.latency_ms == 5


def test_reuse_check():
    run = train_config(CompareConfig(out="/tmp/x"), 4, 0, "noloco")
    saved = run.model_dump(mode="json")
    assert _same_run(saved, run)
    older = {k: v for k, v in saved.items() if k != "network"}  # written before an option existed: its default
    assert _same_run(older, run)
    assert not _same_run({**saved, "steps": 7}, run)
    assert not _same_run({**saved, "inner": {**saved["inner"], "lr": 1.0}}, run)


def test_time_to_reach_interpolates_in_log_ppl():
    ppl = np.array([100.0, 10.0, 5.0])
    sim = np.array([0.0, 10.0, 30.0])
    assert time_to_reach(ppl, sim, 100.0) == 0.0
    assert time_to_reach(ppl, sim, 10.0) == pytest.approx(10.0)
    assert time_to_reach(ppl, sim, math.sqrt(1000)) == pytest.approx(5.0)  # halfway in log
    assert time_to_reach(ppl, sim, 4.0) is None


def test_measured_compute_skips_the_model_std_wait():
    rows = [{"step": 0}] + [{"step": s, "compute_s": 0.5 * s + (2.0 if s >= 4 else 0.0), **({"outer_step": 1} if s == 4 else {})}
                            for s in range(1, 7)]
    out = measured_compute({0: rows, 1: rows}, 6)
    assert out.shape == (2, 6) and out[0].tolist() == [0.5] * 6  # step 4 held a 2 s collective wait: replaced


@pytest.mark.slow
def test_compare_miniature_with_injected_link(tmp_path):
    """Two methods at M = 2 over an injected 30 ms link: files and fields, both DiLoCo ratios, the runs'
    measured communication at least the link's cost, and a second call that trains nothing."""
    from swarmlm.cli import main

    out = tmp_path / "cmp"
    args = ["--log-level", "WARNING", "noloco", "compare", "--out", str(out), "--replicas", "2", "--methods", "diloco,noloco",
            "--steps", "4", "--seq-len", "32", "--batch-size", "2", "--outer.every", "2", "--eval-every", "2",
            "--eval-batches", "1", "--inner.warmup-steps", "1", "--calibration-steps", "3", "--progress", "false",
            "--network.inject", "true", "--network.latency-ms", "30", "--network.bandwidth-gbit", "1"]
    assert main(args) == 0
    for name in ("results.json", "results.md", "ppl.png", "std.png", "calibration.json"):
        assert (out / name).stat().st_size > 0, name
    results = json.loads((out / "results.json").read_text())
    assert set(results["timings"]) == {"M2/seed-0/diloco", "M2/seed-0/noloco"}
    rows = results["table"]["M2"]
    assert set(rows) == {"diloco", "noloco"}
    assert rows["diloco"]["ratio_to_diloco"]["mean"] == pytest.approx(1.0)
    assert rows["noloco"]["ratio_to_diloco"]["mean"] == pytest.approx(rows["noloco"]["final_val_ppl"] / rows["diloco"]["final_val_ppl"])
    assert "within_1pct_of_diloco_or_better" in results["targets"]["M2"]
    link = LinkModel(0.03, 125e6)
    numel = results["calibration"]["parameters"]
    for run in results["runs"]:
        assert [p["step"] for p in run["curve"]] == [0, 2, 4]
        assert all(math.isfinite(p["val_ppl"]) for p in run["curve"]) and run["curve"][-1]["val_ppl"] < run["curve"][0]["val_ppl"]
        sims = [p["sim_s_calibrated"] for p in run["curve"]]
        assert sims == sorted(sims) and sims[0] == 0
        # two synchronisations of 12.9 MB; the modelled clock charges exactly their cost, and the injected
        # transport really spent at least that long communicating
        cost = link.pair_exchange_s(4 * numel) if run["method"] == "noloco" else link.allreduce_s(4 * numel, 2)
        assert run["sim_comm_s"]["calibrated"] == pytest.approx(2 * cost, rel=1e-6)
        assert run["measured_comm_s"] >= 2 * cost - 0.01
        assert run["model_std"] and run["model_std"][0]["before"] > 0
    text = (out / "results.md").read_text()
    assert "| 2 | noloco |" in text and "## Simulated wall-clock" in text and "## Targets" in text
    # the same command again: every run is reused, the numbers are the same
    assert main(args) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["timings"] == {}
    assert again["table"]["M2"]["noloco"]["final_val_ppl"] == rows["noloco"]["final_val_ppl"]
    # other settings in the same directory are refused rather than mixed with the old runs
    with pytest.raises(ConfigError):
        from swarmlm.experiments.noloco_compare import run_compare

        run_compare(CompareConfig(out=str(out), replicas=[2], methods=["noloco"], steps=5, seq_len=32, batch_size=2,
                                  progress=False, network={"inject": True, "latency_ms": 30}))
