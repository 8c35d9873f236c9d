"""The in-process backend's speed: wall seconds per replica-step of ``swarmlm noloco train --backend in_process``,
with the replicas' forward and backward stacked into one vectorised call (``--stack-replicas auto``, the default)
and one replica at a time (``never``), for several M.

Each (M, mode) is one short NoLoCo run of the study's shape (``noloco compare``'s defaults: nano-llama, 32 tokens ×
4 sequences, H = 50, one torch thread), timed whole (the M model builds included, a few percent at 300 steps);
validation only at the first and last step, so the figure is the training loop's. Run it on an otherwise idle
machine.

    python benchmarks/in_process_speed.py --replicas 4,8,16,32,64 --steps 300 --out docs/results/noloco_in_process_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def timed_run(m: int, mode: str, args, out: Path) -> dict:
    from swarmlm.noloco.config import TrainConfig
    from swarmlm.noloco.launch import run_training

    config = TrainConfig(method="noloco", backend="in_process", replicas=m, model=args.model, steps=args.steps,
                         seq_len=args.seq_len, batch_size=args.batch_size, outer={"every": args.every}, eval_every=0,
                         eval_batches=1, checkpoint_every=0, keep_checkpoints=1, threads=args.threads, progress=False,
                         stack_replicas=mode, out=str(out / f"M{m}-{mode}"), seed=args.seed,
                         log={"every": 10, "tensorboard": False, "fsync": False})
    started = time.perf_counter()
    summary = run_training(config)
    wall = time.perf_counter() - started
    return {"M": m, "stack_replicas": mode, "wall_seconds": round(wall, 3),
            "ms_per_replica_step": round(1000 * wall / (m * args.steps), 4),
            "final_val_loss": summary["val_loss_mean"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="4,8,16", help="M values, comma-separated")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="nano-llama")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--every", type=int, default=50, help="H")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON to write (default: print only)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        warm = argparse.Namespace(**{**vars(args), "steps": 2, "every": 1})
        timed_run(2, "auto", warm, Path(tmp) / "warm-up")  # imports, data, first calls: not timed below
        for m in [int(x) for x in args.replicas.split(",")]:
            for mode in ("never", "auto"):
                rows.append(timed_run(m, mode, args, Path(tmp)))
                r = rows[-1]
                print(f"M={m:3d} {mode:6s} {r['ms_per_replica_step']:.3f} ms per replica-step "
                      f"(wall {r['wall_seconds']:.1f} s, val loss {r['final_val_loss']:.4f})", flush=True)
    speedups = {}
    for m in sorted({r["M"] for r in rows}):
        never, auto = (next(r for r in rows if r["M"] == m and r["stack_replicas"] == mode) for mode in ("never", "auto"))
        speedups[str(m)] = round(never["ms_per_replica_step"] / auto["ms_per_replica_step"], 3)
        print(f"M={m}: stacked {speedups[str(m)]:.2f}x faster")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"command": "python benchmarks/in_process_speed.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "source_commit": commit, "machine": platform.processor() or platform.machine(),
              "settings": {k: v for k, v in vars(args).items() if k != "out"}, "runs": rows, "speedup": speedups}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
