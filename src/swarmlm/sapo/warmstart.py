"""Warm start: a short supervised pass that teaches a freshly built preset the answer format.

A randomly initialised model never writes ``<answer>…</answer>``, so RL would see zero reward
everywhere and learn nothing. A few hundred steps of supervised training on reasoning-gym questions
with their answers give a small model the format and a low but non-zero reward, the situation of
Qwen2.5-0.5B at the start of the SAPO paper. The result is cached on disk, keyed by its settings.
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
    seed: int = Field(0, ge=0, description="seed of the preset's initial weights and of the question stream")
    out: str | None = Field(None, description="output directory (default: the cache)")



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
    settings = config.model_dump(mode="json", exclude={"out": True, "tasks": ignored})
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
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    # the processor is part of what a warm start is: float32 training does not give the same model on another one
    info = {"config": config.model_dump(mode="json"), "final_loss": loss_value, "seconds": round(time.time() - started, 1),
            "environment": describe_environment()}
    (tmp / "warmstart.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return info


def warmstart_info(model_dir: str | Path) -> dict | None:
    """What a warm start directory's ``warmstart.json`` says (its settings, final loss, seconds and the machine it
    was trained on), or None for a model that is not a warm start."""
    path = Path(model_dir) / "warmstart.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def warmstart(config: WarmstartConfig, *, progress: bool = True) -> Path:
    """The warm-started model directory for ``config``: from the cache, or trained now (once, under a lock)."""
    from swarmlm.models import PRESETS

    if config.model not in PRESETS:
        raise ValueError(f"warm start is for built-in presets ({', '.join(PRESETS)}), not '{config.model}'")
    out_dir = Path(config.out) if config.out else cache_root() / "warmstart" / f"{config.model}-{warmstart_key(config)}"
    with file_lock(out_dir.with_name(out_dir.name + ".lock")):
        if (out_dir / "warmstart.json").exists():
            log.info("warm start cached at %s", out_dir)
            return out_dir
        info = _train(config, out_dir, progress)
        log.info("warm start of %s done in %.0fs (final loss %.3f) -> %s", config.model, info["seconds"], info["final_loss"], out_dir)
    return out_dir
