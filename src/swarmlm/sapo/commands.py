"""Handlers of the ``swarmlm sapo …`` commands."""

from __future__ import annotations

import json

from swarmlm.sapo.config import SimulateConfig


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
