"""Handlers of the SAPO commands (``swarmlm sapo simulate | node | swarm`` and ``swarmlm warmstart``); each takes
its validated config. The sharing experiment's handler is with the experiment (:mod:`swarmlm.experiments`)."""

from __future__ import annotations

import sys

from swarmlm.sapo.config import SimulateConfig
from swarmlm.sapo.summary import provenance_line, sharing_line, summary_table
from swarmlm.sapo.swarm.config import SwarmConfig, SwarmNodeConfig
from swarmlm.sapo.warmstart import WarmstartConfig


def simulate_command(config: SimulateConfig) -> int:
    from swarmlm.sapo.simulate import run_simulation

    summary = run_simulation(config)
    if summary:
        state = "" if summary.get("completed", True) else " (interrupted: the same command resumes)"
        print(f"\nSAPO, {config.nodes} node(s), {config.rounds} rounds, I/J = {config.local}/{config.external}, "
              f"{summary['wall_seconds']:.0f} s{state}:\n")
        print(summary_table(summary))
        if config.external > 0:
            print(sharing_line(summary))
        print(provenance_line(summary))
        print(f"\nmetrics: {config.out}/node-*/metrics.jsonl, summary: {config.out}/summary.json")
        print(kept_line(config.out, config.final_checkpoint if summary.get("completed", True) else "resumable"))
    return 0 if summary.get("completed", True) else 130


def kept_line(out: str, final_checkpoint: str) -> str:
    """Where the nodes' models are after the run, and how to keep more."""
    return {"resumable": f"checkpoints: {out}/node-*/checkpoints (model and Adam state; the same command with a "
                         "larger --rounds continues the run)",
            "weights": f"final weights: {out}/node-*/final-model (load one with --model.name DIR)",
            "none": "final weights not kept: --final-checkpoint weights keeps them, "
                    "resumable also the Adam state"}[final_checkpoint]


def node_command(config: SwarmNodeConfig) -> int:
    """``swarmlm sapo node``: one node of a decentralized swarm."""
    from swarmlm.sapo.swarm.volunteer import print_volunteer_summary, run_volunteer
    from swarmlm.sapo.transports.hivemind.transport import BootstrapError

    try:
        summary = run_volunteer(config)
    except (BootstrapError, ValueError, ImportError) as err:
        # no peer reachable, an identity file that is not one, hivemind not installed: the user's to fix, in one line
        # with exit code 2, as swarmlm.cli.main reports every such mistake
        print(f"swarmlm sapo node: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return print_volunteer_summary(summary, config.out)


def swarm_command(config: SwarmConfig) -> int:
    """``swarmlm sapo swarm``: N nodes on this machine over loopback."""
    from swarmlm.sapo.swarm.launcher import run_swarm

    try:
        summary = run_swarm(config)
    except (RuntimeError, ImportError) as err:
        print(f"swarmlm sapo swarm: {err}", file=sys.stderr)
        return 1
    state = "" if summary["completed"] else " (not completed: the same command resumes)"
    print(f"\nSAPO swarm, {config.nodes} node process(es), {config.rounds} rounds, {summary['wall_seconds']:.0f} s{state}:\n")
    print(summary_table(summary))
    print(sharing_line(summary))
    failed = {name: code for name, code in summary["exit_codes"].items() if code != 0}
    if failed:
        print("exit codes: " + ", ".join(f"{name} {code}" for name, code in failed.items()))
    print(provenance_line(summary))
    print(f"metrics: {config.out}/node-*/metrics.jsonl, logs: {config.out}/node-*/node.log, summary: {config.out}/summary.json")
    return 0 if summary["completed"] else 1


def warmstart_command(config: WarmstartConfig) -> int:
    """``swarmlm warmstart``: train (or find in the cache) a preset's format warm start and print its directory."""
    from swarmlm.sapo.warmstart import warmstart

    print(warmstart(config))
    return 0
