"""Does a speed option change what a node learns? Two `swarmlm sapo experiment` directories of the same command, one
with the option (for example `--grpo.precision bfloat16`) and one without, compared node by node and seed by seed.

    python benchmarks/precision_learning.py runs/smollm2-spec runs/smollm2-spec-bf16 --config 8/0 \
        --out docs/results/sapo_bf16_learning.json

For every (seed, node) present in both with as many rounds (a run still going is left out), it reads each node's ``metrics.jsonl`` and reports held-out pass@1 at every
evaluation, cumulative own reward, the lowest format rate, and the mean seconds of the update (``train_seconds``)
and of generation per round. The paired difference (option minus baseline) is averaged per seed first (the nodes of
one run are not independent), then over seeds, with a 95% Student-t interval over the seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def node_figures(metrics: Path) -> dict:
    """One node's run: pass@1 by evaluated round, cumulative own reward, lowest format rate, seconds per round."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    evals = {str(r["round"]): r["eval_pass1"] for r in rows if r.get("eval_pass1") is not None}
    trained = [r for r in rows if "train_seconds" in r]
    return {
        "eval_pass1": evals,
        "cumulative_reward_own": max((r.get("cumulative_reward_own", 0.0) for r in rows), default=0.0),
        "min_format_rate": min((r["format_rate"] for r in trained if r.get("format_rate") is not None), default=None),
        "train_seconds_mean": statistics.fmean(r["train_seconds"] for r in trained) if trained else None,
        "gen_seconds_mean": statistics.fmean(r["gen_seconds"] for r in trained if "gen_seconds" in r) if trained else None,
        "rounds": len(trained),
    }


def runs_of(experiment: Path, config: str) -> dict[tuple[int, str], dict]:
    """(seed, node) -> the node's figures, for one configuration of an experiment directory."""
    out = {}
    for seed_dir in sorted((experiment / "runs" / config.replace("/", "-")).glob("seed-*")):
        for node_dir in sorted(seed_dir.glob("node-*")):
            if (node_dir / "metrics.jsonl").is_file():
                out[(int(seed_dir.name.split("-")[1]), node_dir.name)] = node_figures(node_dir / "metrics.jsonl")
    return out


def interval(values: list[float]) -> dict:
    """Mean and the half-width of its 95% Student-t interval (None for a single value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci95": None, "n": len(values)}
    half = T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "ci95": half, "n": len(values)}


def compare(baseline: Path, option: Path, config: str) -> dict:
    base, alt = runs_of(baseline, config), runs_of(option, config)
    # a run still going (fewer rounds than its twin) is left out
    pairs = sorted(k for k in set(base) & set(alt) if base[k]["rounds"] == alt[k]["rounds"])
    if not pairs:
        raise SystemExit(f"no (seed, node) run of configuration {config} in both {baseline} and {option}")
    seeds = sorted({s for s, _ in pairs})
    rounds = sorted(set.intersection(*(set(base[k]["eval_pass1"]) & set(alt[k]["eval_pass1"]) for k in pairs)), key=int)

    def per_seed(figure) -> list[float]:  # the option minus the baseline, averaged over the seed's nodes
        return [statistics.fmean(figure(alt[k]) - figure(base[k]) for k in pairs if k[0] == s) for s in seeds]

    def mean_of(runs: dict, figure) -> float:
        return statistics.fmean(figure(runs[k]) for k in pairs)

    return {
        "configuration": config, "seeds": seeds, "nodes": sorted({n for _, n in pairs}), "pairs": len(pairs),
        "eval_pass1": {r: {"baseline": mean_of(base, lambda f: f["eval_pass1"][r]),
                           "option": mean_of(alt, lambda f: f["eval_pass1"][r]),
                           "difference": interval(per_seed(lambda f: f["eval_pass1"][r]))} for r in rounds},
        "cumulative_reward_own": {"baseline": mean_of(base, lambda f: f["cumulative_reward_own"]),
                                  "option": mean_of(alt, lambda f: f["cumulative_reward_own"]),
                                  "difference": interval(per_seed(lambda f: f["cumulative_reward_own"]))},
        "min_format_rate": {"baseline": min(base[k]["min_format_rate"] for k in pairs),
                            "option": min(alt[k]["min_format_rate"] for k in pairs)},
        "train_seconds_mean": {"baseline": mean_of(base, lambda f: f["train_seconds_mean"]),
                               "option": mean_of(alt, lambda f: f["train_seconds_mean"])},
        "gen_seconds_mean": {"baseline": mean_of(base, lambda f: f["gen_seconds_mean"]),
                             "option": mean_of(alt, lambda f: f["gen_seconds_mean"])},
        "per_run": {f"seed-{s}/{n}": {"baseline": base[(s, n)], "option": alt[(s, n)]} for s, n in pairs},
    }


def table(result: dict) -> str:
    def diff(d: dict) -> str:
        return f"{d['mean']:+.3f}" + (f" ± {d['ci95']:.3f}" if d["ci95"] is not None else "")

    lines = ["| held-out pass@1 at round | without the option | with it | difference (per seed, 95% CI) |",
             "|---|---|---|---|"]
    for r, row in result["eval_pass1"].items():
        lines.append(f"| {r} | {row['baseline']:.3f} | {row['option']:.3f} | {diff(row['difference'])} |")
    c = result["cumulative_reward_own"]
    lines.append(f"| cumulative own reward | {c['baseline']:.2f} | {c['option']:.2f} | {diff(c['difference'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path, help="experiment directory without the option")
    parser.add_argument("option", type=Path, help="experiment directory with the option")
    parser.add_argument("--config", default="8/0", help="the configuration (I/J) to compare")
    parser.add_argument("--out", type=Path, default=None, help="write the comparison here (JSON)")
    args = parser.parse_args(argv)
    result = {"command": "python benchmarks/precision_learning.py " + " ".join(sys.argv[1:] if argv is None else argv),
              **compare(args.baseline, args.option, args.config)}
    print(table(result))
    print(f"update seconds per round: {result['train_seconds_mean']['baseline']:.2f} (baseline), "
          f"{result['train_seconds_mean']['option']:.2f} (option); lowest format rate "
          f"{result['min_format_rate']['baseline']:.2f} / {result['min_format_rate']['option']:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
