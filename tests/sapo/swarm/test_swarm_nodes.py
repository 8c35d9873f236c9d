"""The decentralized swarm end to end: ``swarmlm sapo node`` processes over the hivemind DHT on loopback.

One scenario runs once for the first five tests (starting node processes is what costs time here):

1. nodes A, B, C (tiny-qwen2, L=4, a short warm start so that some groups have non-zero advantage)
   start together and train;
2. C is killed with SIGKILL (its whole process group, as when a machine dies); A and B go on;
3. a late joiner D (tiny-llama, L=6: another architecture and another group size) joins through B,
   and C is restarted from its directory (same identity, last checkpoint) through A;
4. every node is stopped with Ctrl+C (SIGINT), which checkpoints.

A second run pits two honest nodes against a hostile peer written in ``swarm_hostile.py``.
Every wait is bounded; timeouts are generous because other test sessions share the two cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("hivemind")

from swarmlm.runtime.checkpoints import latest_checkpoint  # noqa: E402
from swarmlm.runtime.metrics import read_jsonl  # noqa: E402
from swarmlm.sapo.transports.hivemind.clock import RoundClock  # noqa: E402
from swarmlm.sapo.transports.hivemind.identity import load_identity  # noqa: E402
from swarmlm.tasks import TASK_PRESETS, TaskConfig  # noqa: E402
from tests.sapo.swarm_hostile import DHT_KINDS, MESSAGE_KINDS, RECORD_KINDS, HostilePeer  # noqa: E402

pytestmark = pytest.mark.slow

ROUND_LENGTH = 2.0  # seconds per global round
STALENESS = 3  # rounds
COLLECT_TIMEOUT = 3.0  # seconds
TINY = ["--local", "2", "--external", "2", "--generation.group-size", "4", "--generation.max-new-tokens", "24",
        "--tasks.eval-size", "4", "--eval-every", "0", "--checkpoint-every", "2", "--grpo.lr", "2e-4",
        "--swarm.round-length", str(ROUND_LENGTH), "--sharing.staleness-rounds", str(STALENESS),
        "--sharing.collect-timeout", str(COLLECT_TIMEOUT), "--swarm.poll-interval", "0.25",
        "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--progress", "false", "--rounds", "500"]
# the churn scenario also waits for live peers (bounded by the timeout), the harder case for a dead peer
WAIT = ["--swarm.wait-for-peers", "true"]


class Node:
    """One ``swarmlm sapo node`` process, in its own process group so that the test can kill it whole."""

    def __init__(self, out: Path, run: str, *args: str):
        self.out, self.run, self.args = out, run, list(args)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, initial_peers: list[str] | None = None, *extra: str) -> "Node":
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "peer.json").unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "swarmlm", "--log-level", "INFO", "sapo", "node", "--out", str(self.out),
               "--swarm.run", self.run, *TINY, *self.args, *extra]
        if initial_peers:
            cmd += ["--initial-peers", ",".join(initial_peers)]
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        with open(self.out / f"node-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.starts += 1
        return self

    def log(self) -> str:
        return "\n".join((self.out / f"node-{k}.log").read_text(errors="replace") for k in range(self.starts))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def rows(self) -> list[dict]:
        """The node's training steps (round 1 on; round 0 is its held-out pass@1 before any update)."""
        return [r for r in read_jsonl(self.out / "metrics.jsonl") if r["round"] >= 1]

    def start_row(self) -> dict | None:
        return next((r for r in read_jsonl(self.out / "metrics.jsonl") if r["round"] == 0), None)

    def peer(self) -> dict | None:
        try:
            return json.loads((self.out / "peer.json").read_text())
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def interrupt(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGINT)


def wait_for(condition, timeout: float, what: str, nodes: list[Node]) -> None:
    """Poll ``condition`` until it holds. It may return a dict of named parts, all of which must hold: a timeout
    then names the parts that did not."""
    deadline = time.monotonic() + timeout
    while True:
        state = condition()
        if all(state.values()) if isinstance(state, dict) else state:
            return
        for n in nodes:
            assert n.alive(), f"{n.out.name} exited ({n.proc.returncode}) while waiting for {what}:\n{n.log()[-3000:]}"
        missing = [k for k, v in state.items() if not v] if isinstance(state, dict) else []
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}; not yet: {missing}"
        time.sleep(0.5)


def stop(nodes: list[Node], timeout: float = 90) -> None:
    for n in nodes:
        n.interrupt()
    deadline = time.monotonic() + timeout
    for n in nodes:
        if n.proc is None:
            continue
        try:
            n.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            n.kill()


def drops_of(node: Node, sender: str) -> Counter:
    """How often, and why, ``node`` dropped records from ``sender`` (from its log)."""
    return Counter(line.split(f"dropped record from {sender}: ", 1)[1].split(" ", 1)[0]
                   for line in node.log().splitlines() if f"dropped record from {sender}: " in line)


def sources(rows: list[dict], key: str) -> set[str]:
    return {peer for r in rows for peer in (r.get(key) or {})}


@pytest.fixture(scope="module")
def warm_model() -> str:
    """A tiny-qwen2 that writes ``<answer>…</answer>`` often and is sometimes right: 40 small supervised steps."""
    from swarmlm.sapo.warmstart import WarmstartConfig, warmstart

    return str(warmstart(WarmstartConfig(model="tiny-qwen2", steps=40, batch_size=8, lr=3e-3), progress=False))


@pytest.fixture(scope="module")
def churn(tmp_path_factory, warm_model):
    """Run the churn scenario once; return what the tests check."""
    base = tmp_path_factory.mktemp("swarm")
    run = f"churn-{uuid.uuid4().hex[:8]}"
    # a 40-step warm start is seldom fully right: the task's partial credit gives its groups the advantages that
    # make external groups worth choosing, which is what this scenario checks
    qwen = ["--model.name", warm_model, "--model.warmstart", "never", "--grpo.reward", "task", *WAIT]
    a, b, c = (Node(base / name, run, *qwen) for name in "abc")
    d = Node(base / "d", run, "--model.name", "tiny-llama", "--model.warmstart", "never", "--generation.group-size", "6",
             "--grpo.reward", "task", *WAIT)
    everyone = [a, b, c, d]
    facts: dict = {"nodes": {"a": a, "b": b, "c": c, "d": d}}
    started = time.monotonic()
    try:
        a.start(None, "--swarm.start-peers", "2")
        wait_for(lambda: a.peer() is not None, 180, "A's address", [a])
        entry = a.peer()["maddrs"]
        b.start(entry, "--swarm.start-peers", "2")
        c.start(entry, "--swarm.start-peers", "2")
        # phase 1: the three train together
        wait_for(lambda: all(len(n.rows()) >= 5 for n in (a, b, c)), 240, "5 steps on A, B and C", [a, b, c])
        facts["ids"] = {name: n.peer()["peer_id"] for name, n in (("a", a), ("b", b), ("c", c))}
        # phase 2: C dies at once, mid-step
        c.kill()
        facts["killed_at"] = time.time()
        facts["rows_at_kill"] = {name: len(n.rows()) for name, n in (("a", a), ("b", b))}
        ckpt = latest_checkpoint(c.out / "checkpoints")
        assert ckpt is not None
        facts["c_checkpoint"] = ckpt.step
        facts["c_rows_before"] = c.rows()
        past_window = facts["killed_at"] + STALENESS * ROUND_LENGTH + ROUND_LENGTH

        def survived() -> bool:  # 6 more steps each, of which 2 begun after C's records left the staleness window
            return all(len(n.rows()) >= facts["rows_at_kill"][k] + 6
                       and sum(r["global_round"] * ROUND_LENGTH > past_window for r in n.rows()) >= 2
                       for k, n in (("a", a), ("b", b)))

        wait_for(survived, 120, "A and B to go on after C died", [a, b])
        # phase 3: a late joiner through B, and C back through A
        facts["rejoin_at"] = time.time()
        d.start(b.peer()["maddrs"])
        c.start(entry)
        wait_for(lambda: c.peer() is not None and d.peer() is not None, 180, "C and D up", [a, b, c, d])
        facts["ids"]["d"] = d.peer()["peer_id"]
        facts["c_id_after_restart"] = c.peer()["peer_id"]
        ids = facts["ids"]

        rejoin_round = facts["rejoin_at"] / ROUND_LENGTH

        def rejoined() -> dict[str, bool]:
            c_new = [r for r in c.rows() if r["round"] > facts["c_checkpoint"]]
            survivors_later = [r for n in (a, b) for r in n.rows() if r["global_round"] > rejoin_round]
            return {"C stepped 4 times": len(c_new) >= 4, "D stepped 4 times": len(d.rows()) >= 4,
                    "C took A's and B's records": {ids["a"], ids["b"]} <= sources(c_new, "accepted_sources"),
                    "A or B took C's": ids["c"] in sources(survivors_later, "accepted_sources"),
                    "A or B took D's": ids["d"] in sources(survivors_later, "accepted_sources"),
                    "D trained on others'": bool(sources(d.rows(), "external_sources") & {ids["a"], ids["b"], ids["c"]})}

        wait_for(rejoined, 240, "C and D to exchange records with A and B", everyone)
    finally:
        stop(everyone)
    facts["rows"] = {name: n.rows() for name, n in facts["nodes"].items()}
    facts["seconds"] = time.monotonic() - started
    return facts


def test_three_nodes_train_on_each_others_records(churn):
    ids, rows = churn["ids"], churn["rows"]
    before_kill = {"a": rows["a"][:churn["rows_at_kill"]["a"]], "b": rows["b"][:churn["rows_at_kill"]["b"]],
                   "c": churn["c_rows_before"]}
    for name, own_rows in before_kill.items():
        others = {ids[k] for k in "abc" if k != name}
        assert all(r["node"] == ids[name] for r in own_rows)
        # every record the node took into its pool came from one of the two others, and both sent some
        assert sources(own_rows, "accepted_sources") == others, name
        # ...and it trained on them: external groups chosen for the update (non-zero advantage) came from others
        assert sum(r["external_used"] for r in rows[name]) > 0, name
        assert sources(rows[name], "external_sources") <= others | {ids.get("d")}
        assert all(r["loss"] is not None for r in own_rows)
        # records are keyed by the global round of the swarm clock, not the node's step count
        assert all(r["global_round"] > 10 ** 6 for r in own_rows)
        # honest peers send nothing to drop but, now and then, a copy: two nodes of the small default task space can
        # draw the same question and sample the same group, and one copy counts once
        drops = own_rows[-1]["drops"]  # counts by reason since the node began
        assert set(drops) <= {"duplicate"}, (name, drops)
        start = churn["nodes"][name].start_row()  # held-out pass@1 before the first update, logged once
        assert start is not None and 0.0 <= start["eval_pass1"] <= 1.0


def test_killed_node_does_not_stall_the_others(churn):
    ids = churn["ids"]
    window = STALENESS * ROUND_LENGTH
    for name in "ab":
        after = churn["rows"][name][churn["rows_at_kill"][name]:]
        after_kill = [r for r in after if r["global_round"] * ROUND_LENGTH < churn["rejoin_at"]]
        assert len(after_kill) >= 6
        # never blocked beyond the collect timeout, even while C was still counted as live
        assert max(r["dht_wait_seconds"] for r in after_kill) <= COLLECT_TIMEOUT + 0.5
        assert max(r["transport_seconds"] for r in after_kill) <= COLLECT_TIMEOUT + 5.0
        # once C's last records are older than the staleness window, C is no longer waited for
        past_window = [r for r in after_kill if r["global_round"] * ROUND_LENGTH > churn["killed_at"] + window + ROUND_LENGTH]
        assert past_window, "no step after the staleness window"
        assert all(r["dht_live_peers"] == 1 for r in past_window)  # only the other survivor
        assert all(ids["c"] not in (r.get("accepted_sources") or {}) for r in past_window)


def test_restarted_node_resumes_from_checkpoint_and_rejoins(churn):
    ids, rows, ckpt = churn["ids"], churn["rows"]["c"], churn["c_checkpoint"]
    assert churn["c_id_after_restart"] == ids["c"]  # same identity file, same peer id
    assert [r["round"] for r in rows] == list(range(1, len(rows) + 1))  # the steps past the checkpoint were dropped
    assert rows[:ckpt] == churn["c_rows_before"][:ckpt]
    resumed = rows[ckpt:]
    assert resumed and all(r["node"] == ids["c"] for r in resumed)
    assert "resumed from" in churn["nodes"]["c"].log()
    assert {ids["a"], ids["b"]} <= sources(resumed, "accepted_sources")
    # the survivors take C's new records again (published under a global round after the restart)
    rejoin_round = churn["rejoin_at"] / ROUND_LENGTH
    later = [r for name in "ab" for r in churn["rows"][name] if r["global_round"] > rejoin_round]
    assert ids["c"] in sources(later, "accepted_sources")


def test_late_joiner_receives_and_contributes(churn):
    ids, rows = churn["ids"], churn["rows"]
    d_rows = rows["d"]
    assert len(d_rows) >= 4
    assert sources(d_rows, "accepted_sources") & {ids["a"], ids["b"], ids["c"]}  # it receives
    assert ids["d"] in sources(rows["a"], "accepted_sources") | sources(rows["b"], "accepted_sources")  # it contributes


def test_heterogeneous_presets_share_and_train(churn):
    """D runs tiny-llama with L=6 among tiny-qwen2 nodes with L=4: only text travels, re-tokenised by each."""
    ids, rows = churn["ids"], churn["rows"]
    d_config = (churn["nodes"]["d"].out / "config.yaml").read_text()
    assert "name: tiny-llama" in d_config and "group_size: 6" in d_config
    # the qwen2 nodes accepted D's L=6 records, and D (llama) accepted and trained with the qwen2 nodes' L=4 records
    assert ids["d"] in sources(rows["a"], "accepted_sources") | sources(rows["b"], "accepted_sources")
    assert sources(rows["d"], "external_sources") & {ids["a"], ids["b"], ids["c"]}
    assert all(r["loss"] is not None for r in rows["d"])


# families whose reasoning-gym scorer evaluates text (the honest nodes score them for peers) and one whose
# regeneration overruns the honest nodes' CPU limit (tower_of_hanoi with 20 disks: ~0.6 s of CPU an item, against
# 0.3 s allowed; the others take under 1 ms)
CANARY_FAMILIES = [{"name": n} for n in ("binary_matrix", "spiral_matrix", "number_sorting", "string_insertion", "n_queens")]
SLOW = {"name": "tower_of_hanoi", "config": {"min_disks": 20, "max_disks": 20}}
HOSTILE_ROUND, HOSTILE_STALENESS = 3.0, 5  # the hostile test's global round (seconds) and window (rounds)


def test_hostile_peer_cannot_stop_honest_nodes(tmp_path):
    """Two honest nodes and a hostile DHT peer that tries every class of attack every round (see swarm_hostile.py):
    code-execution canaries in every field and family, poisoned answers, scored text that differs from trained
    text, rebuilt control tokens, invalid Unicode, slow-scorer records, a Sybil flood, writes into the honest
    peers' keys and future rounds, plagiarism and replays. Each class is counted under its reason at both
    honest nodes; nothing crashes, nothing executes, the flood stays within the DHT's budget, and each honest
    node keeps training on the other's records in the same rounds."""
    run = f"hostile-{uuid.uuid4().hex[:8]}"
    limit = 65_536
    allow = json.dumps(CANARY_FAMILIES + [SLOW])
    common = ["--model.warmstart", "never", "--sharing.limits.max-message-bytes", str(limit), "--swarm.start-peers", "1",
              "--tasks.allow-families", allow, "--tasks.verifier.generate-cpu-seconds", "0.3",
              "--swarm.dht-round-bytes", "1000000",
              "--generation.max-new-tokens", "160",  # room for a whole canary in an answer, as trained
              # steps under attack take seconds on two shared cores: a window longer than a step, so that no
              # honest record ages out of it between two steps of its reader
              "--swarm.round-length", str(HOSTILE_ROUND), "--sharing.staleness-rounds", str(HOSTILE_STALENESS)]
    honest = [Node(tmp_path / "h0", run, *common), Node(tmp_path / "h1", run, "--model.name", "tiny-llama", *common)]
    hostile = None
    tasks = TaskConfig(families=[f.model_dump() for f in TASK_PRESETS["easy"]] + CANARY_FAMILIES + [SLOW])
    try:
        honest[0].start()
        wait_for(lambda: honest[0].peer() is not None, 180, "the first honest node's address", honest[:1])
        honest[1].start(honest[0].peer()["maddrs"])
        wait_for(lambda: honest[1].peer() is not None and all(len(n.rows()) >= 1 for n in honest), 180,
                 "both honest nodes up", honest)
        addresses = honest[0].peer()["maddrs"] + honest[1].peer()["maddrs"]
        victim = load_identity(honest[0].out / "identity.key")
        clock = RoundClock(HOSTILE_ROUND)
        hostile = HostilePeer(tmp_path / "hostile", run=run, clock=clock, initial_peers=addresses,
                              max_message_bytes=limit, tasks=tasks, slow_family="tower_of_hanoi", sybils=12,
                              max_new_tokens=160)
        wanted = (set(MESSAGE_KINDS.values()) | {r for r in RECORD_KINDS.values() if r} | set(DHT_KINDS.values()))
        start_rows = [len(n.rows()) for n in honest]
        deadline = time.monotonic() + 300
        while True:
            g = clock.now()
            hostile.publish_round(victim_id=victim.peer_id, victim_subkey=victim.owner_subkey)
            drops = [(n.rows() or [{}])[-1].get("drops", {}) for n in honest]
            progressed = all(len(n.rows()) >= s + 8 for n, s in zip(honest, start_rows))
            if progressed and hostile.rounds_published >= 2 * len(MESSAGE_KINDS) and all(wanted <= set(d) for d in drops):
                break
            for n in honest:
                assert n.alive(), f"{n.out.name} died under attack:\n{n.log()[-3000:]}"
            assert time.monotonic() < deadline, f"missing drop reasons: {[sorted(wanted - set(d)) for d in drops]}"
            while clock.now() == g:
                time.sleep(0.1)
    finally:
        if hostile is not None:
            hostile.close()
        stop(honest)
    assert not hostile.canary.exists(), "a canary payload ran"
    for n, start in zip(honest, start_rows):
        rows = n.rows()
        assert n.proc.returncode == 130, n.log()[-3000:]  # stopped by us, not crashed
        assert all(r["loss"] is not None for r in rows)  # kept training every step
        last = rows[-1]["drops"]
        for kind, reason in {**MESSAGE_KINDS, **RECORD_KINDS, **DHT_KINDS}.items():
            if reason:
                assert last.get(reason, 0) > 0, (n.out.name, kind, reason, last)
        assert "Traceback" not in n.log()
        # the honest peer's records were still taken in: nearly every record it published under attack (but its
        # last step's, which may not have been read yet) was accepted, never crowded out
        peer_node = honest[1] if n is honest[0] else honest[0]
        other = peer_node.peer()["peer_id"]
        other_start = start_rows[honest.index(peer_node)]
        published = 2 * max(0, len(peer_node.rows()) - other_start - 2)  # I = 2 records a step
        accepted = sum((r.get("accepted_sources") or {}).get(other, 0) for r in rows[start:])
        assert accepted >= 0.8 * published, (n.out.name, accepted, published, drops_of(n, other))
        # the flood: this node's DHT kept at most its budget for each round of the window
        window = HOSTILE_STALENESS + 2 + 1
        assert max(r.get("dht_kept_bytes", 0) for r in rows) <= window * 1_000_000 + limit


def test_swarm_command_runs_nodes_and_summarises(tmp_path):
    """``swarmlm sapo swarm``: N node processes over loopback, one display, one summary."""
    out = tmp_path / "swarm"
    tiny = [a for a in TINY if a not in ("--progress", "false")]
    rounds = tiny.index("--rounds")
    tiny[rounds + 1] = "4"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    res = subprocess.run([sys.executable, "-m", "swarmlm", "--log-level", "WARNING", "sapo", "swarm", "--nodes", "2",
                          "--threads-per-node", "1",
                          "--out", str(out), "--model.warmstart", "never", "--node-models", "[tiny-qwen2, tiny-llama]",
                          "--swarm.run", f"cmd-{uuid.uuid4().hex[:8]}", *tiny,
                          # each node's first step waits for the other: node 1 starts some seconds after node 0, who
                          # could otherwise finish its four 2-second rounds alone on a loaded machine
                          "--swarm.start-peers", "1", "--swarm.start-wait", "120"],
                         capture_output=True, text=True, timeout=400, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "node 0 is Qm" in res.stdout and "swarm of 2" in res.stderr  # the address, and one progress bar
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] and summary["exit_codes"] == {"node-0": 0, "node-1": 0}
    ids = [json.loads((out / f"node-{k}" / "peer.json").read_text())["peer_id"] for k in range(2)]
    for k in range(2):
        rows = read_jsonl(out / f"node-{k}" / "metrics.jsonl")
        assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
        assert summary["swarm"][f"node-{k}"]["records_accepted"] > 0
        assert sources(rows, "accepted_sources") == {ids[1 - k]}
    assert summary["records_accepted"] > 0 and 0 < summary["transport_fraction"] < 1
    # a mixed swarm's provenance: this machine, and each model's start
    assert summary["environment"]["cpu"] and set(summary["initial_models"]) == {"tiny-qwen2", "tiny-llama"}
    assert summary["environment"]["torch_threads"] == 1  # the nodes' (--threads-per-node), not the launcher's (all cores)
    # the human summary: a row per node, the records and the transport, the machine
    for text in ("| node-0 |", "| node-1 |", "| mean |", f"records: {summary['records_accepted']} accepted",
                 "of round time", "machine: "):
        assert text in res.stdout, (text, res.stdout[-2000:])
    assert "name: tiny-llama" in (out / "node-1" / "node.yaml").read_text()
    # what docs/swarm.md says each node writes (this test is the `sapo swarm` case of tests/test_cli_smoke.py)
    for k in range(2):
        for name in ("node.log", "metrics.jsonl", "tensorboard", "checkpoints/latest",
                     "checkpoints/step-000004/model/model.safetensors", "checkpoints/step-000004/optimizer.pt"):
            assert (out / f"node-{k}" / name).exists(), (k, name)
