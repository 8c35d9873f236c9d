"""How long the command line takes to answer without running anything: ``--help``, a command's ``--help``, and a
misspelled option (which answers with the command's usage and a "did you mean").

    python benchmarks/cli_latency.py                      # each case 5 times, best and median
    python benchmarks/cli_latency.py --repeats 3 --json out.json

Each case is a fresh ``python -m swarmlm ...`` process (what a user's shell starts; the ``swarmlm`` script is the
same entry point), timed from start to exit, with ``OMP_NUM_THREADS=1``. The best of the repeats is the figure to
quote on a shared machine, where other work only ever adds time; the median shows how much it varied. Also
reported per case: the CPU time of the fastest run (user + system: on a busy machine, nearer what an idle one
would take than the wall time), the exit status (0 for help, 2 for a typo) and whether the process imported torch,
transformers or reasoning-gym (it should not: building the parser reads only the configs' fields).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES: dict[str, list[str]] = {
    "help": ["--help"],
    "command help": ["sapo", "simulate", "--help"],
    "typo": ["sapo", "simulate", "--rouns", "3"],
    "unknown command": ["sapo", "simulat"],
}

HEAVY = ("torch", "transformers", "reasoning_gym")

# runs the command line as ``python -m swarmlm`` does, then reports which heavy libraries the process imported
_PROBE = (
    "import sys, json\n"
    "from swarmlm.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exit_:\n"
    "    code = exit_.code\n"
    "sys.stdout.flush()\n"
    f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)\n"
    "sys.exit(code)\n"
)


def time_case(args: list[str], repeats: int) -> dict:
    """Run ``swarmlm ARGS`` ``repeats`` times; the seconds of each run, its exit status and its heavy imports."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    seconds, cpu, codes, heavy = [], [], set(), set()
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, env=env)
        seconds.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        codes.add(res.returncode)
        last = res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "[]"
        heavy.update(json.loads(last))
    return {"args": args, "best_s": round(min(seconds), 3), "median_s": round(statistics.median(seconds), 3),
            "seconds": [round(s, 3) for s in seconds], "best_cpu_s": round(min(cpu), 3),
            "exit_codes": sorted(codes), "heavy_imports": sorted(heavy)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per case (default: 5)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; cases: {', '.join(CASES)}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    results = {name: time_case(CASES[name], args.repeats) for name in names}
    for name, r in results.items():
        print(f"{name:16s} swarmlm {' '.join(r['args']):32s} best {r['best_s']:.2f} s  median {r['median_s']:.2f} s  "
              f"(CPU {r['best_cpu_s']:.2f} s)  exit {r['exit_codes']}  heavy imports: {', '.join(r['heavy_imports']) or 'none'}")
    print(f"{args.repeats} run(s) each; load average at the start {load:.2f} on {os.cpu_count()} CPUs"
          if load is not None else f"{args.repeats} run(s) each")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "repeats": args.repeats, "load_average_1min": load,
                                         "cpus": os.cpu_count(), "python": platform.python_version(),
                                         "machine": platform.processor() or platform.machine()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
