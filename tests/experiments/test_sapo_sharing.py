"""The sharing experiment: its statistics, and a miniature run of ``swarmlm sapo experiment``."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from swarmlm.experiments.sapo_sharing import ExperimentConfig, run_config, run_dir
from swarmlm.experiments.stats import mean_ci, moving_average
from swarmlm.sapo.config import SimulateConfig


def test_mean_ci_matches_hand_computation():
    # values 1, 2, 3, 4: mean 2.5, sample sd sqrt(5/3), t(0.975, 3) = 3.182
    mean, half = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert half == pytest.approx(3.182 * math.sqrt(5 / 3) / 2, rel=1e-9)
    assert mean_ci([7.0]) == (7.0, None)


def test_moving_average_is_trailing_and_keeps_every_point():
    x = np.array([1.0, 3.0, 5.0, 7.0])
    assert moving_average(x, 2).tolist() == [1.0, 2.0, 4.0, 6.0]
    assert moving_average(x, 10).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_runs_differ_only_in_the_split():
    cfg = ExperimentConfig(configurations=["8/0", "4/4"], seeds=[3], rounds=7, nodes=3, out="/tmp/x")
    a, b = run_config(cfg, "8/0", 3), run_config(cfg, "4/4", 3)
    assert (a.local, a.external, b.local, b.external) == (8, 0, 4, 4)
    assert a.model_dump(exclude={"local", "external", "out"}) == b.model_dump(exclude={"local", "external", "out"})
    assert a.seed == 3 and a.nodes == 3 and a.rounds == 7
    assert run_dir("/tmp/x", "4/4", 3).as_posix().endswith("runs/4-4/seed-3")
    mixed = run_config(cfg.model_copy(update={"node_models": ["m0", "m1"]}), "4/4", 3)
    assert [mixed.node_model(k) for k in range(3)] == ["m0", "m1", "m0"] and a.node_model(2) == a.model.name


def test_experiment_runs_take_the_nodes_update_and_a_partial_override_keeps_the_rest():
    from swarmlm.config import validate_config

    cfg = validate_config(ExperimentConfig, {"grpo": {"lr": 1e-5}})
    run = run_config(cfg, "4/4", 0)
    assert (run.grpo.lr, run.grpo.format_reward, run.grpo.external_weight) == (1e-5, 0.1, "truncated")
    assert run.grpo.model_dump(exclude={"lr"}) == SimulateConfig().grpo.model_dump(exclude={"lr"})
    off = run_config(validate_config(ExperimentConfig, {"grpo": {"format_reward": 0, "external_weight": "none"}}), "4/4", 0)
    assert (off.grpo.format_reward, off.grpo.external_weight) == (0, "none")


def test_bad_configuration_names_the_field():
    from swarmlm.config import ConfigError, validate_config

    with pytest.raises(ConfigError, match="configurations.*I/J"):
        validate_config(ExperimentConfig, {"configurations": ["4-4"]})


@pytest.mark.slow
def test_miniature_experiment_writes_tables_and_plots(tmp_path):
    out = tmp_path / "exp"
    args = [sys.executable, "-m", "swarmlm", "--log-level", "WARNING", "sapo", "experiment",
            "--configurations", "[2/0, 1/1]", "--seeds", "[0, 1]", "--nodes", "2", "--rounds", "3", "--eval-every", "3",
            "--model.warmstart-steps", "8", "--generation.group-size", "4", "--generation.max-new-tokens", "8",
            "--tasks.eval-size", "8", "--smoothing", "2", "--out", str(out),  # 8: every family held out
            "--node-models", "[tiny-qwen2, tiny-llama]",  # a heterogeneous experiment: its by-model table too
            "--scenario", "specialists"]  # node 0 draws chain_sum, node 1 basic_arithmetic: the specialists' table
    res = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["baseline"] == "2/0"
    for c in ("2/0", "1/1"):
        row = results["configurations"][c]
        assert set(row["seeds"]) == {"0", "1"}
        for seed in row["seeds"].values():
            assert seed["rounds"] == 3
            assert seed["cumulative_reward_own"] >= 0
            assert 0 <= seed["final_eval_pass1"] <= 1
        assert row["cumulative_reward_own"]["ci95"] is not None
        assert row["final_eval_pass1"]["mean"] is not None
    # the baseline's ratio to itself is 1 (None only when its reward was exactly 0, as it can be after 8 warm-start steps)
    base_ratio = results["configurations"]["2/0"]["ratio_to_baseline"]
    base_reward = results["configurations"]["2/0"]["cumulative_reward_own"]["mean"]
    assert (base_ratio is None) == (base_reward == 0)
    assert base_ratio is None or base_ratio["mean"] == pytest.approx(1.0)
    table = (out / "results.md").read_text()
    assert "| 2/0 |" in table and "| 1/1 |" in table and "paper" in table
    assert results["settings"]["node_models"] == ["tiny-qwen2", "tiny-llama"]
    assert {m: g["nodes"] for m, g in results["by_model"].items()} == {"tiny-qwen2": [0], "tiny-llama": [1]}
    assert "| `tiny-llama` | 1 | 1/1 |" in table
    # each node began from its own model: node 1's checkpoints are a Llama
    model = out / "runs" / "1-1" / "seed-0" / "node-1" / "checkpoints" / "step-000003" / "model" / "config.json"
    assert json.loads(model.read_text())["model_type"] == "llama"
    assert results["settings"]["node_families"] == ["chain_sum", "basic_arithmetic"]
    spec = results["specialists"]["configurations"]
    for c in ("2/0", "1/1"):
        for seed in spec[c]["seeds"].values():
            for key in ("pass1_unseen_start", "pass1_unseen_end", "pass1_all_start", "pass1_all_end"):
                assert 0 <= seed[key] <= 1
    assert spec["1/1"]["pass1_unseen_end_vs_baseline"]["ci95"] is not None and "unseen end vs 2/0" in table
    own = [json.loads(line) for line in
           (out / "runs" / "1-1" / "seed-0" / "node-1" / "metrics.jsonl").read_text().splitlines()]
    assert {f for r in own for f in r.get("by_family", {})} == {"basic_arithmetic"}  # node 1 drew only its family
    assert set(own[0]["eval_by_family"]) == {"chain_sum", "basic_arithmetic", "products"}  # and was tested on all
    for png in ("reward.png", "eval.png", "unseen.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # resumable: a second call finds every run finished and only rewrites the report
    res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["configurations"] == results["configurations"]


def test_eval_curve_starts_at_the_warm_start():
    from swarmlm.experiments.sapo_sharing_report import eval_series

    cfg = ExperimentConfig(configurations=["2/0"], seeds=[0, 1], rounds=4, nodes=2, out="/tmp/x")
    def node(start, end):
        return [{"round": 0, "eval_pass1": start}, {"round": 1, "reward_own": 0.5, "eval_pass1": None},
                {"round": 2, "reward_own": 0.5, "eval_pass1": end}, {"round": 3, "reward_own": 0.5}]
    runs = {("2/0", 0): [node(0.2, 0.4), node(0.4, 0.6)], ("2/0", 1): [node(0.2, 0.2), node(0.4, 0.4)]}
    x, per_seed = eval_series(cfg, runs, "2/0")
    assert x.tolist() == [0, 2]
    assert np.allclose(per_seed, [[0.3, 0.5], [0.3, 0.3]])


def test_by_model_gives_each_starting_models_nodes_their_own_figures():
    from swarmlm.experiments.sapo_sharing_report import _by_model_lines, by_model

    cfg = ExperimentConfig(configurations=["2/0", "1/1"], seeds=[0, 1], rounds=2, nodes=3, out="/tmp/x",
                           node_models=["strong", "weak"])
    def node(start, end, rewards):
        return [{"round": 0, "eval_pass1": start}] + [
            {"round": r, "reward_own": x, "eval_pass1": end if r == len(rewards) else None} for r, x in enumerate(rewards, 1)]
    runs = {}
    for c, lift in (("2/0", 0.0), ("1/1", 0.1)):
        for s in (0, 1):
            runs[(c, s)] = [node(0.8, 0.8, [0.9, 0.9]), node(0.2, 0.3 + lift + 0.1 * s, [0.1, 0.3]),
                            node(0.4, 0.5 + lift, [0.2, 0.2 + s])]
    out = by_model(cfg, runs)
    assert {m: g["nodes"] for m, g in out.items()} == {"strong": [0, 2], "weak": [1]}
    strong, weak = out["strong"]["configurations"], out["weak"]["configurations"]
    # nodes 0 and 2: start (0.8 + 0.4) / 2; end (0.8 + 0.5) / 2 without sharing, (0.8 + 0.6) / 2 with it
    assert strong["2/0"]["first_eval_pass1"] == {"mean": pytest.approx(0.6), "ci95": 0.0}
    assert strong["2/0"]["gain"]["mean"] == pytest.approx(0.05) and strong["1/1"]["gain"]["mean"] == pytest.approx(0.1)
    # their cumulative own reward, summed over the two nodes: 1.8 + 0.4 (seed 0) and 1.8 + 1.4 (seed 1)
    assert strong["1/1"]["cumulative_reward_own"]["mean"] == pytest.approx((2.2 + 3.2) / 2)
    assert strong["1/1"]["cumulative_reward_own"]["ci95"] == pytest.approx(mean_ci([2.2, 3.2])[1])
    # node 1: the seeds end at 0.3 and 0.4 (+0.1 with sharing); the interval is over the seeds
    assert weak["2/0"]["gain"]["mean"] == pytest.approx(0.15) and weak["1/1"]["gain"]["mean"] == pytest.approx(0.25)
    assert weak["1/1"]["final_eval_pass1"]["ci95"] == pytest.approx(mean_ci([0.4, 0.5])[1])
    lines = _by_model_lines({"by_model": out})
    assert "| `weak` | 1 | 1/1 | 0.200 ± 0.000 | 0.450 ± 0.635 | +0.250 ± 0.635 | 0.40 ± 0.00 |" in lines
