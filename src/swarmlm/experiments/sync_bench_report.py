"""``sync.md`` and ``sync.png`` of ``swarmlm noloco sync-bench``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from swarmlm.experiments.plots import pyplot

LABELS = {
    "allreduce-gloo": "all-reduce (torch/gloo)",
    "allreduce": "all-reduce (emulated)",
    "pair": "NoLoCo pair (as trained: rendezvous + fresh link)",
    "pair-persistent": "NoLoCo pair (persistent link)",
}


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1000:.1f}"


def _cell(rows, m, op, latency, straggler=False):
    return next((r for r in rows if r["M"] == m and r["op"] == op and r["latency_ms"] == latency
                 and r["straggler"] == straggler), None)


def write_markdown(config, report: dict[str, Any], path: Path) -> None:
    """``sync.md``: the measured step per M and operation beside the model, the straggler's effect, the analytic
    extension to many replicas and the targets."""
    s = report["settings"]
    ms = sorted({r["M"] for r in report["cells"]})
    lines = [
        "# Synchronisation step: NoLoCo pair exchange against all-reduce",
        "",
        f"One synchronisation of {s['numel']:,} fp32 values ({s['bytes'] / 2**20:.2f} MiB) per rank, M local processes "
        f"(gloo over loopback) on {s['cpu_count']} CPU cores. Injected link: {s['link']}. "
        f"Median over {config.repeats} repeats of the slowest rank's time (barrier to end of its operation), in ms.",
        "",
        "Load average (1 min) before each M: " + ", ".join(
            f"M={m}: {report['load'][str(m)]['loadavg_before'][0]:.1f}" for m in ms if str(m) in report["load"]) + ".",
    ]
    lines += _measured_lines(config, report, ms)
    lines += _straggler_lines(config, report, ms)
    lines += _analytic_lines(config, report)
    lines += _target_lines(config, report)
    path.write_text("\n".join(lines) + "\n")


def _measured_lines(config, report: dict[str, Any], ms: list[int]) -> list[str]:
    rows = report["cells"]
    lat = config.latency_ms
    latencies = sorted({r["latency_ms"] for r in rows})
    algorithm = {m: (_cell(rows, m, "allreduce", lat) or _cell(rows, m, "allreduce", 0.0) or {}).get("algorithm") for m in ms}
    lines = ["", "## Measured", ""]
    header = ["M", "all-reduce algorithm"]
    columns = []
    for latency in latencies:
        for op in ("allreduce-gloo", "allreduce", "pair", "pair-persistent"):
            if op == "allreduce-gloo" and latency > 0:
                continue
            columns.append((op, latency))
            header.append(f"{LABELS[op]}, {latency:g} ms")
    if lat > 0:
        header += [f"model: all-reduce, {lat:g} ms", f"model: pair, {lat:g} ms"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    model_rows = {r["M"]: r for r in report["analytic"] if r["size"] == "bench tensor"}
    for m in ms:
        cells = [str(m), algorithm.get(m) or "—"]
        for op, latency in columns:
            c = _cell(rows, m, op, latency)
            cells.append(_ms(c["step_s"]) if c else "—")
        if lat > 0:
            a = model_rows.get(m)
            alg = algorithm.get(m) or (a["best"] if a else None)
            cells += [_ms(a[f"{alg}_s"]) if a and alg else "—", _ms(a["pair_s"]) if a else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    bad = [r for r in rows if not r["ok"]]
    lines += ["", "Every transfer delivered the exact expected values." if not bad else
              f"**{len(bad)} cells had a wrong or skipped transfer**: " + ", ".join(f"M={r['M']} {r['op']}" for r in bad)]
    fit = report["fit"]
    lines += [
        "",
        "The model columns are the α-β cost of the injected link plus this machine's overheads, fitted to the "
        f"latency-0 runs: {fit['allreduce_per_hop_s'] * 1000:.2f} ms per all-reduce message, "
        f"{fit['pair_persistent_s'] * 1000:.2f} ms per persistent pair exchange "
        f"(the exchange as trained: {fit['pair_fresh_s'] * 1000:.2f} ms, most of it the rendezvous and the fresh link). "
        + (f"Largest deviation of the model from the injected measurements: {fit['max_abs_error'] * 100:.0f}%."
           if fit.get("max_abs_error") is not None else ""),
    ]
    return lines


def _straggler_lines(config, report: dict[str, Any], ms: list[int]) -> list[str]:
    if config.straggler_s <= 0:
        return []
    rows = report["cells"]
    lines = [
        "",
        f"## One straggler (rank {config.straggler_rank} joins {config.straggler_s * 1000:.0f} ms late)",
        "",
        f"Median over {config.straggler_repeats} repeats, in ms: the straggler's own time after its delay, its "
        "partner's time (NoLoCo), and the other ranks' time (median and slowest). Without a straggler, a rank "
        "takes the 'alone' time.",
        "",
        "| M | operation | link | alone | straggler (after its delay) | its partner | other ranks (median) | other ranks (slowest) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in ms:
        for latency in sorted({r["latency_ms"] for r in rows}):
            for op in ("allreduce-gloo", "allreduce", "pair", "pair-persistent"):
                c = _cell(rows, m, op, latency, True)
                base = _cell(rows, m, op, latency)
                if not c:
                    continue
                lines.append(f"| {m} | {LABELS[op]} | {latency:g} ms | {_ms(base['rank_median_s'] if base else None)} | "
                             f"{_ms(c.get('straggler_own_s'))} | {_ms(c.get('partner_s'))} | {_ms(c.get('others_s'))} | "
                             f"{_ms(c.get('others_max_s'))} |")
    return lines


def _analytic_lines(config, report) -> list[str]:
    sizes = []
    for r in report["analytic"]:
        if r["size"] not in sizes:
            sizes.append(r["size"])
    out = [
        "",
        f"## Analytic model, M up to {max(config.analytic_replicas)}",
        "",
        f"Link: {report['settings']['link']}. Pair: α + nβ. Ring: 2(M−1)(α + nβ/M). Binomial tree: 2⌈log₂M⌉(α + nβ). "
        "Halving-doubling: 2·log₂P·α + 2(P−1)/P·nβ (P = largest power of two ≤ M, plus 2(α + nβ) to fold in the rest). "
        "For the bench tensor, the fitted overheads of this machine are added (per all-reduce message, and per pair "
        "exchange); the other sizes use the link alone. 'With waiting': every replica's compute time per "
        f"synchronisation varies with σ = {config.jitter_ms:g} ms, and a synchronisation waits for the slowest of its "
        "members: σ·E[max of 2 normals] for a pair, σ·E[max of M] for an all-reduce.",
        "",
        "| size | M | pair | ring | tree | halving-doubling | best all-reduce | best / pair | with waiting: pair | with waiting: all-reduce | best / pair with waiting |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        for r in report["analytic"]:
            if r["size"] != size:
                continue
            out.append(
                f"| {size} | {r['M']} | {_s(r['pair_s'])} | {_s(r['ring_s'])} | {_s(r['tree_s'])} | {_s(r['halving_doubling_s'])} | "
                f"{r['best']} | {r['speedup']:.1f}× | {_s(r['pair_s'] + r['pair_wait_s'])} | "
                f"{_s(r['best_s'] + r['allreduce_wait_s'])} | {r['speedup_with_wait']:.1f}× |")
    out += ["", "Times in seconds."]
    return out


def _s(seconds: float) -> str:
    return f"{seconds:.3g}"


def _target_lines(config, report) -> list[str]:
    t = report["targets"]
    out = ["", "## Targets", ""]
    for key, growth in t.items():
        if not key.startswith("growth_"):
            continue
        latency = key[len("growth_latency_"):]
        parts = [f"{LABELS[op]} ×{g['ratio']:.2f} ({_ms(g['from_s'])} → {_ms(g['to_s'])} ms)" for op, g in growth.items()]
        if parts:
            first = next(iter(growth.values()))
            out.append(f"- Growth of the sync step from M = {first['from_M']} to {first['to_M']}, link latency {latency}: "
                       + "; ".join(parts) + ".")
    s = t.get("straggler")
    if s:
        out.append(f"- Straggler: NoLoCo partners waited at least {_ms(s['pair_partner_extra_min_s'])} ms extra, the other "
                   f"NoLoCo ranks at most {_ms(s['pair_others_extra_max_s'])} ms extra; in every all-reduce the other ranks "
                   f"waited at least {_ms(s['allreduce_others_extra_min_s'])} ms extra. Only the partner waits: "
                   f"{'yes' if s['only_partner_waits'] else 'no'}. Everyone waits in an all-reduce: "
                   f"{'yes' if s['allreduce_everyone_waits'] else 'no'}.")
    return out


_OP_COLORS = {"allreduce-gloo": "tab:gray", "allreduce": "tab:red", "pair": "tab:blue", "pair-persistent": "tab:green"}


def plot(config, report: dict[str, Any], path: Path) -> None:
    """Three panels: the measured synchronisation step per M, the analytic model with the measurements over it, and
    the extra wait one straggler causes."""
    plt = pyplot()
    rows = report["cells"]
    ms = sorted({r["M"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    _plot_measured(axes[0], rows, ms)
    _plot_analytic(axes[1], config, report, rows, ms)
    _plot_straggler(axes[2], config, report, ms)
    fig.suptitle(f"Synchronisation step: {report['settings']['numel']:,} fp32 values per rank")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_measured(ax, rows: list[dict[str, Any]], ms: list[int]) -> None:
    colors = _OP_COLORS
    latencies = sorted({r["latency_ms"] for r in rows})
    for latency in latencies:
        for op in ("allreduce-gloo", "allreduce", "pair", "pair-persistent"):
            ys = [(_cell(rows, m, op, latency) or {}).get("step_s") for m in ms]
            if all(y is None for y in ys):
                continue
            ax.plot(ms, [np.nan if y is None else y * 1000 for y in ys], marker="o",
                    ls="-" if latency == 0 else "--", color=colors[op], label=f"{LABELS[op]}, {latency:g} ms")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel("replicas M (processes on this machine)")
    ax.set_ylabel("sync step (ms, median of slowest rank)")
    ax.set_title("Measured")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6.5)


def _plot_analytic(ax, config, report: dict[str, Any], rows: list[dict[str, Any]], ms: list[int]) -> None:
    colors = _OP_COLORS
    bench = [r for r in report["analytic"] if r["size"] == "bench tensor"]
    mm = [r["M"] for r in bench]
    for key, color, label in (("pair_s", "tab:green", "pair"), ("ring_s", "tab:orange", "ring"),
                              ("tree_s", "tab:purple", "tree"), ("halving_doubling_s", "tab:brown", "halving-doubling")):
        ax.plot(mm, [r[key] * 1000 for r in bench], color=color, label=f"model: {label}")
    ax.plot(mm, [(r["pair_s"] + r["pair_wait_s"]) * 1000 for r in bench], color="tab:green", ls=":",
            label=f"model: pair + wait (σ={config.jitter_ms:g} ms)")
    ax.plot(mm, [(r["best_s"] + r["allreduce_wait_s"]) * 1000 for r in bench], color="tab:red", ls=":",
            label="model: best all-reduce + wait")
    lat = config.latency_ms
    if lat > 0:
        for op, marker in (("allreduce", "s"), ("pair-persistent", "^"), ("pair", "v")):
            pts = [(m, _cell(rows, m, op, lat)) for m in ms]
            pts = [(m, c["step_s"]) for m, c in pts if c]
            if pts:
                ax.scatter([p[0] for p in pts], [p[1] * 1000 for p in pts], marker=marker, color=colors[op], zorder=3,
                           label=f"measured: {LABELS[op]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(mm, [str(m) for m in mm], fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("replicas M")
    ax.set_ylabel("sync step (ms)")
    ax.set_title(f"Analytic model ({report['settings']['link']})", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6.5)


def _plot_straggler(ax, config, report: dict[str, Any], ms: list[int]) -> None:
    colors = _OP_COLORS
    lat = config.latency_ms
    waits = (report["targets"].get("straggler") or {}).get("waits", [])
    if waits:
        show = [w for w in waits if w["latency_ms"] == (lat if lat > 0 else 0.0)]
        ops = [op for op in ("allreduce-gloo", "allreduce", "pair", "pair-persistent") if any(w["op"] == op for w in show)]
        width = 0.8 / max(1, 2 * len(ops))
        x = np.arange(len(ms))
        k = 0
        for op in ops:
            for who, hatch in (("others_extra_s", ""), ("partner_extra_s", "//")):
                ys = [next((w[who] for w in show if w["M"] == m and w["op"] == op), None) for m in ms]
                if all(y is None for y in ys):
                    continue
                ax.bar(x + (k - len(ops)) * width + width / 2, [0 if y is None else y * 1000 for y in ys], width,
                       color=colors[op], hatch=hatch, alpha=0.85 if who == "others_extra_s" else 0.5,
                       label=f"{LABELS[op]}: {'other ranks' if who == 'others_extra_s' else 'partner'}")
                k += 1
        ax.axhline(config.straggler_s * 1000, color="k", ls=":", lw=1, label="straggler's delay")
        ax.set_xticks(x, [str(m) for m in ms])
        ax.set_xlabel("replicas M")
        ax.set_ylabel("extra wait caused by the straggler (ms)")
        ax.set_title(f"One straggler, {config.straggler_s * 1000:.0f} ms late (link {lat:g} ms)", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    else:
        ax.set_axis_off()


def write_sync_report(config, report: dict[str, Any], out: Path) -> None:
    write_markdown(config, report, out / "sync.md")
    plot(config, report, out / "sync.png")
