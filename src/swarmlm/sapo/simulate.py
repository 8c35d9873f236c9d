"""``swarmlm sapo simulate``: N SAPO nodes on this machine, sharing in-process or over torch.distributed.

In-process, nodes run one after another inside each round: all of them play (generate and
publish), then all of them learn (collect, select, update). Over torch.distributed each node is a
rank of its own process, launched locally with torch's elastic launcher or by the user's torchrun.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from swarmlm.config import dump_config
from swarmlm.runtime.interrupts import graceful_interrupt
from swarmlm.sapo.config import SimulateConfig
from swarmlm.sapo.node import SAPONode, initial_model_paths
from swarmlm.sapo.summary import node_dir, provenance, run_summary, write_summary
from swarmlm.sapo.transports.in_process import InProcessHub
from swarmlm.verify import Verifier

log = logging.getLogger(__name__)


def _run_in_process(config: SimulateConfig, initials: list[str], progress: bool) -> bool:
    hub = InProcessHub(config.nodes)
    verifier = Verifier(config.tasks)  # the nodes share one task config, so one pool of scoring workers serves them all
    try:
        nodes = [SAPONode(config.node_config(k), k, hub.endpoint(f"node-{k}"), node_dir(config.out, k),
                          initials[k], verifier=verifier)
                 for k in range(config.nodes)]
    except BaseException:
        verifier.close()
        raise
    completed = True
    try:
        for n in nodes:
            n.start()
        start = min(n.round for n in nodes) + 1
        bar = tqdm(range(start, config.rounds + 1), desc="sapo rounds", unit="round", disable=not progress,
                   initial=start - 1, total=config.rounds)
        with graceful_interrupt() as stop:
            for t in bar:
                playing = [n for n in nodes if n.round < t]  # a node resumed ahead of the others waits
                hub.num_nodes = len(playing)
                rollouts = [(n, n.play(t)) for n in playing]
                records = [n.learn(own) for n, own in rollouts]
                bar.set_postfix(reward=f"{sum(r['reward_own'] for r in records) / len(records):.3f}")
                if stop.requested and t < config.rounds:
                    for n in nodes:
                        n.checkpoint()
                    completed = False
                    break
        if completed:
            for n in nodes:
                n.finish()
    finally:
        for n in nodes:
            n.close()
        verifier.close()
    return completed


def torch_worker(config_json: str, initials: list[str]) -> int:
    """Entry point of one rank: one node over :class:`TorchDistributedTransport`."""
    import torch.distributed as dist

    from swarmlm.runtime.distributed import destroy_process_group, init_process_group
    from swarmlm.sapo.transports.torch_distributed import TorchDistributedTransport

    config = SimulateConfig.model_validate_json(config_json)
    rank, world = init_process_group(timeout_s=max(60.0, config.sharing.collect_timeout * 4))
    if world != config.nodes:
        raise RuntimeError(f"world size {world} differs from nodes={config.nodes}")
    node = SAPONode(config.node_config(rank), rank, TorchDistributedTransport(), node_dir(config.out, rank),
                    initials[rank])
    try:
        node.start()
        bar = tqdm(range(node.round + 1, config.rounds + 1), desc="sapo rounds", unit="round", disable=rank != 0,
                   initial=node.round, total=config.rounds)
        for t in bar:
            record = node.run_round(t)
            bar.set_postfix(reward=f"{record['reward_own']:.3f}")
        dist.barrier()  # every node has written its last metrics and checkpoint
        node.finish()
    finally:
        node.close()
        destroy_process_group()
    return node.round


def run_simulation(config: SimulateConfig, *, progress: bool = True) -> dict[str, Any]:
    """Run the swarm to ``config.rounds`` (resuming what ``config.out`` already holds) and summarise it."""
    from swarmlm.runtime.distributed import launch_local, under_torchrun

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    started = time.time()
    initials = initial_model_paths([config.node_config(k) for k in range(config.nodes)], progress=progress)
    completed = True
    if config.transport == "in_process":
        completed = _run_in_process(config, initials, progress)
    elif under_torchrun():
        torch_worker(config.model_dump_json(), initials)
        if int(os.environ["RANK"]) != 0:
            return {}
    else:
        launch_local(config.nodes, torch_worker, config.model_dump_json(), initials)
    summary = run_summary(out, config.nodes, wall_seconds=round(time.time() - started, 1))
    summary["completed"] = completed
    summary.update(provenance({config.node_label(k): path for k, path in enumerate(initials)}))
    write_summary(out, summary)
    return summary
