"""Tables and plots of ``swarmlm noloco compare``: ``results.json``, ``results.md``, ``ppl-H<H>.png`` (perplexity
against step and simulated wall-clock), ``ratio.png`` (NoLoCo / DiLoCo per M with 95% intervals) and ``std.png``
(model std)."""

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
          "diloco-matched": "tab:purple", "diloco-hb-2h": "tab:brown", "noloco-alpha0.3": "tab:green",
          "noloco-int8": "tab:olive", "noloco-int4": "tab:pink"}
LABELS = {"ddp": "DDP", "diloco": "DiLoCo (Nesterov 0.9)", "diloco-hb": "DiLoCo (heavy-ball 0.3)", "noloco": "NoLoCo",
          "noloco-pp2": "NoLoCo, 2 stages, random routing", "diloco-matched": "DiLoCo with NoLoCo's outer step (control)",
          "diloco-hb-2h": "DiLoCo (heavy-ball 0.3) at 2H", "noloco-alpha0.3": "NoLoCo at α 0.3 (control)",
          "noloco-int8": "NoLoCo, 8-bit exchange", "noloco-int4": "NoLoCo, 4-bit exchange"}
# the baselines every method is compared with, where they were run (the last three: the reference's design and the
# controls)
REFERENCES_ORDER = ("diloco", "diloco-hb", "diloco-hb-2h", "diloco-matched")
SHORT = {"diloco": "DiLoCo (Nesterov)", "diloco-hb": "DiLoCo (heavy-ball)", "diloco-hb-2h": "DiLoCo (heavy-ball) at 2H",
         "diloco-matched": "the control"}
# The study's comparisons, each a NoLoCo variant against the DiLoCo variant it is paired with, reported where both ran:
# the NoLoCo reference's design, equal H, and equal effective outer step (heavy-ball moves a steady pseudo-gradient
# by lr / (1 - momentum): 1.4 at momentum 0.5, NoLoCo's α, and 1.0 at 0.3, the reference's DiLoCo baseline's).
COMPARISONS: dict[str, tuple[str, str]] = {
    "the reference's design: DiLoCo at 2H": ("noloco", "diloco-hb-2h"),
    "equal H": ("noloco", "diloco-hb"),
    "equal effective step, momentum 0.5": ("noloco", "diloco-matched"),
    "equal effective step, momentum 0.3": ("noloco-alpha0.3", "diloco-hb"),
}
CLOCKS = ("calibrated", "measured")
AXES = (*CLOCKS, "steps")  # the two simulated clocks, and inner steps (a link that costs nothing)

DESC = {
    "ddp": "all-reduce of the gradients every step",
    "diloco": "all-reduce of φ − θ every H steps, outer Nesterov SGD lr 0.7 momentum 0.9 (DiLoCo paper)",
    "diloco-hb": "the same with outer heavy-ball SGD lr 0.7 momentum 0.3 (the NoLoCo reference's baseline)",
    "noloco": "random pairs every H steps, α 0.5, β = γ 0.7, heavy-ball (the NoLoCo paper's outer step)",
    "noloco-pp2": "the same, with the model in 2 pipeline stages and the NoLoCo paper's random routing; M × 2 processes",
    "diloco-matched": "control: all-reduce every H steps with NoLoCo's own outer step (heavy-ball lr 0.7, momentum 0.5), "
                      "i.e. NoLoCo with the group = all replicas",
    "diloco-hb-2h": "DiLoCo heavy-ball 0.3 with an all-reduce every 2H steps: the NoLoCo reference's comparison design "
                    "(about the bytes per replica of NoLoCo every H)",
    "noloco-alpha0.3": "control: NoLoCo with outer momentum α 0.3, the DiLoCo baseline's (the same effective outer step)",
    "noloco-int8": "NoLoCo with its pair exchange in 8 bits (blockwise absmax, error feedback): 3.8x fewer bytes",
    "noloco-int4": "the same in 4 bits: 7.1x fewer bytes",
}


def _curve(run: dict[str, Any], key: str = "sim_s_calibrated") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, ppl, simulated seconds) of one run's evaluations."""
    pts = run["curve"]
    return (np.array([p["step"] for p in pts]), np.array([p["val_ppl"] for p in pts]),
            np.array([p.get(key, math.nan) for p in pts], dtype=float))


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


def _stat(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    mean, ci = mean_ci(values)
    return {"mean": mean, "ci95": ci, "n": len(values)}


def group_runs(config, numbers: list[dict[str, Any]], h: int, m: int) -> dict[str, list[dict[str, Any]]]:
    """The runs of one (H, M) cell, by method; DDP's (which has no H) belong to every H."""
    return {v: sorted([n for n in numbers if n["M"] == m and n["variant"] == v and n.get("H") in (h, None)],
                      key=lambda n: n["seed"]) for v in config.methods}


def cell_table(config, per: dict[str, list[dict[str, Any]]]) -> tuple[dict[str, Any], float | None]:
    """Per method of one (H, M) cell: final perplexity (mean and 95% interval over seeds), ratios to each DiLoCo
    baseline (per seed, then mean and interval), simulated time to the cell's common target perplexity (the
    highest final perplexity of any run in the cell, so that every run reaches it) and to each baseline's final
    perplexity, bytes, and model std."""
    finals = {v: {n["seed"]: n["final_val_ppl"] for n in runs if n["final_val_ppl"] is not None} for v, runs in per.items()}
    every_final = [p for f in finals.values() for p in f.values()]
    target = max(every_final) if every_final else None
    rows: dict[str, Any] = {}
    for v, runs in per.items():
        if not runs:
            continue
        vals = list(finals[v].values())
        mean, ci = mean_ci(vals) if vals else (None, None)
        with_std = [r for r in runs if r["model_std"]]
        row: dict[str, Any] = {
            "description": DESC.get(v, v), "final_val_ppl": mean, "final_val_ppl_ci95": ci,
            "final_val_ppl_seeds": finals[v],
            "replica_ppl_range": [min(min(r["final_val_ppl_ranks"]) for r in runs if r["final_val_ppl_ranks"]),
                                  max(max(r["final_val_ppl_ranks"]) for r in runs if r["final_val_ppl_ranks"])]
            if any(r["final_val_ppl_ranks"] for r in runs) else None,
            "sim_s": {k: float(np.mean([r["sim_s"][k] for r in runs])) for k in CLOCKS},
            "sim_comm_s": {k: float(np.mean([r["sim_comm_s"][k] for r in runs])) for k in CLOCKS},
            "bytes_sent_per_rank": float(np.mean([r["bytes_sent_per_rank"] for r in runs])),
            "measured_comm_s": float(np.mean([r["measured_comm_s"] for r in runs])),
            "wall_seconds": float(np.mean([r["wall_seconds"] for r in runs if r["wall_seconds"] is not None]
                                          or [float("nan")])),
            "last_model_std_before": _mean_of([r["model_std"][-1]["before"] for r in with_std]),
            "last_model_std_after": _mean_of([r["model_std"][-1]["after"] for r in with_std]),
            "model_std_before_mean": _mean_of([r.get("model_std_mean", {}).get("before") for r in runs]),
        }
        for ref in REFERENCES_ORDER:
            if finals.get(ref):
                row[f"ratio_to_{ref}"] = _stat([finals[v][s] / finals[ref][s] for s in finals[v] if s in finals[ref]])
        if target is not None:
            for clock in AXES:
                if clock == "steps":
                    times = {r["seed"]: time_to_reach(_curve(r)[1], _curve(r)[0].astype(float), target) for r in runs}
                else:
                    times = {r["seed"]: time_to_reach(*_curve(r, f"sim_s_{clock}")[1:], target) for r in runs}
                row.setdefault("time_to_target", {})[clock] = _stat([t for t in times.values() if t is not None])
                row.setdefault("time_to_target_seeds", {})[clock] = times
        rows[v] = row
    for v, row in rows.items():  # speed-ups to the common target, per seed, against each baseline
        for ref in REFERENCES_ORDER:
            if ref not in rows or "time_to_target_seeds" not in row:
                continue
            for clock in AXES:
                mine, theirs = row["time_to_target_seeds"][clock], rows[ref]["time_to_target_seeds"][clock]
                ratios = [theirs[s] / mine[s] for s in mine if mine[s] and theirs.get(s)]
                row.setdefault(f"speedup_to_target_vs_{ref}", {})[clock] = _stat(ratios)
    for v, runs in per.items():  # simulated time to reach each DiLoCo baseline's final perplexity (mean curves)
        if not runs or v not in rows:
            continue
        _, ppl, sim = _mean_curve(runs)
        for ref in REFERENCES_ORDER:
            if ref not in rows or rows[ref]["final_val_ppl"] is None:
                continue
            _, ref_ppl, ref_sim = _mean_curve(per[ref])
            t_ref = time_to_reach(ref_ppl, ref_sim, rows[ref]["final_val_ppl"])
            t = time_to_reach(ppl, sim, rows[ref]["final_val_ppl"])
            rows[v][f"time_to_{ref}_final"] = {"sim_s": t, "speedup": (t_ref / t) if t and t_ref else None}
    return rows, target


def _mean_of(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


def compare_table(config, numbers: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``table[H<h>][M<m>][method]`` (see :func:`cell_table`) and the common target perplexity of each cell."""
    table: dict[str, Any] = {}
    cell_targets: dict[str, Any] = {}
    for h in config.outer.every:
        for m in config.replicas:
            rows, target = cell_table(config, group_runs(config, numbers, h, m))
            table.setdefault(f"H{h}", {})[f"M{m}"] = rows
            cell_targets.setdefault(f"H{h}", {})[f"M{m}"] = target
    return table, cell_targets


def comparisons(config, table: dict[str, Any]) -> dict[str, Any]:
    """``out[name][H<h>][M<m>]``: each of :data:`COMPARISONS` whose two methods both ran, the NoLoCo variant's final
    perplexity over the DiLoCo variant's in every cell (per seed, then mean and 95% interval)."""
    out: dict[str, Any] = {}
    for name, (subject, reference) in COMPARISONS.items():
        if subject in config.methods and reference in config.methods:
            out[name] = {hkey: {mkey: (rows.get(subject) or {}).get(f"ratio_to_{reference}") for mkey, rows in cells.items()}
                         for hkey, cells in table.items()}
    return out


def targets(config, table: dict[str, Any]) -> dict[str, Any]:
    """NoLoCo against each baseline in every cell: perplexity ratio (and whether it is within 1% or better), and the
    wall-clock speed-up to the common target."""
    out: dict[str, Any] = {}
    for hkey, cells in table.items():
        for mkey, rows in cells.items():
            noloco = rows.get("noloco")
            if not noloco:
                continue
            entry = {}
            for ref in REFERENCES_ORDER:
                ratio = noloco.get(f"ratio_to_{ref}")
                if ratio:
                    entry[f"ratio_to_{ref}"] = ratio["mean"]
                    entry[f"ratio_to_{ref}_ci95"] = ratio["ci95"]
                    entry[f"within_1pct_of_{ref}_or_better"] = ratio["mean"] <= 1.01
                speed = (noloco.get(f"speedup_to_target_vs_{ref}") or {}).get("calibrated")
                if speed:
                    entry[f"wallclock_speedup_vs_{ref}"] = speed["mean"]
                    entry[f"wallclock_speedup_vs_{ref}_ci95"] = speed["ci95"]
            out.setdefault(hkey, {})[mkey] = entry
    return out


# ----------------------------------------------------------------------------------------------
# markdown
# ----------------------------------------------------------------------------------------------
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


def _timed(r: dict[str, Any] | None) -> str:
    if not r:
        return "never"
    text = _secs(r["mean"]) + (f" ± {_secs(r['ci95'])}" if r["ci95"] is not None else "")
    return text


def _speed(r: dict[str, Any] | None) -> str:
    if not r:
        return "—"
    return f"{r['mean']:.2f}×" + (f" ± {r['ci95']:.2f}" if r["ci95"] is not None else "")


def _std(x: float | None) -> str:
    return "—" if x is None else f"{x:.2g}"


def write_markdown(config, results: dict[str, Any], path: Path) -> None:
    """``results.md``: the settings, NoLoCo's ratios, the comparisons, every method's final perplexity, the
    simulated wall-clock to a common target and to each baseline's final perplexity, and the targets."""
    refs = [r for r in REFERENCES_ORDER if r in config.methods]
    sections = [_md_header(config, results, refs), _md_comparisons(results), _md_final_ppl(results, refs),
                _md_time_to_target(config, results, refs), _md_time_to_baselines(results, refs), _md_targets(results)]
    lines = [line for section in sections for line in section]
    lines += ["", f"Total time of this command: {results['wall_seconds']:.0f} s (runs trained now: {len(results['timings'])})."]
    path.write_text("\n".join(lines) + "\n")


def _cells(results: dict[str, Any]):
    """(H, M, that cell's rows by method) over the table, H and M as numbers in text."""
    for hkey, cells in results["table"].items():
        for mkey, rows in cells.items():
            yield hkey, mkey, rows


def _md_header(config, results: dict[str, Any], refs: list[str]) -> list[str]:
    cal = results["calibration"]
    seeds = ", ".join(map(str, config.seeds))
    hs = ", ".join(map(str, config.outer.every))
    lines = [
        "# NoLoCo against DiLoCo and data parallel",
        "",
        f"Model `{config.model}` ({cal['parameters'] / 1e6:.2f}M parameters), {config.steps} inner steps of "
        f"{config.batch_size} × {config.seq_len} tokens per replica (× {config.grad_accum} accumulation), the same data, "
        f"seeds {seeds} and inner {config.inner.optimizer} (lr {config.inner.lr:g}, {config.inner.warmup_steps} warm-up "
        f"steps, cosine) for every method; H = {hs}; backend `{config.backend}`. Validation perplexity is exp(mean "
        f"validation loss over the replicas), on {config.eval_batches} × {config.batch_size} × {config.seq_len} "
        "held-out tokens, the same for every run"
        + (" (mean ± 95% confidence interval over seeds, Student t)." if len(config.seeds) > 1 else " (one seed: no interval)."),
        "",
        "Methods: " + "; ".join(f"**{v}**: {DESC.get(v, v)}" for v in config.methods) + ".",
        "",
        "## NoLoCo / DiLoCo, final validation perplexity (per seed, then mean ± 95% CI; below 1: NoLoCo better)",
        "",
        "| H | M | " + "".join(f"NoLoCo / {SHORT[r]} | " for r in refs) + "NoLoCo / DDP |",
        "|---|---|" + "---|" * (len(refs) + 1),
    ]
    for hkey, mkey, rows in _cells(results):
        noloco = rows.get("noloco", {})
        lines.append(f"| {hkey[1:]} | {mkey[1:]} | " + "".join(f"{_ratio(noloco.get(f'ratio_to_{r}'))} | " for r in refs)
                     + f"{_ratio(_ddp_ratio(rows))} |")
    return lines


def _md_comparisons(results: dict[str, Any]) -> list[str]:
    if not results.get("comparisons"):
        return []
    lines = ["", "## The comparisons: NoLoCo variant / DiLoCo variant, final validation perplexity", "",
             "| comparison | methods | H | M | ratio (below 1: NoLoCo better) |", "|---|---|---|---|---|"]
    for name, cells in results["comparisons"].items():
        subject, reference = COMPARISONS[name]
        for hkey, by_m in cells.items():
            for mkey, ratio in by_m.items():
                lines.append(f"| {name} | {subject} / {reference} | {hkey[1:]} | {mkey[1:]} | {_ratio(ratio)} |")
    return lines


def _md_final_ppl(results: dict[str, Any], refs: list[str]) -> list[str]:
    lines = [
        "",
        "## Final validation perplexity",
        "",
        "| H | M | method | val ppl | " + "".join(f"vs {SHORT[r]} | " for r in refs)
        + "replicas' range | model std before / after the last outer step | sent per rank | run wall s |",
        "|---|---|---|---|" + "---|" * len(refs) + "---|---|---|---|",
    ]
    for hkey, mkey, rows in _cells(results):
        for v, row in rows.items():
            rng = row["replica_ppl_range"]
            lines.append(
                f"| {hkey[1:]} | {mkey[1:]} | {v} | **{_ppl(row['final_val_ppl'], row['final_val_ppl_ci95'])}** | "
                + "".join(f"{_ratio(row.get(f'ratio_to_{r}'))} | " for r in refs)
                + f"{'—' if not rng else f'{rng[0]:.2f} – {rng[1]:.2f}'} | "
                f"{_std(row['last_model_std_before'])} / {_std(row['last_model_std_after'])} | "
                f"{_bytes(row['bytes_sent_per_rank'])} | {_secs(row['wall_seconds'])} |")
    return lines


def _md_time_to_target(config, results: dict[str, Any], refs: list[str]) -> list[str]:
    cal = results["calibration"]
    lines = [
        "",
        "## Simulated wall-clock to a common target perplexity",
        "",
        f"Link between every two replicas: {results['settings']['link']}. Calibrated compute: {cal['step_s']:.4f} s per "
        f"inner step ({cal.get('step_s_is', 'CPU time on one thread')}, measured here; load average "
        f"{cal['loadavg'][0]:.1f} at the time), the same for every method. Every synchronisation costs the link "
        "model's time for the method's message, after the replicas involved have waited for each other. The target "
        "of each (H, M) is the highest final perplexity of any of its runs, so that every run reaches it; times are "
        "per seed (mean ± 95% CI), speed-ups are per seed too (the baseline's time over the method's). 'Measured' "
        "uses each replica's own measured compute"
        + (" (the in-process backend's clock)" if config.backend == "in_process" else " (each rank's wall time per step)")
        + "; 'inner steps' is the same with a link that costs nothing (convergence per step alone).",
        "",
        "| H | M | target ppl | method | simulated total (s) | of which communication (s) | to target (s) | "
        + "".join(f"speed-up vs {SHORT[r]} | " for r in refs) + "measured clock: to target (s) | "
        + "".join(f"measured: vs {SHORT[r]} | " for r in refs) + "inner steps to target | "
        + "".join(f"in steps: vs {SHORT[r]} | " for r in refs),
        "|---|---|---|---|---|---|---|" + "---|" * (3 * len(refs) + 2),
    ]
    for hkey, mkey, rows in _cells(results):
        target = results["common_target_ppl"][hkey][mkey]
        for v, row in rows.items():
            tt = row.get("time_to_target", {})

            def speeds(clock: str) -> str:
                return "".join(f"{_speed((row.get(f'speedup_to_target_vs_{r}') or {}).get(clock))} | " for r in refs)

            lines.append(
                f"| {hkey[1:]} | {mkey[1:]} | {'—' if target is None else f'{target:.2f}'} | {v} | "
                f"{_secs(row['sim_s']['calibrated'])} | {_secs(row['sim_comm_s']['calibrated'])} | "
                f"{_timed(tt.get('calibrated'))} | " + speeds("calibrated") + f"{_timed(tt.get('measured'))} | "
                + speeds("measured") + f"{_timed(tt.get('steps'))} | " + speeds("steps"))
    return lines


def _md_time_to_baselines(results: dict[str, Any], refs: list[str]) -> list[str]:
    lines = [
        "",
        "Time to each baseline's own final perplexity (mean curves over seeds, calibrated clock; 'never': not reached "
        "within the run):",
        "",
        "| H | M | method | " + "".join(f"to {SHORT[r]}'s final (s) | speed-up | " for r in refs),
        "|---|---|---|" + "---|---|" * len(refs),
    ]
    for hkey, mkey, rows in _cells(results):
        for v, row in rows.items():
            reach = [row.get(f"time_to_{ref}_final") or {} for ref in refs]
            lines.append(f"| {hkey[1:]} | {mkey[1:]} | {v} | " + "".join(
                ("never | — | " if r.get("sim_s") is None else f"{_secs(r['sim_s'])} | "
                 + ("—" if not r.get("speedup") else f"{r['speedup']:.2f}×") + " | ") for r in reach))
    return lines


def _md_targets(results: dict[str, Any]) -> list[str]:
    lines = ["", "## Targets", ""]
    for hkey, cells in results["targets"].items():
        for mkey, t in cells.items():
            parts = []
            for ref in REFERENCES_ORDER:
                if f"ratio_to_{ref}" in t:
                    r = t[f"ratio_to_{ref}"]
                    parts.append(f"NoLoCo/{LABELS[ref]} = {r:.3f} ({(r - 1) * 100:+.1f}%): within 1% or better: "
                                 f"{'yes' if t[f'within_1pct_of_{ref}_or_better'] else 'no'}")
            lines.append(f"- H = {hkey[1:]}, M = {mkey[1:]}: " + "; ".join(parts) + ".")
    return lines


def _ddp_ratio(rows: dict[str, Any]) -> dict[str, Any] | None:
    noloco, ddp = rows.get("noloco"), rows.get("ddp")
    if not noloco or not ddp:
        return None
    a, b = noloco["final_val_ppl_seeds"], ddp["final_val_ppl_seeds"]
    return _stat([a[s] / b[s] for s in a if s in b])


# ----------------------------------------------------------------------------------------------
# plots
# ----------------------------------------------------------------------------------------------
def plot_ppl(config, numbers: list[dict[str, Any]], h: int, path: Path, link_text: str) -> None:
    plt = pyplot()

    ms = config.replicas
    fig, axes = plt.subplots(len(ms), 2, figsize=(12, 3.8 * len(ms)), squeeze=False)
    for i, m in enumerate(ms):
        for v, runs in group_runs(config, numbers, h, m).items():
            runs = [n for n in runs if n["curve"]]
            if not runs:
                continue
            steps, ppl, sim = _mean_curve(runs)
            per_seed = np.array([[next(p["val_ppl"] for p in r["curve"] if p["step"] == s) for s in steps] for r in runs])
            later = sim > 0  # the log-scaled clock starts after the first evaluation
            for ax, x, keep in ((axes[i][0], steps, slice(None)), (axes[i][1], sim, later)):
                ax.plot(x[keep], ppl[keep], marker="o", ms=3, color=COLORS[v], label=LABELS[v])
                if len(runs) > 1:
                    ax.fill_between(x[keep], per_seed.min(axis=0)[keep], per_seed.max(axis=0)[keep], color=COLORS[v],
                                    alpha=0.15)
        for j, ax in enumerate(axes[i]):
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
            ax.set_ylabel("validation perplexity")
            ax.set_xlabel("inner step" if j == 0 else "simulated wall-clock (s, log scale)")
            if j == 1:
                ax.set_xscale("log")  # DDP pays its all-reduce every step: minutes where the others take seconds
            ax.set_title(f"H = {h}, M = {m}: against step" if j == 0 else
                         f"H = {h}, M = {m}: against simulated wall-clock ({link_text})", fontsize=9)
            ax.legend(fontsize=8)
            cell = [n for runs in group_runs(config, numbers, h, m).values() for n in runs if n["curve"]]
            low = min((p["val_ppl"] for n in cell for p in n["curve"]), default=None)
            high = max((n["curve"][-1]["val_ppl"] for n in cell), default=None)
            if low and high:  # the part where the methods differ; the first evaluations are far above
                ax.set_ylim(low * 0.97, high * 2.5)
    fig.suptitle("mean over seeds (band: min to max)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_ratio(config, results: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    refs = [r for r in REFERENCES_ORDER if r in config.methods]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.3), squeeze=False)
    markers = ["o", "s", "^", "D"]
    for k, (hkey, cells) in enumerate(results["table"].items()):
        for j, ref in enumerate(refs):
            for ax, field, clock in ((axes[0][0], f"ratio_to_{ref}", None),
                                     (axes[0][1], f"speedup_to_target_vs_{ref}", "calibrated"),
                                     (axes[0][2], f"speedup_to_target_vs_{ref}", "steps")):
                xs, ys, es = [], [], []
                for mkey, rows in cells.items():
                    entry = rows.get("noloco", {}).get(field)
                    entry = entry.get(clock) if (clock and entry) else entry
                    if entry:
                        xs.append(int(mkey[1:]) * (1 + 0.04 * (2 * k + j - 1.5)))
                        ys.append(entry["mean"])
                        es.append(entry["ci95"] or 0.0)
                if xs:
                    ax.errorbar(xs, ys, yerr=es, marker=markers[k % 4], capsize=3, color=COLORS[ref],
                                ls="-" if k == 0 else "--", label=f"vs {LABELS[ref]}, H = {hkey[1:]}")
    axes[0][0].axhline(1.0, color="k", lw=0.8)
    axes[0][0].axhline(0.96, color="k", lw=0.8, ls=":", label="paper: up to 4% lower")
    axes[0][0].set_ylabel("NoLoCo / DiLoCo final validation perplexity")
    for ax, what in ((axes[0][1], "simulated wall-clock"), (axes[0][2], "inner steps (a free link)")):
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_ylabel(f"NoLoCo's speed-up to the common target:\n{what}", fontsize=9)
        ax.set_yscale("log")
    for ax in axes[0]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(config.replicas, [str(m) for m in config.replicas])
        ax.set_xlabel("M (replicas)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"mean over seeds {', '.join(map(str, config.seeds))} ± 95% CI", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_std(config, numbers: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()

    hs, ms = config.outer.every, config.replicas
    fig, axes = plt.subplots(len(hs), len(ms), figsize=(5.2 * len(ms), 3.6 * len(hs)), squeeze=False)
    for i, h in enumerate(hs):
        for j, m in enumerate(ms):
            ax = axes[i][j]
            for v, runs in group_runs(config, numbers, h, m).items():
                runs = [r for r in runs if r["model_std"]]
                if not runs or v == "ddp":
                    continue
                for key, ls, suffix in (("before", "-", "before outer step (θ)"), ("after", "--", "after (φ)")):
                    steps = sorted({p["step"] for p in runs[0]["model_std"]})
                    vals = [np.mean([next((p[key] for p in r["model_std"] if p["step"] == s), np.nan) or np.nan
                                     for r in runs]) for s in steps]
                    pts = [(s, y) for s, y in zip(steps, vals) if y and y > 0 and math.isfinite(y)]
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, marker="o", ms=2, color=COLORS[v],
                                label=f"{LABELS[v]}, {suffix}")
            ax.set_yscale("log")
            ax.set_xlabel("inner step")
            ax.set_ylabel("model std (RMS from the replicas' mean)")
            ax.set_title(f"H = {h}, M = {m}, mean over seeds (DDP, DiLoCo after sync: 0)", fontsize=8)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(config, numbers: list[dict[str, Any]], calibration: dict[str, Any], link, *, wall_s: float,
                 timings: dict[str, float], command: str | None = None) -> dict[str, Any]:
    out = Path(config.out)
    table, cell_targets = compare_table(config, numbers)
    results = {
        "command": command,
        "settings": {**config.model_dump(mode="json"), "link": link.describe(), "cpu_count": os.cpu_count()},
        "calibration": {k: v for k, v in calibration.items() if k not in ("cpu_s_all", "wall_s_all")},
        "table": table,
        "common_target_ppl": cell_targets,
        "targets": targets(config, table),
        "comparisons": comparisons(config, table),
        "runs": numbers,
        "wall_seconds": wall_s,
        "timings": timings,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1))
    write_markdown(config, results, out / "results.md")
    link_text = link.describe().rsplit(", all-reduce", 1)[0]
    for h in config.outer.every:
        plot_ppl(config, numbers, h, out / f"ppl-H{h}.png", link_text)
    plot_ratio(config, results, out / "ratio.png")
    plot_std(config, numbers, out / "std.png")
    return results
