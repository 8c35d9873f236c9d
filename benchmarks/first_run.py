"""The first run as a newcomer makes it: ``swarmlm sapo simulate`` on its defaults, timed from the command's start
to its end, on a cache as empty as a new machine's, for one or more seeds.

    python benchmarks/first_run.py --seeds 0,1,2 --jobs 2 --threads 1 --out runs/first-run --json docs/results/sapo_first_run.json
    python benchmarks/first_run.py --seeds 0 --out runs/first-run-alone     # README line 1's run, timed alone

Each seed runs ``swarmlm sapo simulate --seed S --out OUT/seed-S`` as its own process, with ``SWARMLM_CACHE`` set
to a directory of its own under OUT (so the shipped warm start is unpacked as on a new machine) and
``OMP_NUM_THREADS`` to ``--threads``; extra options after ``--`` go to every run. It records per seed: the command,
its wall seconds (process start-up, warm start, rounds and evaluations), the bytes the run left in its output
directory, the mean held-out pass@1 at every evaluated round, the gain, and per node the figures of its
``summary.json`` and ``metrics.jsonl`` (format rate: lowest round, lowest 10-round mean, last round). A seed whose
run is complete already is read, not rerun, so an interrupted study resumes. Runs that share the cores (``--jobs``
above 1) take longer than alone: the JSON says how they ran.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def node_figures(summary_node: dict, rows: list[dict]) -> dict:
    """One node's figures: its summary's, its pass@1 at every evaluated round and its format rate's low points."""
    rates = [r["format_rate"] for r in rows if r["round"] > 0 and r.get("format_rate") is not None]
    windows = [sum(rates[i:i + 10]) / 10 for i in range(len(rates) - 9)] or [sum(rates) / max(1, len(rates))]
    last = rows[-1]
    return {"eval_pass1": {str(r["round"]): r["eval_pass1"] for r in rows if r.get("eval_pass1") is not None},
            "rounds": summary_node["rounds"], "cumulative_reward_own": summary_node["cumulative_reward_own"],
            "first_eval_pass1": summary_node["first_eval_pass1"], "final_eval_pass1": summary_node["final_eval_pass1"],
            "final_format_rate": summary_node["final_format_rate"], "min_format_rate_round": min(rates, default=None),
            "format_rate_min10": round(min(windows), 4), "round_seconds_mean": summary_node["round_seconds_mean"],
            "by_family": last.get("eval_by_family")}


def run_seed(seed: int, out: Path, threads: int, extra: list[str]) -> dict:
    """Run (or read, when complete) one seed's default run and return its figures."""
    run_dir = out / f"seed-{seed}"
    command = [sys.executable, "-m", "swarmlm", "sapo", "simulate", "--seed", str(seed), "--out", str(run_dir), *extra]
    record = out / f"seed-{seed}.json"
    if record.exists():
        return json.loads(record.read_text())
    env = {**os.environ, "SWARMLM_CACHE": str(out / f"cache-{seed}"), "OMP_NUM_THREADS": str(threads)}
    started = time.time()
    with open(out / f"seed-{seed}.log", "w") as log:
        done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    seconds = round(time.time() - started, 1)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed} failed (exit {done.returncode}); see {out / f'seed-{seed}.log'}")
    from swarmlm.runtime.metrics import read_jsonl

    summary = json.loads((run_dir / "summary.json").read_text())
    nodes = {name: node_figures(node, read_jsonl(run_dir / name / "metrics.jsonl")) for name, node in summary["nodes"].items()}
    evaluated = sorted({int(r) for n in nodes.values() for r in n["eval_pass1"]})
    by_round = {str(r): round(sum(n["eval_pass1"][str(r)] for n in nodes.values()) / len(nodes), 4) for r in evaluated}
    result = {"command": f"OMP_NUM_THREADS={threads} swarmlm sapo simulate --seed {seed}" + "".join(f" {a}" for a in extra),
              "wall_seconds": seconds, "run_seconds": summary["wall_seconds"], "bytes_written": _bytes(run_dir),
              "mean_eval_pass1_by_round": by_round, "mean_first_eval_pass1": by_round[str(evaluated[0])],
              "mean_final_eval_pass1": by_round[str(evaluated[-1])],
              "gain": round(by_round[str(evaluated[-1])] - by_round[str(evaluated[0])], 4),
              "environment": summary["environment"], "warmstart_shipped": bool((summary.get("warmstart") or {}).get("shipped")),
              "nodes": nodes}
    record.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0", help="comma-separated run seeds")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run")
    parser.add_argument("--out", default="runs/first-run")
    parser.add_argument("--json", default=None, help="write every seed's figures here")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(lambda s: run_seed(s, out, args.threads, extra), seeds))
    for seed, run in zip(seeds, runs):
        print(f"seed {seed}: {run['wall_seconds']:.0f} s, pass@1 {run['mean_first_eval_pass1']:.3f} -> "
              f"{run['mean_final_eval_pass1']:.3f} ({run['gain']:+.3f}), {run['bytes_written'] / 1e6:.1f} MB written")
    if args.json:
        report = {"what": "swarmlm sapo simulate on its defaults, from a fresh cache (the shipped warm start)",
                  "how": f"{args.jobs} run(s) at a time, {args.threads} torch thread(s) each",
                  "command": "python benchmarks/first_run.py " + " ".join(argv + (["--", *extra] if extra else [])),
                  "runs": runs}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
