"""How many inner steps the reduced GPU study of ``noloco_compare.sh`` can afford: one replica's inner step is
timed here on the study's device (``swarmlm noloco compare``'s own calibration, cached in OUT/calibration.json,
which the study then reuses), and the steps are what fits the training budget for every run, a multiple of H.

    python benchmarks/gpu/noloco_budget.py --out OUT --budget-s 390 --model llama-125m --replicas 8 --methods 4 ...

prints the number of steps (and a line of explanation on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# Per inner step, besides the calibrated step: evaluation, outer steps, turns and logging (measured on CPU at
# 10-30% of a step for the nano study; more margin here, since the GPU run has not been seen yet).
OVERHEAD = 1.5


def steps_for_budget(step_s: float, *, replica_runs: int, budget_s: float, every: int, min_outer: int = 2,
                     max_steps: int = 5000, overhead: float = OVERHEAD) -> int:
    """The most steps, a multiple of ``every``, with ``replica_runs`` replicas × runs of them taking at most
    ``budget_s`` at ``step_s × overhead`` each; at least ``min_outer`` outer steps, at most ``max_steps``."""
    if step_s <= 0 or replica_runs <= 0:
        raise ValueError("step_s and replica_runs must be positive")
    fit = int(budget_s / (step_s * overhead * replica_runs))
    steps = fit // every * every
    return max(min_outer * every, min(steps, max_steps // every * every))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget-s", type=float, required=True, help="seconds of training for the whole study")
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seq-len", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--replicas", type=int, required=True)
    parser.add_argument("--runs", type=int, required=True, help="runs of the study (methods x seeds)")
    parser.add_argument("--every", type=int, required=True, help="H")
    args = parser.parse_args(argv)

    from swarmlm.experiments.noloco_compare import CompareConfig, calibrate

    config = CompareConfig(out=args.out, model=args.model, device=args.device, seq_len=args.seq_len,
                           batch_size=args.batch_size, replicas=[args.replicas], outer={"every": [args.every]})
    Path(args.out).mkdir(parents=True, exist_ok=True)
    calibration = calibrate(config, Path(args.out) / "calibration.json")
    steps = steps_for_budget(calibration["step_s"], replica_runs=args.replicas * args.runs, budget_s=args.budget_s,
                             every=args.every)
    print(f"one inner step of {args.model} on {calibration['device']}: {calibration['step_s'] * 1000:.1f} ms "
          f"({calibration['step_s_is']}); {args.replicas} replicas x {args.runs} runs in {args.budget_s:g} s: "
          f"{steps} steps", file=sys.stderr)
    print(steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
