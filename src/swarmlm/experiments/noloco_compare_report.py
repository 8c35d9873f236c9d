"""Tables and plots of ``swarmlm noloco compare``: ``results.json``, ``results.md``, ``ppl.png``, ``std.png``."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from swarmlm.experiments.plots import pyplot
from swarmlm.experiments.stats import mean_ci

COLORS = {"ddp": "tab:gray", "diloco": "tab:red", "diloco-hb": "tab:orange", "noloco": "tab:blue", "noloco-pp2": "tab:cyan",
          "diloco-matched": "tab:purple"}
LABELS = {"ddp": "DDP", "diloco": "DiLoCo (Nesterov 0.9)", "diloco-hb": "DiLoCo (heavy-ball 0.3)", "noloco": "NoLoCo",
          "noloco-pp2": "NoLoCo, 2 stages, random routing", "diloco-matched": "DiLoCo with NoLoCo's outer step (control)"}


def _mean_curve(runs: list[dict[str, Any]], key: str = "sim_s_calibrated") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean ppl over seeds, mean simulated seconds) on the steps every seed evaluated."""
    common = sorted(set.intersection(*[{p["step"] for p in r["curve"]} for r in runs])) if runs else []
    ppl = np.array([[next(p["val_ppl"] for p in r["curve"] if p["step"] == s) for s in common] for r in runs])
    sim = np.array([[next(p[key] for p in r["curve"] if p["step"] == s) for s in common] for r in runs])
    return np.array(common), ppl.mean(axis=0) if len(runs) else ppl, sim.mean(axis=0) if len(runs) else sim


def time_to_reach(ppl: np.ndarray, sim: np.ndarray, target: float) -> float | None:
    """First simulated time at which ``ppl`` reaches ``target`` (linear in log ppl between evaluations)."""
    for i in range(len(ppl)):
        if ppl[i] <= target * (1 + 1e-9):
            if i == 0:
                return float(sim[0])
            a, b = math.log(ppl[i - 1]), math.log(ppl[i])
            f = 0.0 if a == b else (a - math.log(target)) / (a - b)
            return float(sim[i - 1] + f * (sim[i] - sim[i - 1]))
    return None


def compare_table(config, numbers: list[dict[str, Any]]) -> dict[str, Any]:
    """Per M and method: final perplexity (mean and 95% interval over seeds), ratios to each DiLoCo baseline,
    simulated time to reach each baseline's final perplexity, bytes, and model std."""
    table: dict[str, Any] = {}
    for m in config.replicas:
        per = {v: [n for n in numbers if n["M"] == m and n["variant"] == v] for v in config.methods}
        rows: dict[str, Any] = {}
        finals = {v: {n["seed"]: n["final_val_ppl"] for n in runs if n["final_val_ppl"] is not None} for v, runs in per.items()}
        for v, runs in per.items():
            if not runs:
                continue
            vals = list(finals[v].values())
            mean, ci = mean_ci(vals) if vals else (None, None)
            row: dict[str, Any] = {
                "description": DESC.get(v, v), "final_val_ppl": mean, "final_val_ppl_ci95": ci,
                "final_val_ppl_seeds": finals[v],
                "replica_ppl_range": [min(min(r["final_val_ppl_ranks"]) for r in runs if r["final_val_ppl_ranks"]),
                                      max(max(r["final_val_ppl_ranks"]) for r in runs if r["final_val_ppl_ranks"])]
                if any(r["final_val_ppl_ranks"] for r in runs) else None,
                "sim_s": {k: float(np.mean([r["sim_s"][k] for r in runs])) for k in ("calibrated", "measured")},
                "sim_comm_s": {k: float(np.mean([r["sim_comm_s"][k] for r in runs])) for k in ("calibrated", "measured")},
                "bytes_sent_per_rank": float(np.mean([r["bytes_sent_per_rank"] for r in runs])),
                "measured_comm_s": float(np.mean([r["measured_comm_s"] for r in runs])),
                "wall_s": float(np.mean([r["wall_s"] for r in runs if r["wall_s"] is not None] or [float("nan")])),
                "last_model_std_before": runs[0]["model_std"][-1]["before"] if runs[0]["model_std"] else None,
                "last_model_std_after": runs[0]["model_std"][-1]["after"] if runs[0]["model_std"] else None,
            }
            for ref in REFERENCES_ORDER:
                if ref in finals and finals[ref]:
                    ratios = [finals[v][s] / finals[ref][s] for s in finals[v] if s in finals[ref]]
                    if ratios:
                        r_mean, r_ci = mean_ci(ratios)
                        row[f"ratio_to_{ref}"] = {"mean": r_mean, "ci95": r_ci}
            rows[v] = row
        for v, runs in per.items():  # simulated time to reach each DiLoCo baseline's final perplexity
            if not runs or v not in rows:
                continue
            steps, ppl, sim = _mean_curve(runs)
            for ref in REFERENCES_ORDER:
                if ref not in rows or rows[ref]["final_val_ppl"] is None:
                    continue
                _, ref_ppl, ref_sim = _mean_curve(per[ref])
                t_ref = time_to_reach(ref_ppl, ref_sim, rows[ref]["final_val_ppl"])
                t = time_to_reach(ppl, sim, rows[ref]["final_val_ppl"])
                rows[v][f"time_to_{ref}_final"] = {"sim_s": t, "speedup": (t_ref / t) if t and t_ref else None}
        table[f"M{m}"] = rows
    return table


REFERENCES_ORDER = ("diloco", "diloco-hb", "diloco-matched")  # the last is a control, when it was run
SHORT = {"diloco": "DiLoCo (Nesterov)", "diloco-hb": "DiLoCo (heavy-ball)", "diloco-matched": "the control"}


def targets(config, table: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, rows in table.items():
        noloco = rows.get("noloco")
        if not noloco:
            continue
        entry = {}
        for ref in REFERENCES_ORDER:
            ratio = noloco.get(f"ratio_to_{ref}")
            if ratio:
                entry[f"within_1pct_of_{ref}_or_better"] = ratio["mean"] <= 1.01
                entry[f"ratio_to_{ref}"] = ratio["mean"]
            reach = noloco.get(f"time_to_{ref}_final")
            if reach:
                entry[f"wallclock_speedup_to_{ref}_final"] = reach["speedup"]
        out[key] = entry
    return out


def _ppl(mean: float | None, ci: float | None) -> str:
    if mean is None:
        return "—"
    return f"{mean:.2f}" + (f" ± {ci:.2f}" if ci is not None else "")


def _ratio(r: dict[str, Any] | None) -> str:
    if not r:
        return "—"
    return f"{r['mean']:.3f}" + (f" ± {r['ci95']:.3f}" if r["ci95"] is not None else "")


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _secs(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "—"
    return f"{s:.0f}" if s >= 100 else f"{s:.1f}"


def _reach(r: dict[str, Any]) -> str:
    if not r:
        return "—"
    return "never" if r.get("sim_s") is None else _secs(r["sim_s"])


def _speedup(r: dict[str, Any]) -> str:
    return "—" if not r or not r.get("speedup") else f"{r['speedup']:.2f}×"


def write_markdown(config, results: dict[str, Any], path: Path) -> None:
    cal = results["calibration"]
    seeds = ", ".join(map(str, config.seeds))
    refs = [r for r in REFERENCES_ORDER if r in config.methods]
    lines = [
        "# NoLoCo against DiLoCo and data parallel",
        "",
        f"Model `{config.model}` ({cal['parameters'] / 1e6:.2f}M parameters), {config.steps} inner steps of "
        f"{config.batch_size} × {config.seq_len} tokens per replica (× {config.grad_accum} accumulation), the same data, "
        f"seed(s) {seeds} and inner AdamW (lr {config.inner.lr:g}, {config.inner.warmup_steps} warm-up steps, cosine) for "
        f"every method; H = {config.outer.every}. Validation perplexity is exp(mean validation loss over the replicas), "
        f"on {config.eval_batches} × {config.batch_size} × {config.seq_len} held-out tokens"
        + (" (mean ± 95% CI over seeds)." if len(config.seeds) > 1 else " (one seed: no confidence interval)."),
        "",
        "Methods: " + "; ".join(f"**{v}**: {DESC.get(v, v)}" for v in config.methods) + ".",
        "",
        "## Final validation perplexity",
        "",
        "| M | method | val ppl | " + "".join(f"vs {SHORT[r]} | " for r in refs)
        + "replicas' range | model std before / after last outer step | sent per rank | run wall s |",
        "|---|---|---|" + "---|" * len(refs) + "---|---|---|---|",
    ]
    for key, rows in results["table"].items():
        for v, row in rows.items():
            rng = row["replica_ppl_range"]
            std_b, std_a = row["last_model_std_before"], row["last_model_std_after"]
            lines.append(
                f"| {key[1:]} | {v} | **{_ppl(row['final_val_ppl'], row['final_val_ppl_ci95'])}** | "
                + "".join(f"{_ratio(row.get(f'ratio_to_{r}'))} | " for r in refs) +
                f"{'—' if not rng else f'{rng[0]:.2f} – {rng[1]:.2f}'} | "
                f"{'—' if std_b is None else f'{std_b:.2g}'} / {'—' if std_a is None else f'{std_a:.2g}'} | "
                f"{_bytes(row['bytes_sent_per_rank'])} | {_secs(row['wall_s'])} |")
    lines += [
        "",
        "## Simulated wall-clock",
        "",
        f"Link between every two replicas: {results['settings']['link']}. Compute per inner step: "
        f"{cal['cpu_s_per_step']:.3f} s, the CPU time of one replica's inner step measured here on one thread "
        f"(wall {cal['wall_s_per_step']:.3f} s; load average {cal['loadavg'][0]:.1f} at the time). Every synchronisation "
        "costs the link model's time for the method's message, after the ranks involved have waited for each other. "
        "'Measured compute' instead uses each rank's own measured step times from its run, which on this "
        "oversubscribed machine include waiting for a core.",
        "",
        "| M | method | simulated total (s) | of which communication (s) | "
        + "".join(f"to {SHORT[r]}'s final ppl (s) | speedup | " for r in refs)
        + "measured compute: total (s) | measured compute: communication (s) |",
        "|---|---|---|---|" + "---|---|" * len(refs) + "---|---|",
    ]
    for key, rows in results["table"].items():
        for v, row in rows.items():
            reach = [row.get(f"time_to_{ref}_final") or {} for ref in refs]
            lines.append(
                f"| {key[1:]} | {v} | {_secs(row['sim_s']['calibrated'])} | {_secs(row['sim_comm_s']['calibrated'])} | "
                + " | ".join(f"{_reach(r)} | {_speedup(r)}" for r in reach)
                + f" | {_secs(row['sim_s']['measured'])} | {_secs(row['sim_comm_s']['measured'])} |")
    lines += ["", "'never': the method's validation perplexity did not reach that value within the run.", "", "## Targets", ""]
    for key, t in results["targets"].items():
        parts = []
        for ref in REFERENCES_ORDER:
            if f"ratio_to_{ref}" in t:
                r = t[f"ratio_to_{ref}"]
                parts.append(f"NoLoCo/{LABELS[ref]} = {r:.3f} ({(r - 1) * 100:+.1f}%): within 1% or better: "
                             f"{'yes' if t[f'within_1pct_of_{ref}_or_better'] else 'no'}")
        lines.append(f"- M = {key[1:]}: " + "; ".join(parts) + ".")
    lines += ["", f"Total time of this command: {results['wall_s']:.0f} s (runs trained now: {len(results['timings'])})."]
    path.write_text("\n".join(lines) + "\n")


DESC = {
    "ddp": "all-reduce of the gradients every step",
    "diloco": "all-reduce of φ − θ every H steps, outer Nesterov SGD lr 0.7 momentum 0.9 (DiLoCo paper)",
    "diloco-hb": "the same with outer heavy-ball SGD lr 0.7 momentum 0.3 (the NoLoCo reference's baseline)",
    "noloco": "random pairs every H steps, α 0.5, β = γ 0.7, heavy-ball (the NoLoCo paper's outer step)",
    "noloco-pp2": "the same, with the model in 2 pipeline stages and the NoLoCo paper's random routing; M × 2 processes",
    "diloco-matched": "control: all-reduce every H steps with NoLoCo's own outer step (heavy-ball lr 0.7, momentum 0.5), "
                      "i.e. NoLoCo with the group = all replicas",
}


def plot_ppl(config, numbers: list[dict[str, Any]], path: Path, link_text: str) -> None:
    plt = pyplot()

    ms = config.replicas
    fig, axes = plt.subplots(len(ms), 2, figsize=(12, 3.8 * len(ms)), squeeze=False)
    for i, m in enumerate(ms):
        for v in config.methods:
            runs = [n for n in numbers if n["M"] == m and n["variant"] == v and n["curve"]]
            if not runs:
                continue
            steps, ppl, sim = _mean_curve(runs)
            for ax, x in ((axes[i][0], steps), (axes[i][1], sim / 60)):
                ax.plot(x, ppl, marker="o", ms=3, color=COLORS[v], label=LABELS[v])
                if len(runs) > 1:
                    per_seed = np.array([[next(p["val_ppl"] for p in r["curve"] if p["step"] == s) for s in steps] for r in runs])
                    ax.fill_between(x, per_seed.min(axis=0), per_seed.max(axis=0), color=COLORS[v], alpha=0.15)
        for j, ax in enumerate(axes[i]):
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
            ax.set_ylabel("validation perplexity")
            ax.set_xlabel("inner step" if j == 0 else "simulated wall-clock (minutes)")
            ax.set_title(f"M = {m}: against step" if j == 0 else f"M = {m}: against simulated wall-clock ({link_text})", fontsize=9)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_std(config, numbers: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()

    ms = config.replicas
    fig, axes = plt.subplots(1, len(ms), figsize=(6.2 * len(ms), 4), squeeze=False)
    for ax, m in zip(axes[0], ms):
        for v in config.methods:
            runs = [n for n in numbers if n["M"] == m and n["variant"] == v and n["model_std"]]
            if not runs:
                continue
            run = runs[0]
            for key, ls, suffix in (("before", "-", "before outer step (θ)"), ("after", "--", "after (φ)")):
                pts = [(p["step"], p[key]) for p in run["model_std"] if p.get(key) and p[key] > 0]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, marker="o", ms=3, color=COLORS[v],
                            label=f"{LABELS[v]}, {suffix}" if v != "ddp" else f"{LABELS[v]}")
        ax.set_yscale("log")
        ax.set_xlabel("inner step")
        ax.set_ylabel("model std (RMS deviation from the replicas' mean)")
        ax.set_title(f"M = {m}, seed {config.seeds[0]} (DiLoCo after sync and DDP: 0, not drawn)", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(config, numbers: list[dict[str, Any]], calibration: dict[str, Any], link, *, wall_s: float,
                 timings: dict[str, float]) -> dict[str, Any]:
    out = Path(config.out)
    table = compare_table(config, numbers)
    results = {
        "settings": {**config.model_dump(mode="json"), "link": link.describe(), "cpu_count": os.cpu_count()},
        "calibration": {k: v for k, v in calibration.items() if k not in ("cpu_s_all", "wall_s_all")},
        "table": table,
        "targets": targets(config, table),
        "runs": numbers,
        "wall_s": wall_s,
        "timings": timings,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_markdown(config, results, out / "results.md")
    link_text = link.describe().rsplit(", all-reduce", 1)[0]
    plot_ppl(config, numbers, out / "ppl.png", link_text)
    plot_std(config, numbers, out / "std.png")
    return results
