"""The swarm's DHT record rules on their own, on hand-made records (no DHT): digests, and the storage budget that
bounds what a peer stores but never what it reads."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("hivemind")

from hivemind.dht.protocol import DHTProtocol  # noqa: E402
from hivemind.dht.routing import DHTID  # noqa: E402
from hivemind.dht.validation import DHTRecord  # noqa: E402

from swarmlm.sapo.transports.hivemind.clock import RoundClock  # noqa: E402
from swarmlm.sapo.transports.hivemind.identity import load_identity  # noqa: E402
from swarmlm.sapo.transports.hivemind.keys import digest_key, message_digest, message_key  # noqa: E402
from swarmlm.sapo.transports.hivemind.validators import forget_validators, make_validators  # noqa: E402


def _record(key: str, subkey: bytes, value: object) -> DHTRecord:
    dumps = DHTProtocol.serializer.dumps
    return DHTRecord(DHTID.generate(source=key).to_bytes(), dumps(subkey), dumps(value), time.time() + 30)


def test_digests_are_checked_and_the_budget_bounds_storing_not_reading(tmp_path):
    clock = RoundClock(round_length=10.0)
    me, peer = load_identity(tmp_path / "me.key"), load_identity(tmp_path / "peer.key")
    rules = make_validators(me, "run", clock, back_rounds=4, max_value_bytes=1000, max_ttl=60.0, round_bytes=2500,
                            token="test")[-1]
    g = clock.now()
    digest = _record(digest_key("run", g, peer.peer_id), peer.owner_subkey, message_digest(b"x" * 900))
    assert rules.validate(digest)
    for bad in (message_digest(b"x" * 900)[:39], message_digest(b"x" * 2000), "not bytes"):
        assert not rules.validate(_record(digest_key("run", g, peer.peer_id), peer.owner_subkey, bad))
    assert rules.take_counts() == {"bad_message": 3}  # 39 bytes, a length over the cap, not bytes
    # a digest under another peer's key is a foreign key, as a message would be
    assert not rules.validate(_record(digest_key("run", g, me.peer_id), peer.owner_subkey, message_digest(b"x")))
    assert rules.take_counts().get("foreign_key") == 1

    # the budget: 2,500 bytes a round, newcomers half of it. Two messages of 900 bytes from a newcomer: the second
    # is not stored (it would pass half), yet both validate, so both can still be read
    first = _record(message_key("run", g, peer.peer_id), peer.owner_subkey, b"a" * 900)
    second = _record(message_key("run", g + 1, peer.peer_id), peer.owner_subkey, b"b" * 900)
    assert rules.validate(first) and rules.validate(second)
    assert rules.admit_stored(first.key, peer.owner_subkey, first.value)
    other = load_identity(tmp_path / "other.key")
    third = _record(message_key("run", g, other.peer_id), other.owner_subkey, b"c" * 900)
    assert rules.validate(third)
    assert not rules.admit_stored(third.key, other.owner_subkey, third.value)  # newcomers' half of round g is spent
    assert rules.take_counts() == {"dht_full": 1}
    assert rules.validate(third)  # still readable: validation never charges the budget
    rules.budget.trusted = {other.peer_id}
    assert rules.admit_stored(third.key, other.owner_subkey, third.value)  # a known peer gets the rest
    # digests have their own budget: storing one never takes a message's room
    assert rules.admit_stored(digest.key, peer.owner_subkey, digest.value)
    assert rules.budget.kept_bytes() == sum(len(r.value) for r in (first, third))
    forget_validators("test")
