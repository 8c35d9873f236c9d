"""Does a pretrained model's held-out pass@1 move under SAPO's update, and at which learning rate?

Runs ``swarmlm sapo simulate`` once per learning rate: one node (I own groups, no external ones: the plain
update, so that only the learning rate differs), the easy task mix, the node's plain reward (no format
bonus), held-out greedy pass@1 before training (the node's ``round: 0`` row, where the node logs one) and
every ``--eval-every`` rounds. Two starting points:

* ``--raw-lrs``: the model as it is. SmolLM2-135M-Instruct almost never writes ``<answer>…</answer>``
  (0 of 128 sampled completions of 32 tokens here), so every group has zero advantage and no learning rate
  can move it;
* ``--lrs``: the model after ``--sft-steps`` supervised steps on questions with their answers in the answer
  format, in its chat template (batch 8, AdamW 2e-5; written to ``OUT/format-sft``): it then knows the format
  and has a low reward, where the SAPO paper's models start.

Writes one JSON with every run's trajectory and a summary per run::

    OMP_NUM_THREADS=1 python benchmarks/pretrained_lr.py --model smollm2-135m --lrs 1e-6,1e-5,3e-5 --raw-lrs 1e-4 \\
        --raw-rounds 12 --sft-steps 5 --rounds 30 --out runs/lr-smollm2 --json docs/results/smollm2_lr.json

(the figures of docs/guides/models.md, and docs/results/smollm2_lr.json).

Runs that finished are read back rather than run again, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="any model sapo simulate accepts")
    ap.add_argument("--lrs", default="1e-6,1e-5,3e-5,1e-4",
                    help="comma-separated Adam learning rates, each run from the format-SFT start")
    ap.add_argument("--raw-lrs", default="", help="comma-separated learning rates, each run from the model as it is")
    ap.add_argument("--raw-rounds", type=int, default=None, help="rounds of the raw runs (default: --rounds)")
    ap.add_argument("--sft-steps", type=int, default=5, help="supervised format steps of the SFT start")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--local", type=int, default=4, help="I: own groups per round")
    ap.add_argument("--group-size", type=int, default=8, help="L")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/lr-sweep", help="one simulate run per directory under this")
    ap.add_argument("--json", default=None, help="write the results here (default: OUT/results.json)")
    return ap.parse_args(argv)


def _mean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "node-0" / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _summarise(rows: list[dict[str, Any]], window: int = 10) -> dict[str, Any]:
    steps = [r for r in rows if r.get("round", 0) >= 1]
    evals = {r["round"]: r["eval_pass1"] for r in rows if r.get("eval_pass1") is not None}
    first, last = steps[:window], steps[-window:]
    return {
        "rounds_done": len(steps),
        "eval_pass1": evals,  # round -> held-out greedy pass@1 (round 0: before any update)
        "pass1_start": evals.get(0),
        "pass1_end": evals[max(evals)] if evals else None,
        "reward_own_first": _mean([r.get("reward_own") for r in first]),
        "reward_own_last": _mean([r.get("reward_own") for r in last]),
        "format_rate_first": _mean([r.get("format_rate") for r in first]),
        "format_rate_last": _mean([r.get("format_rate") for r in last]),
        "grad_norm_mean": _mean([r.get("grad_norm") for r in steps]),
        "nonzero_grad_rounds": sum(1 for r in steps if (r.get("grad_norm") or 0) > 0),
        "round_seconds_median": sorted(r["round_seconds"] for r in steps)[len(steps) // 2] if steps else None,
        "window": window,
    }


def format_sft(model: str, steps: int, out: Path, seed: int) -> dict[str, Any]:
    """``steps`` supervised steps that teach ``model`` the answer format in its own prompt style (its chat template
    for a chat model), on a question stream of its own (never the held-out set); saved to ``out``."""
    if (out / "format_sft.json").exists():
        return json.loads((out / "format_sft.json").read_text())
    import torch

    from swarmlm.models import load_model
    from swarmlm.tasks import TaskConfig, TaskSource, build_prompt, format_answer

    torch.manual_seed(seed)
    loaded = load_model(model, seed=seed)
    net, tok = loaded.model.train(), loaded.tokenizer
    source = TaskSource(TaskConfig(), stream=f"format-sft/{seed}")
    opt = torch.optim.AdamW(net.parameters(), lr=2e-5, weight_decay=0.0)
    started, losses = time.monotonic(), []
    for step in range(steps):
        batch = source.sample(8, round=step)
        prompts = [tok(build_prompt(q.question, tok), add_special_tokens=False)["input_ids"] for q in batch]
        targets = [tok(format_answer(q.answer or ""), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                   for q in batch]
        width = max(len(p) + len(t) for p, t in zip(prompts, targets))
        ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)
        labels, attention = torch.full_like(ids, -100), torch.zeros_like(ids)
        for row, (p, t) in enumerate(zip(prompts, targets)):
            ids[row, : len(p) + len(t)] = torch.tensor(p + t)
            labels[row, len(p): len(p) + len(t)] = torch.tensor(t)
            attention[row, : len(p) + len(t)] = 1
        loss = net(input_ids=ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        losses.append(round(loss.item(), 4))
    net.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    info = {"model": model, "steps": steps, "batch": 8, "lr": 2e-5, "losses": losses,
            "seconds": round(time.monotonic() - started, 1)}
    (out / "format_sft.json").write_text(json.dumps(info, indent=1))
    return info


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sft = None
    grid: list[tuple[str, float]] = [("raw", float(lr)) for lr in args.raw_lrs.split(",") if lr.strip()]
    if args.lrs.strip():
        print(f"format SFT of {args.model}: {args.sft_steps} steps -> {out / 'format-sft'}", flush=True)
        sft = format_sft(args.model, args.sft_steps, out / "format-sft", args.seed)
        grid += [("format-sft", float(lr)) for lr in args.lrs.split(",") if lr.strip()]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               MKL_NUM_THREADS=os.environ.get("MKL_NUM_THREADS", "1"))
    runs = []
    for start, lr in grid:
        name = f"{start}-lr-{lr:g}"
        run_dir = out / name
        model = args.model if start == "raw" else str(out / "format-sft")
        rounds = args.raw_rounds if start == "raw" and args.raw_rounds else args.rounds
        cmd = [sys.executable, "-m", "swarmlm", "--log-level", "WARNING", "sapo", "simulate", "--model", model,
               "--nodes", "1", "--local", str(args.local), "--external", "0", "--rounds", str(rounds),
               "--generation.group-size", str(args.group_size), "--generation.max-new-tokens", str(args.max_new_tokens),
               "--eval-every", str(args.eval_every), "--tasks.eval-size", str(args.eval_size),
               "--checkpoint-every", "10", "--grpo.lr", f"{lr:g}", "--grpo.format-reward", "0",
               "--seed", str(args.seed), "--out", str(run_dir),
               # each start exactly as named: not the format warm-up that model.warmstart auto gives a pretrained model
               "--model.warmstart", "never"]
        started = time.monotonic()
        if len([r for r in _rows(run_dir) if r.get("round", 0) >= 1]) < rounds:
            print(f"{name}: {' '.join(cmd[1:])}", flush=True)
            with open(out / f"{name}.log", "ab") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
            if rc != 0:
                print(f"  exited {rc}; see {out}/{name}.log", flush=True)
        run = {"start": start, "lr": lr, "rounds": rounds, "wall_seconds": round(time.monotonic() - started, 1),
               **_summarise(_rows(run_dir))}
        runs.append(run)
        print(f"  pass@1 {run['pass1_start']} -> {run['pass1_end']}, reward_own {run['reward_own_first']} -> "
              f"{run['reward_own_last']}, format rate {run['format_rate_first']} -> {run['format_rate_last']}", flush=True)
    result = {
        "what": "held-out greedy pass@1 of one SAPO node (I own groups, J = 0, no format reward) under swarmlm "
                "sapo simulate, per Adam learning rate, from the model as it is (raw) and after a short format SFT",
        "command": "OMP_NUM_THREADS=1 python benchmarks/pretrained_lr.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": args.model, "rounds": args.rounds, "local": args.local, "group_size": args.group_size,
        "max_new_tokens": args.max_new_tokens, "eval_every": args.eval_every, "eval_size": args.eval_size,
        "tasks": "easy", "seed": args.seed,
        "machine": {"cpus": os.cpu_count(), "threads": env["OMP_NUM_THREADS"], "python": platform.python_version()},
        "format_sft": sft,
        "runs": runs,
    }
    path = Path(args.json) if args.json else out / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
