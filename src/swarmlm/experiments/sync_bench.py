"""``swarmlm noloco sync-bench``: the time of one synchronisation step, NoLoCo's pair exchange against an
all-reduce of the same tensor, as the number of replicas grows; with and without an injected link, and
with one straggler. An analytic model, fitted to the measurements, extends them to M = 64…1024.

For every M in ``--replicas``, M local processes (gloo over loopback) run these operations on a tensor
of ``--numel`` fp32 values, ``--repeats`` times each, every time after a barrier so that all ranks start
together:

- ``allreduce-gloo``: torch's own all-reduce (no injection possible; the library's algorithm);
- ``allreduce``: the emulated all-reduce of :mod:`swarmlm.noloco.comm.emulated` (the algorithm the model
  picks for the injected link), over point-to-point messages, at latency 0 and at ``--latency-ms``;
- ``pair``: NoLoCo's exchange exactly as training runs it (store rendezvous with a deadline, a fresh
  two-rank gloo link, one isend and one irecv), with the pairs of that outer step;
- ``pair-persistent``: the same transfer over a link made before the clock starts, which is the
  algorithm's one hop without this implementation's per-exchange set-up.

A rank's time runs from the end of the barrier to the end of its own operation. The "sync step" is the
slowest rank's time, and the table gives its median over repeats. With a straggler, rank
``--straggler-rank`` sleeps ``--straggler-s`` before it joins; every other rank's time is then the wait
it suffered.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from swarmlm.config import StrictModel, dump_config, parse_list
from swarmlm.experiments.plots import require_matplotlib
from swarmlm.noloco.comm.link_model import ALGORITHMS, LinkModel
from swarmlm.noloco.config import Algorithm

log = logging.getLogger(__name__)

OPS = ("allreduce-gloo", "allreduce", "pair", "pair-persistent")


class SyncBenchConfig(StrictModel):
    """``swarmlm noloco sync-bench``: one synchronisation step, pair exchange against all-reduce."""

    out: str = Field("runs/sync-bench", description="output directory (sync.md, sync.png, sync.json)")
    replicas: list[int] = Field([2, 4, 8, 16], description="M values to measure (one launch of M processes each)")
    numel: int = Field(262_144, ge=1, description="fp32 values in the synchronised tensor (262144 = 1 MiB)")
    repeats: int = Field(7, ge=1, description="timed repeats of every operation (the median is reported)")
    straggler_repeats: int = Field(3, ge=1, description="timed repeats with the straggler")
    latency_ms: float = Field(50.0, ge=0, description="injected one-way latency per message (the 'with latency' case)")
    bandwidth_gbit: float = Field(1.0, ge=0, description="injected link bandwidth in Gbit/s (0 = unlimited)")
    allreduce: Algorithm = Field("best", description="emulated all-reduce algorithm (best = the model's cheapest for the injected link)")
    straggler_s: float = Field(0.5, ge=0, description="delay of the straggler before it joins (0 = no straggler runs)")
    straggler_rank: int = Field(0, ge=0, description="the rank that straggles")
    timeout_s: float = Field(60.0, gt=0, description="NoLoCo exchange deadline (must exceed the straggler's delay)")
    seed: int = Field(0, ge=0, description="seed of the pairings")
    analytic_replicas: list[int] = Field([64, 128, 256, 512, 1024], description="M values of the analytic extension")
    analytic_mbytes: list[float] = Field([12.9, 500.0], description="extra message sizes (MB) for the analytic table: "
                                                                     "12.9 = tiny-llama in fp32, 500 = a 125M model")
    jitter_ms: float = Field(50.0, ge=0, description="analytic model: std of each replica's compute time per sync "
                                                      "(synchronising ranks wait for the slowest of them)")

    _lists = field_validator("replicas", "analytic_replicas", mode="before")(parse_list)

    @field_validator("replicas")
    @classmethod
    def _at_least_two(cls, values: list[int]) -> list[int]:
        if not values or min(values) < 2:
            raise ValueError("every M must be at least 2")
        return sorted(set(values))


# ----------------------------------------------------------------------------------------------
# the worker: one rank of one launch
# ----------------------------------------------------------------------------------------------
def _pairs(m: int, seed: int, index: int) -> list[list[int]]:
    from swarmlm.noloco.groups import make_groups

    return make_groups(m, 2, seed, index + 1, "join")


def bench_worker(config_json: str) -> list[dict[str, Any]]:
    """One rank: every operation × latency × straggler, timed; returns this rank's records."""
    import torch
    import torch.distributed as dist

    from swarmlm.runtime.distributed import destroy_process_group, init_process_group

    config = SyncBenchConfig.model_validate_json(config_json)
    torch.set_num_threads(1)
    rank, world = init_process_group(backend="gloo", timeout_s=max(300.0, 4 * config.timeout_s))
    key = [os.urandom(6).hex() if rank == 0 else None]
    dist.broadcast_object_list(key, src=0)
    bench = _RankBench(config, rank, world, key[0])
    records: list[dict[str, Any]] = []
    for op, latency, straggle, repeats in _plan(config):
        for index in range(repeats + 1):  # the first is a warm-up, not recorded
            record = bench.timed(op, latency, straggle, index)
            if index > 0 and record is not None:
                records.append(record)
    dist.barrier()
    bench.plain.finish(grace_s=2 * config.timeout_s)
    destroy_process_group()
    return records


def _plan(config: SyncBenchConfig) -> list[tuple[str, float, bool, int]]:
    """(operation, injected latency in ms, with a straggler, repeats) in the order they are timed."""
    plan = []
    for latency in sorted({0.0, config.latency_ms}):
        for op in OPS:
            if op == "allreduce-gloo" and latency > 0:
                continue  # the library's all-reduce cannot be delayed per message
            plan.append((op, latency, False, config.repeats))
            if config.straggler_s > 0:
                plan.append((op, latency, True, config.straggler_repeats))
    return plan


class _RankBench:
    """One rank's communicators (the plain one, and an emulated link per latency) and its timed operations."""

    def __init__(self, config: SyncBenchConfig, rank: int, world: int, key: str):
        import torch

        from swarmlm.noloco.comm.emulated import EmulatedCommunicator
        from swarmlm.noloco.comm.exchange import DistributedCommunicator

        self.config, self.rank, self.world, self.key = config, rank, world, key
        nbytes = config.numel * 4
        injected = LinkModel(config.latency_ms / 1000,
                             config.bandwidth_gbit * 1e9 / 8 if config.bandwidth_gbit > 0 else math.inf, config.allreduce)
        self.algorithm = injected.best_algorithm(nbytes, world) if config.allreduce == "best" else config.allreduce
        self.plain = DistributedCommunicator(rank=rank, world_size=world, timeout_s=config.timeout_s,
                                             run_key=f"sync-{key}")
        self.links = {lat: EmulatedCommunicator(
            link=LinkModel(lat / 1000, injected.bandwidth if lat > 0 else math.inf, self.algorithm),
            rank=rank, world_size=world, timeout_s=config.timeout_s, run_key=f"sync-{key}")
            for lat in sorted({0.0, config.latency_ms})}
        self.payload = torch.full((config.numel,), float(rank))
        self.exchanges = 0

    def timed(self, op: str, latency: float, straggle: bool, index: int) -> dict[str, Any] | None:
        """Run ``op`` once after a barrier (the straggler sleeping first) and time it; None for a persistent pair
        link where this rank is in a group of three."""
        import torch.distributed as dist

        from swarmlm.noloco.comm.exchange import forget_pair_group

        config = self.config
        group = next(g for g in _pairs(self.world, config.seed, index) if self.rank in g)
        pg = None
        if op == "pair-persistent":
            pg, group = self._persistent_link(index, f"{latency}-{int(straggle)}")
        dist.barrier()
        started = time.perf_counter()
        if straggle and self.rank == config.straggler_rank % self.world:
            time.sleep(config.straggler_s)
        info = self._run(op, latency, pg, group)
        seconds = time.perf_counter() - started
        if pg is not None:
            forget_pair_group(pg)
        if op == "pair-persistent" and pg is None:
            return None
        return {"op": op, "latency_ms": latency, "straggler": straggle, "repeat": index, "rank": self.rank,
                "M": self.world, "seconds": seconds, "group": group, **info}

    def _persistent_link(self, index: int, tag: str):
        """A two-rank gloo group of this rank's pair, connected by a first tiny message before any clock starts
        (None for a group of three: odd M, not a single hop, measured by "pair" only)."""
        import datetime

        import torch
        import torch.distributed as dist

        from swarmlm.noloco.comm.exchange import send_recv

        group = next(g for g in _pairs(self.world, self.config.seed, index) if self.rank in g)
        pg = None
        if len(group) == 2:
            low, high = group
            prefix = dist.PrefixStore(f"swarmlm/sync/{self.key}/persist/{tag}/{index}/{low}-{high}/", self.plain.store)
            pg = dist.ProcessGroupGloo(prefix, 0 if self.rank == low else 1, 2,
                                       datetime.timedelta(seconds=self.config.timeout_s))
        dist.barrier()
        if pg is not None:
            for work in send_recv(pg, {group[0]: 0, group[1]: 1}, torch.zeros(1), torch.zeros(1),
                                  1 if self.rank == group[0] else 0):
                work.wait()
        return pg, group

    def _run(self, op: str, latency: float, pg, group: list[int]) -> dict[str, Any]:
        """One synchronisation and whether every rank got what it should."""
        import torch

        comm, rank, world = self.links[latency], self.rank, self.world
        if op in ("allreduce-gloo", "allreduce"):
            x = self.payload.clone()
            (self.plain if op == "allreduce-gloo" else comm).all_reduce_mean_(x)
            ok = bool(torch.allclose(x, torch.full_like(x, (world - 1) / 2)))
            return {"ok": ok} if op == "allreduce-gloo" else {"ok": ok, "algorithm": self.algorithm}
        if op == "pair":
            self.exchanges += 1
            result = comm.exchange(self.exchanges, group, self.payload)
            ok = not result.skipped and all(bool((t == float(p)).all()) for p, t in result.received.items())
            return {"ok": ok, "partners": sorted(result.received), "skipped": sorted(result.skipped)}
        if op == "pair-persistent":
            if pg is None:
                return {"ok": None, "partners": []}
            peer = next(p for p in group if p != rank)
            buffer = torch.empty_like(self.payload)
            for work in comm.pair_transfer(pg, {group[0]: 0, group[1]: 1}, self.payload, buffer,
                                           1 if rank == group[0] else 0):
                work.wait()
            return {"ok": bool((buffer == float(peer)).all()), "partners": [peer]}
        raise ValueError(op)


# ----------------------------------------------------------------------------------------------
# aggregation, fitting and the analytic model
# ----------------------------------------------------------------------------------------------
def summarize_cells(records: list[dict[str, Any]], straggler_rank: int, straggler_s: float) -> list[dict[str, Any]]:
    """One row per (M, op, latency, straggler): the sync step's median time over repeats, and with a
    straggler, the waits of its partner(s) and of the other ranks."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for r in records:
        cells.setdefault((r["M"], r["op"], r["latency_ms"], r["straggler"]), []).append(r)
    rows = []
    for (m, op, latency, straggle), rs in sorted(cells.items()):
        by_repeat: dict[int, list[dict[str, Any]]] = {}
        for r in rs:
            by_repeat.setdefault(r["repeat"], []).append(r)
        step = [max(x["seconds"] for x in rep) for rep in by_repeat.values()]
        row: dict[str, Any] = {"M": m, "op": op, "latency_ms": latency, "straggler": straggle,
                               "repeats": len(by_repeat), "step_s": statistics.median(step),
                               "step_s_min": min(step), "step_s_max": max(step),
                               "rank_median_s": statistics.median(x["seconds"] for x in rs),
                               "ok": all(x.get("ok") is not False for x in rs),
                               "algorithm": next((x["algorithm"] for x in rs if x.get("algorithm")), None)}
        if straggle:
            s = straggler_rank % m
            partner, others, own = [], [], []
            for rep in by_repeat.values():
                group = next(x["group"] for x in rep if x["rank"] == s)
                for x in rep:
                    if x["rank"] == s:
                        own.append(x["seconds"] - straggler_s)
                    elif op.startswith("pair") and x["rank"] in group:
                        partner.append(x["seconds"])
                    else:
                        others.append(x["seconds"])
            row.update({"straggler_own_s": statistics.median(own) if own else None,
                        "partner_s": statistics.median(partner) if partner else None,
                        "others_s": statistics.median(others) if others else None,
                        "others_max_s": max(others) if others else None})
        rows.append(row)
    return rows


def _cell(rows, m, op, latency, straggler=False):
    return next((r for r in rows if r["M"] == m and r["op"] == op and r["latency_ms"] == latency
                 and r["straggler"] == straggler), None)


def fit_overheads(rows: list[dict[str, Any]], link: LinkModel, nbytes: int) -> dict[str, Any]:
    """Per-message overhead of this machine's transport, fitted to the measurements without a straggler:

    - all-reduce: ``t(M) = hops(M) · o`` (least squares through 0), from the latency-0 emulated runs;
    - pair: ``t = c`` (the median over M), for the persistent link and for the exchange as trained
      (whose c includes the rendezvous and the fresh link).

    The model's prediction for the injected link is then ``cost(link) + overhead``; its error against the
    injected measurements is reported."""
    ar = [r for r in rows if r["op"] == "allreduce" and r["latency_ms"] == 0 and not r["straggler"]]
    hops = np.array([link.hops(r["M"], r["algorithm"]) for r in ar], dtype=float)
    times = np.array([r["step_s"] for r in ar])
    per_hop = float((hops @ times) / (hops @ hops)) if len(ar) and hops.any() else 0.0
    pair = [r["step_s"] for r in rows if r["op"] == "pair-persistent" and r["latency_ms"] == 0 and not r["straggler"]]
    fresh = [r["step_s"] for r in rows if r["op"] == "pair" and r["latency_ms"] == 0 and not r["straggler"]]
    fit = {"allreduce_per_hop_s": per_hop, "pair_persistent_s": statistics.median(pair) if pair else 0.0,
           "pair_fresh_s": statistics.median(fresh) if fresh else 0.0}
    checks = []
    for r in rows:
        if r["straggler"] or r["latency_ms"] == 0 or r["op"] == "allreduce-gloo":
            continue
        if r["op"] == "allreduce":
            predicted = link.allreduce_s(nbytes, r["M"], r["algorithm"]) + per_hop * link.hops(r["M"], r["algorithm"])
        else:
            predicted = link.pair_exchange_s(nbytes) + fit["pair_fresh_s" if r["op"] == "pair" else "pair_persistent_s"]
        checks.append({"M": r["M"], "op": r["op"], "measured_s": r["step_s"], "predicted_s": predicted,
                       "error": r["step_s"] / predicted - 1 if predicted > 0 else None})
    fit["checks"] = checks
    errors = [abs(c["error"]) for c in checks if c["error"] is not None]
    fit["max_abs_error"] = max(errors) if errors else None
    return fit


def expected_max_normal(k: int) -> float:
    """E[max of k independent standard normals] (0 for k = 1), by numerical integration."""
    if k <= 1:
        return 0.0
    from math import erf

    x = np.linspace(-8, 8, 4001)
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.vectorize(erf)(x / math.sqrt(2)))
    density = x * k * pdf * cdf ** (k - 1)
    return float(np.sum((density[1:] + density[:-1]) / 2 * np.diff(x)))


def analytic_row(link: LinkModel, nbytes: float, m: int, *, per_hop_s: float = 0.0, pair_overhead_s: float = 0.0,
                 jitter_s: float = 0.0) -> dict[str, Any]:
    """The modelled sync step at M replicas: one pair hop against each all-reduce algorithm.

    Communication: the α-β costs of :class:`LinkModel` plus the fitted per-message overheads. Waiting: with
    a compute-time jitter σ per replica, a pair waits for the slower of 2 (σ·E[max of 2 normals]) and an
    all-reduce for the slowest of M (σ·E[max of M])."""
    wait_pair = jitter_s * expected_max_normal(2)
    wait_all = jitter_s * expected_max_normal(m)
    row: dict[str, Any] = {"M": m, "bytes": nbytes, "pair_s": link.pair_exchange_s(nbytes) + pair_overhead_s,
                           "pair_wait_s": wait_pair, "allreduce_wait_s": wait_all}
    for algorithm in ALGORITHMS:
        row[f"{algorithm}_s"] = link.allreduce_s(nbytes, m, algorithm) + per_hop_s * link.hops(m, algorithm)
    best = min(ALGORITHMS, key=lambda a: row[f"{a}_s"])
    row["best"] = best
    row["best_s"] = row[f"{best}_s"]
    row["speedup"] = row["best_s"] / row["pair_s"] if row["pair_s"] > 0 else None
    row["speedup_with_wait"] = ((row["best_s"] + wait_all) / (row["pair_s"] + wait_pair)
                                if row["pair_s"] + wait_pair > 0 else None)
    return row


# ----------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------
def run_sync_bench(config: SyncBenchConfig, *, progress: bool = True) -> dict[str, Any]:
    from swarmlm.experiments.sync_bench_report import write_sync_report
    from swarmlm.runtime.distributed import launch_local

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    records: list[dict[str, Any]] = []
    load: dict[str, Any] = {}
    started = time.time()
    for m in config.replicas:
        before = os.getloadavg()
        t0 = time.time()
        if progress:
            print(f"sync-bench: M = {m} ...", flush=True)
        results = launch_local(m, bench_worker, config.model_dump_json())
        for rank_records in results.values():
            records.extend(rank_records)
        load[str(m)] = {"loadavg_before": before, "loadavg_after": os.getloadavg(), "seconds": round(time.time() - t0, 1)}
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report = build_report(config, records, load)
    report["wall_seconds"] = round(time.time() - started, 1)
    (out / "sync.json").write_text(json.dumps(report, indent=1))
    write_sync_report(config, report, out)
    return report


def build_report(config: SyncBenchConfig, records: list[dict[str, Any]], load: dict[str, Any]) -> dict[str, Any]:
    nbytes = config.numel * 4
    link = LinkModel(config.latency_ms / 1000, config.bandwidth_gbit * 1e9 / 8 if config.bandwidth_gbit > 0 else math.inf,
                     config.allreduce)
    rows = summarize_cells(records, config.straggler_rank, config.straggler_s)
    fit = fit_overheads(rows, link, nbytes)
    sizes = [("bench tensor", nbytes)] + [(f"{mb:g} MB", mb * 1e6) for mb in config.analytic_mbytes]
    measured_m = config.replicas
    analytic = []
    for label, size in sizes:
        overhead = label == "bench tensor"  # the fitted overheads belong to this machine and this tensor
        for m in sorted(set(measured_m) | set(config.analytic_replicas)):
            row = analytic_row(link, size, m, per_hop_s=fit["allreduce_per_hop_s"] if overhead else 0.0,
                               pair_overhead_s=fit["pair_persistent_s"] if overhead else 0.0,
                               jitter_s=config.jitter_ms / 1000)
            row["size"] = label
            analytic.append(row)
    return {"settings": {**config.model_dump(mode="json"), "bytes": nbytes, "link": link.describe(),
                         "cpu_count": os.cpu_count()},
            "load": load, "cells": rows, "fit": fit, "analytic": analytic, "targets": targets(rows, config)}


def targets(rows: list[dict[str, Any]], config: SyncBenchConfig) -> dict[str, Any]:
    """The claims to check (the pair's time flat in M, the all-reduce's growing; only a straggler's partner waits),
evaluated on the measurements (the verdicts are computed, not written)."""
    ms = sorted({r["M"] for r in rows})
    out: dict[str, Any] = {}
    lo, hi = ms[0], ms[-1]
    for latency in sorted({r["latency_ms"] for r in rows}):
        growth = {}
        for op in OPS:
            a, b = _cell(rows, lo, op, latency), _cell(rows, hi, op, latency)
            if a and b and a["step_s"] > 0:
                growth[op] = {"from_M": lo, "to_M": hi, "from_s": a["step_s"], "to_s": b["step_s"], "ratio": b["step_s"] / a["step_s"]}
        out[f"growth_latency_{latency:g}ms"] = growth
    if config.straggler_s > 0:
        waits = []
        for r in rows:
            if r["straggler"]:
                base = _cell(rows, r["M"], r["op"], r["latency_ms"])
                base_s = base["rank_median_s"] if base else 0.0
                waits.append({"M": r["M"], "op": r["op"], "latency_ms": r["latency_ms"],
                              "partner_extra_s": None if r.get("partner_s") is None else r["partner_s"] - base_s,
                              "others_extra_s": None if r.get("others_s") is None else r["others_s"] - base_s})
        pair_others = [w["others_extra_s"] for w in waits if w["op"].startswith("pair") and w["others_extra_s"] is not None]
        pair_partner = [w["partner_extra_s"] for w in waits if w["op"].startswith("pair") and w["partner_extra_s"] is not None]
        ar_others = [w["others_extra_s"] for w in waits if w["op"].startswith("allreduce") and w["others_extra_s"] is not None]
        out["straggler"] = {
            "waits": waits,
            "pair_others_extra_max_s": max(pair_others) if pair_others else None,
            "pair_partner_extra_min_s": min(pair_partner) if pair_partner else None,
            "allreduce_others_extra_min_s": min(ar_others) if ar_others else None,
            # "only the partner waits": partners wait (most of) the delay, the others under a fifth of it
            "only_partner_waits": bool(pair_partner and pair_others and min(pair_partner) > 0.5 * config.straggler_s
                                       and max(pair_others) < 0.2 * config.straggler_s),
            "allreduce_everyone_waits": bool(ar_others and min(ar_others) > 0.5 * config.straggler_s),
        }
    return out


def sync_bench_command(config: SyncBenchConfig) -> int:
    require_matplotlib("swarmlm noloco sync-bench")  # before the launches, not after
    report = run_sync_bench(config)
    print((Path(config.out) / "sync.md").read_text())
    print(f"wrote {config.out}/sync.md, {config.out}/sync.png, {config.out}/sync.json ({report['wall_seconds']} s)")
    return 0
