"""Soak test of a SAPO node: many rounds of one node, its memory sampled every round, a failure if it grows.

    python benchmarks/sapo_soak.py                         # 300 rounds of the tiny preset, a few minutes
    python benchmarks/sapo_soak.py --rounds 2000 --out runs/soak
    python benchmarks/sapo_soak.py --nodes 2               # two nodes in this process, sharing rollouts (J = I)

Every round (generation, scoring, publishing, the update, and, on their schedule, evaluation, metrics with
TensorBoard, checkpoints) the process's current RSS (``/proc/self/status`` VmRSS, read after collecting garbage
and trimming the heap: ``settle``) and peak RSS (``resource.getrusage``) are recorded, with the number of Python
objects the garbage collector tracks. After the warm-up rounds memory must stay flat: the run fails (exit status
1) when the peak RSS grows by more than ``--allowance-mb`` after warm-up, or when the current RSS drifts up by
more than that (median of the last tenth of the rounds against the first tenth after warm-up, and the
least-squares trend over the whole stretch).

Writes ``rss.csv`` (one row per round), ``soak.json`` (settings, verdict, series) and ``rss.png`` to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MB = 1 << 20


# ----------------------------------------------------------------------------- memory readings
def current_rss_bytes() -> int:
    """Resident set size now: VmRSS from /proc (Linux), else psutil where installed, else the peak."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except ImportError:
        return peak_rss_bytes()


def settle() -> None:
    """Free what is garbage before a reading: collect reference cycles and hand the heap's free pages back to the
    kernel (glibc's ``malloc_trim``). Otherwise memory freed late, such as what earlier work in the process left
    for the collector, lowers the readings of later rounds and can hide a real leak."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (``ru_maxrss`` is in KB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


# ----------------------------------------------------------------------------- the verdict
def detect_growth(series_mb: list[float], warmup: int, allowance_mb: float) -> dict[str, Any]:
    """Whether ``series_mb`` (one reading per round) grows by more than ``allowance_mb`` after ``warmup`` rounds.

    Two measures, both must stay within the allowance: the median of the last tenth of the post-warm-up readings
    minus the median of the first tenth (robust to single spikes), and the least-squares slope times the length
    of the post-warm-up stretch (a slow steady leak that the medians might straddle).
    """
    post = series_mb[warmup:]
    if len(post) < 6:
        raise ValueError(f"need at least 6 readings after warm-up, got {len(post)}")
    k = max(3, len(post) // 10)
    head, tail = statistics.median(post[:k]), statistics.median(post[-k:])
    n = len(post)
    mean_x, mean_y = (n - 1) / 2, sum(post) / n
    var_x = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(post)) / var_x
    step_growth = tail - head
    trend_growth = slope * (n - 1)
    return {"head_mb": head, "tail_mb": tail, "growth_mb": step_growth, "slope_mb_per_round": slope,
            "trend_growth_mb": trend_growth, "allowance_mb": allowance_mb,
            "passed": step_growth <= allowance_mb and trend_growth <= allowance_mb}


def peak_growth(peaks_mb: list[float], warmup: int, allowance_mb: float) -> dict[str, Any]:
    """Growth of the (monotone) peak RSS after warm-up."""
    base = peaks_mb[min(warmup, len(peaks_mb)) - 1] if warmup > 0 else peaks_mb[0]
    growth = peaks_mb[-1] - base
    return {"at_warmup_mb": base, "final_mb": peaks_mb[-1], "growth_mb": growth, "allowance_mb": allowance_mb,
            "passed": growth <= allowance_mb}


# ----------------------------------------------------------------------------- the run
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30, help="rounds before memory must be flat")
    ap.add_argument("--allowance-mb", type=float, default=25.0, help="largest growth after warm-up that passes")
    ap.add_argument("--model", default="tiny-qwen2")
    ap.add_argument("--nodes", type=int, default=1, help="nodes in this process (more than 1: they share rollouts)")
    ap.add_argument("--local", type=int, default=2, help="questions per round (I)")
    ap.add_argument("--external", type=int, default=None, help="external groups per round (J; default I when --nodes > 1)")
    ap.add_argument("--group-size", type=int, default=4, help="completions per question (L)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--warmstart", action="store_true",
                    help="start from the preset's format warm start (rewards vary, so external groups get used)")
    ap.add_argument("--eval-every", type=int, default=25, help="held-out evaluation every E rounds")
    ap.add_argument("--eval-size", type=int, default=8, help="held-out questions")
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--no-tensorboard", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="directory for rss.csv, soak.json, rss.png (default: a temp dir)")
    ap.add_argument("--no-plot", action="store_true")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from swarmlm.sapo.config import SAPOConfig
    from swarmlm.sapo.node import SAPONode, initial_model_path
    from swarmlm.sapo.transports.in_process import InProcessHub

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="sapo-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    external = args.external if args.external is not None else (args.local if args.nodes > 1 else 0)
    config = SAPOConfig(
        model={"name": args.model, "device": args.device, "warmstart": "auto" if args.warmstart else "never"},
        generation={"group_size": args.group_size, "max_new_tokens": args.max_new_tokens},
        tasks={"eval_size": args.eval_size}, local=args.local, external=external, rounds=args.rounds,
        eval_every=args.eval_every, checkpoint_every=args.checkpoint_every, seed=args.seed,
        sharing={"collect_timeout": 5.0},
    )
    initial = initial_model_path(config, progress=False)
    hub = InProcessHub(args.nodes)
    nodes = [SAPONode(config, k, hub.endpoint(f"node-{k}"), out / (f"node-{k}" if args.nodes > 1 else "node"),
                      initial, resume=False, tensorboard=not args.no_tensorboard) for k in range(args.nodes)]
    rows = []
    started = time.perf_counter()
    try:
        for t in range(1, args.rounds + 1):
            t0 = time.perf_counter()
            if len(nodes) == 1:
                nodes[0].run_round(t)
            else:  # in lockstep, as `sapo simulate` runs them: all publish, then all learn
                played = [(n, n.play(t)) for n in nodes]
                for n, own in played:
                    n.learn(own)
            settle()
            rss = current_rss_bytes()  # the kernel's peak can lag the current reading a little: keep the larger
            rows.append({"round": t, "rss_mb": rss / MB, "peak_rss_mb": max(rss, peak_rss_bytes()) / MB,
                         "python_objects": len(gc.get_objects()), "round_s": time.perf_counter() - t0})
    finally:
        for n in nodes:
            n.close()
    wall = time.perf_counter() - started
    warmup = min(args.warmup, max(0, args.rounds - 6))
    rss = detect_growth([r["rss_mb"] for r in rows], warmup, args.allowance_mb)
    peak = peak_growth([r["peak_rss_mb"] for r in rows], warmup, args.allowance_mb)
    objects = [r["python_objects"] for r in rows[warmup:]]
    result = {
        "settings": {k: v for k, v in vars(args).items()},
        "wall_seconds": wall, "rounds": len(rows), "warmup": warmup,
        "rss": rss, "peak_rss": peak,
        "python_objects": {"after_warmup": objects[0], "final": objects[-1], "growth": objects[-1] - objects[0]},
        "passed": rss["passed"] and peak["passed"],
        "series": rows,
    }
    with open(out / "rss.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "soak.json").write_text(json.dumps(result, indent=1))
    if not args.no_plot:
        plot(rows, warmup, out / "rss.png", title=f"{args.model}, {args.nodes} node(s), I={args.local}, J={external}, "
                                                  f"L={args.group_size}")
    result["out"] = str(out)
    return result


def plot(rows: list[dict[str, Any]], warmup: int, path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r["round"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(rounds, [r["rss_mb"] for r in rows], label="RSS")
    ax.plot(rounds, [r["peak_rss_mb"] for r in rows], label="peak RSS", linestyle="--")
    ax.axvline(warmup, color="grey", linewidth=0.8, label="end of warm-up")
    ax.set_xlabel("round")
    ax.set_ylabel("MB")
    ax.set_title(f"SAPO node memory per round ({title})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary_line(result: dict[str, Any]) -> str:
    rss, peak = result["rss"], result["peak_rss"]
    return (f"{'PASS' if result['passed'] else 'FAIL'}: {result['rounds']} rounds in {result['wall_seconds']:.0f} s; after "
            f"{result['warmup']} warm-up rounds RSS {rss['head_mb']:.1f} -> {rss['tail_mb']:.1f} MB "
            f"(growth {rss['growth_mb']:+.1f} MB, trend {rss['slope_mb_per_round'] * 1000:+.2f} KB/round = "
            f"{rss['trend_growth_mb']:+.1f} MB), peak RSS {peak['at_warmup_mb']:.1f} -> {peak['final_mb']:.1f} MB "
            f"(growth {peak['growth_mb']:+.1f} MB); allowance {rss['allowance_mb']:.0f} MB; Python objects "
            f"{result['python_objects']['growth']:+d}; files in {result['out']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print(summary_line(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
