"""``swarmlm noloco train``: the entry point of one rank (:func:`worker_main`), the local launch of M × S workers
(or one rank's part under the user's torchrun), the in-process backend's M replicas in this process
(:func:`run_in_process`), and the run's summary."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from swarmlm.config import ConfigError, dump_config
from swarmlm.noloco.config import TrainConfig
from swarmlm.noloco.pipeline.step import PipelineStep
from swarmlm.noloco.replica import Replica, rank_dir
from swarmlm.runtime.distributed import destroy_process_group, init_process_group
from swarmlm.runtime.metrics import read_jsonl

log = logging.getLogger(__name__)


def load_tokenizer(spec: str) -> Any:
    """The tokenizer of a model spec, without building the model (presets use the byte tokenizer)."""
    from swarmlm.models import PRESETS, build_byte_tokenizer, load_model

    if spec in PRESETS:
        return build_byte_tokenizer()
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" or (path.is_dir() and not (path / "tokenizer_config.json").exists()
                                  and not (path / "tokenizer.json").exists()):
        return load_model(spec).tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec)


def write_train_summary(config: TrainConfig, results: dict[int, Any] | None, world: int, wall_s: float) -> dict[str, Any]:
    """Per-rank and mean final validation figures (from the workers' results, else their metrics files);
    written to ``DIR/summary.json``."""

    out = Path(config.out)
    ranks = {}
    stages = config.stages
    for rank in range(world):
        result = (results or {}).get(rank)
        if not isinstance(result, dict):
            rows = [r for r in read_jsonl(rank_dir(out, rank) / "metrics.jsonl") if r.get("val_loss") is not None]
            last = rows[-1] if rows else {}
            result = {"rank": rank, "step": last.get("step"), "val_loss": last.get("val_loss"), "val_ppl": last.get("val_ppl"),
                      "skipped_total": last.get("skipped_total"), "from": "metrics file"}
        ranks[f"rank-{rank}"] = result
    # One validation loss per replica: rank 0 of each replica's stages (every stage of a replica reports the same).
    losses = [r["val_loss"] for k, r in enumerate(ranks.values()) if k % stages == 0 and r.get("val_loss") is not None]
    mean_loss = sum(losses) / len(losses) if losses else None
    summary = {
        "method": config.method, "replicas": world // stages, "model": config.model, "steps": config.steps,
        **({"stages": stages, "routing": config.pipeline.routing} if stages > 1 else {}),
        "outer_every": config.outer.every if config.method != "ddp" else None,
        "val_loss_mean": mean_loss, "val_ppl_mean_loss": math.exp(mean_loss) if mean_loss is not None else None,
        "val_ppl_rank0": ranks.get("rank-0", {}).get("val_ppl"),
        "wall_seconds": round(wall_s, 1), "backend": config.backend, "ranks": ranks,
    }
    sims = [r["sim_s"] for r in ranks.values() if r.get("sim_s") is not None]
    if sims:  # the in-process backend's simulated wall-clock: the run ends with its slowest replica
        summary["sim_s"] = max(sims)
    Path(out, "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def worker_main(config_json: str) -> dict[str, Any]:
    """Entry point of one rank (``launch_local`` or the user's ``torchrun``)."""
    config = TrainConfig.model_validate_json(config_json)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    try:
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass
    if hasattr(os, "setpgrp") and os.getpgrp() != os.getpid():
        # Leave the terminal's process group: a Ctrl+C then reaches the launcher (torchrun or launch_local)
        # alone, which forwards exactly one SIGINT to every worker; one SIGINT is a graceful stop
        # (graceful_interrupt), whereas the terminal's and the launcher's together would be an abort.
        os.setpgrp()
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    rank, world = init_process_group(backend=config.backend, timeout_s=max(300.0, 4 * config.exchange.timeout_s))
    if world % config.stages:
        raise ValueError(f"the world size ({world}) is not a multiple of --stages ({config.stages})")
    replicas = world // config.stages
    if config.method == "noloco" and config.noloco.group_size > replicas > 1:
        raise ValueError(f"noloco.group_size ({config.noloco.group_size}) is larger than the number of replicas ({replicas})")
    try:
        # Every rank creates the pipeline's process groups here, in the same order, before anything else.
        inner_step = PipelineStep(config, rank, world) if config.stages > 1 else None
        replica = Replica(config, rank, world, local_rank=int(os.environ.get("LOCAL_RANK", 0)), inner_step=inner_step)
        return replica.run()
    finally:
        destroy_process_group()


def run_in_process(config: TrainConfig) -> tuple[dict[int, Any], bool]:
    """``--backend in_process``: the M replicas of ``config`` in this process, on one device, each a
    :class:`Replica` in a thread of its own with an in-process communicator
    (:mod:`swarmlm.noloco.comm.in_process`), stepped in turn. Returns (rank -> final figures, whether Ctrl+C
    stopped the run); every replica checkpoints at the same step on Ctrl+C, as the local launch does."""
    import torch

    from swarmlm.noloco.comm import make_communicator
    from swarmlm.noloco.comm.in_process import InProcessHub
    from swarmlm.noloco.comm.link_model import LinkModel
    from swarmlm.noloco.stacked_step import StackedStep, StackedWeights
    from swarmlm.runtime.devices import resolve_device
    from swarmlm.runtime.interrupts import graceful_interrupt

    m = config.replicas
    device = resolve_device(config.device)
    link = LinkModel.from_config(config.network)
    hub = InProcessHub(m, link=link, timeout_s=config.exchange.timeout_s, device=device)
    stacked = StackedWeights(m) if config.stack_replicas == "auto" and m > 1 else None
    log.info("in-process backend: %d replicas of %s on %s, stepped in turn%s; simulated link %s", m, config.model, device,
             ", forward and backward stacked" if stacked is not None else "", link.describe())
    threads = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        with graceful_interrupt() as interrupt:
            def replica(rank: int) -> dict[str, Any]:
                comm = make_communicator(config.network, rank=rank, world_size=m, timeout_s=config.exchange.timeout_s,
                                         hub=hub)
                inner_step = StackedStep(config.method, stacked) if stacked is not None else None
                return Replica(config, rank, m, comm=comm, inner_step=inner_step).run(interrupt=interrupt)

            results = hub.run(replica)
    finally:
        torch.set_num_threads(threads)
    return results, interrupt.requested


def run_training(config: TrainConfig) -> dict[str, Any]:
    """Train ``config.replicas`` replicas locally (processes, or all in this one with backend in_process), or be one
    rank under torchrun; returns the summary."""
    from swarmlm.noloco.data import prepare
    from swarmlm.runtime.distributed import launch_local, under_torchrun

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if config.backend == "in_process":
        if under_torchrun():
            raise ConfigError("backend in_process runs every replica in this one process: start it without torchrun, "
                              "or pick backend auto, gloo or nccl")
        dump_config(config, out / "config.yaml")
        prepare(config.data, load_tokenizer(config.model))
        results, interrupted = run_in_process(config)
        summary = write_train_summary(config, results, config.replicas, time.time() - started)
        if interrupted and not all(r.get("completed") for r in results.values()):
            log.warning("stopped by Ctrl+C; run the same command again to resume from %s", config.out)
            summary["interrupted"] = True
        return summary
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        if world != config.replicas * config.stages:
            log.info("running under torchrun: %d replicas (the world size / %d stages), not replicas=%d",
                     world // config.stages, config.stages, config.replicas)
            config = config.model_copy(update={"replicas": world // config.stages})
        if rank == 0:
            dump_config(config, out / "config.yaml")
        result = worker_main(config.model_dump_json())
        if rank != 0:
            return result
        return write_train_summary(config, {0: result}, world, time.time() - started)
    dump_config(config, out / "config.yaml")
    prepare(config.data, load_tokenizer(config.model))  # tokenize once here, before the workers start
    from torch.distributed.elastic.multiprocessing.api import SignalException

    try:
        results = launch_local(config.replicas * config.stages, worker_main, config.model_dump_json())
    except SignalException as err:  # Ctrl+C / SIGTERM: the workers stopped at a common step and checkpointed
        log.warning("stopped by signal %s; run the same command again to resume from %s", err.sigval, config.out)
        summary = write_train_summary(config, None, config.replicas * config.stages, time.time() - started)
        summary["interrupted"] = True
        return summary
    return write_train_summary(config, results, config.replicas * config.stages, time.time() - started)


def train_command(config: TrainConfig) -> int:
    summary = run_training(config)
    if "ranks" not in summary:  # a rank other than 0 under torchrun
        return 0
    if summary.get("interrupted"):
        print(f"interrupted; resume with the same command (checkpoints in {config.out}/checkpoints)")
        return 130
    print(f"{summary['method']} M={summary['replicas']}{' S=' + str(summary['stages']) if 'stages' in summary else ''} "
          f"steps={summary['steps']}: "
          f"validation loss {summary['val_loss_mean']:.4f} (mean over replicas), "
          f"perplexity {summary['val_ppl_mean_loss']:.3f}; wall {summary['wall_seconds']}s"
          + (f", simulated {summary['sim_s']:.1f}s" if summary.get("sim_s") is not None else "")
          + f" -> {config.out}/summary.json")
    return 0
