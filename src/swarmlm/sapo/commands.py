"""Handlers of the ``swarmlm sapo …`` commands."""

from __future__ import annotations

import json
from pathlib import Path

from swarmlm.sapo.config import SimulateConfig
from swarmlm.sapo.experiment import ExperimentConfig
from swarmlm.sapo.swarm_config import SwarmConfig, SwarmNodeConfig


def simulate_command(config: SimulateConfig) -> int:
    from swarmlm.sapo.simulate import run_simulation

    summary = run_simulation(config)
    if summary:
        print(json.dumps({k: v for k, v in summary.items() if k != "nodes"} | {
            "cumulative_reward_own": {n: round(v["cumulative_reward_own"], 3) for n, v in summary["nodes"].items()},
            "final_eval_pass1": {n: v["final_eval_pass1"] for n, v in summary["nodes"].items()},
        }, indent=1))
        print(f"metrics: {config.out}/node-*/metrics.jsonl, summary: {config.out}/summary.json")
    return 0 if summary.get("completed", True) else 130


def experiment_command(config: ExperimentConfig) -> int:
    """``swarmlm sapo experiment``: every I/J configuration over several seeds, then a table and plots."""
    from swarmlm.sapo.experiment import run_experiment

    results = run_experiment(config)
    print((Path(config.out) / "results.md").read_text())
    print(f"results: {config.out}/results.json, plots: {config.out}/reward.png, {config.out}/eval.png")
    return 0 if results else 1


def node_command(config: SwarmNodeConfig) -> int:
    """``swarmlm sapo node``: one node of a decentralized swarm."""
    import sys

    from swarmlm.sapo.swarm_node import node_command_result, run_node
    from swarmlm.sapo.transports.hivemind_dht import BootstrapError

    try:
        summary = run_node(config)
    except (BootstrapError, ValueError, ImportError) as err:
        print(f"swarmlm sapo node: {err}", file=sys.stderr)
        return 1
    return node_command_result(summary, config.out)


def swarm_command(config: SwarmConfig) -> int:
    """``swarmlm sapo swarm``: N nodes on this machine over loopback."""
    import sys

    from swarmlm.sapo.swarm import run_swarm

    try:
        summary = run_swarm(config)
    except (RuntimeError, ImportError) as err:
        print(f"swarmlm sapo swarm: {err}", file=sys.stderr)
        return 1
    print(json.dumps({
        "wall_seconds": summary["wall_seconds"],
        "total_cumulative_reward_own": round(summary["total_cumulative_reward_own"], 3),
        "rounds": {n: s["rounds"] for n, s in summary["swarm"].items()},
        "records_accepted": summary["records_accepted"],
        "records_dropped": summary["records_dropped"],
        "drops": summary["drops"],
        "transport_fraction": summary["transport_fraction"],
        "transport_wait_fraction": summary["transport_wait_fraction"],
        "transport_io_fraction": summary["transport_io_fraction"],
        "exit_codes": summary["exit_codes"],
    }, indent=1))
    print(f"metrics: {config.out}/node-*/metrics.jsonl, logs: {config.out}/node-*/node.log, summary: {config.out}/summary.json")
    return 0 if summary["completed"] else 1
