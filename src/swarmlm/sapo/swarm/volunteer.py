"""``swarmlm sapo node``: one SAPO node of a decentralized swarm, sharing rollouts over the hivemind DHT.

The node joins (or starts) the DHT, loads its model (resuming from ``OUT/checkpoints`` when it can),
and then takes ``rounds`` training steps at its own pace. Each step publishes under the swarm's
global round and trains on whatever other peers published within the staleness window; it never
waits longer than ``sharing.collect_timeout``. ``OUT/peer.json`` holds the node's addresses once its
DHT is up, and ``OUT/summary.json`` its totals at the end.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import time
from pathlib import Path
from typing import Any

from swarmlm.config import dump_config
from swarmlm.runtime.interrupts import graceful_interrupt
from swarmlm.runtime.metrics import read_jsonl
from swarmlm.sapo.summary import node_totals, provenance, provenance_line, sharing_line, summary_table
from swarmlm.sapo.swarm.config import SwarmNodeConfig

log = logging.getLogger(__name__)


def derived_index(peer_id: str) -> int:
    """A node index (it seeds the question stream) that differs between peers without coordination."""
    return int(hashlib.sha256(peer_id.encode()).hexdigest()[:6], 16)


def join_command(config: SwarmNodeConfig, maddrs: list[str]) -> str:
    swarm = config.swarm
    parts = ["swarmlm", "sapo", "node", "--initial-peers", f"[{', '.join(maddrs)}]", "--swarm.run", swarm.run,
             "--swarm.round-length", f"{swarm.round_length:g}"]
    if swarm.epoch:
        parts += ["--swarm.epoch", f"{swarm.epoch:.3f}"]
    return " ".join(shlex.quote(p) for p in parts)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_volunteer(config: SwarmNodeConfig) -> dict[str, Any]:
    """Run one node to ``config.rounds`` steps (resuming what ``config.out`` holds); returns its summary."""
    from tqdm.auto import tqdm

    from swarmlm.sapo.node import SAPONode, initial_model_path
    from swarmlm.sapo.transports.hivemind.clock import RoundClock
    from swarmlm.sapo.transports.hivemind.identity import load_identity
    from swarmlm.sapo.transports.hivemind.transport import HivemindTransport

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    identity = load_identity(config.identity or out / "identity.key")
    index = config.node_index if config.node_index is not None else derived_index(identity.peer_id)
    dump_config(config, out / "config.yaml")
    swarm = config.swarm
    clock = RoundClock(swarm.round_length, swarm.epoch)

    def on_connected(peer_id: str, maddrs: list[str]) -> None:
        _write_json(out / "peer.json", {"peer_id": peer_id, "maddrs": maddrs, "run": swarm.run,
                                        "round_length": swarm.round_length, "epoch": swarm.epoch,
                                        "join": join_command(config, maddrs) if maddrs else None})
        lines = [f"swarmlm node {peer_id} is in swarm '{swarm.run}' (global round {clock.now()})"]
        if maddrs:
            lines += ["listening on:", *(f"  {m}" for m in maddrs),
                      "other machines join with (use an address they can reach):", f"  {join_command(config, maddrs)}"]
        print("\n".join(lines), flush=True)

    transport = HivemindTransport(
        identity, run=swarm.run, clock=clock, staleness_rounds=config.sharing.staleness_rounds,
        initial_peers=config.initial_peers, host_maddrs=config.host_maddrs, announce_maddrs=config.announce_maddrs,
        max_value_bytes=config.sharing.limits.max_message_bytes, max_peers_per_round=swarm.max_peers_per_round,
        max_round_bytes=config.sharing.limits.max_round_bytes, dht_round_bytes=swarm.dht_round_bytes,
        poll_interval=swarm.poll_interval, wait_for_peers=swarm.wait_for_peers, startup_timeout=swarm.startup_timeout,
        retry_initial=swarm.retry_initial, retry_max=swarm.retry_max, peer_book=out / "peers.json",
        on_connected=on_connected, start=False)
    completed = False
    started = time.time()
    try:
        initial = initial_model_path(config, progress=config.progress)
        node = SAPONode(config, index, transport, out, initial, swarm=swarm.run)
        transport.drops = node.drops  # the DHT's refusals are counted with the node's own drops
        transport.trusted = node.intake.standing.recent  # the DHT keeps known peers' messages before new identities
        node.start()  # the round-0 row
        # the node joins once it can train: a peer that others know is a peer about to publish, so that their
        # start_peers wait ends when this node is ready, not while it still loads or evaluates its model
        transport.start()
        if swarm.start_peers > 0 and node.round < config.rounds:
            known = transport.await_peers(swarm.start_peers, swarm.start_wait)
            if known < swarm.start_peers:
                log.warning("starting with %d known peer(s) of the %d awaited", known, swarm.start_peers)
        try:
            bar = tqdm(range(node.round + 1, config.rounds + 1), desc=f"node {identity.peer_id[-6:]}", unit="step",
                       initial=node.round, total=config.rounds, disable=not config.progress)
            with graceful_interrupt() as stop:
                for step in bar:
                    record = node.run_round(step)
                    bar.set_postfix(reward=f"{record['reward_own']:.3f}", peers=record.get("peers_heard", 0),
                                    accepted=record.get("records_accepted", 0), dropped=record.get("records_dropped", 0))
                    parent_gone = config.watch_pid is not None and not _alive(config.watch_pid)
                    if parent_gone:
                        log.warning("process %d is gone; stopping", config.watch_pid)
                    if (stop.requested or parent_gone) and step < config.rounds:
                        node.checkpoint()
                        break
            completed = node.round >= config.rounds
            if completed:
                node.finish()
        finally:
            node.close()
    finally:
        transport.close()
    summary = (node_totals(read_jsonl(out / "metrics.jsonl")) | {"completed": completed, "wall_seconds": round(time.time() - started, 1)}
               | provenance(initial))
    _write_json(out / "summary.json", summary)
    return summary


def print_volunteer_summary(summary: dict[str, Any], out: str) -> int:
    """Print the node's totals and where its files are; the command's exit code (130: stopped early)."""
    state = "" if summary.get("completed") else " (stopped early: the same command resumes)"
    print(f"\nSAPO node {summary.get('node_id')}, {summary.get('rounds')} round(s), {summary.get('peers_seen', 0)} peer(s) "
          f"seen, {summary.get('wall_seconds', 0):.0f} s{state}:\n")
    print(summary_table({"nodes": {summary.get("node_id") or "this node": summary},
                         "total_cumulative_reward_own": summary["cumulative_reward_own"]}))
    print(sharing_line(summary))
    print(provenance_line(summary))
    print(f"metrics: {out}/metrics.jsonl, summary: {out}/summary.json")
    return 0 if summary.get("completed") else 130
