"""The SAPO benchmarks at tiny sizes, and their arithmetic on hand-made inputs.

* ``benchmarks/sapo_throughput.py``: one short run against TRL's GRPOTrainer (every reported field present and
  positive, TRL saw the node's prompts), and the decoding bound on a shape whose numbers are worked out by hand;
* ``benchmarks/sapo_soak.py``: a short run that passes and writes its files, a run with a real leak injected
  (memory held every round) that fails with exit status 1, and the growth detector on synthetic series.
"""

from __future__ import annotations

import importlib.util
import json
import math
import mmap
import sys
from pathlib import Path

import pytest

from swarmlm.tasks import extract_answer

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning")


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def throughput():
    return _load("sapo_throughput")


@pytest.fixture(scope="module")
def soak():
    return _load("sapo_soak")


# ----------------------------------------------------------------------------- throughput
def test_throughput_benchmark_runs_both_sides(throughput, tmp_path, capsys):
    out = tmp_path / "throughput.md"
    result = throughput.main(["--local", "2", "--group-size", "2", "--max-new-tokens", "4", "--repeats", "1",
                              "--warmup", "1", "--threads", "1", "--out", str(out)])
    for side in ("swarmlm", "trl"):
        r = result[side]
        for key in ("generation_tokens_per_s", "update_samples_per_s", "round_s", "bound_tokens_per_s",
                    "fraction_of_bound"):
            assert r[key] is not None and r[key] > 0, (side, key)
        assert r["round_s"] >= r["update_s"] > 0 and r["round_s"] >= r["generation_s"] > 0
        assert r["completion_tokens_per_round"] <= 2 * 2 * 4  # I x L x max_new_tokens, EOS included
    assert len(result["raw"]["swarmlm"]) == len(result["raw"]["trl"]) == 1
    assert result["trl_info"]["prompts_identical"] is True and result["trl_info"]["steps"] == 2
    ours, theirs = result["swarmlm"], result["trl"]
    assert result["ratios"]["round_s"] == pytest.approx(ours["round_s"] / theirs["round_s"])
    assert result["ratios"]["generation_tokens_per_s"] == pytest.approx(
        ours["generation_tokens_per_s"] / theirs["generation_tokens_per_s"])
    assert result["hardware"]["memory_bandwidth_GBps"] > 0 and result["hardware"]["matmul_GFLOPs"] > 0
    text = out.read_text()
    assert "| whole round, s |" in text and "share of the bound reached" in text
    saved = json.loads(out.with_suffix(".json").read_text())
    assert saved["ratios"] == result["ratios"] and saved["command"].startswith("python benchmarks/sapo_throughput.py")
    assert "| generation tokens/s |" in capsys.readouterr().out


def test_throughput_benchmark_decoding_in_bf16_states_its_bound_for_bf16(throughput, tmp_path):
    result = throughput.main(["--local", "2", "--group-size", "2", "--max-new-tokens", "4", "--repeats", "1",
                              "--warmup", "0", "--threads", "1", "--no-trl", "--generation-precision", "bfloat16",
                              "--out", str(tmp_path / "bf16.md")])
    ours = result["swarmlm"]
    assert ours["decode_dtype"] == "bfloat16" and ours["decode_matmul_GFLOPs"] > 0
    assert ours["generation_tokens_per_s"] > 0 and 0 < ours["fraction_of_bound"]
    assert "trl" not in result


def test_decoding_bound_by_hand(throughput):
    shape = throughput.ModelShape(param_bytes=1000, matmul_params=100, layers=2, heads=2, kv_heads=1, head_dim=4,
                                  dtype_bytes=4)
    assert shape.kv_bytes_per_token == 2 * 2 * 1 * 4 * 4  # K and V, 2 layers, 1 KV head of 4 floats
    # one prompt of 3 tokens, two completions of 3 and 1 tokens (EOS included)
    rows = [(3, 3), (3, 1)]
    bound = throughput.generation_bound(shape, [3], rows, bandwidth=100.0, flops_rate=1000.0)
    attn = 4 * 2 * 2 * 4  # per query per context token
    assert bound["prefill_s"] == pytest.approx((2 * 100 * 3 + attn * 9 / 2) / 1000.0)
    # decode steps s = 1, 2: only the first row is still active, with contexts 4 and 5
    mem = [(1000 + 64 * 4) / 100.0, (1000 + 64 * 5) / 100.0]
    comp = [(2 * 100 + attn * 4) / 1000.0, (2 * 100 + attn * 5) / 1000.0]
    assert bound["decode_steps"] == 2 and bound["memory_bound_steps"] == 2
    assert bound["decode_s"] == pytest.approx(sum(max(m, c) for m, c in zip(mem, comp)))
    assert bound["total_s"] == pytest.approx(bound["prefill_s"] + bound["decode_s"])
    # a fast memory makes the same steps compute-bound
    fast = throughput.generation_bound(shape, [3], rows, bandwidth=1e9, flops_rate=1000.0)
    assert fast["memory_bound_steps"] == 0 and fast["decode_s"] == pytest.approx(sum(comp))


def test_hardware_rates_are_measured(throughput):
    import torch

    assert throughput.measure_bandwidth(torch.device("cpu"), mbytes=8, repeats=2) > 1e8
    assert throughput.measure_matmul(torch.device("cpu"), size=128, repeats=2) > 1e7


# ----------------------------------------------------------------------------- soak: the detector
def test_growth_detector_on_synthetic_series(soak):
    flat = [500 + 3 * math.sin(i) for i in range(300)]  # noise of a few MB, no trend
    assert soak.detect_growth(flat, warmup=30, allowance_mb=10)["passed"]
    warmup_only = [400 + i for i in range(30)] + flat[30:]  # growth during warm-up does not count
    assert soak.detect_growth(warmup_only, warmup=30, allowance_mb=10)["passed"]
    spike = list(flat)
    spike[150] += 300  # one transient reading
    assert soak.detect_growth(spike, warmup=30, allowance_mb=10)["passed"]
    leak = [500 + 0.1 * i + math.sin(i) for i in range(300)]  # 100 KB a round: 27 MB after warm-up
    verdict = soak.detect_growth(leak, warmup=30, allowance_mb=10)
    assert not verdict["passed"] and verdict["slope_mb_per_round"] == pytest.approx(0.1, rel=0.05)
    step = flat[:200] + [v + 40 for v in flat[200:]]  # memory that grew once and stayed
    assert not soak.detect_growth(step, warmup=30, allowance_mb=10)["passed"]
    peaks = [500.0] * 30 + [505.0] * 100 + [530.0] * 170
    assert not soak.peak_growth(peaks, warmup=30, allowance_mb=10)["passed"]
    assert soak.peak_growth(peaks, warmup=30, allowance_mb=40)["passed"]
    with pytest.raises(ValueError):
        soak.detect_growth([1.0] * 8, warmup=5, allowance_mb=1)


def test_memory_readings(soak):
    rss, peak = soak.current_rss_bytes(), soak.peak_rss_bytes()
    assert 10 * soak.MB < rss <= peak * 1.05
    # Fresh anonymous pages, touched so they are resident: a bytearray could be served from heap that earlier tests
    # freed but malloc kept resident, and then RSS would not move.
    held = mmap.mmap(-1, 64 * soak.MB)
    held.write(b"\x01" * (64 * soak.MB))
    assert soak.current_rss_bytes() > rss + 48 * soak.MB
    held.close()


# ----------------------------------------------------------------------------- soak: short runs
SHORT = ["--rounds", "8", "--warmup", "2", "--local", "1", "--group-size", "2", "--max-new-tokens", "4",
         "--eval-every", "4", "--eval-size", "2", "--checkpoint-every", "5", "--threads", "1"]


def test_soak_short_run_passes_and_writes_its_files(soak, tmp_path, capsys):
    """Two nodes sharing rollouts (the lockstep path); the single-node path runs in the leak test below."""
    out = tmp_path / "soak"
    assert soak.main([*SHORT, "--nodes", "2", "--allowance-mb", "80", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("PASS: 8 rounds")
    rows = (out / "rss.csv").read_text().splitlines()
    assert rows[0] == "round,rss_mb,peak_rss_mb,python_objects,round_s" and len(rows) == 9
    result = json.loads((out / "soak.json").read_text())
    assert result["passed"] and result["rounds"] == 8 and len(result["series"]) == 8
    assert all(r["peak_rss_mb"] >= r["rss_mb"] > 0 for r in result["series"])
    assert (out / "rss.png").stat().st_size > 1000
    for k in range(2):
        rows = [json.loads(line) for line in (out / f"node-{k}" / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == 8 and all(r["records_accepted"] == 1 for r in rows)  # the other node's group


def test_soak_fails_on_a_real_leak(soak, tmp_path, monkeypatch, capsys):
    """Memory held every round (a list that keeps 12 MB a round, as a metrics history kept in memory would):
    the soak must fail with exit status 1. The 12 MB are fresh pages (an anonymous mmap, written): heap memory
    could reuse what earlier tests in this process freed, which is already resident and would not show."""
    import mmap

    from swarmlm.sapo.node import SAPONode

    kept = []
    original = SAPONode.run_round

    def leaky(self, round):
        held = mmap.mmap(-1, 12 * soak.MB)
        held[:] = b"\x01" * (12 * soak.MB)
        kept.append(held)
        return original(self, round)

    monkeypatch.setattr(SAPONode, "run_round", leaky)
    assert soak.main([*SHORT, "--allowance-mb", "40", "--out", str(tmp_path / "leak"), "--no-plot"]) == 1
    assert capsys.readouterr().out.startswith("FAIL")
    result = json.loads((tmp_path / "leak" / "soak.json").read_text())
    assert result["rss"]["slope_mb_per_round"] == pytest.approx(12, rel=0.3)
    for held in kept:
        held.close()


# ----------------------------------------------------------------------------- swarm flood
@pytest.mark.slow
def test_swarm_flood_benchmark_runs(tmp_path, monkeypatch):
    pytest.importorskip("hivemind")
    flood = _load("swarm_flood")
    out = tmp_path / "flood.json"
    monkeypatch.setattr(sys, "argv", ["swarm_flood.py", "--rounds", "2", "--round-length", "2", "--sybils", "3",
                                      "--message-bytes", "20000", "--alice-bytes", "5000",
                                      "--dht-round-bytes", "1000000", "--attackers", "1", "--attacker-bytes", "30000",
                                      "--attacker-nice", "19", "--out", str(out)])
    import os

    reniced, setpriority = [], os.setpriority
    monkeypatch.setattr(os, "setpriority", lambda which, pid, value: (reniced.append((pid, value)),
                                                                      setpriority(which, pid, value)))
    flood.main()
    assert reniced and {value for _, value in reniced} == {19}  # the attacker's and the Sybils' DHT process trees
    result = json.loads(out.read_text())
    assert result["rounds"] == 2 and len(result["per_round"]) == 2
    assert 0 < result["read_seconds_mean"] <= result["read_seconds_max"] and result["settings"]["attackers"] == 1
    assert result["bob_dht_rss_mb_peak"] >= result["bob_dht_rss_mb_start"] > 0
    assert 0 <= result["alice_read_rounds"] <= 2 and result["drops"]
    assert all(isinstance(r["alice_stored"], bool) for r in result["per_round"])


# ----------------------------------------------------------------------------- intake flood
def test_intake_flood_benchmark_runs_and_bounds_what_it_tokenizes(tmp_path):
    """Three senders' genuine records through a real PeerIntake and verifier: every field reported, the round's
    records capped, and the intake's time measured (the 2 s target is for the full size, not asserted here)."""
    bench = _load("intake_flood")
    out = tmp_path / "intake.json"
    code = bench.main(["--senders", "3", "--message-bytes", "60000", "--completion-chars", "2000", "--group-size", "4",
                       "--rounds", "2", "--target-seconds", "1000", "--out", str(out)])
    result = json.loads(out.read_text())
    assert code == 0 and result["passed"] and len(result["rows"]) == 2
    assert result["cut_chars"] == 34  # the presets' byte tokenizer at 32 tokens
    for row in result["rows"]:
        assert 50_000 < row["message_bytes"] <= 3 * 60_000 and row["records_sent"] >= 3 * 5
        assert row["records_accepted"] == row["records_sent"] and not row["drops"]  # genuine, within the caps
        assert 0 < row["intake_seconds"] <= row["accept_seconds"] and row["verify_seconds"] > 0
    capped = bench.main(["--senders", "3", "--message-bytes", "60000", "--completion-chars", "2000", "--group-size",
                         "4", "--rounds", "1", "--max-new-tokens", "4096", "--target-seconds", "1000",
                         "--out", str(out)])
    row = json.loads(out.read_text())["rows"][0]
    assert capped == 0 and row["records_accepted"] == row["records_sent"]  # 2000 characters a completion: no cut


def test_gradient_anatomy_classes_tokens_and_runs(tmp_path, capsys):
    """``benchmarks/sapo_gradient_anatomy.py``: the token classes of a completion, by hand, and a tiny run whose
    class shares add up to 1."""
    anatomy = _load("sapo_gradient_anatomy")
    text = "ok <answer>12</answer>x"
    prefixes = [text[:k] for k in range(1, len(text) + 1)]  # a byte-level tokenizer: one character a token
    classes = anatomy.token_classes(prefixes, eos=True)
    letter = {"other": "x", "open": "O", "answer": "A", "close": "C", "eos": "E"}
    assert "".join(letter[c] for c in classes) == "xxx" + "O" * 8 + "AA" + "C" * 9 + "x" + "E"
    assert anatomy.token_classes(["no answer"], eos=False) == ["other"]
    out = tmp_path / "anatomy"
    assert anatomy.main(["--model", "tiny-qwen2", "--groups", "3", "--group-size", "3", "--max-new-tokens", "6",
                         "--out", str(out)]) == 0
    report = json.loads((out / "anatomy.json").read_text())
    assert sum(c["token_share"] for c in report["classes"].values()) == pytest.approx(1.0)
    grad = sum(c["grad_share"] for c in report["classes"].values())
    assert grad == pytest.approx(1.0) or report["zero_advantage_groups"] == 1.0
    assert report["classes"]["eos"]["token_share"] > 0 and (out / "anatomy.md").exists()


def test_warmstart_quality_trains_and_reports(tmp_path):
    """``benchmarks/warmstart_quality.py``: a 2-step warm start, then greedy, sampled and signal shares that agree
    with each other (a family's share of groups with signal is 0 where its samples are all wrong or all right)."""
    quality = _load("warmstart_quality")
    log = tmp_path / "q.jsonl"
    assert quality.main(["--steps", "2", "--batch-size", "2", "--out", str(tmp_path / "ws"), "--eval-size", "6",
                         "--groups", "3", "--group-size", "3", "--max-new-tokens", "4", "--json", str(log)]) == 0
    report = json.loads(log.read_text().splitlines()[-1])
    assert report["warmstart"]["steps"] == 2 and report["warmstart_seconds"] is not None
    assert report["eval_size"] == 6 and report["groups"] == 3
    assert report["environment"]["cpu_count"] >= 1 and report["environment"]["torch"]
    for key in ("greedy", "sampled", "signal", "format"):
        assert 0.0 <= report[key] <= 1.0
    for fam in report["per_family"].values():
        if fam.get("sampled") in (0.0, 1.0):
            assert fam["signal"] == 0.0
    assert set(report["per_family"]) <= {"chain_sum", "basic_arithmetic", "products"}
    # k right samples of 3, for each k, over the 3 groups: they give back the sampled success and signal shares
    successes = report["successes"]
    assert len(successes) == 4 and sum(successes) == 3
    assert sum(k * n for k, n in enumerate(successes)) / 9 == pytest.approx(report["sampled"], abs=1e-3)
    assert (successes[1] + successes[2]) / 3 == pytest.approx(report["signal"], abs=1e-3)
    assert report["near_miss"] <= (successes[2] + successes[3]) / 3 + 1e-3 and 0.0 <= report["fragile"] <= 1.0
    # the samples without an answer span, counted and shown: as many as the format share leaves out
    bad = report["unformatted"]
    assert bad["count"] == sum(bad["by_family"].values()) == round((1 - report["format"]) * 3 * 3)
    assert set(bad["by_family"]) <= set(report["per_family"])
    assert len(bad["examples"]) == min(bad["count"], 20)
    assert all(extract_answer(t) is None for t in bad["examples"])
    # the questions for which at least half the samples lost the format: each with its count, none counted twice
    assert all(2 <= g["unformatted"] <= 3 and g["family"] in report["per_family"] and g["question"] for g in bad["questions"])
    listed = sum(g["unformatted"] for g in bad["questions"])
    # every group left out lost at most 1 of its 3 samples
    assert listed <= bad["count"] <= listed + (3 - len(bad["questions"]))


def test_ship_warmstart_packs_and_records_quality(tmp_path, monkeypatch, capsys):
    """``benchmarks/ship_warmstart.py`` on a 2-step warm start: packed in bfloat16 under the settings' key, with
    the packed model's quality in its record, which is what ``warmstart`` then finds for those settings."""
    from swarmlm.sapo import warmstart as ws

    monkeypatch.setenv("SWARMLM_CACHE", str(tmp_path / "cache"))
    trained = ws.warmstart(ws.WarmstartConfig(steps=2, batch_size=2, out=str(tmp_path / "trained")), progress=False)
    ship = _load("ship_warmstart")
    assert ship.main([str(trained), "--dest", str(tmp_path / "shipped"), "--eval-size", "6", "--groups", "2"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    monkeypatch.setattr(ws, "SHIPPED_DIR", tmp_path / "shipped")
    packed = ws.shipped_warmstart(ws.WarmstartConfig(steps=2, batch_size=2))
    assert packed is not None and printed["packed"] == str(packed) and printed["bytes"] > 0
    quality = ws.warmstart_info(packed)["quality"]
    assert quality["eval_size"] == 6 and quality["groups"] == 2 and 0 <= quality["greedy"] <= 1
    assert quality["greedy"] == printed["greedy"] and quality["environment"]["cpu"]


def test_first_run_times_the_default_run_and_resumes(tmp_path, capsys):
    """``benchmarks/first_run.py`` at tiny size (a 2-node, 2-round run): the figures of the run it started, from its
    own summary and metrics, in the JSON; a second call reads the finished seed instead of running it again."""
    first = _load("first_run")
    small = ["--", "--nodes", "2", "--rounds", "2", "--eval-every", "1", "--local", "1", "--external", "1",
             "--model.warmstart", "never", "--generation.group-size", "2", "--generation.max-new-tokens", "4",
             "--tasks.eval-size", "4"]
    out, report = tmp_path / "fr", tmp_path / "first_run.json"
    assert first.main(["--seeds", "3", "--threads", "1", "--out", str(out), "--json", str(report), *small]) == 0
    run = json.loads(report.read_text())["runs"][0]
    assert run["command"] == "OMP_NUM_THREADS=1 swarmlm sapo simulate --seed 3 " + " ".join(small[1:])
    assert set(run["mean_eval_pass1_by_round"]) == {"0", "1", "2"} and set(run["nodes"]) == {"node-0", "node-1"}
    node = run["nodes"]["node-0"]
    assert node["rounds"] == 2 and set(node["eval_pass1"]) == {"0", "1", "2"}
    assert run["gain"] == pytest.approx(run["mean_final_eval_pass1"] - run["mean_first_eval_pass1"], abs=1e-4)
    assert run["wall_seconds"] >= run["run_seconds"] > 0 and 0 < run["bytes_written"] < 2**20  # no checkpoint kept
    assert not (out / "seed-3" / "node-0" / "checkpoints").exists()
    capsys.readouterr()
    (out / "seed-3.log").unlink()
    assert first.main(["--seeds", "3", "--out", str(out), *small]) == 0  # read, not run again: no new log
    assert not (out / "seed-3.log").exists() and "seed 3: " in capsys.readouterr().out


def test_answer_likelihood_of_a_finished_run(tmp_path, capsys):
    """benchmarks/answer_likelihood.py on a real 2-node run (one round, no warm start): every node's answer
    log-probability by family at the start and the end, the start equal to its initial model's own figure, and
    the unseen-family summary with the change against 8/0 paired by seed."""
    from swarmlm.sapo.config import SimulateConfig
    from swarmlm.sapo.simulate import run_simulation

    likelihood = _load("answer_likelihood")
    runs = {}
    for split, (local, external) in {"8-0": (2, 0), "1-1": (1, 1)}.items():
        out = tmp_path / "study" / "runs" / split / "seed-0"
        config = SimulateConfig(nodes=2, rounds=1, local=local, external=external, seed=0, out=str(out),
                                model={"warmstart": "never", "device": "cpu"}, tasks={"eval_size": 6},
                                node_families=["chain_sum", "products"], generation={"group_size": 2, "max_new_tokens": 4},
                                final_checkpoint="weights" if split == "8-0" else "resumable")
        run_simulation(config, progress=False)
        runs[split] = out
    report = tmp_path / "likelihood.json"
    assert likelihood.main([str(runs["8-0"]), str(runs["1-1"]), "--out", str(report)]) == 0
    data = json.loads(report.read_text())
    node = data["runs"][0]["nodes"]["node-0"]
    assert node["families"] == ["chain_sum"] and set(node["start"]) == set(node["end"]) != set()
    assert all(v < 0 for v in [*node["start"].values(), *node["end"].values()])
    # the start is the initial model's: both runs begin from the same preset weights
    assert data["runs"][0]["nodes"]["node-1"]["start"] == data["runs"][1]["nodes"]["node-1"]["start"]
    summary = data["summary"][str(tmp_path / "study" / "runs" / "1-1")]
    assert summary["seeds"] == 1 and summary["unseen_answer_logp_end_vs_8/0"]["n"] == 1
    assert "unseen families' answer log p" in capsys.readouterr().out


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_update_speed_trains_every_sample(tmp_path, precision):
    """benchmarks/update_speed.py at tiny size: every sample of the fixed batch trains, the peer's half with it,
    and the precision asked for is the one used."""
    speed = _load("update_speed")
    out = tmp_path / "speed.json"
    assert speed.main(["--local", "2", "--group-size", "2", "--completion-tokens", "4", "--repeats", "1",
                       "--external", "--precision", precision, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["trained_samples"] == 1.0 and result["samples"] == 4 and result["samples_per_s"] > 0
    assert result["bf16"] == (precision == "bfloat16") and len(result["update_s_all"]) == 1


# ----------------------------------------------------------------------------- precision learning
def _experiment(root: Path, evals: dict[int, list[float]], train_seconds: float) -> Path:
    """An experiment directory of configuration 8/0 in the layout `swarmlm sapo experiment` writes: seed -> the
    pass@1 of node-0 and node-1 at rounds 0 and 2."""
    for seed, (first, last0, last1) in evals.items():
        for node, last in (("node-0", last0), ("node-1", last1)):
            rows = [{"round": 0, "eval_pass1": first, "cumulative_reward_own": 0.0},
                    {"round": 1, "train_seconds": train_seconds, "gen_seconds": 1.0, "format_rate": 0.9,
                     "cumulative_reward_own": 0.5},
                    {"round": 2, "train_seconds": train_seconds, "gen_seconds": 1.0, "format_rate": 1.0,
                     "cumulative_reward_own": 1.0 + last, "eval_pass1": last}]
            path = root / "runs" / "8-0" / f"seed-{seed}" / node / "metrics.jsonl"
            path.parent.mkdir(parents=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_precision_learning_pairs_nodes_and_averages_per_seed(tmp_path):
    precision = _load("precision_learning")
    base = _experiment(tmp_path / "fp32", {0: (0.4, 0.5, 0.7), 1: (0.4, 0.6, 0.6)}, train_seconds=4.0)
    alt = _experiment(tmp_path / "bf16", {0: (0.4, 0.5, 0.5), 1: (0.4, 0.7, 0.7), 2: (0.4, 0.9, 0.9)}, train_seconds=2.0)
    out = tmp_path / "cmp.json"
    result = precision.main([str(base), str(alt), "--config", "8/0", "--out", str(out)])
    assert json.loads(out.read_text())["pairs"] == 4 and result["seeds"] == [0, 1]  # seed 2 has no baseline
    last = result["eval_pass1"]["2"]
    assert last["baseline"] == pytest.approx(0.6) and last["option"] == pytest.approx(0.6)
    # per seed: seed 0 -0.1 (mean of 0 and -0.2), seed 1 +0.1; mean 0, interval t(1) * stdev / sqrt(2)
    assert last["difference"]["mean"] == pytest.approx(0.0, abs=1e-12)
    assert last["difference"]["ci95"] == pytest.approx(12.706 * math.sqrt(0.02) / math.sqrt(2))
    assert result["train_seconds_mean"] == {"baseline": 4.0, "option": 2.0}
    assert result["min_format_rate"] == {"baseline": 0.9, "option": 0.9}


def test_in_process_speed_times_both_modes(tmp_path, capsys):
    """benchmarks/in_process_speed.py at tiny sizes: both modes for each M, the same training (the stacked run
    equals the one-at-a-time run up to rounding), and its JSON."""
    speed = _load("in_process_speed")
    out = tmp_path / "speed.json"
    assert speed.main(["--replicas", "2,3", "--steps", "4", "--every", "2", "--seq-len", "16", "--batch-size", "2",
                       "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [(r["M"], r["stack_replicas"]) for r in result["runs"]] == [(2, "never"), (2, "auto"), (3, "never"), (3, "auto")]
    assert all(r["ms_per_replica_step"] > 0 for r in result["runs"])
    for m in (2, 3):
        never, auto = (r["final_val_loss"] for r in result["runs"] if r["M"] == m)
        assert auto == pytest.approx(never, rel=1e-4)
    assert set(result["speedup"]) == {"2", "3"} and "stacked" in capsys.readouterr().out
