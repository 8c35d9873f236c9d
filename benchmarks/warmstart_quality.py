"""What a warm start leaves for RL: greedy pass@1, the sampled success rate and the share of groups with signal.

    python benchmarks/warmstart_quality.py                                    # the default warm start (shipped)
    python benchmarks/warmstart_quality.py --train                            # the same recipe, trained here
    python benchmarks/warmstart_quality.py --steps 1000 --preset easy
    python benchmarks/warmstart_quality.py --steps 500 --lr 3e-3 --schedule cosine --json results.jsonl
    python benchmarks/warmstart_quality.py --model runs/sapo/node-0/checkpoints/step-000100/model   # a trained node

GRPO (arXiv 2402.03300) learns only from groups whose completions disagree: a group of L samples that are all
wrong, or all right, has zero advantage. So what a warm start is worth to RL is not only its greedy pass@1 but
how often its samples are right and how many of its groups hold both a right and a wrong answer. For one warm
start (trained now, or taken from the cache or ``--model``) this reports, per family and overall:

* ``greedy``: greedy pass@1 on the first ``--eval-size`` held-out questions (full marks only);
* ``sampled``: the share of ``--group-size`` samples at temperature 1 that are right, on ``--groups`` of them;
* ``signal``: the share of those groups with both a right and a wrong answer;
* ``format``: the share of samples with an ``<answer>…</answer>`` span, and ``unformatted``: the samples without
  one, counted per family, with the first few as written (what a loss of the format looks like) and the questions
  for which at least half the samples lost it (``questions``: a question a policy answers malformed every time
  gives GRPO a group of equal rewards, which no group-relative reward can correct);
* ``successes``: how many of the ``--groups`` questions have k right samples of ``--group-size``, for each k, and
  ``near_miss`` / ``fragile``: the share of them answered wrong greedily with at least 2 right samples (the right
  answer within the policy's reach, where sharpening alone can make it the greedy one) / answered right greedily
  with fewer than half the samples right (where it can be lost). Two warm starts with the same pass@1 can leave RL
  different amounts of each;
* ``warmstart_seconds``: the time the warm start took when it was trained by this call (null when cached);
* ``environment``: the machine and library versions of this call (a warm start's float32 training differs by
  processor, so its figures are tied to the machine).

Scoring goes through the node's Verifier (worker processes under CPU, wall-clock and memory limits): the model's
own completions are untrusted text too. Appends one JSON line per call to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


MAX_EXAMPLES = 20


def quality(model, tokenizer, tasks, scores_of, *, eval_size: int, groups: int, group_size: int,
            max_new_tokens: int, seed: int = 0) -> dict:
    """The report for ``model`` on ``tasks``' held-out set (see the module docstring); ``scores_of(questions,
    texts)`` gives each question's list of scores for its list of completion texts."""
    import torch

    from swarmlm.sapo.engines.hf import HFEngine
    from swarmlm.tasks import build_prompt, extract_answer
    from swarmlm.tasks.reasoning_gym_tasks import eval_questions

    questions = eval_questions(tasks.model_copy(update={"eval_size": eval_size}))
    engine = HFEngine(model, tokenizer)
    prompts = [tokenizer(build_prompt(q.question, tokenizer, "auto"), add_special_tokens=False)["input_ids"]
               for q in questions]

    with torch.no_grad():
        greedy = engine.generate(prompts, num_completions=1, max_new_tokens=max_new_tokens, greedy=True)
        torch.manual_seed(seed)
        sampled = engine.generate(prompts[:groups], num_completions=group_size, max_new_tokens=max_new_tokens,
                                  temperature=1.0)
    per_family: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    greedy_right = []
    for q, (score,) in zip(questions, scores_of(questions, [gen.texts[:1] for gen in greedy])):
        greedy_right.append(score >= 1 - 1e-9)
        per_family[q.family]["greedy"].append(float(greedy_right[-1]))
    formats = []
    unformatted: dict[str, int] = defaultdict(int)
    examples: list[str] = []
    lost_questions: list[dict] = []  # the questions for which at least half the samples have no answer span
    successes = [0] * (group_size + 1)
    near_miss, fragile = [], []
    for i, (q, gen, scores) in enumerate(zip(questions, sampled, scores_of(questions[:groups], [gen.texts for gen in sampled]))):
        hits = [s >= 1 - 1e-9 for s in scores]
        successes[sum(hits)] += 1
        near_miss.append(float(not greedy_right[i] and sum(hits) >= 2))
        fragile.append(float(greedy_right[i] and 2 * sum(hits) < len(hits)))
        per_family[q.family]["sampled"].append(sum(hits) / len(hits))
        per_family[q.family]["signal"].append(float(0 < sum(hits) < len(hits)))
        group_formats = [extract_answer(text) is not None for text in gen.texts]
        formats.extend(group_formats)
        for text, formatted in zip(gen.texts, group_formats):
            if not formatted:
                unformatted[q.family] += 1
                if len(examples) < MAX_EXAMPLES:
                    examples.append(text)
        lost = group_formats.count(False)
        if 2 * lost >= len(gen.texts) and len(lost_questions) < MAX_EXAMPLES:
            lost_questions.append({"family": q.family, "question": q.question, "unformatted": lost, "right": sum(hits)})

    def mean(values: list[float]) -> float | None:
        return round(sum(values) / len(values), 3) if values else None

    def overall(key: str) -> float | None:
        return mean([v for fam in per_family.values() for v in fam[key]])

    return {"greedy": overall("greedy"), "sampled": overall("sampled"), "signal": overall("signal"),
            "format": mean([float(f) for f in formats]),
            "successes": successes, "near_miss": mean(near_miss), "fragile": mean(fragile),
            # the samples without an answer span: how many per family, and the first few as written
            "unformatted": {"count": sum(unformatted.values()), "by_family": dict(sorted(unformatted.items())),
                            "examples": examples, "questions": lost_questions},
            "per_family": {name: {k: mean(v) for k, v in fam.items()} for name, fam in sorted(per_family.items())},
            "eval_size": len(questions), "groups": min(groups, len(questions)), "group_size": group_size}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a model directory to assess instead of a warm start")
    parser.add_argument("--preset", default="arithmetic", help="task mix (--tasks.preset)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--schedule", default="constant", choices=["constant", "cosine"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-size", type=int, default=512)
    parser.add_argument("--groups", type=int, default=128)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--out", default=None, help="where to write the warm start (default: the cache)")
    parser.add_argument("--train", action="store_true", help="train the warm start on this machine even where "
                        "swarmlm ships one of these settings (the default ones): does the recipe still give a model "
                        "of the shipped one's quality here?")
    parser.add_argument("--json", default=None, help="append the report as one JSON line to this file")
    args = parser.parse_args(argv)

    from swarmlm.models import load_model
    from swarmlm.runtime.environment import describe_environment
    from swarmlm.sapo.warmstart import WarmstartConfig, warmstart, warmstart_info
    from swarmlm.tasks import TaskConfig
    from swarmlm.verify import Verifier

    tasks = TaskConfig(preset=args.preset)
    settings = None
    seconds = None
    if args.model is None:
        config = WarmstartConfig(tasks=tasks, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                 schedule=args.schedule, seed=args.seed, out=args.out, train=args.train)
        started = time.time()
        path = warmstart(config, progress=sys.stderr.isatty())
        info = warmstart_info(path)
        seconds = info["seconds"] if time.time() - started > 0.5 * info["seconds"] else None  # trained by this call
        settings = {"preset": args.preset, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
                    "schedule": args.schedule, "seed": args.seed, "shipped": bool(info.get("shipped"))}
    else:
        path = Path(args.model)
    loaded = load_model(str(path))
    loaded.model.eval()
    with Verifier(tasks) as verifier:
        report = {"model": str(path) if args.model else None, "warmstart": settings, "warmstart_seconds": seconds,
                  "environment": describe_environment(),
                  **quality(loaded.model, loaded.tokenizer, tasks, verifier.completion_scores,
                            eval_size=args.eval_size, groups=args.groups, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
                            seed=args.seed)}
    print(json.dumps(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "a") as f:
            f.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
