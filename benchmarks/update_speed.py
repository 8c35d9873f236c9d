"""The SAPO update alone: samples per second of ``GRPOUpdate.update`` on a batch where every sample trains.

``benchmarks/sapo_throughput.py`` times the update inside real rounds, where a model that answers nothing right
(SmolLM2 before its format warm-up) has no advantage anywhere, and the update is then only an optimizer step.
Here the batch is fixed: I prompts of the held-out set × L completions of ``--completion-tokens`` random tokens,
advantages ±1 (half of each group up, half down), and, with ``--external``, the second half of the groups marked
as a peer's (so the truncated weights are computed). Medians over ``--repeats`` after one warm-up.

    python benchmarks/update_speed.py --model smollm2-135m --precision float32
    python benchmarks/update_speed.py --model smollm2-135m --precision bfloat16
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def make_samples(tokenizer, local: int, group_size: int, completion_tokens: int, external: bool, seed: int):
    """The fixed batch: real prompts, random completions ended by EOS, advantages ±1."""
    from swarmlm.sapo.batching import TrainSample
    from swarmlm.tasks import TaskConfig, build_prompt, eval_questions

    rng = random.Random(seed)
    questions = eval_questions(TaskConfig(eval_size=local))
    vocab = tokenizer.vocab_size
    samples = []
    for g, q in enumerate(questions):
        prompt = tokenizer(build_prompt(q.question, tokenizer), add_special_tokens=False)["input_ids"]
        for i in range(group_size):
            completion = [rng.randrange(vocab) for _ in range(completion_tokens)] + [tokenizer.eos_token_id]
            samples.append(TrainSample(prompt, completion, 1.0 if i % 2 else -1.0,
                                       external=external and g >= local // 2))
    return samples


def measure(args) -> dict:
    import torch

    from swarmlm.models import load_model
    from swarmlm.sapo.config import GRPOSection
    from swarmlm.sapo.update import GRPOUpdate

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    loaded = load_model(args.model, seed=args.seed)
    model = loaded.model.train()
    extra = {"precision": args.precision} if args.precision != "float32" else {}  # (an older GRPOSection has none)
    section = GRPOSection(lr=1e-6, micro_batch_size=args.micro_batch_size, **extra)
    optimizer = torch.optim.AdamW(model.parameters(), lr=section.lr)
    updater = GRPOUpdate(model, optimizer, section, loaded.tokenizer.pad_token_id)
    samples = make_samples(loaded.tokenizer, args.local, args.group_size, args.completion_tokens, args.external,
                           args.seed)
    times = []
    for k in range(args.repeats + 1):
        for s in samples:
            s.weight = 1.0
        started = time.perf_counter()
        stats = updater.update(samples, random.Random(k))
        if k > 0:  # the first is a warm-up
            times.append(time.perf_counter() - started)
    median = statistics.median(times)
    return {"model": args.model, "precision": args.precision, "bf16": getattr(updater, "bf16", False), "samples": len(samples),
            "completion_tokens": args.completion_tokens, "external": args.external, "threads": torch.get_num_threads(),
            "update_s": median, "samples_per_s": len(samples) / median, "update_s_all": times,
            "trained_samples": stats["trained_samples"], "loss": stats["loss"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-qwen2", help="preset, local directory, .gguf or smollm2-135m")
    ap.add_argument("--precision", default="float32", choices=["float32", "bfloat16", "auto"])
    ap.add_argument("--local", type=int, default=4, help="groups (I)")
    ap.add_argument("--group-size", type=int, default=8, help="completions per group (L)")
    ap.add_argument("--completion-tokens", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=32)
    ap.add_argument("--external", action="store_true", help="the second half of the groups are a peer's")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    result = measure(args)
    result["command"] = "python benchmarks/update_speed.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(f"{args.model}, update in {result['precision']} (bf16 autocast: {result['bf16']}): "
          f"{result['samples_per_s']:.1f} samples/s ({result['update_s']:.3f} s for {result['samples']} samples, "
          f"{result['trained_samples']:.0%} trained)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
