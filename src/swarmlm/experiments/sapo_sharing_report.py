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


def _eval_rows(rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A node's first and last rows with a held-out evaluation by family (round 0 is the first)."""
    evals = [r for r in rows if r.get("eval_by_family")]
    return (evals[0], evals[-1]) if evals else (None, None)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def specialist_numbers(config, nodes: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """One run's held-out pass@1 by each node's own families (:meth:`~swarmlm.sapo.config.NodeModels.node_specialty`:
    those it draws, or those its warm start learned): on the others (``unseen``), on its own (``own``) and on all, before the first update (``start``) and at
    the last evaluation (``end``), each the mean over nodes. A node's unseen (own) pass@1 is the mean over those
    families of its pass@1 on each; ``all`` is its pass@1 on the whole held-out set. Per family F,
    ``family:F:drawn_{when}`` is the mean pass@1 on F of the nodes whose family F is, ``family:F:others_{when}`` of
    those whose it is not: whether what F's specialists or experts knew reached the others."""
    mix = [f.name for f in config.tasks.resolved_families()]
    parts: dict[str, list[float]] = {}
    for k, rows in enumerate(nodes):
        own = set(config.node_specialty(k) or mix)
        unseen = [f for f in mix if f not in own]
        for when, row in zip(("start", "end"), _eval_rows(rows)):
            if row is None:
                continue
            by_family = row["eval_by_family"]
            for part, families in (("unseen", unseen), ("own", sorted(own))):
                value = _mean([by_family[f] for f in families if f in by_family])
                if value is not None:
                    parts.setdefault(f"pass1_{part}_{when}", []).append(value)
            parts.setdefault(f"pass1_all_{when}", []).append(row["eval_pass1"])
            for f, value in by_family.items():
                parts.setdefault(f"family:{f}:{'drawn' if f in own else 'others'}_{when}", []).append(value)
    out = {key: _mean(values) for key, values in sorted(parts.items())}
    # what sharing carried: external groups trained per round and how much their completions counted
    used = [r.get("external_used", 0) for rows in nodes for r in rows if r.get("round", 0) >= 1]
    weights = [r["external_weight"] for rows in nodes for r in rows if r.get("external_weight") is not None]
    shares = [r["external_loss_share"] for rows in nodes for r in rows if r.get("external_loss_share") is not None]
    out["external_used_per_round"] = _mean(used)
    out["external_weight_mean"] = _mean(weights)
    out["external_loss_share_mean"] = _mean(shares)
    return out


def specialist_table(config, runs: dict[tuple[str, int], list[list[dict[str, Any]]]]) -> dict[str, Any]:
    """Per configuration: each seed's :func:`specialist_numbers`, the mean over seeds of each with its 95% interval,
    and the change of unseen-family and all-family pass@1 against the baseline configuration, paired by seed."""
    baseline = config.configurations[0]
    per_config: dict[str, Any] = {}
    numbers = {(c, s): specialist_numbers(config, runs[(c, s)]) for c in config.configurations for s in config.seeds}
    for c in config.configurations:
        seeds = {str(s): numbers[(c, s)] for s in config.seeds}
        keys = sorted({k for v in seeds.values() for k, x in v.items() if x is not None})
        row: dict[str, Any] = {"seeds": seeds}
        for key in keys:
            row[key] = _ci([v[key] for v in seeds.values() if v.get(key) is not None])
        for part in ("unseen", "all"):
            end = f"pass1_{part}_end"
            diffs = [numbers[(c, s)][end] - numbers[(baseline, s)][end] for s in config.seeds
                     if numbers[(c, s)].get(end) is not None and numbers[(baseline, s)].get(end) is not None]
            row[f"{end}_vs_baseline"] = _ci(diffs) if c != baseline else None
            gains = [numbers[(c, s)][end] - numbers[(c, s)][f"pass1_{part}_start"] for s in config.seeds
                     if numbers[(c, s)].get(end) is not None and numbers[(c, s)].get(f"pass1_{part}_start") is not None]
            row[f"pass1_{part}_gain"] = _ci(gains)
        per_config[c] = row
    return {"baseline": baseline, "node_families": ["+".join(config.node_specialty(k)) for k in range(config.nodes)],
            "set_apart_by": _set_apart_by(config), "configurations": per_config}


def _set_apart_by(config) -> str:
    """What makes a node's families its own: ``draws`` (specialists, ``node_families``) or ``warm start``
    (experts, ``node_warmstart_families``)."""
    return "draws" if config.node_families else "warm start"


def specialised(config) -> bool:
    """Whether the nodes of ``config`` differ in their families (specialists or experts)."""
    return bool(config.node_families or config.node_warmstart_families)


def _signed(v: dict[str, float | None] | None, digits: int = 3) -> str:
    if not v:
        return "—"
    return f"{v['mean']:+.{digits}f}" + (f" ± {v['ci95']:.{digits}f}" if v["ci95"] is not None else "")


def _specialist_lines(results: dict[str, Any]) -> list[str]:
    spec = results["specialists"]
    base = spec["baseline"]
    if spec.get("set_apart_by", "draws") == "draws":
        intro = "Specialists: node k draws its own questions from "
        unseen = "the families a node never draws itself (unseen)"
    else:
        intro = "Experts: every node draws from the whole mix, and node k's warm start learned only "
        unseen = "the families outside a node's warm start (unseen)"
    lines = ["", intro + ", ".join(f"{k}: `{f}`" for k, f in enumerate(spec["node_families"])) + f"; held-out pass@1 "
        f"on {unseen} and on all families, mean over nodes (mean ± 95% CI over seeds; changes paired by seed):",
        "", f"| I / J | unseen: start | unseen: end | unseen: change | unseen end vs {base} | all: end | "
        f"all end vs {base} | own families: end | external groups / round | external weight | external share of "
        "the update |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c, row in spec["configurations"].items():
        def cell(key: str, digits: int = 3) -> str:
            v = row.get(key)
            return _fmt(v["mean"], v["ci95"], digits) if v else "—"
        lines.append(f"| {c} | {cell('pass1_unseen_start')} | {cell('pass1_unseen_end')} | {_signed(row.get('pass1_unseen_gain'))} | "
                     f"{_signed(row.get('pass1_unseen_end_vs_baseline')) if c != base else '—'} | {cell('pass1_all_end')} | "
                     f"{_signed(row.get('pass1_all_end_vs_baseline')) if c != base else '—'} | {cell('pass1_own_end')} | "
                     f"{cell('external_used_per_round', 2)} | {cell('external_weight_mean', 2)} | "
                     f"{cell('external_loss_share_mean', 2)} |")
    return lines


def _family_lines(config, results: dict[str, Any]) -> list[str]:
    spec = results["specialists"]
    whose = "nodes drawing it" if spec.get("set_apart_by", "draws") == "draws" else "its experts"
    lines = ["", f"By family: held-out pass@1 on each family of {'the ' if whose.startswith('nodes') else ''}{whose} and of the others, at round 0 and "
             "at the end (mean over those nodes; mean ± 95% CI over seeds):", "",
             f"| I / J | family | {whose}: start | end | the others: start | end |", "|---|---|---|---|---|---|"]
    for c, row in spec["configurations"].items():
        for f in [f.name for f in config.tasks.resolved_families()]:
            cells = [_fmt(row[k]["mean"], row[k]["ci95"], 3) if row.get(k) else "—"
                     for k in (f"family:{f}:drawn_start", f"family:{f}:drawn_end", f"family:{f}:others_start",
                               f"family:{f}:others_end")]
            lines.append(f"| {c} | `{f}` | " + " | ".join(cells) + " |")
    return lines


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
    if "specialists" in results:
        lines += _specialist_lines(results) + _family_lines(config, results)
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


def _plot_series(config, runs, series, ylabel: str, title: str, path: Path) -> None:
    """One line per configuration of ``series(config, runs, configuration)`` (rounds, [seeds, rounds]): the mean
    over seeds, with the range over seeds as a band."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for c in config.configurations:
        x, per_seed = series(config, runs, c)
        if not len(x):
            continue
        ax.plot(x, np.nanmean(per_seed, axis=0), marker="o", ms=3, label=c)
        if per_seed.shape[0] > 1:
            ax.fill_between(x, np.nanmin(per_seed, axis=0), np.nanmax(per_seed, axis=0), alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(title="I / J")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_eval(config, runs, path: Path) -> None:
    _plot_series(config, runs, eval_series, "held-out pass@1 (greedy)",
                 "Held-out pass@1, mean over nodes (band: range over seeds)", path)


def unseen_series(config, runs, configuration: str) -> tuple[np.ndarray, np.ndarray]:
    """The rounds with a held-out evaluation by family, and [seeds, those rounds] of pass@1 on the families each
    node does not draw itself (its mean over those families), averaged over nodes."""
    mix = [f.name for f in config.tasks.resolved_families()]
    curves = np.full((len(config.seeds), config.nodes, config.rounds + 1), np.nan)
    for si, s in enumerate(config.seeds):
        for k, rows in enumerate(runs[(configuration, s)]):
            unseen = [f for f in mix if f not in set(config.node_specialty(k) or mix)]
            for r in rows:
                values = [r["eval_by_family"][f] for f in unseen if f in (r.get("eval_by_family") or {})]
                if values and 0 <= r["round"] <= config.rounds:
                    curves[si, k, r["round"]] = sum(values) / len(values)
    have = ~np.all(np.isnan(curves), axis=(0, 1))
    return np.arange(0, config.rounds + 1)[have], np.nanmean(curves[:, :, have], axis=1)


def plot_unseen(config, runs, path: Path) -> None:
    title = ("Specialists: pass@1 on the families a node never draws" if config.node_families else
             "Experts: pass@1 on the families outside a node's warm start")
    _plot_series(config, runs, unseen_series, "held-out pass@1 on unseen families",
                 title + "\n(mean over nodes; band: range over seeds)", path)


def write_report(config, runs, paper: dict[str, float], wall_seconds: float | None = None) -> dict[str, Any]:
    out = Path(config.out)
    results = sharing_table(config, runs, paper)
    if config.node_models:
        results["by_model"] = by_model(config, runs)
    if specialised(config):
        results["specialists"] = specialist_table(config, runs)
    results["settings"] = {"nodes": config.nodes, "rounds": config.rounds, "model": config.model.name,
                           "node_models": [config.node_model(k) for k in range(config.nodes)],
                           "node_families": ([config.node_family(k) for k in range(config.nodes)]
                                             if config.node_families else []),
                           "node_warmstart_families": ["+".join(config.node_warmstart(k)) for k in range(config.nodes)]
                                                      if config.node_warmstart_families else [],
                           "scenario": config.scenario, "tasks": [f.name for f in config.tasks.resolved_families()],
                           "group_size": config.generation.group_size, "seeds": config.seeds}
    results["wall_seconds"] = wall_seconds
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_markdown(config, results, out / "results.md")
    plot_reward(config, runs, out / "reward.png")
    plot_eval(config, runs, out / "eval.png")
    if specialised(config):
        plot_unseen(config, runs, out / "unseen.png")
    return results
