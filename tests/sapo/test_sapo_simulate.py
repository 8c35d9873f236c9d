"""End to end: ``swarmlm sapo simulate`` as a user runs it, in real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from swarmlm.runtime.checkpoints import latest_checkpoint
from swarmlm.runtime.environment import cpu_model, describe_environment
from swarmlm.runtime.metrics import read_jsonl
from swarmlm.sapo.warmstart import warmstart_info

REQUIRED = {"round", "reward_own", "reward_external", "loss", "tokens_per_s", "eval_pass1",
            "records_accepted", "records_dropped", "external_used", "transport_seconds", "drops"}

FAMILIES = {"chain_sum", "basic_arithmetic", "products"}  # the default task mix

# Tiny but complete: a short warm start, 2 local + 2 external groups of 4 completions.
SMALL = ["--local", "2", "--external", "2", "--model.warmstart-steps", "8", "--generation.group-size", "4",
         "--generation.max-new-tokens", "12", "--tasks.eval-size", "8", "--sharing.collect-timeout", "60"]


def swarmlm(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarmlm", "--log-level", "WARNING", *args], capture_output=True,
                          text=True, timeout=timeout, env=os.environ.copy(), **kwargs)


def check_kept(node: Path, rounds: int, kept: str) -> None:
    """What a finished node keeps (final_checkpoint): its resumable checkpoint, its model alone, or neither."""
    if kept == "resumable":
        assert latest_checkpoint(node / "checkpoints").step == rounds
        assert not (node / "finished.json").exists()
        return
    assert not (node / "checkpoints").exists()
    assert json.loads((node / "finished.json").read_text()) == {"round": rounds, "final_checkpoint": kept}
    assert (node / "final-model" / "model.safetensors").is_file() == (kept == "weights")


def check_run(out: Path, nodes: int, rounds: int, eval_every: int, kept: str = "none") -> dict:
    summary = json.loads((out / "summary.json").read_text())
    total = 0.0
    for k in range(nodes):
        node = out / f"node-{k}"
        rows = read_jsonl(node / "metrics.jsonl")
        assert [r["round"] for r in rows] == list(range(0, rounds + 1))
        start, rows = rows[0], rows[1:]  # round 0: held-out pass@1 before any update
        assert 0.0 <= start["eval_pass1"] <= 1.0 and summary["nodes"][f"node-{k}"]["first_eval_pass1"] == start["eval_pass1"]
        for r in rows:
            assert REQUIRED <= set(r), REQUIRED - set(r)
            assert 0.0 <= r["reward_own"] <= 1.0
            assert r["tokens_per_s"] > 0
            assert (r["eval_pass1"] is not None) == (r["round"] % eval_every == 0 or r["round"] == rounds)
            # the other node's records arrived and passed validation, every round
            assert r["records_accepted"] == 2 * (nodes - 1) and r["records_dropped"] == 0
            # per family: the round's own groups, split; weighted by groups they give back the round's figures
            fam = r["by_family"]
            assert sum(f["groups"] for f in fam.values()) == 2 and set(fam) <= FAMILIES
            for key in ("reward", "format_rate", "truncated_rate"):
                assert sum(f["groups"] * f[key] for f in fam.values()) / 2 == pytest.approx(r[key if key != "reward" else "reward_own"])
        assert any(f.name.startswith("events") for f in (node / "tensorboard").iterdir())
        check_kept(node, rounds, kept)
        cum = summary["nodes"][f"node-{k}"]["cumulative_reward_own"]
        assert cum == pytest.approx(sum(r["reward_own"] for r in rows))
        total += cum
    assert summary["total_cumulative_reward_own"] == pytest.approx(total)
    # the records, added up over nodes: each node accepted the other's two groups a round
    assert summary["records_accepted"] == nodes * (nodes - 1) * 2 * rounds
    assert summary["records_dropped"] == 0 and summary["drops"] == {}
    # where the numbers come from: this machine, and the warm start the nodes began from
    assert summary["environment"] == {**describe_environment(), "torch_threads": summary["environment"]["torch_threads"]}
    assert summary["warmstart"] == warmstart_info(summary["initial_model"]) and summary["warmstart"]["config"]["steps"] == 8
    assert summary["warmstart"]["environment"]["cpu"] == cpu_model()
    return summary


@pytest.mark.slow
@pytest.mark.parametrize("transport, kept", [("in_process", "none"), ("torch", "weights")])
def test_simulate_two_nodes_share_and_log(tmp_path, transport, kept):
    out = tmp_path / "run"
    args = ["sapo", "simulate", "--nodes", "2", "--eval-every", "2", "--transport", transport, "--out", str(out), *SMALL]
    if kept != "none":  # the default of sapo simulate
        args += ["--final-checkpoint", kept]
    res = swarmlm(*args, "--rounds", "3")
    assert res.returncode == 0, res.stderr[-3000:]
    check_run(out, nodes=2, rounds=3, eval_every=2, kept=kept)
    assert f"machine: {cpu_model()}, torch " in res.stdout and "warm start: final loss " in res.stdout
    assert "| node-1 |" in res.stdout and "records: 12 accepted, 0 dropped\n" in res.stdout  # 2 nodes x 2 groups x 3 rounds
    assert ("final weights not kept" if kept == "none" else f"final weights: {out}/node-*/final-model") in res.stdout
    if kept == "weights":  # the kept model loads as a model directory
        from swarmlm.models import load_model

        assert load_model(str(out / "node-0" / "final-model")).model.config.model_type == "qwen2"
        return
    # the same command again finds the run complete and plays nothing; asking it for more rounds is an error
    metrics = (out / "node-0" / "metrics.jsonl").read_text()
    again = swarmlm(*args, "--rounds", "3")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "node-0" / "metrics.jsonl").read_text() == metrics
    more = swarmlm(*args, "--rounds", "5")
    assert more.returncode == 2 and "rounds: " in more.stderr and "kept no checkpoint" in more.stderr, more.stderr[-2000:]


@pytest.mark.slow
def test_simulate_resumes_and_ctrl_c_leaves_checkpoint(tmp_path):
    out = tmp_path / "run"
    args = ["sapo", "simulate", "--nodes", "2", "--eval-every", "0", "--out", str(out), *SMALL]
    proc = subprocess.Popen([sys.executable, "-m", "swarmlm", "--log-level", "WARNING", *args, "--rounds", "200"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while len(read_jsonl(out / "node-1" / "metrics.jsonl")) < 2:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no rounds completed in time"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    done = [r["round"] for r in read_jsonl(out / "node-0" / "metrics.jsonl")]
    assert latest_checkpoint(out / "node-0" / "checkpoints").step == done[-1]
    assert latest_checkpoint(out / "node-1" / "checkpoints").step == done[-1]
    # resume and finish two more rounds: no round is repeated or skipped
    res = swarmlm("sapo", "simulate", *args[2:], "--rounds", str(done[-1] + 2))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = check_run(out, nodes=2, rounds=done[-1] + 2, eval_every=10**9)
    assert summary["completed"] is True


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["in_process", "torch"])
def test_simulate_heterogeneous_nodes_begin_from_their_own_models(tmp_path, transport):
    """``--node-models``: node k begins from node_models[k % len], each model prepared once, and nodes of two
    architectures share rollouts as text."""
    out = tmp_path / "run"
    res = swarmlm("sapo", "simulate", "--nodes", "3", "--rounds", "2", "--eval-every", "2", "--transport", transport,
                  "--node-models", "[tiny-qwen2, tiny-llama]", "--model.warmstart", "never", "--final-checkpoint", "weights",
                  "--out", str(out), *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["initial_models"] == {m: {"initial_model": m, "warmstart": None} for m in ("tiny-qwen2", "tiny-llama")}
    assert "initial_model" not in summary and summary["environment"]["cpu"] == cpu_model()
    for k, model_type in enumerate(("qwen2", "llama", "qwen2")):
        config = out / f"node-{k}" / "final-model" / "config.json"
        assert json.loads(config.read_text())["model_type"] == model_type
        rows = read_jsonl(out / f"node-{k}" / "metrics.jsonl")
        assert [r["records_accepted"] for r in rows[1:]] == [4, 4]  # both others' 2 groups, every round
    assert "| node-2 |" in res.stdout and "records: 24 accepted, 0 dropped\n" in res.stdout


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.slow
def test_simulate_output_is_the_newest_checkpoint_per_node_and_a_few_kib_a_round(tmp_path):
    """What docs/guides/sapo-one-machine.md ("What a run writes") states, with resumable final checkpoints: a checkpoint
    every round, yet each node keeps only its newest one, which is the model and its Adam state in float32 (at most
    12 bytes a parameter, plus tokenizer, RNG and state files); besides it a node writes a few KiB a round."""
    from swarmlm.models import build_preset

    out = tmp_path / "run"
    nodes, rounds = 2, 4
    res = swarmlm("sapo", "simulate", "--nodes", str(nodes), "--rounds", str(rounds), "--checkpoint-every", "1",
                  "--eval-every", "2", "--model.warmstart", "never", "--final-checkpoint", "resumable", "--out", str(out),
                  *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    params = sum(p.numel() for p in build_preset("tiny-qwen2", seed=0).model.parameters())
    checkpoint_bound = 12 * params + 128 * 1024
    per_round_bound = 8 * 1024  # metrics.jsonl and TensorBoard events of one round (a row is about 3 KiB)
    for k in range(nodes):
        node = out / f"node-{k}"
        assert sorted(p.name for p in (node / "checkpoints").iterdir()) == ["latest", f"step-{rounds:06d}"]
        step = node / "checkpoints" / f"step-{rounds:06d}"
        assert 4 * params <= _bytes(step / "model") <= 4 * params + 64 * 1024  # the weights, float32
        assert _bytes(node / "checkpoints") <= checkpoint_bound
        assert _bytes(node) - _bytes(node / "checkpoints") <= (rounds + 1) * per_round_bound
    run_files = _bytes(out) - sum(_bytes(out / f"node-{k}") for k in range(nodes))  # summary, config, learning curve
    assert run_files <= 256 * 1024
    assert _bytes(out) <= nodes * (checkpoint_bound + (rounds + 1) * per_round_bound) + 256 * 1024
