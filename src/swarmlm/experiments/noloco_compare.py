"""``swarmlm noloco compare``: DDP, DiLoCo and NoLoCo trained alike, compared on validation perplexity
against step and against a simulated wall-clock.

Every method runs with the same model, data, seed, token budget (steps × batch × sequence per replica)
and inner hyperparameters; each method's outer hyperparameters are those of its paper or reference code:

- ``ddp``: all-reduce of the gradients every step;
- ``diloco``: the DiLoCo paper's outer optimizer, Nesterov SGD, lr 0.7, momentum 0.9;
- ``diloco-hb``: the NoLoCo reference's DiLoCo baseline, heavy-ball SGD, lr 0.7, momentum 0.3;
- ``noloco``: α = 0.5, β = γ = 0.7, heavy-ball, random pairs (NoLoCo, arXiv 2506.10911).

Both DiLoCo baselines are run, and every NoLoCo ratio is given against each of them. Three more variants make
the study's comparisons (the report's "comparisons" table):

- ``diloco-hb-2h``: ``diloco-hb`` synchronising every 2H where NoLoCo does every H, the NoLoCo reference's own
  design (its configs: 100 against 50; about the same bytes per replica over a run);
- ``diloco-matched``: a control, DiLoCo with NoLoCo's own outer step (heavy-ball, lr 0.7, momentum 0.5), which is
  NoLoCo with the group = all replicas and γ = 0. Against it NoLoCo differs only in averaging with one partner
  instead of all replicas, at the same effective outer step (heavy-ball moves a steady pseudo-gradient by
  lr / (1 − momentum): 1.4 at 0.5, 1.0 at 0.3);
- ``noloco-alpha0.3``: the other control at equal effective step, NoLoCo at α = 0.3 against ``diloco-hb``.

``noloco-int8`` and ``noloco-int4`` (opt-in) are NoLoCo with its pair exchange compressed to 8 or 4 bits
(:mod:`swarmlm.noloco.compress`); ``--exchange.compress`` compresses every NoLoCo variant of a study instead. The
DiLoCo and DDP runs always all-reduce in fp32.

Each (H, M, seed, method) is one ``noloco train`` run under ``DIR/runs/H<H>/M<M>/seed-<s>/<method>/`` (DDP,
which has no outer step, once per (M, seed) under ``DIR/runs/M<M>/seed-<s>/ddp/``, shown with every H). By default
(``--backend in_process``) the M replicas of a run train in this process, stepped in turn
(:mod:`swarmlm.noloco.comm.in_process`), so that M = 16 or more fits one CPU core or one GPU; ``--backend auto``
starts one process per replica instead. A finished run is reused and an interrupted one starts again (or
resumes from its checkpoints, ``--checkpoint-every``), so the command is resumable.

The simulated wall-clock (see :mod:`swarmlm.noloco.comm.link_model`) is compute plus modelled communication:

- compute, ``calibrated`` (the headline): one replica's inner step timed here (``DIR/calibration.json``: CPU time
  on one thread on a CPU, synchronised wall time on a GPU), the same for every method, M and replica;
- compute, ``measured``: each replica's own measured compute in its run. With the in-process backend this is
  the clock the backend keeps while training (``sim_s`` in the metrics: one replica runs at a time, so its
  time is its own); with one process per replica it is rebuilt from each rank's wall time per step, which
  on an oversubscribed machine includes waiting for a core;
- communication: the link model's cost of every synchronisation the method makes. Ranks that
  synchronise wait for each other first: all ranks for an all-reduce, the pair for NoLoCo.

Evaluation and the model-std measurement are not part of any method, and are not on the clock.

**How the study runs fast.** ``--jobs`` runs train at once, each in a process of its own (by default one per
``--threads`` CPU cores, so 2 on a 2-core machine; 1 on a GPU or with ``--compute measured``, whose times want
the cores to themselves); the calibrated clock does not depend on it (the calibration runs alone first). Within
an in-process run, the M replicas' forward and backward passes are one vectorised call
(``--stack-replicas auto``, :mod:`swarmlm.noloco.stacked_step`).

``noloco-pp2`` (opt-in: ``--methods ...,noloco-pp2``) is NoLoCo with the model cut into S = 2 pipeline
stages and random routing (:mod:`swarmlm.noloco.pipeline.schedule`): M × 2 processes. Its curves come from
stage 0 of each replica (which logs the replica's own loss and validation loss). On the calibrated clock,
an inner step is a GPipe step of the two half-models (:func:`~swarmlm.noloco.pipeline.schedule.gpipe_step_s`)
with every activation hand-over charged one link message, and each stage's outer exchange carries that
stage's half of θ (all stages exchange at once).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field, ValidationInfo, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo

from swarmlm.config import ConfigError, StrictModel, dump_config, parse_list
from swarmlm.experiments.plots import require_matplotlib
from swarmlm.experiments.sim_clock import simulate_clock
from swarmlm.noloco.comm.link_model import LinkModel
from swarmlm.noloco.config import (
    InnerSection,
    NetworkSection,
    OuterSection,
    TrainConfig,
)

log = logging.getLogger(__name__)

Variant = Literal["ddp", "diloco", "diloco-hb", "diloco-hb-2h", "noloco", "noloco-alpha0.3", "noloco-pp2", "diloco-matched",
                  "noloco-int8", "noloco-int4"]

# Each method's outer hyperparameters, from its paper (DiLoCo arXiv 2311.08105, NoLoCo arXiv 2506.10911) or the NoLoCo
# reference code's DiLoCo baseline; never tuned here.
VARIANTS: dict[str, dict[str, Any]] = {
    "ddp": {"method": "ddp"},
    "diloco": {"method": "diloco", "diloco": {"lr": 0.7, "momentum": 0.9, "nesterov": True}},
    "diloco-hb": {"method": "diloco", "diloco": {"lr": 0.7, "momentum": 0.3, "nesterov": False}},
    "noloco": {"method": "noloco"},
    "noloco-pp2": {"method": "noloco", "stages": 2},
    # a control, not a baseline: DiLoCo with NoLoCo's outer step (heavy-ball α = 0.5, lr β = 0.7), which is what
    # NoLoCo becomes with the group = all replicas and γ = 0; it isolates pairs against all-reduce
    "diloco-matched": {"method": "diloco", "diloco": {"lr": 0.7, "momentum": 0.5, "nesterov": False}},
    # the NoLoCo reference's own comparison design: its DiLoCo baseline synchronises every 2H where NoLoCo does
    # every H (its configs: 100 against 50); a ring all-reduce sends about twice the model per replica where a pair
    # exchange sends it once, so over a run both send about the same bytes per replica
    "diloco-hb-2h": {"method": "diloco", "diloco": {"lr": 0.7, "momentum": 0.3, "nesterov": False}, "h_factor": 2},
    # the control at equal effective outer step: a steady pseudo-gradient moves heavy-ball by lr / (1 - momentum),
    # 1.4 for NoLoCo's α = 0.5 and 1.0 for the DiLoCo baseline's 0.3; NoLoCo at α = 0.3 against diloco-hb, as
    # diloco-matched (DiLoCo at 0.5) against noloco, compares the two at the same step
    "noloco-alpha0.3": {"method": "noloco", "noloco": {"alpha": 0.3}},
    # NoLoCo's outer messages in 8 and 4 bits, blockwise with error feedback (swarmlm.noloco.compress)
    "noloco-int8": {"method": "noloco", "exchange": {"compress": "int8"}},
    "noloco-int4": {"method": "noloco", "exchange": {"compress": "int4"}},
}
class CompareNetworkSection(NetworkSection):
    """The link of the simulated wall-clock; by default 100 ms and 1 Gbit/s between every two replicas."""

    latency_ms: float = Field(100.0, ge=0, description="one-way latency of every message between replicas (ms)")
    bandwidth_gbit: float = Field(1.0, ge=0, description="bandwidth of every link (Gbit/s); 0 = unlimited")


class CompareOuterSection(OuterSection):
    """H, the inner steps between outer steps: one or several values (each a set of runs)."""

    every: list[int] = Field([20, 50], description="H values (e.g. 20,50; the NoLoCo reference uses 50); DDP has no H "
                                                   "and runs once")

    _lists = field_validator("every", mode="before")(parse_list)

    @field_validator("every")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if not values or min(values) < 1:
            raise ValueError("every H must be at least 1")
        return sorted(set(values))


class CompareInnerSection(InnerSection):
    """The inner optimizer, the same for every method (defaults sized for the nano-llama study)."""

    lr: float = Field(3e-3, gt=0, description="peak learning rate")
    warmup_steps: int = Field(60, ge=0, description="linear warmup steps, then cosine decay to min_lr_ratio * lr")


#: the options every run of the study takes from ``noloco train`` (:class:`TrainConfig`): its own fields, derived
#: rather than declared again, with the study's default where it differs (and a description where the study reads
#: the option differently); ``replicas``, ``inner``, ``outer`` and ``network`` are the study's own (a list of M,
#: and sections derived from the training ones by subclassing)
SHARED_OPTIONS: dict[str, dict[str, Any]] = {
    "out": {"default": "runs/noloco-compare",
            "description": "output directory (results.json, results.md, ppl-H*.png, ratio.png, std.png)"},
    "backend": {"default": "in_process", "description": "in_process: each run's M replicas in one process, stepped in "
                                                        "turn; auto, gloo, nccl: one process per replica"},
    "model": {"default": "nano-llama", "description": "model preset, directory or hub id (the same for every method)"},
    "steps": {"default": 1500, "description": "inner steps per replica (the same token budget for every method)"},
    "seq_len": {"default": 32},
    "batch_size": {"default": 4},
    "grad_accum": {},
    "eval_every": {"default": 100, "description": "validation every K steps (the perplexity curves' resolution)"},
    "eval_batches": {"default": 24},
    "checkpoint_every": {"default": 0, "description": "checkpoint every C steps, so that an interrupted run resumes "
                                                      "(0: only at its end; an interrupted run then starts again)"},
    "device": {"description": "auto, cpu, cuda or mps (in_process: the one device of every run)"},
    "precision": {},
    "threads": {"default": 1, "description": "torch threads of each in-process run and of the calibration (0 = "
                                             "torch's default)"},
    "stack_replicas": {},
    "noloco": {"description": "NoLoCo's outer step (defaults: the NoLoCo paper's)"},
    "data": {},
    "exchange": {},
    "progress": {"description": "progress bars"},
}

_SharedOptions = create_model(
    "_SharedOptions", __base__=StrictModel, __module__=__name__,
    **{name: (TrainConfig.model_fields[name].annotation, FieldInfo.merge_field_infos(TrainConfig.model_fields[name], **changes))
       for name, changes in SHARED_OPTIONS.items()})


class CompareConfig(_SharedOptions):
    """``swarmlm noloco compare``: the three methods (and both DiLoCo baselines), trained alike.

    The defaults are the study of docs/results/noloco-vs-diloco.md (M = 4, 8, 16; H = 20 and 50; 1500 steps, so 30 outer
    steps at H = 50) with its three comparisons (the reference's design, equal H, equal effective step) over 5 seeds:
    13 runs per (M, seed), 195 runs, 71 minutes on a 2-core CPU (two runs at a time, replicas stacked). It resumes
    from the runs that finished. The options it shares with
    ``noloco train`` are that command's own (:data:`SHARED_OPTIONS`)."""

    replicas: list[int] = Field([4, 8, 16], description="M values to compare (e.g. 4,8,16)")
    methods: list[Variant] = Field(
        ["ddp", "diloco", "diloco-hb", "diloco-hb-2h", "noloco", "noloco-alpha0.3", "diloco-matched"],
        description="methods to train: ddp, diloco, diloco-hb, noloco, and the comparisons' diloco-hb-2h (DiLoCo at 2H, "
        "the reference's design), diloco-matched and noloco-alpha0.3 (equal effective outer step); noloco-pp2 opt-in")
    seeds: list[int] = Field([0, 1, 2, 3, 4], min_length=1, description="repeats of every run (the table gives the mean and its 95-percent confidence interval)")
    jobs: int = Field(0, ge=0, description="runs trained at once, each in a process of its own (0 = one per `threads` "
                                           "CPU cores on a CPU, else 1; 1 = one after another in this process)")
    log_every: int = Field(10, ge=1, description="a per-step metrics line every L steps (in_process runs; one process "
                                                 "per replica logs every step, for its measured clock)")
    inner: CompareInnerSection = Field(default_factory=CompareInnerSection)
    outer: CompareOuterSection = Field(default_factory=CompareOuterSection)
    network: CompareNetworkSection = Field(default_factory=CompareNetworkSection, description="the link of the simulated wall-clock")
    compute: Literal["calibrated", "measured"] = Field(
        "calibrated", description="compute time per inner step on the simulated clock: calibrated = one replica's CPU "
                                  "time per step measured here (the same for all); measured = each rank's wall time in its run")
    calibration_steps: int = Field(12, ge=2, description="inner steps timed for the calibration (the first is a warm-up)")

    _lists = field_validator("replicas", "methods", "seeds", mode="before")(parse_list)

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, values: list[int]) -> list[int]:
        if not values or min(values) < 2:
            raise ValueError("every M must be at least 2")
        return sorted(set(values))

    @field_validator("methods")
    @classmethod
    def _methods_fit_backend(cls, values: list[str], info: ValidationInfo) -> list[str]:
        if info.data.get("backend") == "in_process" and "noloco-pp2" in values:
            raise ValueError("noloco-pp2 needs one process per pipeline stage; use --backend auto for it")
        return values

    @field_validator("network")
    @classmethod
    def _network_fits_backend(cls, value: CompareNetworkSection, info: ValidationInfo) -> CompareNetworkSection:
        if info.data.get("backend") == "in_process" and value.inject:
            raise ValueError("inject: the in_process backend never sleeps, it charges the link to its simulated "
                             "clock; use --backend auto to inject the link")
        return value

    @model_validator(mode="after")
    def _jobs_fit_compute(self) -> "CompareConfig":
        if self.compute == "measured" and self.jobs > 1:
            raise ValueError(f"jobs: {self.jobs} runs at once would share the cores that compute measured times; with "
                             "compute measured use jobs 1 (or 0)")
        return self

    @property
    def in_process(self) -> bool:
        return self.backend == "in_process"

    def parallel_runs(self) -> int:
        """How many runs train at once (``jobs``, resolved)."""
        import os

        from swarmlm.runtime.devices import resolve_device

        if self.jobs:
            return self.jobs
        if self.compute == "measured" or resolve_device(self.device).type != "cpu":
            return 1  # measured times want the cores to themselves; runs on one GPU would share its memory
        return max(1, (os.cpu_count() or 1) // max(1, self.threads or (os.cpu_count() or 1)))


def run_dir(out: str | Path, m: int, seed: int, variant: str, h: int | None = None) -> Path:
    if VARIANTS[variant]["method"] == "ddp" or h is None:
        return Path(out) / "runs" / f"M{m}" / f"seed-{seed}" / variant
    return Path(out) / "runs" / f"H{h}" / f"M{m}" / f"seed-{seed}" / variant


def train_config(config: CompareConfig, m: int, seed: int, variant: str, h: int | None = None) -> TrainConfig:
    """The ``noloco train`` configuration of one run: everything shared, except the method, its outer step and H
    (``h``, default the first of ``outer.every``; DDP, which has none, logs its model std every min(H) steps)."""
    spec = VARIANTS[variant]
    ddp = spec["method"] == "ddp"
    h = min(config.outer.every) if ddp or h is None else h
    every = h * spec.get("h_factor", 1)  # the run's own H (the cell's, or a multiple of it)
    data = {
        "method": spec["method"], "replicas": m, "out": str(run_dir(config.out, m, seed, variant, None if ddp else h)),
        "model": config.model, "backend": config.backend, "device": config.device, "precision": config.precision,
        "steps": config.steps, "seq_len": config.seq_len, "batch_size": config.batch_size, "grad_accum": config.grad_accum,
        "seed": seed, "eval_every": config.eval_every, "eval_batches": config.eval_batches,
        "checkpoint_every": config.checkpoint_every, "keep_checkpoints": 1, "progress": False,
        "inner": config.inner.model_dump(), "outer": {**config.outer.model_dump(), "every": every},
        "noloco": {**config.noloco.model_dump(), **spec.get("noloco", {})}, "data": config.data.model_dump(),
        "exchange": {**config.exchange.model_dump(), **spec.get("exchange", {})},
    }
    if spec["method"] != "noloco":
        data["exchange"]["compress"] = "none"  # an all-reduce goes in fp32
    if "diloco" in spec:
        data["diloco"] = spec["diloco"]
    if spec.get("stages", 1) > 1:
        if config.network.inject:
            raise ConfigError(f"{variant}: the injected link does not apply to pipeline hops; use the modelled link")
        data["stages"] = spec["stages"]
    if config.in_process:
        # the backend's own clock charges the same link; many replicas log sparsely and without fsync
        data["network"] = config.network.model_dump()
        data["threads"] = config.threads
        data["stack_replicas"] = config.stack_replicas
        data["log"] = {"every": config.log_every, "tensorboard": False, "fsync": False}
    elif config.network.inject:  # the link really delays the run's messages; otherwise it is only modelled
        data["network"] = config.network.model_dump()
    return TrainConfig.model_validate(data)


_VOLATILE = {"progress", "resume", "stop_after"}


def _same_settings(saved: Any, wanted: Any, default: Any) -> bool:
    """Whether a saved run's settings are ``wanted``. A setting the saved file lacks (an option added since)
    counts as its default; a setting only the saved file has (an option removed since) is ignored."""
    if isinstance(wanted, dict) and isinstance(saved, dict):
        default = default if isinstance(default, dict) else {}
        return all(_same_settings(saved[k], v, default.get(k)) if k in saved else v == default.get(k)
                   for k, v in wanted.items())
    return saved == wanted


def _same_run(existing: dict[str, Any], wanted: TrainConfig) -> bool:
    if "nproc" in existing:  # a run saved before M had one name
        existing = {**{k: v for k, v in existing.items() if k not in ("nproc", "replicas")}, "replicas": existing["nproc"]}
    mine = {k: v for k, v in wanted.model_dump(mode="json").items() if k not in _VOLATILE}
    return _same_settings(existing, mine, TrainConfig().model_dump(mode="json"))


def finished(run: TrainConfig) -> bool:
    summary = Path(run.out) / "summary.json"
    if not summary.exists():
        return False
    data = json.loads(summary.read_text())
    ranks = data.get("ranks", {})
    return (data.get("steps") == run.steps and len(ranks) == run.replicas * run.stages
            and all(r.get("completed") for r in ranks.values()) and not data.get("interrupted"))


# ----------------------------------------------------------------------------------------------
# compute calibration
# ----------------------------------------------------------------------------------------------
def calibrate(config: CompareConfig, path: Path) -> dict[str, Any]:
    """The time of one replica's inner step (forward, backward, clipping, AdamW), measured in this process and cached
    in ``path`` for the same model, batch shape and device: on a CPU its CPU time on one thread (what one replica
    takes alone, however busy the machine), on a GPU its wall time between device synchronisations (bf16 autocast
    where the runs use it). ``step_s`` is the figure the calibrated clock charges."""
    import os

    import torch

    from swarmlm.runtime.devices import resolve_device

    device = resolve_device(config.device)
    key = {"model": config.model, "seq_len": config.seq_len, "batch_size": config.batch_size,
           "grad_accum": config.grad_accum, "optimizer": config.inner.optimizer, "steps": config.calibration_steps,
           "device": device.type}
    if path.exists():
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            return cached

    from swarmlm.models import load_model
    from swarmlm.noloco.data import prepare, replica_data
    from swarmlm.noloco.launch import load_tokenizer
    from swarmlm.noloco.replica import inner_optimizer
    from swarmlm.runtime.devices import autocast

    cuda = device.type == "cuda"
    bf16 = cuda and torch.cuda.is_bf16_supported()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prepare(config.data, load_tokenizer(config.model))
        loaded = load_model(config.model, seed=0)
        model = loaded.model.to(device)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        inner = config.inner
        optimizer = inner_optimizer(params, inner)
        data = replica_data(config.data, loaded.tokenizer, replica=0, num_replicas=1, seq_len=config.seq_len,
                            batch_size=config.batch_size, seed=0)
        cpu, wall = [], []
        for i in range(config.calibration_steps):
            sync()
            c0, w0 = time.process_time(), time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            for _ in range(config.grad_accum):
                batch = data.sampler.next_batch().to(device)
                with autocast(device, bf16):
                    loss = model(input_ids=batch, labels=batch).loss / config.grad_accum
                loss.backward()
            torch.nn.utils.clip_grad_norm_(params, inner.clip)
            optimizer.step()
            sync()
            if i > 0:
                cpu.append(time.process_time() - c0)
                wall.append(time.perf_counter() - w0)
        numel = sum(p.numel() for p in params)
    finally:
        torch.set_num_threads(threads)
    cpu_s, wall_s = statistics.median(cpu), statistics.median(wall)
    result = {"key": key, "device": str(device), "step_s": wall_s if cuda else cpu_s,
              "step_s_is": "synchronised wall time" if cuda else "CPU time on one thread",
              "cpu_s_per_step": cpu_s, "wall_s_per_step": wall_s,
              "cpu_s_all": cpu, "wall_s_all": wall, "threads": 1, "parameters": numel,
              "loadavg": os.getloadavg(), "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.write_text(json.dumps(result, indent=1))
    return result


# ----------------------------------------------------------------------------------------------
# reading one run
# ----------------------------------------------------------------------------------------------
def load_run(run: TrainConfig) -> dict[int, list[dict[str, Any]]]:
    # One record list per replica; in a pipeline run, stage 0's (rank d × S), which logs the replica's loss.
    from swarmlm.noloco.replica import rank_dir  # imports torch: not with the config, which --help reads
    from swarmlm.runtime.metrics import read_jsonl

    return {r: read_jsonl(rank_dir(run.out, r * run.stages) / "metrics.jsonl") for r in range(run.replicas)}


def measured_compute(records: dict[int, list[dict[str, Any]]], steps: int) -> np.ndarray:
    """``[M, steps]`` wall seconds of compute per inner step, from each rank's cumulative ``compute_s``. At
    outer steps that figure also holds the model-std measurement (a collective that waits for the other
    ranks, not part of any method), so those steps take the rank's median step instead."""
    out = np.zeros((len(records), steps))
    for r, rows in records.items():
        by_step = {row["step"]: row for row in rows if "compute_s" in row}
        previous = 0.0
        deltas, outer = [], set()
        for s in range(1, steps + 1):
            row = by_step.get(s)
            value = row["compute_s"] if row else previous
            deltas.append(max(0.0, value - previous))
            previous = value
            if row and "outer_step" in row:
                outer.add(s)
        typical = statistics.median([d for i, d in enumerate(deltas, 1) if i not in outer] or deltas)
        out[r] = [typical if s in outer else d for s, d in enumerate(deltas, 1)]
    return out


def run_numbers(config: CompareConfig, run: TrainConfig, variant: str, records: dict[int, list[dict[str, Any]]],
                calibration: dict[str, Any], link: LinkModel) -> dict[str, Any]:
    """The curves and final figures of one run, with its simulated clock under both compute models."""
    m, steps, every = run.replicas, run.steps, run.outer.every
    nbytes = _message_bytes(run, calibration["parameters"])
    clocks, comm_free, measured, nbytes = _clocks(run, records, calibration, link, nbytes)
    curve = _curve(records, clocks, m)
    std = [{"step": row["step"], "before": row.get("model_std_fast"), "after": row.get("model_std")}
           for row in records[0] if row.get("model_std") is not None]
    last = {r: rows[-1] for r, rows in records.items() if rows}
    final = curve[-1] if curve and curve[-1]["step"] == steps else None
    summary = Path(run.out) / "summary.json"
    return {
        # H is the cell's (diloco-hb-2h runs at twice it: outer_every)
        "variant": variant, "method": run.method, "H": None if run.method == "ddp" else every // VARIANTS[variant].get("h_factor", 1),
        "outer_every": None if run.method == "ddp" else every, "M": m, "seed": run.seed,
        "steps": steps, "out": run.out, "backend": run.backend,
        "final_val_ppl": final["val_ppl"] if final else None,
        "final_val_ppl_ranks": final["val_ppl_ranks"] if final else None,
        "curve": curve, "model_std": std,
        "message_bytes": nbytes,
        "bytes_sent_per_rank": max((row.get("bytes_sent", 0) for row in last.values()), default=0),
        "measured_comm_s": max((row.get("comm_s", 0.0) for row in last.values()), default=0.0),
        "measured_compute_s_per_step": float(np.median(measured)),
        "model_std_mean": _mean_std(std),
        "sim_s": {name: float(clock[:, -1].max()) for name, clock in clocks.items()},
        "sim_comm_s": {name: float(clock[:, -1].max()) - comm_free[name] for name, clock in clocks.items()},
        "skipped_total": sum(row.get("skipped_total", 0) or 0 for row in last.values()),
        "wall_seconds": _wall_seconds(summary),
    }


def _wall_seconds(summary: Path) -> float | None:
    """A finished run's wall time from its summary.json (``wall_s`` in runs written before the key was renamed)."""
    if not summary.exists():
        return None
    data = json.loads(summary.read_text())
    return data.get("wall_seconds", data.get("wall_s"))


def _message_bytes(run: TrainConfig, numel: int) -> int:
    """Bytes one replica sends per synchronisation of ``run``'s method, for a model of ``numel`` parameters."""
    if run.method == "ddp":
        return 4 * (numel + 1)  # the gradients and the stop flag
    if run.method != "noloco":
        return 4 * numel  # DiLoCo's pseudo-gradient
    values = numel if run.noloco.beta == run.noloco.gamma else 2 * numel  # θ, or θ and φ
    from swarmlm.noloco.compress import BITS, encoded_bytes  # torch: not with the config, which --help reads

    x = run.exchange
    return 4 * values if x.compress == "none" else encoded_bytes(values, BITS[x.compress], x.block)


def _clocks(run: TrainConfig, records: dict[int, list[dict[str, Any]]], calibration: dict[str, Any], link: LinkModel,
            nbytes: int) -> tuple[dict[str, np.ndarray], dict[str, float], np.ndarray, int]:
    """Each replica's simulated clock after every step, under the calibrated compute and the measured one (the
    in-process backend's own clock, or each rank's measured compute on the modelled link); the same runs'
    totals without communication; the measured compute per step; the message size (a pipeline stage's share)."""
    from swarmlm.noloco.groups import make_groups

    m, steps, every = run.replicas, run.steps, run.outer.every

    def groups(k: int):
        return make_groups(m, run.noloco.group_size, run.seed, k, run.noloco.leftover)

    in_process = run.backend == "in_process"
    if in_process:  # the backend's own clock: each replica's compute, measured alone, plus the same link
        last_rows = [rows[-1] for rows in records.values() if rows]
        measured = np.array([[row["compute_s"] / steps] for row in last_rows])  # only for the per-step median
    else:
        measured = measured_compute(records, steps)
    step_s = free_step_s = calibration.get("step_s", calibration["cpu_s_per_step"])
    if run.stages > 1:
        from swarmlm.experiments.gpipe_time import activation_bytes, gpipe_step_s

        nbytes = -(-nbytes // run.stages)  # each stage exchanges its own share of θ, all stages at once
        micro = run.grad_accum * run.pipeline.micro_batches
        step_s = gpipe_step_s(step_s, run.stages, micro, link.message_s(activation_bytes(run)))
        free_step_s = gpipe_step_s(free_step_s, run.stages, micro, 0.0)  # the hand-overs count as communication
    clocks = {"calibrated": simulate_clock(run.method, np.full((m, steps), step_s), link=link,
                                           every=every, nbytes=nbytes, groups=groups)}
    comm_free = {"calibrated": steps * free_step_s}
    if in_process:
        at: dict[int, list[float]] = {}
        for rows in records.values():
            for row in rows:
                if row.get("sim_s") is not None:
                    at.setdefault(row["step"], []).append(row["sim_s"])
        in_run = np.zeros((m, steps))  # the backend's clock where it logged it (every logged step, every replica)
        for st, values in at.items():
            if 1 <= st <= steps:
                in_run[:, st - 1] = max(values)
        clocks["measured"] = in_run
        comm_free["measured"] = max(row["compute_s"] for row in last_rows)
    else:
        clocks["measured"] = simulate_clock(run.method, measured, link=link, every=every, nbytes=nbytes, groups=groups)
        comm_free["measured"] = float(measured.sum(axis=1).max())
    return clocks, comm_free, measured, nbytes


def _curve(records: dict[int, list[dict[str, Any]]], clocks: dict[str, np.ndarray], m: int) -> list[dict[str, Any]]:
    """The validation curve: the mean loss over the replicas at every step all ``m`` of them evaluated, its
    perplexity, each replica's, and the slowest replica's simulated time under each clock."""
    evals: dict[int, list[float]] = {}
    for rows in records.values():
        for row in rows:
            if row.get("val_loss") is not None:
                evals.setdefault(row["step"], []).append(row["val_loss"])
    curve = []
    for s in sorted(s for s, v in evals.items() if len(v) == m):
        loss = sum(evals[s]) / m
        point = {"step": s, "val_loss": loss, "val_ppl": math.exp(loss), "val_ppl_ranks": [math.exp(v) for v in evals[s]]}
        for name, clock in clocks.items():
            point[f"sim_s_{name}"] = 0.0 if s == 0 else float(clock[:, s - 1].max())
        curve.append(point)
    return curve


def _mean_std(std: list[dict[str, Any]]) -> dict[str, float | None]:
    """The model std before and after the outer steps, averaged over the run's outer steps."""
    out: dict[str, float | None] = {}
    for key in ("before", "after"):
        values = [p[key] for p in std if p.get(key) is not None]
        out[key] = float(np.mean(values)) if values else None
    return out


# ----------------------------------------------------------------------------------------------
# the command
# ----------------------------------------------------------------------------------------------
def plan(config: CompareConfig) -> list[tuple[int | None, int, int, str]]:
    """Every run, as (H, M, seed, method); DDP once per (M, seed), with H None. Seed by seed, so that an
    interrupted study already holds whole seeds."""
    runs = []
    for seed in config.seeds:
        for m in config.replicas:
            for v in config.methods:
                if VARIANTS[v]["method"] == "ddp":
                    runs.append((None, m, seed, v))
                else:
                    runs.extend((h, m, seed, v) for h in config.outer.every)
    return runs


def run_key(h: int | None, m: int, seed: int, variant: str) -> str:
    return ("" if h is None else f"H{h}/") + f"M{m}/seed-{seed}/{variant}"


def _train_one(run_json: str) -> tuple[dict[str, Any], float]:
    """One run in a worker process: its summary and wall seconds."""
    from swarmlm.noloco.launch import run_training

    started = time.time()
    summary = run_training(TrainConfig.model_validate_json(run_json))
    return summary, time.time() - started


def train_runs(todo: dict[str, TrainConfig], jobs: int) -> Iterator[tuple[str, tuple[dict[str, Any], float]]]:
    """Train the runs of ``todo`` (key -> config), ``jobs`` at a time, each in a process of its own (one after
    another in this process when ``jobs`` is 1); yields (key, (summary, wall seconds)) as each ends. On Ctrl+C
    the workers' runs stop as a run does (they share the terminal's signal) and no new run starts."""
    if jobs <= 1:
        for key, run in todo.items():
            yield key, _train_one(run.model_dump_json())
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_train_one, run.model_dump_json()): key for key, run in todo.items()}
        for future in as_completed(futures):
            yield futures[future], future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_compare(config: CompareConfig) -> dict[str, Any]:
    from tqdm.auto import tqdm

    from swarmlm.experiments.noloco_compare_report import write_report

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    started = time.time()
    runs = plan(config)
    for h, m, seed, variant in runs:  # check every reused run before training anything
        run = train_config(config, m, seed, variant, h)
        saved = Path(run.out) / "config.yaml"
        if saved.exists() and not _same_run(yaml.safe_load(saved.read_text()) or {}, run):
            raise ConfigError(f"{run.out} holds a run with other settings; use another --out, or delete it")
    calibration = calibrate(config, out / "calibration.json")
    todo = {run_key(h, m, seed, variant): train_config(config, m, seed, variant, h) for h, m, seed, variant in runs}
    todo = {key: run for key, run in todo.items() if not finished(run)}
    jobs = min(config.parallel_runs(), max(1, len(todo)))
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc="compare runs", unit="run",
               disable=not config.progress)
    if jobs > 1:
        log.info("noloco compare: %d runs to train, %d at a time (--jobs)", len(todo), jobs)
    timings: dict[str, float] = {}
    for key, (summary, seconds) in train_runs(todo, jobs):
        timings[key] = round(seconds, 1)
        bar.update(1)
        bar.set_postfix_str(key)
        if summary.get("interrupted"):
            raise KeyboardInterrupt  # its checkpoints are saved; the same command resumes
    bar.close()
    link = LinkModel.from_config(config.network)
    numbers = [run_numbers(config, train_config(config, m, s, v, h), v, load_run(train_config(config, m, s, v, h)),
                           calibration, link) for h, m, s, v in runs]
    results = write_report(config, numbers, calibration, link, wall_s=round(time.time() - started, 1), timings=timings,
                           command=command_line(config))
    return results


def command_line(config: CompareConfig) -> str:
    """The command that gives ``config``: ``swarmlm noloco compare`` with every option that differs from its
    default, after the torch thread setting it ran under."""
    import os
    import shlex

    def leaves(data: dict[str, Any], default: dict[str, Any], prefix: str = "") -> list[str]:
        out = []
        for key, value in data.items():
            name = prefix + key
            if isinstance(value, dict):
                out += leaves(value, default.get(key) or {}, name + ".")
            elif value != default.get(key) and key != "progress":
                text = ",".join(map(str, value)) if isinstance(value, list) else (
                    str(value).lower() if isinstance(value, bool) else str(value))
                out.append(f"--{name.replace('_', '-')} {shlex.quote(text)}")
        return out

    threads = os.environ.get("OMP_NUM_THREADS")
    flags = leaves(config.model_dump(mode="json"), CompareConfig().model_dump(mode="json"))
    return (f"OMP_NUM_THREADS={threads} " if threads else "") + " ".join(["swarmlm noloco compare", *flags])


def compare_command(config: CompareConfig) -> int:
    require_matplotlib("swarmlm noloco compare")  # before hours of training, not after
    try:
        run_compare(config)
    except KeyboardInterrupt:
        print(f"interrupted; run the same command again to resume ({config.out})")
        return 130
    print((Path(config.out) / "results.md").read_text())
    print(f"wrote {config.out}/results.json, results.md, " + ", ".join(f"ppl-H{h}.png" for h in config.outer.every)
          + ", ratio.png, std.png")
    return 0
