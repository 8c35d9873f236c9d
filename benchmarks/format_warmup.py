"""What the format warm-up does to a pretrained model: the answer format, and whether it teaches answers.

Runs the warm-up a SAPO node runs at the defaults (``model.warmstart auto``: :func:`swarmlm.sapo.warmstart.
format_warmup`, from the cache when it is there) and scores the model before and after it on the held-out set, with
greedy decoding at the node's budget (``--max-new-tokens``), in the node's prompt:

* ``pass1``: held-out pass@1 as a node measures it (the answer inside ``<answer>…</answer>``, full marks);
* ``pass1_lenient``: the last integer of the completion taken as the answer, format or not: what the model knows
  of the answers whatever it writes them in. A warm-up that only teaches the format leaves this about where it was;
* ``format_rate`` and the mean completion length.

The warm-up trains on training questions only (its own question streams); the held-out set is generated from seeds
no training question uses (:func:`swarmlm.tasks.eval_questions`)::

    OMP_NUM_THREADS=1 python benchmarks/format_warmup.py --model smollm2-135m --json docs/results/format_warmup_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="any model that is not a preset")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="the node's generation.max-new-tokens")
    ap.add_argument("--eval-size", type=int, default=256, help="held-out questions (the node's default)")
    ap.add_argument("--json", default=None, help="write the results here")
    return ap.parse_args(argv)


_INT = re.compile(r"-?\d+")


def last_integer(text: str) -> str | None:
    """The last integer written in ``text`` (None when there is none)."""
    found = _INT.findall(text)
    return found[-1] if found else None


def score(model_spec: str, args: argparse.Namespace) -> dict[str, Any]:
    """Greedy held-out scores of ``model_spec`` in the node's prompt and budget."""
    from swarmlm.models import load_model
    from swarmlm.sapo.engines.base import tokenize_prompts
    from swarmlm.sapo.engines.hf import generate_completions
    from swarmlm.tasks import TaskConfig, TaskSource, build_prompt, eval_questions, extract_answer
    from swarmlm.verify.verifier import score_in_process

    tasks = TaskConfig(eval_size=args.eval_size)
    questions = eval_questions(tasks)
    scorer = TaskSource(tasks, stream="format-warmup-benchmark")
    loaded = load_model(model_spec)
    started = time.monotonic()
    ids = tokenize_prompts(loaded.tokenizer, [build_prompt(q.question, loaded.tokenizer) for q in questions], 512)
    generated = generate_completions(loaded.model, loaded.tokenizer, ids, num_completions=1,
                                     max_new_tokens=args.max_new_tokens, greedy=True)
    right = lenient = formatted = tokens = 0
    for q, gen in zip(questions, generated):
        text = gen.texts[0]
        answer = extract_answer(text)
        formatted += answer is not None
        right += answer is not None and score_in_process(scorer, q.family, answer, q.entry) >= 1 - 1e-9
        lenient += score_in_process(scorer, q.family, last_integer(text), q.entry) >= 1 - 1e-9
        tokens += len(gen.completion_ids[0])
    n = len(questions)
    return {"pass1": right / n, "pass1_lenient": lenient / n, "format_rate": formatted / n,
            "completion_tokens": tokens / n, "examples": [g.texts[0][:100] for g in generated[:4]],
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from swarmlm.sapo.config import SAPOConfig
    from swarmlm.sapo.node import initial_model_path
    from swarmlm.sapo.warmstart import FORMAT_CHECK

    config = SAPOConfig(model={"name": args.model}, generation={"max_new_tokens": args.max_new_tokens})
    started = time.monotonic()
    start = initial_model_path(config, progress=sys.stderr.isatty())
    warmup_seconds = round(time.monotonic() - started, 1)
    check = json.loads((Path(start) / FORMAT_CHECK).read_text()) if start != args.model else None
    before = score(args.model, args)
    print(f"before: {json.dumps(before)}", flush=True)
    after = score(start, args) if start != args.model else before
    print(f"after:  {json.dumps(after)}", flush=True)
    result = {
        "what": "held-out greedy scores of a pretrained model before and after the format warm-up a SAPO node runs "
                "at the defaults (model.warmstart auto); pass1_lenient takes the last integer of a completion as "
                "its answer, format or not",
        "command": "OMP_NUM_THREADS=1 python benchmarks/format_warmup.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.model, "max_new_tokens": args.max_new_tokens, "eval_size": args.eval_size,
        "warmup_dir": start, "warmup_seconds_this_call": warmup_seconds,
        "warmup": {k: check[k] for k in ("steps", "losses", "probes", "seconds", "environment")} if check else None,
        "before": before, "after": after,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"results: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
