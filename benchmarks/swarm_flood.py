"""A Sybil flood against two honest DHT peers on loopback: memory of the honest DHT process, and whether the honest
peer's message is still read in every round.

    python benchmarks/swarm_flood.py --out docs/results/swarm_flood.json

Alice and Bob are honest :class:`~swarmlm.sapo.transports.hivemind.transport.HivemindTransport` peers. A hostile
DHT peer (``tests/sapo/swarm_hostile.py``) holds ``--sybils`` identities, each publishing a message of
``--message-bytes`` every round under its own key, and writes into Alice's next-round key. Every round Alice
publishes a message of ``--alice-bytes`` and Bob reads the round. Beside the Sybils, ``--attackers`` ordinary DHT
peers publish a message of ``--attacker-bytes`` under their own keys at every round g and g + 1 (the next round's
key is read too), within Bob's read budget of ``--max-round-bytes``. Reported per round: whether Bob read Alice's
message, how long Bob's reads of the round took until he had it, when Alice's store of it ended (and whether it
reported success), the resident memory of Bob's DHT process and its p2p daemon, the bytes Bob's storage budget
keeps, and Bob's refusals by reason. ``--sybils 0 --attackers 0`` is the baseline.

Every peer runs on this machine. On a real network the attackers' DHT peers would store their flood with their
own CPUs; here they take Alice's and Bob's cores, so Bob's read times measure the cores' contention as much as the
protocol. ``--attacker-nice 19`` runs the attackers' and the Sybils' DHT processes at the lowest CPU priority, a
stand-in for machines of their own (what reaches Bob's DHT process, and what the main process signs and hands
to the attackers, still costs this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.sapo.swarm_hostile

from swarmlm.sapo.records import DropCounter  # noqa: E402
from swarmlm.sapo.transports.hivemind.clock import RoundClock  # noqa: E402
from swarmlm.sapo.transports.hivemind.identity import load_identity  # noqa: E402
from swarmlm.sapo.transports.hivemind.transport import HivemindTransport  # noqa: E402
from swarmlm.tasks import TaskConfig  # noqa: E402
from tests.sapo.swarm_hostile import HostilePeer, process_tree, process_tree_rss_mb  # noqa: E402


def renice_tree(pid: int, niceness: int) -> None:
    """Give ``pid`` and every process under it the CPU priority ``niceness`` (19: the lowest)."""
    for p in process_tree(pid):
        try:
            os.setpriority(os.PRIO_PROCESS, p, niceness)
        except OSError:
            continue


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="swarm-flood-"))
    clock = RoundClock(round_length=args.round_length)
    addresses: list[str] = []

    def peer(name: str, **kw) -> HivemindTransport:
        return HivemindTransport(load_identity(work / f"{name}.key"), run="flood", clock=clock, staleness_rounds=2,
                                 host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                                 max_value_bytes=max(args.message_bytes, args.attacker_bytes),
                                 dht_round_bytes=args.dht_round_bytes, poll_interval=0.1,
                                 on_connected=lambda p, m: addresses.extend(m), **kw)

    alice = peer("alice")
    bob = peer("bob", initial_peers=list(addresses), max_round_bytes=args.max_round_bytes)
    bob.drops = DropCounter()
    attackers = [peer(f"attacker-{k}", initial_peers=list(addresses)) for k in range(args.attackers)]
    hostile = HostilePeer(work / "hostile", run="flood", clock=clock, initial_peers=list(addresses),
                          max_message_bytes=args.message_bytes, tasks=TaskConfig(),
                          sybils=args.sybils) if args.sybils else None
    if args.attacker_nice:  # the attackers' DHT processes (and their p2p daemons) stand in for machines of their own
        for dht_pid in [a._dht.pid for a in attackers] + ([hostile.dht.pid] if hostile is not None else []):
            renice_tree(dht_pid, args.attacker_nice)
    rows = []
    try:
        pid = bob._dht.pid
        start_rss = process_tree_rss_mb(pid)
        for _ in range(args.rounds):
            g = clock.now()
            payload = f"alice {g} ".encode() * (args.alice_bytes // 12)
            published = time.monotonic()
            alice.publish(g, payload)
            stored = alice._pending_stores[-1]  # Alice's store of this round's message and digest
            if hostile is not None:
                hostile.publish_round(victim_id=alice.node_id, victim_subkey=alice.identity.owner_subkey)
            for k, attacker in enumerate(attackers):
                for r in (g, g + 1):
                    attacker.publish(r, bytes([65 + k]) * args.attacker_bytes)
            got, started = [], time.monotonic()
            until = started + 0.8 * args.round_length
            stored_seconds = None
            while time.monotonic() < until and not any(m.sender == alice.node_id and m.round == g for m in got):
                got += bob.collect(g, timeout=0.5)
                if stored_seconds is None and stored.done():
                    stored_seconds = round(time.monotonic() - published, 3)
            stored_ok = stored.done() and stored.exception() is None and bool(stored.result())
            rows.append({"round": g, "alice_read": any(m.sender == alice.node_id and m.payload == payload for m in got),
                         "read_seconds": round(time.monotonic() - started, 3), "alice_stored_seconds": stored_seconds,
                         "alice_stored": stored_ok,
                         "bob_dht_rss_mb": round(process_tree_rss_mb(pid), 1), "bob_dht_kept_bytes": bob.stats()["dht_kept_bytes"],
                         "senders_read": sorted({m.sender[-6:] for m in got})})
            print(json.dumps(rows[-1]), flush=True)
            while clock.now() == g:
                time.sleep(0.05)
    finally:
        if hostile is not None:
            hostile.close()
        for attacker in attackers:
            attacker.close()
        alice.close()
        bob.close()
    flood_per_round = args.sybils * args.message_bytes
    return {
        "command": "python benchmarks/swarm_flood.py " + " ".join(sys.argv[1:]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"flood_bytes_per_round": flood_per_round},
        "bob_dht_rss_mb_start": round(start_rss, 1),
        "bob_dht_rss_mb_peak": max(r["bob_dht_rss_mb"] for r in rows),
        "bob_dht_kept_bytes_peak": max(r["bob_dht_kept_bytes"] for r in rows),
        "alice_read_rounds": sum(r["alice_read"] for r in rows),
        "read_seconds_mean": round(sum(r["read_seconds"] for r in rows) / max(1, len(rows)), 3),
        "read_seconds_max": max((r["read_seconds"] for r in rows), default=0.0),
        "rounds": len(rows),
        "drops": dict(bob.drops.counts),
        "per_round": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-length", type=float, default=3.0)
    parser.add_argument("--sybils", type=int, default=24)
    parser.add_argument("--message-bytes", type=int, default=1_000_000, help="each Sybil's message (and the size cap)")
    parser.add_argument("--alice-bytes", type=int, default=200_000)
    parser.add_argument("--dht-round-bytes", type=int, default=32_000_000,
                        help="the honest peers' storage budget per round (the node's default)")
    parser.add_argument("--attackers", type=int, default=2, help="peers that publish at every round g and g + 1")
    parser.add_argument("--attacker-bytes", type=int, default=1_900_000)
    parser.add_argument("--max-round-bytes", type=int, default=16_000_000, help="Bob's read budget per round")
    parser.add_argument("--attacker-nice", type=int, default=0,
                        help="CPU priority of the attackers' and the Sybils' DHT processes (19: the lowest, standing in "
                             "for machines of their own; 0: they share the cores with Alice and Bob as equals)")
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    args = parser.parse_args()
    result = run(args)
    print(f"Bob's DHT process: {result['bob_dht_rss_mb_start']} MB at the start, {result['bob_dht_rss_mb_peak']} MB at "
          f"the peak, under {result['settings']['flood_bytes_per_round'] / 1e6:.0f} MB of Sybil messages a round; "
          f"Alice's message read in {result['alice_read_rounds']} of {result['rounds']} rounds (Bob's reads until then: "
          f"mean {result['read_seconds_mean']} s, max {result['read_seconds_max']} s); drops {result['drops']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
