"""Where a GRPO update's gradient lands: answer content, the answer tags, EOS, or the rest of a completion.

    python benchmarks/sapo_gradient_anatomy.py                          # the default warm-started tiny-qwen2
    python benchmarks/sapo_gradient_anatomy.py --model runs/sapo/node-0/checkpoints/step-000040/model
    python benchmarks/sapo_gradient_anatomy.py --reward task --groups 64 --out results/anatomy

A diagnostic for RL that does not learn, or collapses: it samples ``--groups`` questions × L completions from a
model as a SAPO node does, scores them with the node's verifier, computes GRPO's group advantages
(arXiv 2402.03300) and, for the token-mean loss of one on-policy step, the gradient on every completion position's
logits: ``∂L/∂z_t = −(A_i / N)(onehot(y_t) − softmax(z_t))``. Positions are classed by the text they decode to:
``open`` (``<answer>``), ``answer`` (its content), ``close`` (``</answer>``), ``eos`` (the EOS appended for
training), ``other`` (text outside the span). For each class it reports its share of tokens, its share of the
summed logit-gradient norm, and the net push on the sampled tokens' logits, ``Σ A_i (1 − p_t) / N`` (negative:
the update makes the tokens of that class that were sampled less likely on the whole). It also reports the share
of groups with no advantage, the share of completions cut at ``max_new_tokens``, success rates and the sampled
tokens' mean −log p (an estimate of the policy's entropy per token).

Writes ``anatomy.json`` and ``anatomy.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CLASSES = ("open", "answer", "close", "eos", "other")


def token_classes(texts_so_far: list[str], eos: bool) -> list[str]:
    """The class of each token of a completion, from the decoded text of its first k tokens (k = 1..n)."""
    full = texts_so_far[-1] if texts_so_far else ""
    open_at = full.rfind("<answer>")
    close_at = full.find("</answer>", open_at + 1) if open_at >= 0 else -1
    spans = []
    if open_at >= 0:
        spans.append(("open", open_at, open_at + len("<answer>")))
        end = close_at if close_at >= 0 else len(full)
        spans.append(("answer", open_at + len("<answer>"), end))
        if close_at >= 0:
            spans.append(("close", close_at, close_at + len("</answer>")))
    out, previous = [], 0
    for text in texts_so_far:
        start, end = previous, max(previous, len(text))
        previous = end
        middle = (start + end - 1) // 2 if end > start else start  # the token's characters, judged by their middle
        out.append(next((name for name, a, b in spans if a <= middle < b), "other"))
    if eos:
        out.append("eos")
    return out


def anatomy(model, tokenizer, questions, scores_of, *, group_size: int, max_new_tokens: int, reward: str,
            seed: int = 0) -> dict:
    """The report for one on-policy step over ``questions`` (see the module docstring)."""
    import torch

    from swarmlm.sapo.batching import TrainSample, collate, with_eos
    from swarmlm.sapo.engines.hf import HFEngine
    from swarmlm.sapo.grpo import group_advantages, is_zero_advantage
    from swarmlm.tasks import build_prompt

    torch.manual_seed(seed)
    engine = HFEngine(model, tokenizer)
    prompts = [tokenizer(build_prompt(q.question, tokenizer, "auto"), add_special_tokens=False)["input_ids"]
               for q in questions]
    generated = engine.generate(prompts, num_completions=group_size, max_new_tokens=max_new_tokens, temperature=1.0)
    scores = scores_of(questions, [g.texts for g in generated])
    rewards = [[float(s >= 1 - 1e-9) for s in row] if reward == "correct" else list(row) for row in scores]
    advantages = group_advantages(torch.tensor(rewards, dtype=torch.float64)).tolist()
    eos_id = tokenizer.eos_token_id
    samples, classes = [], []
    for gen, advs in zip(generated, advantages):
        for ids, a in zip(gen.completion_ids, advs):
            full = with_eos(ids, eos_id, max_new_tokens)
            body = full[:-1]
            decoded = [tokenizer.decode(body[:k + 1], skip_special_tokens=True) for k in range(len(body))]
            samples.append(TrainSample(gen.prompt_ids, full, a))
            classes.append(token_classes(decoded, eos=True))
    batch = collate(samples, tokenizer.pad_token_id)
    totals = {c: {"tokens": 0, "grad_norm": 0.0, "push": 0.0} for c in CLASSES}
    nll_sum = 0.0
    n_tokens = sum(len(s.completion_ids) for s in samples)
    model.eval()
    with torch.no_grad():
        for start in range(0, len(samples), 32):
            rows = slice(start, start + 32)
            logits = model(input_ids=batch["input_ids"][rows], attention_mask=batch["attention_mask"][rows],
                           position_ids=batch["position_ids"][rows]).logits.float()
            probs = torch.softmax(logits[:, :-1], dim=-1)  # position t predicts token t + 1
            targets = batch["input_ids"][rows][:, 1:]
            mask = batch["completion_mask"][rows][:, 1:]
            for r in range(probs.shape[0]):
                i = start + r
                where = mask[r].nonzero().flatten()
                p = probs[r, where]
                y = targets[r, where]
                p_y = p.gather(1, y.unsqueeze(1)).squeeze(1)
                # ||onehot(y) - p||_2 = sqrt((1 - p_y)^2 + sum p^2 - p_y^2)
                norms = torch.sqrt(((1 - p_y) ** 2 + (p ** 2).sum(dim=1) - p_y ** 2).clamp(min=0))
                a = samples[i].advantage
                nll_sum -= float(torch.log(p_y.clamp(min=1e-30)).sum())
                for cls, g, py in zip(classes[i], norms.tolist(), p_y.tolist()):
                    totals[cls]["tokens"] += 1
                    totals[cls]["grad_norm"] += abs(a) * g / n_tokens
                    totals[cls]["push"] += a * (1 - py) / n_tokens
    grad_total = sum(t["grad_norm"] for t in totals.values()) or 1.0
    flat_scores = [s for row in scores for s in row]
    return {
        "groups": len(questions), "group_size": group_size, "reward": reward,
        "zero_advantage_groups": sum(is_zero_advantage(r) for r in rewards) / len(rewards),
        "truncated": sum(not f for g in generated for f in g.finished) / len(samples),
        "mean_completion_tokens": sum(len(s.completion_ids) - 1 for s in samples) / len(samples),
        "correct": sum(s >= 1 - 1e-9 for s in flat_scores) / len(flat_scores),
        "mean_score": sum(flat_scores) / len(flat_scores),
        "partial_credit_share": sum(0 < s < 1 - 1e-9 for s in flat_scores) / len(flat_scores),
        "classes": {c: {"token_share": t["tokens"] / max(1, n_tokens), "grad_share": t["grad_norm"] / grad_total,
                        "net_push": t["push"]} for c, t in totals.items()},
        "token_nll": nll_sum / max(1, n_tokens),
    }


def markdown(report: dict, model: str) -> str:
    lines = [f"Gradient anatomy of one GRPO step: `{model}`, {report['groups']} groups × L = {report['group_size']}, "
             f"reward `{report['reward']}`.", "",
             f"correct {report['correct']:.3f} · mean score {report['mean_score']:.3f} · partial credit "
             f"{report['partial_credit_share']:.3f} · zero-advantage groups {report['zero_advantage_groups']:.3f} · "
             f"truncated {report['truncated']:.3f} · mean length {report['mean_completion_tokens']:.1f} tokens · "
             f"−log p per sampled token {report['token_nll']:.3f}", "",
             "| tokens | share of tokens | share of the logit gradient | net push on sampled tokens |", "|---|---|---|---|"]
    for c, v in report["classes"].items():
        lines.append(f"| {c} | {v['token_share']:.3f} | {v['grad_share']:.3f} | {v['net_push']:+.5f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory, preset or hub id (default: the SAPO "
                        "commands' warm-started tiny-qwen2, trained now if not cached)")
    parser.add_argument("--groups", type=int, default=64, help="questions (groups) sampled")
    parser.add_argument("--group-size", type=int, default=8, help="completions per question (L)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--reward", choices=["task", "correct"], default="correct",
                        help="task = the task's score with partial credit; correct = 1 for full marks, else 0")
    parser.add_argument("--warmstart-steps", type=int, default=None, help="warm-start steps of the default model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--out", default="results/anatomy")
    args = parser.parse_args(argv)

    import torch

    from swarmlm.models import load_model
    from swarmlm.sapo.config import ModelSection, SAPOConfig
    from swarmlm.sapo.node import initial_model_path
    from swarmlm.tasks import TaskConfig, TaskSource
    from swarmlm.verify import Verifier

    if args.threads:
        torch.set_num_threads(args.threads)
    model_name = args.model
    if model_name is None:
        section = ModelSection() if args.warmstart_steps is None else ModelSection(warmstart_steps=args.warmstart_steps)
        model_name = initial_model_path(SAPOConfig(model=section), progress=False)
    loaded = load_model(model_name, seed=args.seed)
    tasks = TaskConfig()
    questions = TaskSource(tasks, stream=f"anatomy/{args.seed}").sample(args.groups, round=0)
    with Verifier(tasks) as verifier:
        report = anatomy(loaded.model, loaded.tokenizer, questions, verifier.completion_scores,
                         group_size=args.group_size, max_new_tokens=args.max_new_tokens, reward=args.reward, seed=args.seed)
    report["model"] = str(model_name)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "anatomy.json").write_text(json.dumps(report, indent=1))
    text = markdown(report, Path(str(model_name)).name)
    (out / "anatomy.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
