"""The learning curve of one SAPO run on this machine (``swarmlm sapo simulate``), drawn from the nodes'
``metrics.jsonl``: ``DIR/learning_curve.png``, held-out pass@1 (from the ``round: 0`` row, before any update) and
own reward (moving average) against the round, one line per node and their mean. The command line draws it after
the run (:func:`simulate_report`); the table a person reads is :func:`swarmlm.sapo.summary.summary_table`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from swarmlm.runtime.metrics import read_jsonl
from swarmlm.sapo.config import SimulateConfig
from swarmlm.sapo.summary import node_dir

log = logging.getLogger(__name__)


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def write_learning_curve(out: str | Path, num_nodes: int, smoothing: int = 10) -> Path | None:
    """``DIR/learning_curve.png`` for a run of ``num_nodes`` nodes; None (logged) where matplotlib is missing."""
    try:
        from swarmlm.experiments.plots import pyplot

        plt = pyplot()
    except ImportError:
        log.warning("no learning curve: matplotlib is not installed (pip install 'swarmlm[plots]')")
        return None
    fig, (ax_eval, ax_reward) = plt.subplots(1, 2, figsize=(11, 4))
    evals_by_round: dict[int, list[float]] = {}
    for k in range(num_nodes):
        rows = read_jsonl(node_dir(out, k) / "metrics.jsonl")
        evals = [(r["round"], r["eval_pass1"]) for r in rows if r.get("eval_pass1") is not None]
        if evals:
            ax_eval.plot(*zip(*evals), marker="o", ms=3, lw=1, alpha=0.6, label=f"node {k}")
            for rnd, v in evals:
                evals_by_round.setdefault(rnd, []).append(v)
        train = [r for r in rows if r.get("round", 0) >= 1 and r.get("reward_own") is not None]
        if train:
            ax_reward.plot([r["round"] for r in train], _moving_average([r["reward_own"] for r in train], smoothing),
                           lw=1, alpha=0.7, label=f"node {k}")
    full = sorted(r for r, v in evals_by_round.items() if len(v) == num_nodes)
    if full:
        ax_eval.plot(full, [sum(evals_by_round[r]) / num_nodes for r in full], color="black", lw=2, label="mean")
    ax_eval.set(xlabel="round", ylabel="held-out pass@1 (greedy)", title="held-out pass@1 (round 0: before any update)")
    ax_reward.set(xlabel="round", ylabel=f"own reward ({smoothing}-round moving average)", title="reward of own completions")
    for ax in (ax_eval, ax_reward):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(out) / "learning_curve.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def simulate_report(config: SimulateConfig) -> None:
    """After ``swarmlm sapo simulate``: its learning curve (on the Agg backend, where matplotlib is installed),
    once (by rank 0 where torchrun started a process per node)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    path = write_learning_curve(config.out, config.nodes)
    if path is not None:
        print(f"learning curve: {path}")
