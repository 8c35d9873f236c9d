"""Digests over real DHT peers on loopback: a message crosses the network once, a lying digest is never followed
far, and a full storage budget never stops a read (the transport's other behaviour: test_hivemind_transport.py)."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("hivemind")

from swarmlm.sapo.records import DropCounter  # noqa: E402
from swarmlm.sapo.transports.hivemind.clock import RoundClock  # noqa: E402
from swarmlm.sapo.transports.hivemind.transport import HivemindTransport  # noqa: E402
from swarmlm.tasks import TaskConfig  # noqa: E402
from tests.sapo.swarm_hostile import HostilePeer  # noqa: E402
from tests.sapo.transports.test_hivemind_transport import ahead_peers, publish_ahead, transport  # noqa: E402

pytestmark = pytest.mark.slow


class LookupSpy:
    """Counts the messages a transport fetches (the real lookups run unchanged)."""

    def __init__(self, t: HivemindTransport):
        self.fetched: list[tuple[int, str]] = []
        real = t._lookup

        def lookup(dht, keys, deadline, **how):
            if "/peer/" in next(iter(keys), ""):
                self.fetched.extend(keys.values())
            return real(dht, keys, deadline, **how)

        t._lookup = lookup  # type: ignore[method-assign]


def test_a_message_crosses_once_and_a_lying_digest_is_never_followed_far(tmp_path):
    """Bob reads a round eight times. Alice's message is fetched once and returned once (before digests, every
    read fetched it again); republished with other content, it is fetched and returned again. A hostile peer
    whose digest names other content than its message is fetched in at most MAX_FETCHES_PER_ROUND reads a round
    (two tries each), never returned, and counted as digest_mismatch."""
    from swarmlm.sapo.transports.hivemind.transport import MAX_FETCHES_PER_ROUND

    clock = RoundClock(round_length=12.0)
    alice = transport(tmp_path, "alice", clock)
    bob = transport(tmp_path, "bob", clock, initial_peers=alice.addresses)
    bob.drops = DropCounter()
    spy = LookupSpy(bob)
    hostile = HostilePeer(tmp_path / "hostile", run="test", clock=clock, initial_peers=alice.addresses + bob.addresses,
                          max_message_bytes=200_000, tasks=TaskConfig(), sybils=0)
    try:
        while (clock.now() + 1) * clock.round_length - time.time() < 10.0:  # the test runs within one round
            time.sleep(0.1)
        g = clock.now()
        first, second = b"first " * 20_000, b"second " * 20_000
        alice.publish(g, first)
        hostile.publish_lying_digest(b"what is stored " * 100, named=b"what the digest names")
        got = []
        for _ in range(8):
            got += [m for m in bob.collect(g, timeout=0.5) if m.round == g]
        alice.publish(g, second)
        for _ in range(12):
            got += [m for m in bob.collect(g, timeout=0.5) if m.round == g]
            if any(m.payload == second for m in got):
                break
        assert clock.now() == g, "the round ended during the test (a loaded machine)"
        assert [m.payload for m in got if m.sender == alice.node_id] == [first, second]
        assert 2 <= spy.fetched.count((g, alice.node_id)) <= 4  # one read each (two tries: a stale local copy)
        assert not [m for m in got if m.sender == hostile.peer_id]
        assert 1 <= spy.fetched.count((g, hostile.peer_id)) <= 2 * MAX_FETCHES_PER_ROUND
        assert bob.drops.counts["digest_mismatch"] >= 1, dict(bob.drops.counts)
    finally:
        hostile.close()
        for t in (alice, bob):
            t.close()


def test_a_full_storage_budget_never_stops_a_read(tmp_path):
    """Two peers publish 140 KB at every round g and g + 1, so that Bob's storage budget (300 KB a round) is full
    before Alice publishes: Bob's DHT refuses to store Alice's message (dht_full), and still reads it from the
    peers that do store it (Alice keeps her own). The budget bounds what a peer holds, not what it can read."""
    clock = RoundClock(round_length=3.0)
    alice = transport(tmp_path, "alice", clock)
    bob = transport(tmp_path, "bob", clock, initial_peers=alice.addresses, dht_round_bytes=300_000)
    bob.drops = DropCounter()
    ahead = ahead_peers(tmp_path, clock, alice, bob)
    try:
        heard, rounds = set(), []
        deadline = time.monotonic() + 90
        while len(rounds) < 5 and time.monotonic() < deadline:
            g = clock.now()
            publish_ahead(ahead, g, 140_000)
            time.sleep(0.8)  # their stores land first
            payload = f"alice {g:03d} ".encode() * 2_000
            alice.publish(g, payload)
            until = time.monotonic() + 1.5
            while time.monotonic() < until and g not in heard:
                heard.update(m.round for m in bob.collect(g, timeout=0.5)
                             if m.sender == alice.node_id and m.payload == payload)
            rounds.append(g)
            while clock.now() == g and time.monotonic() < deadline:
                time.sleep(0.05)
        assert len(rounds) >= 4, "too few rounds ran"
        assert bob.drops.counts["dht_full"] > 0, dict(bob.drops.counts)  # Bob's storage was full
        missed = sorted(set(rounds[1:]) - heard)  # the first round: the peers were still finding each other
        assert not missed, f"alice's message was not read in rounds {missed}"
    finally:
        for t in (alice, bob, *ahead):
            t.close()
