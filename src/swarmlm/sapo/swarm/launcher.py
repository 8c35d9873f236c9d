"""``swarmlm sapo swarm``: N ``swarmlm sapo node`` processes on this machine, over loopback, and one display.

The first node starts the DHT; once it has written its address to ``OUT/node-0/peer.json`` the
others start with it as their initial peer. Every node is an ordinary volunteer's node: its own
process, identity, checkpoints and pace. The launcher only starts them, follows their
``metrics.jsonl`` files with one progress bar, forwards Ctrl+C (each node then checkpoints and stops)
and writes ``OUT/summary.json``. Node k's output, log included, is in ``OUT/node-k``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from swarmlm.config import dump_config
from swarmlm.runtime.interrupts import graceful_interrupt
from swarmlm.sapo.summary import node_dir, provenance, run_summary, write_summary
from swarmlm.sapo.swarm.config import SwarmConfig, SwarmNodeConfig

log = logging.getLogger(__name__)

_LAUNCHER_ONLY = {"nodes", "node_models", "node_families", "node_warmstart_families", "node_group_sizes", "threads_per_node", "startup_wait"}


def node_configs(config: SwarmConfig) -> list[SwarmNodeConfig]:
    """Each node's own configuration: the swarm's options, its directory, identity, seed, model, families and L."""
    base = config.model_dump(mode="json", exclude=_LAUNCHER_ONLY)
    out = []
    for k in range(config.nodes):
        data = json.loads(json.dumps(base))
        d = node_dir(config.out, k)
        data.update(out=str(d), identity=str(d / "identity.key"), node_index=k, progress=False, watch_pid=os.getpid())
        if data["swarm"]["start_peers"] == 0:  # start training together, not one after another
            data["swarm"].update(start_peers=config.nodes - 1, start_wait=config.startup_wait)
        data["model"]["name"] = config.node_model(k)
        data["tasks"]["draw_families"] = config.node_tasks(k).draw_families
        data["model"]["warmstart_families"] = config.node_warmstart(k)
        if config.node_group_sizes:
            data["generation"]["group_size"] = config.node_group_sizes[k % len(config.node_group_sizes)]
        out.append(SwarmNodeConfig.model_validate(data))
    return out


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class _NodeProcess:
    """One ``swarmlm sapo node`` process that the launcher started, with its directory and log."""

    def __init__(self, index: int, config: SwarmNodeConfig, env: dict[str, str], log_level: str):
        self.index, self.config = index, config
        self.dir = Path(config.out)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.yaml = self.dir / "node.yaml"
        self.log_path = self.dir / "node.log"
        self.env, self.log_level = env, log_level
        self.proc: subprocess.Popen | None = None

    def start(self, initial_peers: list[str]) -> None:
        cfg = self.config.model_copy(update={"initial_peers": list(self.config.initial_peers) + initial_peers})
        (self.dir / "peer.json").unlink(missing_ok=True)  # a resumed run's old address is not this run's
        dump_config(cfg, self.yaml)
        cmd = [sys.executable, "-m", "swarmlm", "--log-level", self.log_level, "sapo", "node", "--config", str(self.yaml)]
        with open(self.log_path, "ab") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def peer_info(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir / "peer.json").read_text())
        except (OSError, ValueError):
            return None


class _Follower:
    """Reads what a node appended to its ``metrics.jsonl`` since the last look (the file only grows, except when
    a resumed node drops rows past its checkpoint, which starts the count over)."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0
        self.rows = 0
        self.accepted = self.dropped = 0
        self.last: dict[str, Any] | None = None

    def poll(self) -> None:
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size < self.offset:
            self.__init__(self.path)
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            chunk = fh.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is read next time
        self.offset += len(complete)
        for line in complete.decode("utf-8", errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("round", 0) < 1:  # the node's round-0 row (held-out pass@1 before training) is no step
                continue
            self.rows += 1
            self.accepted += row.get("records_accepted", 0)
            self.dropped += row.get("records_dropped", 0)
            self.last = row


def _status(followers: list[_Follower]) -> tuple[int, dict[str, Any]]:
    for f in followers:
        f.poll()
    lasts = [f.last for f in followers if f.last is not None]
    rewards = [r["reward_own"] for r in lasts if r.get("reward_own") is not None]
    peers = [r.get("peers_seen", 0) for r in lasts]
    postfix = {"reward": f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
               "peers": min(peers) if peers else 0, "accepted": sum(f.accepted for f in followers),
               "dropped": sum(f.dropped for f in followers)}
    return sum(f.rows for f in followers), postfix


def run_swarm(config: SwarmConfig, *, progress: bool = True) -> dict[str, Any]:
    """Start the nodes, follow them to the end, and summarise the run."""
    from swarmlm.sapo.node import initial_model_paths
    from swarmlm.sapo.transports.hivemind import require_hivemind

    require_hivemind()
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    started = time.time()
    configs = node_configs(config)
    # each model's initial weights, warmed up once here, not N times in parallel
    initials = initial_model_paths(configs, progress=progress)
    env = dict(os.environ)
    threads = config.threads_per_node or max(1, (os.cpu_count() or 1) // config.nodes)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, str(threads))
    effective = logging.getLogger().getEffectiveLevel()  # by number: hivemind renames WARNING to "WARN"
    level = next((name for name in ("DEBUG", "INFO", "WARNING") if effective <= getattr(logging, name)), "ERROR")
    nodes = [_NodeProcess(k, c, env, level) for k, c in enumerate(configs)]
    print(f"starting {config.nodes} nodes of swarm '{config.swarm.run}' in {out} (logs: {out}/node-K/node.log)", flush=True)
    interrupted = False
    try:
        with graceful_interrupt() as stop:
            info = _start_first_node(nodes[0], config.startup_wait, stop)
            print(f"node 0 is {info['peer_id']} at {' '.join(info['maddrs'])}", flush=True)
            for n in nodes[1:]:
                n.start(list(info["maddrs"]))
            interrupted = _follow(nodes, config.nodes * config.rounds, stop, progress)
    finally:
        _stop_all(nodes)
    codes = {f"node-{n.index}": n.returncode for n in nodes}
    for name, code in codes.items():
        if code not in (0, 130):
            print(f"{name} failed with exit code {code}; last lines of its log:\n{_tail(node_dir(out, int(name[5:])) / 'node.log')}",
                  file=sys.stderr)
    summary = run_summary(out, config.nodes, wall_seconds=round(time.time() - started, 1))
    summary.update(swarm=summary["nodes"], exit_codes=codes, **_transport_fractions(summary["nodes"]),
                   completed=not interrupted and all(code == 0 for code in codes.values()))
    summary.update(provenance({config.node_label(k): path for k, path in enumerate(initials)}))  # as in simulate; a mixed swarm's models each get theirs
    summary["environment"]["torch_threads"] = int(env["OMP_NUM_THREADS"])  # each node's, not this launcher's
    write_summary(out, summary)
    return summary


def _start_first_node(node: "_NodeProcess", startup_wait: float, stop) -> dict[str, Any]:
    """Start node 0 with no initial peers and wait for the address it prints (its peer id and multiaddrs)."""
    node.start([])
    deadline = time.monotonic() + startup_wait
    while True:
        info = node.peer_info()
        if info is not None:
            return info
        if node.returncode is not None:
            raise RuntimeError(f"node 0 exited with code {node.returncode} before its DHT was up:\n{_tail(node.log_path)}")
        if time.monotonic() > deadline or stop.requested:
            raise RuntimeError(f"node 0 printed no address within {startup_wait:.0f}s:\n{_tail(node.log_path)}")
        time.sleep(0.5)


def _follow(nodes: list["_NodeProcess"], total: int, stop, progress: bool) -> bool:
    """Show the nodes' progress (from their metrics files) until every node has exited; Ctrl+C is passed on to
    each node once, which checkpoints after its current step. Whether the run was interrupted."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=f"swarm of {len(nodes)}", unit="step", disable=not progress)
    interrupted = False
    followers = [_Follower(n.dir / "metrics.jsonl") for n in nodes]
    while True:
        done, postfix = _status(followers)
        bar.update(max(0, min(done, total) - bar.n))
        bar.set_postfix(postfix, refresh=True)
        if stop.requested and not interrupted:
            interrupted = True
            for n in nodes:
                n.signal(signal.SIGINT)
        if all(n.returncode is not None for n in nodes):
            break
        time.sleep(1.0)
    bar.close()
    return interrupted


def _stop_all(nodes: list["_NodeProcess"]) -> None:
    """SIGTERM to every node still running, then SIGKILL to any still there after 60 s."""
    for n in nodes:
        n.signal(signal.SIGTERM)
    for n in nodes:
        if n.proc is not None:
            try:
                n.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                n.signal(signal.SIGKILL)


def _transport_fractions(per_node: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The share of all nodes' round time spent in the transport, waiting in it, and in its own work."""
    round_s = sum((s["round_seconds_mean"] or 0) * s["rounds"] for s in per_node.values())
    transport_s = sum((s["transport_seconds_mean"] or 0) * s["rounds"] for s in per_node.values())
    wait_s = sum((s["transport_wait_fraction"] or 0) * (s["round_seconds_mean"] or 0) * s["rounds"] for s in per_node.values())
    if round_s <= 0:
        return {"transport_fraction": None, "transport_wait_fraction": None, "transport_io_fraction": None}
    return {"transport_fraction": transport_s / round_s, "transport_wait_fraction": wait_s / round_s,
            "transport_io_fraction": (transport_s - wait_s) / round_s}
