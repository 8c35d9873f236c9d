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


def test_experiment_update_guards_are_defaults_that_a_partial_override_keeps():
    from swarmlm.config import validate_config

    cfg = validate_config(ExperimentConfig, {"grpo": {"lr": 1e-5}})
    run = run_config(cfg, "4/4", 0)
    assert (run.grpo.lr, run.grpo.format_reward, run.grpo.external_weight) == (1e-5, 0.1, "truncated")
    off = run_config(validate_config(ExperimentConfig, {"grpo": {"format_reward": 0, "external_weight": "none"}}), "4/4", 0)
    assert (off.grpo.format_reward, off.grpo.external_weight) == (0, "none")
    assert SimulateConfig().grpo.format_reward == 0 and SimulateConfig().grpo.external_weight == "truncated"


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
            "--tasks.eval-size", "4", "--smoothing", "2", "--out", str(out)]
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
    for png in ("reward.png", "eval.png"):
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
