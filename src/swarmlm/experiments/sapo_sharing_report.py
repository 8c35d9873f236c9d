"""Tables and plots of the sharing experiment: ``results.json``, ``results.md``, ``reward.png``, ``eval.png``.

The headline numbers are the reward of each node's **own** completions (summed over nodes and rounds)
and the held-out pass@1 at the end, never a batch mean that includes the filtered external groups.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from swarmlm.experiments.plots import pyplot
from swarmlm.experiments.stats import mean_ci, moving_average
from swarmlm.sapo.summary import node_totals


def _run_numbers(nodes: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """One run's figures from its nodes' per-round metrics."""
    totals = [node_totals(rows) for rows in nodes]
    finals = [t["final_eval_pass1"] for t in totals if t["final_eval_pass1"] is not None]
    firsts = [t["first_eval_pass1"] for t in totals if t["first_eval_pass1"] is not None]
    ext = [r["reward_external"] for rows in nodes for r in rows if r.get("reward_external") is not None]
    return {
        "cumulative_reward_own": sum(t["cumulative_reward_own"] for t in totals),
        "first_eval_pass1": sum(firsts) / len(firsts) if firsts else None,
        "final_eval_pass1": sum(finals) / len(finals) if finals else None,
        "mean_reward_external_used": sum(ext) / len(ext) if ext else None,
        "rounds": min((t["rounds"] for t in totals), default=0),
    }


def _fmt(mean: float | None, ci: float | None, digits: int = 2) -> str:
    if mean is None:
        return "—"
    return f"{mean:.{digits}f}" + (f" ± {ci:.{digits}f}" if ci is not None else "")


def _pct(ratio: float | None) -> str:
    return "—" if ratio is None else f"{(ratio - 1) * 100:+.0f}%"


def sharing_table(config, runs: dict[tuple[str, int], list[list[dict[str, Any]]]], paper: dict[str, float]) -> dict[str, Any]:
    """Per I/J configuration: each seed's numbers, their means with 95% intervals, and the paper's figures."""
    baseline = config.configurations[0]
    table: dict[str, Any] = {}
    for c in config.configurations:
        per_seed = {}
        for s in config.seeds:
            numbers = _run_numbers(runs[(c, s)])
            base = _run_numbers(runs[(baseline, s)])["cumulative_reward_own"]
            numbers["ratio_to_baseline"] = numbers["cumulative_reward_own"] / base if base > 0 else None
            per_seed[str(s)] = numbers
        cum = mean_ci([v["cumulative_reward_own"] for v in per_seed.values()])
        ratios = [v["ratio_to_baseline"] for v in per_seed.values() if v["ratio_to_baseline"] is not None]
        evals = [v["final_eval_pass1"] for v in per_seed.values() if v["final_eval_pass1"] is not None]
        table[c] = {
            "seeds": per_seed,
            "cumulative_reward_own": {"mean": cum[0], "ci95": cum[1]},
            "ratio_to_baseline": dict(zip(("mean", "ci95"), mean_ci(ratios))) if ratios else None,
            "final_eval_pass1": dict(zip(("mean", "ci95"), mean_ci(evals))) if evals else None,
            "paper_cumulative_reward": paper.get(c),
            "paper_ratio_to_baseline": paper[c] / paper[baseline] if c in paper and baseline in paper else None,
        }
    return {"baseline": baseline, "configurations": table}


def _ci(values: list[float]) -> dict[str, float | None] | None:
    return dict(zip(("mean", "ci95"), mean_ci(values))) if values else None


def by_model(config, runs: dict[tuple[str, int], list[list[dict[str, Any]]]]) -> dict[str, Any]:
    """A heterogeneous experiment's figures for the nodes of each starting model (``node_models``): per
    configuration, their mean held-out pass@1 before any update and at the end, its change, and their cumulative
    own reward, each the mean over seeds with its 95% interval. So a configuration can be seen to lift the weak
    nodes and cost the strong ones, or not, where the run's mean would hide it."""
    groups: dict[str, list[int]] = {}
    for k in range(config.nodes):
        groups.setdefault(config.node_model(k), []).append(k)
    out: dict[str, Any] = {}
    for model, ks in groups.items():
        per_config = {}
        for c in config.configurations:
            first, final, gain, cum = [], [], [], []
            for s in config.seeds:
                totals = [node_totals(runs[(c, s)][k]) for k in ks]
                pairs = [(t["first_eval_pass1"], t["final_eval_pass1"]) for t in totals]
                pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
                if pairs:
                    first.append(sum(a for a, _ in pairs) / len(pairs))
                    final.append(sum(b for _, b in pairs) / len(pairs))
                    gain.append(final[-1] - first[-1])
                cum.append(sum(t["cumulative_reward_own"] for t in totals))
            per_config[c] = {"first_eval_pass1": _ci(first), "final_eval_pass1": _ci(final), "gain": _ci(gain),
                             "cumulative_reward_own": _ci(cum)}
        out[model] = {"nodes": ks, "configurations": per_config}
    return out


def _by_model_lines(results: dict[str, Any]) -> list[str]:
    lines = ["", "By starting model (the nodes that began from each; mean ± 95% CI over seeds):", "",
             "| model | nodes | I / J | pass@1 before the first update | at the end | change | cumulative own reward |",
             "|---|---|---|---|---|---|---|"]
    for model, group in results["by_model"].items():
        for c, row in group["configurations"].items():
            def cell(key: str, digits: int) -> str:
                v = row[key]
                return _fmt(v["mean"], v["ci95"], digits) if v else "—"
            change = row["gain"]
            change_txt = "—" if not change else (f"{change['mean']:+.3f}"
                                                 + (f" ± {change['ci95']:.3f}" if change["ci95"] is not None else ""))
            lines.append(f"| `{model}` | {', '.join(map(str, group['nodes']))} | {c} | {cell('first_eval_pass1', 3)} | "
                         f"{cell('final_eval_pass1', 3)} | {change_txt} | {cell('cumulative_reward_own', 2)} |")
    return lines


def _models(config) -> str:
    if not config.node_models:
        return f"model `{config.model.name}`"
    return "node models " + ", ".join(f"{k}: `{config.node_model(k)}`" for k in range(config.nodes))


def write_markdown(config, results: dict[str, Any], path: Path) -> None:
    base = results["baseline"]
    lines = [
        f"Sharing experiment: {config.nodes} nodes, {config.rounds} rounds, {_models(config)}, "
        f"L = {config.generation.group_size}, tasks `{config.tasks.preset if not config.tasks.families else 'custom'}`, "
        f"seeds {', '.join(map(str, config.seeds))} (mean ± 95% CI over seeds).",
        "",
        f"| I / J | cumulative own reward | vs {base} | final held-out pass@1 | paper: cumulative reward | paper: vs {base} |",
        "|---|---|---|---|---|---|",
    ]
    for c, row in results["configurations"].items():
        ratio = row["ratio_to_baseline"]
        ev = row["final_eval_pass1"]
        ratio_txt = "—" if c == base or ratio is None else (
            _pct(ratio["mean"]) + (f" ± {ratio['ci95'] * 100:.0f}%" if ratio["ci95"] is not None else ""))
        paper_cum = row["paper_cumulative_reward"]
        lines.append(
            f"| {c} | {_fmt(row['cumulative_reward_own']['mean'], row['cumulative_reward_own']['ci95'])} | {ratio_txt} | "
            f"{_fmt(ev['mean'] if ev else None, ev['ci95'] if ev else None, 3)} | "
            f"{'—' if paper_cum is None else f'{paper_cum:.2f}'} | "
            f"{'—' if c == base else _pct(row['paper_ratio_to_baseline'])} |")
    lines += ["", "Cumulative own reward: the mean reward of each node's own completions, summed over nodes and rounds. "
              "The paper's column is over 8 nodes × 2000 rounds of Qwen2.5-0.5B, so only the ratios compare."]
    if "by_model" in results:
        lines += _by_model_lines(results)
    path.write_text("\n".join(lines) + "\n")


def _curves(runs, config, configuration: str, key: str, first: int = 1) -> np.ndarray:
    """[seeds, nodes, rounds first..config.rounds] of ``key`` (NaN where missing); round 0 is the held-out
    evaluation before any update."""
    out = np.full((len(config.seeds), config.nodes, config.rounds - first + 1), np.nan)
    for si, s in enumerate(config.seeds):
        for k, rows in enumerate(runs[(configuration, s)]):
            for r in rows:
                if r.get(key) is not None and first <= r["round"] <= config.rounds:
                    out[si, k, r["round"] - first] = r[key]
    return out


def plot_reward(config, runs, path: Path) -> None:
    plt = pyplot()

    n = len(config.configurations)
    fig, axes = plt.subplots(1, n, figsize=(3.6 * n, 3.4), sharey=True, squeeze=False)
    rounds = np.arange(1, config.rounds + 1)
    for ax, c in zip(axes[0], config.configurations):
        per_node = np.nanmean(_curves(runs, config, c, "reward_own"), axis=0)  # [nodes, rounds], mean over seeds
        smooth = np.stack([moving_average(np.nan_to_num(row), config.smoothing) for row in per_node])
        ax.fill_between(rounds, smooth.min(axis=0), smooth.max(axis=0), alpha=0.25, label="min–max over nodes")
        ax.plot(rounds, smooth.mean(axis=0), lw=1.8, label="mean over nodes")
        ax.set_title(f"I/J = {c}")
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"own reward ({config.smoothing}-round moving average)")
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"SAPO: reward of each node's own completions ({config.nodes} nodes, mean over {len(config.seeds)} seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def eval_series(config, runs, configuration: str) -> tuple[np.ndarray, np.ndarray]:
    """The rounds with a held-out evaluation, round 0 (before any update) included, and [seeds, those rounds]
    of pass@1 averaged over nodes."""
    curves = _curves(runs, config, configuration, "eval_pass1", first=0)  # [seeds, nodes, rounds 0..R]
    have = ~np.all(np.isnan(curves), axis=(0, 1))
    return np.arange(0, config.rounds + 1)[have], np.nanmean(curves[:, :, have], axis=1)


def plot_eval(config, runs, path: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for c in config.configurations:
        x, per_seed = eval_series(config, runs, c)
        if not len(x):
            continue
        mean = np.nanmean(per_seed, axis=0)
        ax.plot(x, mean, marker="o", ms=3, label=f"{c}")
        if per_seed.shape[0] > 1:
            ax.fill_between(x, np.nanmin(per_seed, axis=0), np.nanmax(per_seed, axis=0), alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel("held-out pass@1 (greedy)")
    ax.set_title("Held-out pass@1, mean over nodes (band: range over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(title="I / J")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(config, runs, paper: dict[str, float], wall_seconds: float | None = None) -> dict[str, Any]:
    out = Path(config.out)
    results = sharing_table(config, runs, paper)
    if config.node_models:
        results["by_model"] = by_model(config, runs)
    results["settings"] = {"nodes": config.nodes, "rounds": config.rounds, "model": config.model.name,
                           "node_models": [config.node_model(k) for k in range(config.nodes)],
                           "group_size": config.generation.group_size, "seeds": config.seeds}
    results["wall_seconds"] = wall_seconds
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_markdown(config, results, out / "results.md")
    plot_reward(config, runs, out / "reward.png")
    plot_eval(config, runs, out / "eval.png")
    return results
