"""``swarmlm sapo experiment``: the SAPO paper's controlled sharing experiment (arXiv 2509.08721)
at a chosen scale.

Every configuration I/J runs with the same nodes, seeds, task mix and number of rounds; only the split
of each node's 8 training groups between its own (I) and other nodes' (J) changes. Each
(configuration, seed) is one ``simulate`` run under ``DIR/runs/``; finished runs are reused and an
interrupted one resumes from its checkpoints, so the whole experiment is resumable.
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from tqdm.auto import tqdm

from swarmlm.config import dump_config
from swarmlm.experiments.plots import require_matplotlib
from swarmlm.experiments.sapo_sharing_report import write_report
from swarmlm.runtime.metrics import read_jsonl
from swarmlm.sapo.config import NodeModels, SAPOSettings, SimulateConfig
from swarmlm.sapo.summary import node_dir

log = logging.getLogger(__name__)

# The SAPO paper's controlled experiment (arXiv 2509.08721): cumulative reward over 8 nodes x 2000 rounds,
# Qwen2.5-0.5B, L = 8.
PAPER_RESULTS = {"8/0": 561.79, "6/2": 854.43, "4/4": 1093.31, "2/6": 945.87}


class ExperimentConfig(NodeModels, SAPOSettings):
    """The configurations, seeds and swarm size; everything else is shared by every run."""

    configurations: list[str] = Field(["8/0", "6/2", "4/4", "2/6"], description="I/J splits to compare; the first is the baseline")
    seeds: list[int] = Field([0, 1, 2], min_length=1, description="repeats of every configuration")
    nodes: int = Field(4, ge=2, description="nodes per run")
    rounds: int = Field(100, ge=1, description="rounds of every run (the default scale ends in about an hour on 2 CPU cores)")
    transport: Literal["in_process", "torch"] = Field(
        "in_process", description="in_process = a run's nodes in this process; torch = one process per node over torch.distributed")
    scenario: Literal["homogeneous", "specialists", "experts"] = Field(
        "homogeneous", description="homogeneous = every node draws questions from the whole task mix; specialists = "
        "node k draws only from family k of the mix (node_families, unless given), so that what one node learns of "
        "its family can reach the others only through sharing; experts = every node draws from the whole mix but "
        "node k's warm start learns only family k (node_warmstart_families, unless given), so that nodes know "
        "different things at round 0. Both add held-out pass@1 on each node's unseen families to the report")
    smoothing: int = Field(10, ge=1, description="moving-average window (rounds) of the reward plot")
    out: str = Field("runs/sapo-experiment", description="output directory")

    @model_validator(mode="after")
    def _specialists(self) -> "ExperimentConfig":
        if self.scenario == "specialists" and not self.node_families:
            self.node_families = [f.name for f in self.tasks.resolved_families()]
        if self.scenario == "experts" and not self.node_warmstart_families:
            self.node_warmstart_families = [f.name for f in self.tasks.resolved_families()]
        return self

    @field_validator("configurations")
    @classmethod
    def _splits(cls, values: list[str]) -> list[str]:
        for v in values:
            m = re.fullmatch(r"(\d+)/(\d+)", v)
            if not m or int(m.group(1)) < 1:
                raise ValueError(f"configuration '{v}' must be 'I/J' with I >= 1, e.g. '4/4'")
        if len(set(values)) != len(values):
            raise ValueError("configurations must be distinct")
        return values


def split(configuration: str) -> tuple[int, int]:
    i, j = configuration.split("/")
    return int(i), int(j)


def run_dir(out: str | Path, configuration: str, seed: int) -> Path:
    i, j = split(configuration)
    return Path(out) / "runs" / f"{i}-{j}" / f"seed-{seed}"


def run_config(config: ExperimentConfig, configuration: str, seed: int) -> SimulateConfig:
    i, j = split(configuration)
    shared = config.model_dump(exclude={"configurations", "seeds", "scenario", "smoothing", "out"})
    return SimulateConfig(**shared, local=i, external=j, seed=seed, out=str(run_dir(config.out, configuration, seed)))


def _finished(run: SimulateConfig) -> bool:
    summary = Path(run.out) / "summary.json"
    if not summary.exists():
        return False
    data = json.loads(summary.read_text())
    return bool(data.get("completed")) and all(n["rounds"] == run.rounds for n in data["nodes"].values())


def load_run(out: str | Path, nodes: int) -> list[list[dict[str, Any]]]:
    """Each node's per-round metrics of one run."""
    return [read_jsonl(node_dir(out, k) / "metrics.jsonl") for k in range(nodes)]


def run_experiment(config: ExperimentConfig, *, progress: bool = True) -> dict[str, Any]:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    plan = [(c, s) for s in config.seeds for c in config.configurations]  # seeds outermost: early results cover every config
    started = time.time()
    bar = tqdm(plan, desc="experiment runs", unit="run", disable=not progress)
    for configuration, seed in bar:
        run = run_config(config, configuration, seed)
        bar.set_postfix(config=configuration, seed=seed)
        if _finished(run):
            continue
        from swarmlm.sapo.simulate import run_simulation  # torch and the models: not with the config, which --help reads

        summary = run_simulation(run, progress=progress)
        if not summary.get("completed", True):
            raise KeyboardInterrupt  # Ctrl+C inside a run: its checkpoints are saved; rerun to resume
    runs = {(c, s): load_run(run_dir(out, c, s), config.nodes) for c, s in plan}
    results = write_report(config, runs, PAPER_RESULTS, wall_seconds=round(time.time() - started, 1))
    return results


def experiment_command(config: ExperimentConfig) -> int:
    """``swarmlm sapo experiment``: every I/J configuration over several seeds, then a table and plots."""
    require_matplotlib("swarmlm sapo experiment")  # before the runs, not after
    results = run_experiment(config)
    print((Path(config.out) / "results.md").read_text())
    print(f"results: {config.out}/results.json, plots: {config.out}/reward.png, {config.out}/eval.png")
    return 0 if results else 1
