"""What bounded, regenerating verification costs a SAPO node per round.

    python benchmarks/verifier_cost.py                       # both presets, 30 rounds each
    python benchmarks/verifier_cost.py --presets paper --rounds 100 --out docs/results/verifier_cost.json

The workload of the default run: 4 nodes, each with I = 4 own questions per round and L = 8 completions per
question; each node scores its own 4 groups and re-scores the 12 groups the 3 other nodes published (each
regenerated from its provenance, as a receiver must). Every round, node 0's :class:`~swarmlm.verify.verifier.Verifier`
gets those 16 groups in one ``score_many`` call (128 answers); the call's wall time is the per-round cost. The
completions are synthetic (reasoning text, then the right answer, a near miss, a wrong answer or none), so the
scorers take their usual paths. For comparison, the same answers are scored in this process, unbounded and
without regeneration, as nodes did before (``score_in_process``).

Prints a table and writes JSON (settings, per-round times, summary) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.stdout.reconfigure(line_buffering=True)

from swarmlm.tasks import TaskConfig, TaskSource, extract_answer  # noqa: E402
from swarmlm.verify.verifier import ScoreRequest, Verifier, score_in_process  # noqa: E402


def completions_for(question, k: int) -> list[str]:
    answer = question.answer if question.answer is not None else question.metadata.get("example_answer", "P")
    styles = [f"<answer>{answer}</answer>", f"<answer>{answer}0</answer>", "<answer>no idea</answer>", "I give up."]
    return [f"Let me think step by step about this ({i}).\n" + styles[i % len(styles)] for i in range(k)]


def measure(preset: str, rounds: int, nodes: int, local: int, group: int, workers: int) -> dict:
    config = TaskConfig(preset=preset, verifier={"workers": workers})
    sources = [TaskSource(config, stream=f"bench/node-{k}") for k in range(nodes)]
    started = time.perf_counter()
    verifier = Verifier(config)
    verifier.wait_ready()
    startup = time.perf_counter() - started
    pooled, in_process, drops = [], [], 0
    try:
        for r in range(rounds):
            batch = []
            for k, source in enumerate(sources):
                for q in source.sample(local, round=r):
                    answers = [extract_answer(t) for t in completions_for(q, group)]
                    if k == 0:
                        batch.append(ScoreRequest(q.family, answers, entry=q.entry))
                    else:
                        batch.append(ScoreRequest(q.family, answers, provenance=q.provenance, question=q.question))
            t0 = time.perf_counter()
            results = verifier.score_many(batch)
            pooled.append(time.perf_counter() - t0)
            drops += sum(not r.ok for r in results)
            t0 = time.perf_counter()
            for req, res in zip(batch, results):
                entry = req.entry if req.entry is not None else res.item.entry
                [score_in_process(sources[0], req.family, a, entry) for a in req.answers]
            in_process.append(time.perf_counter() - t0)
    finally:
        verifier.close()
    ms = lambda xs, q: 1000 * statistics.quantiles(xs, n=100)[q - 1] if len(xs) >= 2 else 1000 * xs[0]  # noqa: E731
    return {
        "preset": preset, "rounds": rounds, "groups_per_round": nodes * local, "answers_per_round": nodes * local * group,
        "workers": workers, "worker_startup_s": round(startup, 2), "drops": drops,
        "verifier_ms": {"median": round(statistics.median(pooled) * 1000, 2), "p90": round(ms(pooled, 90), 2),
                        "max": round(max(pooled) * 1000, 2)},
        "in_process_unbounded_ms": {"median": round(statistics.median(in_process) * 1000, 2),
                                    "p90": round(ms(in_process, 90), 2)},
        "verifier_round_s": [round(x, 5) for x in pooled],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["easy", "paper"])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--local", type=int, default=4, help="I: own questions per node per round")
    parser.add_argument("--group", type=int, default=8, help="L: completions per question")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="results/verifier_cost.json")
    args = parser.parse_args()
    runs = [measure(p, args.rounds, args.nodes, args.local, args.group, args.workers) for p in args.presets]
    print(f"{'preset':8s} {'groups':>6s} {'answers':>7s} {'verifier median':>16s} {'p90':>8s} {'max':>8s} "
          f"{'in-process median':>18s} {'startup':>8s} {'drops':>5s}")
    for r in runs:
        v, u = r["verifier_ms"], r["in_process_unbounded_ms"]
        print(f"{r['preset']:8s} {r['groups_per_round']:6d} {r['answers_per_round']:7d} {v['median']:13.1f} ms "
              f"{v['p90']:5.1f} ms {v['max']:5.1f} ms {u['median']:15.1f} ms {r['worker_startup_s']:6.1f} s {r['drops']:5d}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(["python benchmarks/verifier_cost.py"] + sys.argv[1:]),
                               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "load_average_1m": os.getloadavg()[0]},
                               "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
