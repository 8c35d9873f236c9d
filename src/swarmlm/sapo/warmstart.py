"""Warm starts: short supervised passes that teach a model the answer format before RL.

* :func:`warmstart`, for a built-in preset (random weights): a few hundred steps, below.
* :func:`format_warmup`, for any other model (a pretrained one): a probe of its sampled completions, and only when
  it lacks the format, a few steps until it has it (the second half of this module).

A randomly initialised model never writes ``<answer>…</answer>``, so RL would see zero reward
everywhere and learn nothing. A few hundred steps of supervised training on reasoning-gym questions
with their answers give a small model the format and a low but non-zero reward, the situation of
Qwen2.5-0.5B at the start of the SAPO paper. The result is cached on disk, keyed by its settings.

Training in float32 does not give the same model on every processor (matrix kernels round differently, and a
few hundred steps at a high rate amplify that), so swarmlm ships the warm start of the default settings
(``shipped_warmstarts/``, bfloat16 weights): every machine starts the default run from the same model, and
none spends the training time. ``train=True`` (``swarmlm warmstart --train true``, ``--model.warmstart train``)
trains it here instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Literal

from pydantic import Field

from swarmlm.config import StrictModel
from swarmlm.runtime.cache import cache_root, file_lock
from swarmlm.runtime.environment import describe_environment
from swarmlm.tasks.prompts import INSTRUCTION, PromptStyle
from swarmlm.tasks.reasoning_gym_tasks import TaskConfig

log = logging.getLogger(__name__)

WARMSTART_VERSION = 2  # bump when the procedure changes, so that old caches are not reused


class WarmstartConfig(StrictModel):
    model: str = Field("tiny-qwen2", description="built-in preset to warm-start")
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    steps: int = Field(600, ge=0, description="optimizer steps")
    batch_size: int = Field(32, ge=1, description="questions (with their answers) per optimizer step")
    lr: float = Field(1e-3, gt=0, description="AdamW peak learning rate (linear warm-up over the first tenth of the "
                      "steps, then the schedule)")
    schedule: Literal["constant", "cosine"] = Field(
        "constant", description="after the warm-up: constant, or cosine decay to a tenth of the peak at the last step")
    seed: int = Field(1, ge=0, description="seed of the preset's initial weights and of the question stream (1: "
                      "the shipped warm start's)")
    out: str | None = Field(None, description="output directory (default: the cache)")
    train: bool = Field(False, description="train on this machine even where swarmlm ships the warm start of these "
                        "settings (the default ones); false: use the shipped one")


def lr_factor(step: int, *, steps: int, schedule: str) -> float:
    """The warm start's learning rate at ``step`` as a fraction of the peak: linear warm-up over the first tenth of
    the steps, then constant or a cosine decay to 0.1 at the last step."""
    warmup = max(1, steps // 10)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def warmstart_key(config: WarmstartConfig) -> str:
    # Neither the held-out set's size nor the verifier's limits nor the families scored for peers change what the
    # warm start learns; draw_families does when it is set (and is left out when empty, so that the keys of warm
    # starts made before it existed still hold).
    ignored = {"eval_size", "verifier", "allow_families"} | (set() if config.tasks.draw_families else {"draw_families"})
    settings = config.model_dump(mode="json", exclude={"out": True, "train": True, "tasks": ignored})
    blob = json.dumps({"v": WARMSTART_VERSION, **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _train(config: WarmstartConfig, out_dir: Path, progress: bool) -> dict:
    # torch, transformers (the presets) and reasoning-gym are imported here, not with the config above, which the
    # command line reads to build its --help
    import torch
    from tqdm.auto import tqdm

    from swarmlm.models import build_preset
    from swarmlm.tasks import TaskSource, build_prompt, format_answer

    loaded = build_preset(config.model, seed=config.seed)
    model, tok = loaded.model, loaded.tokenizer
    torch.manual_seed(config.seed)
    source = TaskSource(config.tasks, stream=f"warmstart/{config.seed}")
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, partial(lr_factor, steps=config.steps, schedule=config.schedule))
    model.train()
    started = time.time()
    loss_value = float("nan")
    for step in tqdm(range(config.steps), desc=f"warm start {config.model}", disable=not progress, unit="step"):
        questions = source.sample(config.batch_size, round=step)
        prompts = [tok(build_prompt(q.question, tok, "plain"), add_special_tokens=False)["input_ids"] for q in questions]
        targets = [tok(format_answer(q.answer or ""), add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for q in questions]
        width = max(len(p) + len(t) for p, t in zip(prompts, targets))
        ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        attention = torch.zeros_like(ids)
        for row, (p, t) in enumerate(zip(prompts, targets)):
            ids[row, : len(p) + len(t)] = torch.tensor(p + t)
            labels[row, len(p): len(p) + len(t)] = torch.tensor(t)
            attention[row, : len(p) + len(t)] = 1
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_value = loss.item()
    # the processor is part of what a warm start is: float32 training does not give the same model on another one
    info = {"config": config.model_dump(mode="json"), "final_loss": loss_value, "seconds": round(time.time() - started, 1),
            "environment": describe_environment()}
    _publish(out_dir, model, tok, info)
    return info


def _publish(out_dir: Path, model, tokenizer, info: dict) -> None:
    """Write a warm start to ``out_dir`` (safetensors, tokenizer, ``warmstart.json``) through a temporary directory
    renamed into place, so that a killed process never leaves a half-written entry that looks complete."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "warmstart.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def warmstart_info(model_dir: str | Path) -> dict | None:
    """What a warm start directory's ``warmstart.json`` says (its settings, final loss, seconds and the machine it
    was trained on; a format warm-up's also its probes), or None for a model that is not a warm start."""
    return _read_json(Path(model_dir) / "warmstart.json")


SHIPPED_DIR = Path(__file__).with_name("shipped_warmstarts")


def shipped_warmstart(config: WarmstartConfig) -> Path | None:
    """The warm start swarmlm ships for ``config``'s settings (``SHIPPED_DIR/<model>-<key>``), or None."""
    path = SHIPPED_DIR / f"{config.model}-{warmstart_key(config)}"
    return path if (path / "warmstart.json").is_file() else None


def _unpack(shipped: Path, out_dir: Path) -> dict:
    """Write the shipped warm start to ``out_dir`` in float32 (exact: bfloat16 widens without rounding), with its
    ``warmstart.json`` marked ``shipped``."""
    import torch

    from swarmlm.models import load_model

    loaded = load_model(str(shipped), dtype=torch.float32)
    info = {**(_read_json(shipped / "warmstart.json") or {}), "shipped": True}
    _publish(out_dir, loaded.model, loaded.tokenizer, info)
    return info


def warmstart(config: WarmstartConfig, *, progress: bool = True) -> Path:
    """The warm-started model directory for ``config``: the shipped one for its settings (unpacked into the cache
    once) unless ``config.train``, else from the cache, or trained now (once, under a lock)."""
    from swarmlm.models import PRESETS

    if config.model not in PRESETS:
        raise ValueError(f"warm start is for built-in presets ({', '.join(PRESETS)}), not '{config.model}'")
    shipped = None if config.train else shipped_warmstart(config)
    # the shipped one has a cache entry of its own, so that a warm start trained here earlier never stands in for it
    name = f"{config.model}-{warmstart_key(config)}" + ("-shipped" if shipped else "")
    out_dir = Path(config.out) if config.out else cache_root() / "warmstart" / name
    with file_lock(out_dir.with_name(out_dir.name + ".lock")):
        info = _read_json(out_dir / "warmstart.json")
        # an explicit --out holds whatever warm start was made there; the cache's entries are one kind each
        if info is not None and (config.out or bool(info.get("shipped")) == bool(shipped)):
            log.info("warm start cached at %s", out_dir)
            return out_dir
        if shipped:
            _unpack(shipped, out_dir)
            log.info("warm start of %s: the one shipped with swarmlm -> %s", config.model, out_dir)
            return out_dir
        info = _train(config, out_dir, progress)
        log.info("warm start of %s done in %.0fs (final loss %.3f) -> %s", config.model, info["seconds"], info["final_loss"], out_dir)
    return out_dir


def pack_warmstart(model_dir: str | Path, dest: Path = SHIPPED_DIR) -> Path:
    """Store the warm start in ``model_dir`` (trained by :func:`warmstart`) for shipping: its weights in bfloat16,
    its tokenizer and ``warmstart.json``, under ``dest/<model>-<key>``. What it ships is the rounded model: measure
    that one."""
    import torch

    from swarmlm.models import load_model

    info = _read_json(Path(model_dir) / "warmstart.json")
    if info is None or "config" not in info:
        raise ValueError(f"{model_dir} holds no warm start of a preset (no warmstart.json with its config)")
    config = WarmstartConfig.model_validate({**info["config"], "out": None, "train": False})
    target = dest / f"{config.model}-{warmstart_key(config)}"
    loaded = load_model(str(model_dir), dtype=torch.bfloat16)
    shutil.rmtree(target, ignore_errors=True)
    loaded.model.save_pretrained(target, safe_serialization=True)
    loaded.tokenizer.save_pretrained(target)
    (target / "warmstart.json").write_text(json.dumps({**info, "config": config.model_dump(mode="json")}, indent=1))
    return target


# ---------------------------------------------------------------------------------------------------------------------
# Format warm-up of a pretrained model
#
# A pretrained instruct model knows arithmetic and how to reply, but not this project's answer format: SmolLM2-135M-
# Instruct, asked in its chat template with the instruction in the system turn, wrote <answer>…</answer> in 0 of 32
# sampled completions (1 of 32 with a one-line example added), at 32 and at 128 new tokens, so every group of a node
# had zero advantage. A few supervised steps on training questions with their answers in the format give it the
# format (0.00 -> 0.97 of the probe's 32 sampled completions after 4 steps of 8 questions at 5e-5, measured here) while
# moving it as little as possible. The warm-up runs only for a model that lacks the format, stops as soon as a probe
# of sampled completions shows it, and is cached on disk keyed by its settings and the model's identity.

FORMAT_WARMUP_VERSION = 1  # bump when the procedure changes, so that old caches are not reused
FORMAT_CHECK = "format_check.json"  # the probe's outcome, in every cache entry (the marker that it is complete)


class FormatWarmupConfig(StrictModel):
    """Settings of the format warm-up of a model that is not a preset (see :func:`format_warmup`)."""

    model: str = Field(description="the model as load_model takes it: a directory, .gguf file, smollm2-135m or hub id")
    tasks: TaskConfig = Field(default_factory=TaskConfig)
    prompt_style: PromptStyle = Field("auto", description="the node's generation.prompt_style (its prompts are trained)")
    max_prompt_tokens: int = Field(512, ge=8, description="the node's generation.max_prompt_tokens")
    max_new_tokens: int = Field(32, ge=1, description="the probe's completion budget: the node's generation.max_new_tokens")
    temperature: float = Field(1.0, gt=0, description="the probe's sampling temperature: the node's")
    max_steps: int = Field(16, ge=0, description="most supervised steps")
    batch_size: int = Field(8, ge=1, description="training questions (with their answers) per step")
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate (constant, no weight decay)")
    target: float = Field(0.95, gt=0, le=1, description="stop once this share of the probe's sampled completions has "
                          "an answer span; a model that has it already is used as it is")
    check_every: int = Field(2, ge=1, description="steps between probes")
    probe_questions: int = Field(8, ge=1, description="training questions of the probe (never held-out ones)")
    probe_samples: int = Field(4, ge=1, description="sampled completions per probe question")
    seed: int = Field(0, ge=0, description="seed of the question streams and of the probe's sampling")
    device: str = Field("cpu", description="where it trains (not part of the cache key)")


def format_warmup_key(config: FormatWarmupConfig) -> str:
    """The cache key: every setting but the device and the held-out set's, the instruction text, and the model's
    identity (:func:`swarmlm.models.model_identity`: a replaced weight file gets a new entry)."""
    from swarmlm.models import model_identity

    ignored = {"eval_size", "verifier", "allow_families"} | (set() if config.tasks.draw_families else {"draw_families"})
    settings = config.model_dump(mode="json", exclude={"device": True, "tasks": ignored})
    blob = json.dumps({"v": FORMAT_WARMUP_VERSION, "identity": model_identity(config.model), "instruction": INSTRUCTION,
                       **settings}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def format_warmup_dir(config: FormatWarmupConfig) -> Path:
    """The cache entry of ``config`` (whether or not it exists yet)."""
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(config.model.rstrip("/")).name)[-48:] or "model"
    return cache_root() / "format-warmup" / f"{stem}-{format_warmup_key(config)}"


def _prompt_ids(questions: list, tok, config: FormatWarmupConfig) -> list[list[int]]:
    from swarmlm.sapo.engines.base import tokenize_prompts
    from swarmlm.tasks import build_prompt

    return tokenize_prompts(tok, [build_prompt(q.question, tok, config.prompt_style) for q in questions],
                            config.max_prompt_tokens)


def probe_format(model, tok, questions: list, config: FormatWarmupConfig, seed: int) -> dict:
    """The share of sampled completions (``probe_samples`` per question, at the node's temperature and budget) that
    hold an ``<answer>…</answer>`` span, their mean length in tokens, and the share cut at the budget."""
    import torch

    from swarmlm.sapo.engines.hf import generate_completions
    from swarmlm.tasks import extract_answer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generated = generate_completions(model, tok, _prompt_ids(questions, tok, config),
                                         num_completions=config.probe_samples, max_new_tokens=config.max_new_tokens,
                                         temperature=config.temperature)
    texts = [t for g in generated for t in g.texts]
    lengths = [len(c) for g in generated for c in g.completion_ids]
    cut = [not f for g in generated for f in g.finished]
    return {"format_rate": sum(extract_answer(t) is not None for t in texts) / max(1, len(texts)),
            "completion_tokens": sum(lengths) / max(1, len(lengths)), "truncated_rate": sum(cut) / max(1, len(cut)),
            "example": texts[0][:120] if texts else ""}


def _supervised_step(model, tok, questions: list, config: FormatWarmupConfig, opt) -> float:
    """One AdamW step on ``questions``: the loss is on the answer in the format and EOS, after the node's prompt."""
    import torch

    from swarmlm.tasks import format_answer

    device = next(model.parameters()).device
    prompts = _prompt_ids(questions, tok, config)
    targets = [tok(format_answer(q.answer or ""), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
               for q in questions]
    width = max(len(p) + len(t) for p, t in zip(prompts, targets))
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    attention = torch.zeros_like(ids)
    for row, (p, t) in enumerate(zip(prompts, targets)):  # right-padded: positions start at 0 in every row
        ids[row, : len(p) + len(t)] = torch.tensor(p + t)
        labels[row, len(p): len(p) + len(t)] = torch.tensor(t)
        attention[row, : len(p) + len(t)] = 1
    model.train()
    loss = model(input_ids=ids.to(device), attention_mask=attention.to(device), labels=labels.to(device)).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def _run_format_warmup(config: FormatWarmupConfig, out_dir: Path, progress: bool) -> dict:
    import torch
    from tqdm.auto import tqdm

    from swarmlm.models import load_model
    from swarmlm.runtime.devices import resolve_device
    from swarmlm.tasks import TaskSource, format_answer

    started = time.time()
    # float32 whatever the checkpoint's dtype: a few small AdamW steps on bfloat16 weights would mostly round away
    loaded = load_model(config.model, seed=config.seed, dtype=torch.float32)
    model, tok = loaded.model.to(resolve_device(config.device)), loaded.tokenizer
    probe_questions = TaskSource(config.tasks, stream=f"format-warmup-probe/{config.seed}").sample(config.probe_questions, round=0)
    source = TaskSource(config.tasks, stream=f"format-warmup/{config.seed}")
    # the share of the probe's questions whose answer, in the format, fits in the node's budget: the most the probe can
    # show. Below the target no warm-up can reach it (a budget of a few tokens, as the smoke tests run), so none runs
    fits = sum(len(tok(format_answer(q.answer or ""), add_special_tokens=False)["input_ids"]) <= config.max_new_tokens
               for q in probe_questions) / len(probe_questions)
    if fits < config.target:
        before = {"format_rate": None, "completion_tokens": None, "truncated_rate": None, "example": ""}
    else:
        before = probe_format(model, tok, probe_questions, config, seed=config.seed)
    probes = [{"step": 0, **before}]
    losses: list[float] = []
    if fits >= config.target and before["format_rate"] < config.target and config.max_steps > 0:
        torch.manual_seed(config.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
        bar = tqdm(total=config.max_steps, desc=f"format warm-up {loaded.name}", disable=not progress, unit="step")
        for step in range(config.max_steps):
            losses.append(round(_supervised_step(model, tok, source.sample(config.batch_size, round=step), config, opt), 4))
            bar.update(1)
            if (step + 1) % config.check_every == 0 or step + 1 == config.max_steps:
                probes.append({"step": step + 1, **probe_format(model, tok, probe_questions, config, seed=config.seed + step + 1)})
                bar.set_postfix(format=f"{probes[-1]['format_rate']:.2f}")
                if probes[-1]["format_rate"] >= config.target:
                    break
        bar.close()
        model.eval()
    trained = bool(losses)
    info = {"config": config.model_dump(mode="json"), "kind": "format", "trained": trained, "answers_fit": fits,
            "steps": len(losses), "final_loss": losses[-1] if losses else None, "losses": losses,
            "format_rate_before": before["format_rate"], "format_rate_after": probes[-1]["format_rate"], "probes": probes, "seconds": round(time.time() - started, 1), "environment": describe_environment()}
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if trained:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        # the record a warm start carries (warmstart_info): the node's default learning rate reads its model
        (tmp / "warmstart.json").write_text(json.dumps(info, indent=1))
    (tmp / FORMAT_CHECK).write_text(json.dumps(info, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return info


def format_warmup(config: FormatWarmupConfig, *, progress: bool = True) -> str:
    """The model a node should start from: ``config.model`` itself when it already writes the answer format (or is
    a warm start already), else its format warm-up's directory; from the cache, or probed and trained now (once,
    under a lock)."""
    from swarmlm.models import PRESETS

    if config.model in PRESETS:
        raise ValueError(f"'{config.model}' is a built-in preset: its warm start is warmstart(), not the format warm-up")
    if warmstart_info(config.model) is not None:
        return config.model  # a warm start (a preset's or a format warm-up) is used as it is
    out_dir = format_warmup_dir(config)
    with file_lock(out_dir.with_name(out_dir.name + ".lock")):
        info = _read_json(out_dir / FORMAT_CHECK)
        if info is None:
            info = _run_format_warmup(config, out_dir, progress)
            if info["format_rate_before"] is None:
                log.warning("no format warm-up of %s: the answer format fits in max_new_tokens %d for only %.0f%% of "
                            "training answers; the model is used as it is", config.model, config.max_new_tokens,
                            100 * info["answers_fit"])
                return config.model
            log.info("format warm-up of %s: format rate %.2f -> %.2f in %d steps (%.0fs) -> %s", config.model,
                     info["format_rate_before"], info["format_rate_after"], info["steps"], info["seconds"], out_dir)
            if info["format_rate_after"] < config.target:
                log.warning("format warm-up of %s reached a format rate of %.2f in %d steps, short of %.2f", config.model,
                            info["format_rate_after"], info["steps"], config.target)
    return str(out_dir) if info.get("trained") else config.model
