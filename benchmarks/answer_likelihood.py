"""How likely each node of a finished SAPO run finds the right answers of the held-out set, by family, at its
start and at its end: a measure that moves before pass@1 does.

For every held-out question, the log-probability the model gives the right answer in the node's format
(``<answer>A</answer>``, teacher-forced after the node's own prompt), summed over its tokens; the mean over the
questions of each family. Under the node's initial model (its warm start, from the cache) and under its last
checkpoint. Pass@1 only counts a question once sampling lands on the answer; this shows whether sharing moved a
node towards answers it does not give yet.

    python benchmarks/answer_likelihood.py RUN_DIR [RUN_DIR ...] --out answer_likelihood.json
    # RUN_DIR: one run of swarmlm sapo simulate or sapo experiment (its config.yaml, and node-K/final-model or
    # node-K/checkpoints: sapo simulate keeps them with --final-checkpoint weights or resumable)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def answer_logprobs(model, tokenizer, questions, prompt_style: str = "auto", batch: int = 32) -> list[float]:
    """Summed log-probability of each question's right answer in the answer format, after its prompt."""
    import torch

    from swarmlm.sapo.batching import TrainSample, sample_logprobs
    from swarmlm.tasks import build_prompt, format_answer

    samples = []
    for q in questions:
        prompt = tokenizer(build_prompt(q.question, tokenizer, prompt_style), add_special_tokens=False)["input_ids"]
        answer = tokenizer(format_answer(q.answer or ""), add_special_tokens=False)["input_ids"]
        samples.append(TrainSample(prompt, answer, 0.0))
    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(samples), batch):
            logp, mask = sample_logprobs(model, samples[start:start + batch], tokenizer.pad_token_id)
            out.extend(float(v) for v in (logp * mask).sum(dim=1))
    return out


def by_family(questions, values: list[float]) -> dict[str, float]:
    sums: dict[str, list[float]] = {}
    for q, v in zip(questions, values):
        sums.setdefault(q.family, []).append(v)
    return {family: sum(v) / len(v) for family, v in sorted(sums.items())}


_MEASURED: dict[tuple[str, str, str], dict[str, float]] = {}


def _weights_digest(model_dir: Path) -> str:
    """SHA-1 of a model directory's weight files (a preset name is its own key)."""
    import hashlib

    files = sorted(model_dir.glob("*.safetensors")) if model_dir.is_dir() else []
    if not files:
        return str(model_dir)
    digest = hashlib.sha1()
    for f in files:
        digest.update(f.read_bytes())
    return digest.hexdigest()


def _final_model(node_dir: Path) -> Path | None:
    """A finished node's model: its ``final-model/`` (final_checkpoint: weights), else its newest checkpoint's."""
    from swarmlm.runtime.checkpoints import latest_checkpoint
    from swarmlm.sapo.node import FINAL_MODEL

    if (node_dir / FINAL_MODEL / "config.json").is_file():
        return node_dir / FINAL_MODEL
    checkpoint = latest_checkpoint(node_dir / "checkpoints")
    return checkpoint.model_dir if checkpoint else None


def run_likelihoods(run_dir: Path, eval_size: int | None = None) -> dict[str, Any]:
    """Per node of the run: its families (what its warm start learned, or what it draws), and by family the mean
    answer log-probability under its initial model and under its last checkpoint."""
    import yaml

    from swarmlm.models import load_model
    from swarmlm.sapo.config import SimulateConfig
    from swarmlm.sapo.node import initial_model_paths
    from swarmlm.tasks import eval_questions

    config = SimulateConfig.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text()))
    configs = [config.node_config(k) for k in range(config.nodes)]
    initials = initial_model_paths(configs, progress=False)
    nodes = {}
    for k, (node_config, initial) in enumerate(zip(configs, initials)):
        tasks = node_config.tasks if eval_size is None else node_config.tasks.model_copy(update={"eval_size": eval_size})
        questions = eval_questions(tasks)
        style = node_config.generation.prompt_style
        figures = {}
        for when, path in (("start", initial), ("end", _final_model(run_dir / f"node-{k}"))):
            if path is None:
                continue
            key = (_weights_digest(Path(path)), tasks.model_dump_json(), style)
            if key not in _MEASURED:  # the same weights (a shared warm start, a copied run) are measured once
                loaded = load_model(str(path), seed=0)
                loaded.model.eval()
                _MEASURED[key] = by_family(questions, answer_logprobs(loaded.model, loaded.tokenizer, questions, style))
            figures[when] = _MEASURED[key]
        nodes[f"node-{k}"] = {"families": list(config.node_specialty(k)), **figures}
    return {"run": str(run_dir), "nodes": nodes}


def unseen_means(result: dict[str, Any]) -> dict[str, float | None]:
    """A run's mean over nodes of the answer log-probability on the families outside each node's own (all families
    for a node with none), at the start and at the end."""
    out: dict[str, float | None] = {}
    for when in ("start", "end"):
        per_node = []
        for figures in result["nodes"].values():
            if when not in figures:
                continue
            unseen = [v for family, v in figures[when].items() if family not in figures["families"]]
            if unseen:
                per_node.append(sum(unseen) / len(unseen))
        out[when] = sum(per_node) / len(per_node) if per_node else None
    return out


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs grouped by their directory less the seed (``…/runs/<I>-<J>/seed-<s>``): per group, the unseen-family
    answer log-probability at the start and the end (per seed, and mean with its 95% interval), and where the same
    study holds an ``8-0`` group, the end's change against it paired by seed."""
    from swarmlm.experiments.stats import mean_ci

    groups: dict[str, dict[str, dict[str, float | None]]] = {}
    for r in results:
        run = Path(r["run"])
        groups.setdefault(str(run.parent), {})[run.name] = unseen_means(r)
    out: dict[str, Any] = {}
    for group, seeds in groups.items():
        row: dict[str, Any] = {"seeds": len(seeds), "per_seed": seeds}
        for when in ("start", "end"):
            values = [v[when] for v in seeds.values() if v[when] is not None]
            mean, ci = mean_ci(values) if values else (None, None)
            row[f"unseen_answer_logp_{when}"] = {"mean": mean, "ci95": ci}
        alone = groups.get(str(Path(group).parent / "8-0"))
        if alone is not None and Path(group).name != "8-0":
            diffs = [seeds[s]["end"] - alone[s]["end"] for s in seeds
                     if s in alone and seeds[s]["end"] is not None and alone[s]["end"] is not None]
            mean, ci = mean_ci(diffs) if diffs else (None, None)
            row["unseen_answer_logp_end_vs_8/0"] = {"mean": mean, "ci95": ci, "n": len(diffs)}
        out[group] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories")
    ap.add_argument("--eval-size", type=int, default=None, help="held-out questions (default: the run's)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures here (JSON)")
    args = ap.parse_args(argv)
    results = [run_likelihoods(run, args.eval_size) for run in args.runs]
    for r in results:
        print(r["run"])
        for node, figures in r["nodes"].items():
            print(f"  {node} ({'+'.join(figures['families']) or 'all'}): " + "; ".join(
                f"{family} {figures['start'][family]:.2f} -> {figures.get('end', {}).get(family, float('nan')):.2f}"
                for family in figures.get("start", {})))
    summary = summarise(results)
    for group, row in summary.items():
        start, end = row["unseen_answer_logp_start"], row["unseen_answer_logp_end"]
        versus = row.get("unseen_answer_logp_end_vs_8/0")
        print(f"{group} ({row['seeds']} seeds): unseen families' answer log p {start['mean']:.2f} -> "
              f"{end['mean']:.2f}" + (f" ± {end['ci95']:.2f}" if end["ci95"] is not None else "")
              + (f"; vs 8/0 {versus['mean']:+.2f}" + (f" ± {versus['ci95']:.2f}" if versus["ci95"] is not None else "")
                 if versus and versus["mean"] is not None else ""))
    if args.out:
        args.out.write_text(json.dumps({"command": "python benchmarks/answer_likelihood.py " + " ".join(
            map(str, sys.argv[1:] if argv is None else argv)), "summary": summary, "runs": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
