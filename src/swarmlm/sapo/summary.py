"""Totals of SAPO runs, read back from the nodes' ``metrics.jsonl`` files: per node (:func:`node_totals`) and
per run of several nodes on one machine (:func:`run_summary`, written as the run's ``summary.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from swarmlm.runtime.environment import describe_environment
from swarmlm.runtime.metrics import read_jsonl
from swarmlm.sapo.warmstart import warmstart_info


def node_dir(out: str | Path, index: int) -> Path:
    """Where node ``index`` of a run on one machine writes (``sapo simulate`` and ``sapo swarm``)."""
    return Path(out) / f"node-{index}"


def node_totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One node's totals from its per-round metrics: rewards, held-out pass@1, records received, accepted and
    dropped (by reason), external groups used, peers, and the transport's share of the round time. The ``round: 0``
    row (held-out pass@1 before any update) gives the first pass@1 and takes no part in the sums."""
    start = [r for r in rows if r.get("round") == 0]
    rows = [r for r in rows if r.get("round", 0) >= 1]
    round_s = sum(r.get("round_seconds") or 0.0 for r in rows)
    transport_s = sum(r.get("transport_seconds") or 0.0 for r in rows)
    wait_s = sum(r.get("dht_wait_seconds") or 0.0 for r in rows)
    sources: dict[str, int] = {}
    for r in rows:
        for peer, n in (r.get("external_sources") or {}).items():
            sources[peer] = sources.get(peer, 0) + n
    evals = [r["eval_pass1"] for r in start + rows if r.get("eval_pass1") is not None]
    cumulative = sum(r["reward_own"] for r in rows)
    return {
        "node_id": (rows or start)[-1].get("node") if rows or start else None,
        "rounds": len(rows),
        "cumulative_reward_own": cumulative,
        "mean_reward_own": cumulative / len(rows) if rows else None,
        "first_eval_pass1": evals[0] if evals else None,
        "final_eval_pass1": evals[-1] if evals else None,
        "final_format_rate": rows[-1].get("format_rate") if rows else None,
        "min_format_rate": min((r["format_rate"] for r in rows if r.get("format_rate") is not None), default=None),
        "records_received": sum(r.get("records_received", 0) for r in rows),
        "records_accepted": sum(r.get("records_accepted", 0) for r in rows),
        "records_dropped": sum(r.get("records_dropped", 0) for r in rows),
        "drops": rows[-1].get("drops", {}) if rows else {},
        "external_used": sum(r.get("external_used", 0) for r in rows),
        "external_sources": sources,
        "peers_seen": max((r.get("peers_seen", 0) for r in rows), default=0),
        "round_seconds_mean": round_s / len(rows) if rows else None,
        "transport_seconds_mean": transport_s / len(rows) if rows else None,
        "transport_fraction": transport_s / round_s if round_s > 0 else None,
        # of which: waiting for peers that had not published yet, and the DHT's own work (publish, reads)
        "transport_wait_fraction": wait_s / round_s if round_s > 0 else None,
        "transport_io_fraction": (transport_s - wait_s) / round_s if round_s > 0 else None,
    }


def run_summary(out: str | Path, num_nodes: int, wall_seconds: float | None = None) -> dict[str, Any]:
    """Every node's totals, the swarm's cumulative own reward and mean final pass@1, and the records its nodes
    accepted and dropped (by reason), read from the nodes' metrics."""
    nodes = {f"node-{k}": node_totals(read_jsonl(node_dir(out, k) / "metrics.jsonl")) for k in range(num_nodes)}
    finals = [n["final_eval_pass1"] for n in nodes.values() if n["final_eval_pass1"] is not None]
    drops: dict[str, int] = {}
    for n in nodes.values():
        for reason, count in n["drops"].items():
            drops[reason] = drops.get(reason, 0) + count
    summary = {
        "nodes": nodes,
        "total_cumulative_reward_own": sum(n["cumulative_reward_own"] for n in nodes.values()),
        "mean_final_eval_pass1": sum(finals) / len(finals) if finals else None,
        "records_accepted": sum(n["records_accepted"] for n in nodes.values()),
        "records_dropped": sum(n["records_dropped"] for n in nodes.values()),
        "drops": drops,
        "wall_seconds": wall_seconds,
    }
    return summary


def write_summary(out: str | Path, summary: dict[str, Any]) -> None:
    """The run's ``OUT/summary.json``, written once when the run is over."""
    Path(out, "summary.json").write_text(json.dumps(summary, indent=1))


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def summary_table(summary: dict[str, Any]) -> str:
    """Markdown: one row per node of a run's ``summary.json`` contents, then the mean over nodes."""
    rows = ["| node | pass@1 at start | pass@1 at end | change | cumulative own reward | format rate (last / lowest) |",
            "|---|---|---|---|---|---|"]
    starts, ends = [], []
    for name, node in summary["nodes"].items():
        start, end = node.get("first_eval_pass1"), node.get("final_eval_pass1")
        change = None if start is None or end is None else end - start
        if change is not None:
            starts.append(start)
            ends.append(end)
        rows.append(f"| {name} | {_fmt(start)} | {_fmt(end)} | {'—' if change is None else f'{change:+.3f}'} | "
                    f"{node['cumulative_reward_own']:.2f} | {_fmt(node.get('final_format_rate'), 2)} / "
                    f"{_fmt(node.get('min_format_rate'), 2)} |")
    if starts and len(summary["nodes"]) > 1:  # the mean over nodes (a lone node's row is its own)
        s, e = sum(starts) / len(starts), sum(ends) / len(ends)
        rows.append(f"| mean | {s:.3f} | {e:.3f} | {e - s:+.3f} | {summary['total_cumulative_reward_own'] / len(summary['nodes']):.2f} | |")
    return "\n".join(rows)


def sharing_line(summary: dict[str, Any]) -> str:
    """One line: the records a swarm's nodes accepted and dropped (by reason, most first), and the transport's
    share of the round time (waiting for peers, and the DHT's own work)."""
    drops = sorted((summary.get("drops") or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    reasons = f" ({', '.join(f'{reason} {n}' for reason, n in drops)})" if drops else ""
    line = f"records: {summary.get('records_accepted', 0)} accepted, {summary.get('records_dropped', 0)} dropped{reasons}"
    share = summary.get("transport_fraction")
    if share is not None:
        parts = [f"{label} {summary[key]:.1%}" for label, key in (("waiting", "transport_wait_fraction"),
                                                                   ("DHT work", "transport_io_fraction"))
                 if summary.get(key) is not None]
        line += f"; transport {share:.1%} of round time" + (f" ({', '.join(parts)})" if parts else "")
    return line


def provenance(initial_model: str | dict[str, str]) -> dict[str, Any]:
    """Where a run's numbers come from: this machine (``environment``), the model the nodes began from and, for a
    warm start, its ``warmstart.json`` (float32 training gives another warm start on another processor). A
    heterogeneous run passes ``{model name: initial weights}`` and gets ``initial_models``, one entry per model."""
    if isinstance(initial_model, dict) and len(initial_model) == 1:
        initial_model = next(iter(initial_model.values()))
    if isinstance(initial_model, str):
        return {"environment": describe_environment(), "initial_model": initial_model,
                "warmstart": warmstart_info(initial_model)}
    return {"environment": describe_environment(), "initial_models": {
        name: {"initial_model": path, "warmstart": warmstart_info(path)} for name, path in initial_model.items()}}


def provenance_line(summary: dict[str, Any]) -> str:
    """One line: the machine the run took, and the one its warm start was trained on with its final loss (the
    same settings give another warm start, and other numbers, on another processor)."""
    env = summary.get("environment") or {}
    line = f"machine: {env.get('cpu', 'unknown')}, torch {env.get('torch')}, {env.get('torch_threads')} thread(s)"
    ws = summary.get("warmstart")
    if ws:
        trained_on = (ws.get("environment") or {}).get("cpu", "an unrecorded machine")
        loss = ws.get("final_loss")
        loss = f"final loss {loss:.4f}" if isinstance(loss, (int, float)) else "no final loss recorded"
        line += f"; warm start: {'shipped with swarmlm, ' if ws.get('shipped') else ''}{loss}, trained on {trained_on}"
    return line
