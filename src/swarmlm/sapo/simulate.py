"""``swarmlm sapo simulate``: N SAPO nodes on this machine, sharing in-process or over torch.distributed.

In-process, nodes run one after another inside each round: all of them play (generate and
publish), then all of them learn (collect, select, update). Over torch.distributed each node is a
rank of its own process, launched locally with torch's elastic launcher or by the user's torchrun.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from swarmlm.config import dump_config
from swarmlm.interrupts import graceful_interrupt
from swarmlm.metrics import read_jsonl
from swarmlm.sapo.config import SimulateConfig
from swarmlm.sapo.node import SAPONode, initial_model_path
from swarmlm.sapo.transports.in_process import InProcessHub

log = logging.getLogger(__name__)


def node_dir(out: str | Path, index: int) -> Path:
    return Path(out) / f"node-{index}"


def summarize(out: str | Path, num_nodes: int, wall_seconds: float | None = None) -> dict[str, Any]:
    """Cumulative own reward per node and in total, from the nodes' metrics files; written to ``summary.json``."""
    nodes = {}
    for k in range(num_nodes):
        rows = read_jsonl(node_dir(out, k) / "metrics.jsonl")
        evals = [r["eval_pass1"] for r in rows if r.get("eval_pass1") is not None]
        nodes[f"node-{k}"] = {
            "rounds": len(rows),
            "cumulative_reward_own": sum(r["reward_own"] for r in rows),
            "mean_reward_own": (sum(r["reward_own"] for r in rows) / len(rows)) if rows else None,
            "first_eval_pass1": evals[0] if evals else None,
            "final_eval_pass1": evals[-1] if evals else None,
            "external_used": sum(r.get("external_used", 0) for r in rows),
            "records_dropped": sum(r.get("records_dropped", 0) for r in rows),
        }
    finals = [n["final_eval_pass1"] for n in nodes.values() if n["final_eval_pass1"] is not None]
    summary = {
        "nodes": nodes,
        "total_cumulative_reward_own": sum(n["cumulative_reward_own"] for n in nodes.values()),
        "mean_final_eval_pass1": sum(finals) / len(finals) if finals else None,
        "wall_seconds": wall_seconds,
    }
    Path(out, "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _run_in_process(config: SimulateConfig, initial: str, progress: bool) -> bool:
    hub = InProcessHub(config.nodes)
    nodes = [SAPONode(config, k, hub.endpoint(f"node-{k}"), node_dir(config.out, k), initial) for k in range(config.nodes)]
    completed = True
    try:
        start = min(n.round for n in nodes) + 1
        bar = tqdm(range(start, config.rounds + 1), desc="sapo rounds", unit="round", disable=not progress,
                   initial=start - 1, total=config.rounds)
        with graceful_interrupt() as stop:
            for t in bar:
                playing = [n for n in nodes if n.round < t]  # a node resumed ahead of the others waits
                hub.num_nodes = len(playing)
                started = time.perf_counter()
                rollouts = [(n, n.play(t)) for n in playing]
                records = [n.learn(own, started) for n, own in rollouts]
                bar.set_postfix(reward=f"{sum(r['reward_own'] for r in records) / len(records):.3f}")
                if stop.requested and t < config.rounds:
                    for n in nodes:
                        n.checkpoint()
                    completed = False
                    break
    finally:
        for n in nodes:
            n.close()
    return completed


def torch_worker(config_json: str, initial: str) -> int:
    """Entry point of one rank: one node over :class:`TorchDistributedTransport`."""
    import torch.distributed as dist

    from swarmlm.distributed import destroy_process_group, init_process_group
    from swarmlm.sapo.transports.torch_distributed import TorchDistributedTransport

    config = SimulateConfig.model_validate_json(config_json)
    rank, world = init_process_group(timeout_s=max(60.0, config.sharing.collect_timeout * 4))
    if world != config.nodes:
        raise RuntimeError(f"world size {world} differs from nodes={config.nodes}")
    node = SAPONode(config, rank, TorchDistributedTransport(), node_dir(config.out, rank), initial)
    try:
        bar = tqdm(range(node.round + 1, config.rounds + 1), desc="sapo rounds", unit="round", disable=rank != 0,
                   initial=node.round, total=config.rounds)
        for t in bar:
            record = node.run_round(t)
            bar.set_postfix(reward=f"{record['reward_own']:.3f}")
        dist.barrier()  # every node has written its last metrics and checkpoint
    finally:
        node.close()
        destroy_process_group()
    return node.round


def run_simulation(config: SimulateConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run the swarm to ``config.rounds`` (resuming what ``config.out`` already holds) and summarise it."""
    from swarmlm.distributed import launch_local, under_torchrun

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    started = time.time()
    initial = initial_model_path(config, progress=progress)
    completed = True
    if config.transport == "in_process":
        completed = _run_in_process(config, initial, progress)
    elif under_torchrun():
        torch_worker(config.model_dump_json(), initial)
        if int(os.environ["RANK"]) != 0:
            return {}
    else:
        launch_local(config.nodes, torch_worker, config.model_dump_json(), initial)
    summary = summarize(out, config.nodes, wall_seconds=round(time.time() - started, 1))
    summary["completed"] = completed
    Path(out, "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
