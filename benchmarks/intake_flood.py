"""The main-process cost of one round's intake under a flood of genuine-question records.

    python benchmarks/intake_flood.py --out docs/results/intake_flood.json

``--senders`` identities (8) each send one message of about ``--message-bytes`` (2 MB): records of their own
genuine questions (each passes the stream binding, so nothing is dropped cheaply), each with ``--group-size``
completions of ``--completion-chars`` characters (7,000) of varied text, a right or a wrong ``<answer>`` span first.
The messages go through a real :class:`~swarmlm.sapo.intake.PeerIntake` with its real verifier (worker processes,
started before the clock runs), for ``--rounds`` rounds, each round's records new. Reported per round: the
main-process seconds of the intake before verification (reading, checks, caps, cut, tokenization), the verifier's
seconds, the whole ``accept`` call, and the records accepted and dropped by reason.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from swarmlm.models import build_byte_tokenizer
from swarmlm.sapo.intake import PeerIntake, question_stream
from swarmlm.sapo.records import DropCounter, RecordLimits, RolloutRecord, encode_message
from swarmlm.sapo.transports.base import Received
from swarmlm.tasks import TaskConfig, TaskSource, format_answer
from swarmlm.verify import Verifier

SWARM = "intake-flood"
WORDS = ("the", "answer", "is", "so", "we", "add", "carry", "then", "check", "each", "digit", "twice", "because",
         "sum", "of", "terms", "equals", "step", "next", "value", "therefore", "product", "and", "result")


def completion(rng: random.Random, answer: str, chars: int) -> str:
    """An ``<answer>`` span, then words and numbers up to ``chars`` characters."""
    parts = [format_answer(answer)]
    size = len(parts[0])
    while size < chars:
        word = rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randrange(10_000))
        parts.append(word)
        size += len(word) + 1
    return " ".join(parts)[:chars]


def flood_messages(args: argparse.Namespace, round: int, rng: random.Random, tasks: TaskConfig) -> list[Received]:
    """Each sender's message of ``round``: as many records of its own questions as fit ``--message-bytes``."""
    messages = []
    for s in range(args.senders):
        sender = f"flooder-{s}"
        source = TaskSource(tasks, stream=question_stream(SWARM, sender))
        records: list[RolloutRecord] = []
        slot = 0
        while True:
            q = source.question(round, slot)
            texts = [completion(rng, q.answer if k % 2 == 0 else "no", args.completion_chars)
                     for k in range(args.group_size)]
            candidate = records + [RolloutRecord(sender, round, slot, q.family, q.question, q.provenance, texts, "m")]
            if len(candidate) > args.max_records or len(encode_message(candidate)) > args.message_bytes:
                break
            records = candidate
            slot += 1
        messages.append(Received(sender, round, encode_message(records)))
    return messages


def load_tokenizer(spec: str):
    if spec == "byte":
        return build_byte_tokenizer()
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(spec)


def run(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    tasks = TaskConfig()
    tokenizer = load_tokenizer(args.tokenizer)
    limits = RecordLimits()
    rows = []
    with Verifier(tasks) as verifier:
        verifier.wait_ready()
        drops = DropCounter()
        intake = PeerIntake(swarm=SWARM, node_id="receiver", limits=limits, verifier=verifier, tokenizer=tokenizer,
                            max_new_tokens=args.max_new_tokens, staleness_rounds=2, future_rounds=1,
                            round_seconds=10.0, drops=drops, rng=random.Random(args.seed))
        for r in range(1, args.rounds + 1):
            messages = flood_messages(args, r, rng, tasks)
            before = dict(drops.counts)
            cpu, started = time.process_time(), time.perf_counter()
            candidates = intake.candidates(messages, r)
            checked = time.perf_counter()
            pool = intake.verify(candidates, r, lambda texts, scores, lengths: list(scores))
            took = time.perf_counter() - started
            intake_seconds, verify_seconds = checked - started, took - (checked - started)
            rows.append({
                "round": r,
                "message_bytes": sum(len(m.payload) for m in messages),
                "records_sent": sum(len(json.loads(m.payload)["records"]) for m in messages),
                "intake_seconds": round(intake_seconds, 4),  # main process, before verification
                "verify_seconds": round(verify_seconds, 4),
                "accept_seconds": round(took, 4),
                "main_process_cpu_seconds": round(time.process_time() - cpu, 4),
                "records_accepted": len(pool),
                "drops": {k: v - before.get(k, 0) for k, v in drops.counts.items() if v - before.get(k, 0)},
            })
            print(json.dumps(rows[-1]), flush=True)
    intake_s = [row["intake_seconds"] for row in rows]
    return {"benchmark": "intake_flood", "args": vars(args), "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0], "limits": limits.model_dump(),
            "cut_chars": getattr(intake, "max_chars", None), "rows": rows,
            "intake_seconds_median": statistics.median(intake_s), "intake_seconds_max": max(intake_s),
            "accept_seconds_max": max(row["accept_seconds"] for row in rows)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--senders", type=int, default=8)
    p.add_argument("--message-bytes", type=int, default=1_990_000)
    p.add_argument("--completion-chars", type=int, default=7000)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-records", type=int, default=64, help="records per message at most")
    p.add_argument("--max-new-tokens", type=int, default=32, help="the receiver's generation.max_new_tokens")
    p.add_argument("--tokenizer", default="byte", help="'byte' (the presets') or a tokenizer directory / name")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-seconds", type=float, default=2.0, help="exit 1 when a round's intake took longer")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    result = run(args)
    result["passed"] = result["intake_seconds_max"] <= args.target_seconds
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"intake: median {result['intake_seconds_median']:.3f} s, max {result['intake_seconds_max']:.3f} s a round "
          f"(target {args.target_seconds} s); accept max {result['accept_seconds_max']:.3f} s")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
