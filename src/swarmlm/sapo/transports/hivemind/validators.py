"""What this peer's DHT refuses: the swarm's rules for its keys, hivemind's signature check, and a storage budget.

Every honest peer runs :class:`SwarmRecordValidator` on what others ask it to store and on what other peers
return to its queries. The DHT is the swarm's own, so it is strict: a record is accepted only under **its
signer's own key** and subkey, either as a message of a round within the window (:func:`.keys.message_key`, bytes
of at most the size cap) or as its addresses (:func:`.keys.address_key`, at most ``MAX_ADDRESS_BYTES``), expiring
no later than the longest TTL. Everything else is refused with a reason:

* ``unsigned``: the subkey is not exactly an owner subkey ``[owner:ssh-rsa …]`` (a plain value, or junk after it);
* ``foreign_key``: not one of the signer's own keys (a write into another peer's key, or any other key);
* ``future_round``: the signer's key of a round more than one ahead of this peer's clock;
* ``bad_message`` / ``oversized_message``: the value is not bytes, or too large;
* ``bad_expiration``: it would expire later than ``max_ttl`` from now;
* ``dht_full``: the round's storage budget is spent (below);
* ``bad_signature``: hivemind's :class:`~hivemind.dht.crypto.RSASignatureValidator` refused it.

**Storage budget.** All peers' messages of one round together may take at most ``round_bytes`` here (one value
per signer and round; a newer one replaces it). This node's own message is always kept; peers this node
accepted records from recently (:func:`set_trusted`) come next; identities it does not know share at most half
the budget, so a flood of new identities can never take the room of known peers. Rounds leave the budget
when they leave the window, so the DHT process holds at most about ``window × round_bytes`` of messages.

Refusals are counted by reason, each distinct record once, and reach the node's ``drops``. The validators run
inside the DHT process (a fork of the node's process); :func:`take_refusals` and :func:`set_trusted` are called
there (``DHT.run_coroutine``, see :mod:`.dht_process`).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter, OrderedDict
from typing import Any

from swarmlm.sapo.transports.hivemind import require_hivemind
from swarmlm.sapo.transports.hivemind.clock import FUTURE_ROUNDS, RoundClock
from swarmlm.sapo.transports.hivemind.identity import Identity, sender_peer_id
from swarmlm.sapo.transports.hivemind.keys import address_key, message_key

MAX_ADDRESS_BYTES = 2048  # a peer's list of addresses

#: validators of the transports of this process, by token: after the DHT process forks, its copy of
#: this registry points at its copies of the validators, so a coroutine run there can reach them
_VALIDATORS: dict[str, Any] = {}


class RoundBudget:
    """Bytes of messages kept per round: at most ``round_bytes`` in all, newcomers at most half of it."""

    def __init__(self, round_bytes: int, own_peer: str):
        self.round_bytes, self.own_peer = round_bytes, own_peer
        self.trusted: set[str] = set()
        self._kept: dict[int, dict[str, int]] = {}  # round -> signer -> bytes of its message

    def admit(self, round: int, peer: str, size: int) -> bool:
        kept = self._kept.setdefault(round, {})
        if peer == self.own_peer:
            kept[peer] = size
            return True
        others = sum(n for p, n in kept.items() if p != peer)
        newcomers = sum(n for p, n in kept.items() if p != peer and p not in self.trusted and p != self.own_peer)
        if others + size > self.round_bytes:
            return False
        if peer not in self.trusted and newcomers + size > self.round_bytes // 2:
            return False
        kept[peer] = max(size, kept.get(peer, 0))
        return True

    def forget_before(self, round: int) -> None:
        for r in [r for r in self._kept if r < round]:
            del self._kept[r]

    def kept_bytes(self) -> int:
        return sum(sum(v.values()) for v in self._kept.values())


def make_validators(identity: Identity, run: str, clock: RoundClock, *, back_rounds: int, max_value_bytes: int,
                    max_ttl: float, round_bytes: int, token: str) -> list:
    """The record validators of one node's DHT: hivemind's signature check (counting what it refuses),
    then the swarm's rules (:class:`SwarmRecordValidator`)."""
    classes = _validator_classes()
    rules = classes["rules"](run, clock, back_rounds=back_rounds, max_value_bytes=max_value_bytes, max_ttl=max_ttl,
                             budget=RoundBudget(round_bytes, identity.peer_id), token=token)
    return [classes["signature"](identity.private_key, rules), rules]


_CLASSES: dict[str, type] = {}


def _validator_classes() -> dict[str, type]:
    """The validator classes, defined on first use because their hivemind base classes are optional."""
    if "rules" in _CLASSES:
        return _CLASSES
    require_hivemind()
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.protocol import DHTProtocol
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import RecordValidatorBase

    class SwarmRecordValidator(RecordValidatorBase):
        """This run's rules (see the module docstring), applied by hivemind to every record this peer is asked
        to store and every record other peers return to it, after the signature check; refusals are counted by
        reason, each distinct record once."""

        def __init__(self, run: str, clock: RoundClock, *, back_rounds: int, max_value_bytes: int, max_ttl: float,
                     budget: RoundBudget, token: str):
            self.run, self.clock = run, clock
            self.back_rounds, self.max_value_bytes, self.max_ttl = back_rounds, max_value_bytes, max_ttl
            self.budget = budget
            # no record may expire later than max_ttl from now, so rounds further ahead than this hold nothing
            self.ahead_rounds = math.ceil(max_ttl / clock.round_length) + FUTURE_ROUNDS + 1
            self.counts: Counter = Counter()
            self._seen_bad: OrderedDict[bytes, None] = OrderedDict()
            self._ids: OrderedDict[tuple[str, int], bytes] = OrderedDict()
            _VALIDATORS[token] = self

        def _key_id(self, peer: str, round: int) -> bytes:
            key = (peer, round)
            found = self._ids.get(key)
            if found is None:
                found = self._ids[key] = DHTID.generate(source=message_key(self.run, round, peer)).to_bytes()
                if len(self._ids) > 65_536:
                    self._ids.popitem(last=False)
            return found

        def _address_id(self, peer: str) -> bytes:
            key = (peer, -1)
            found = self._ids.get(key)
            if found is None:
                found = self._ids[key] = DHTID.generate(source=address_key(self.run, peer)).to_bytes()
            return found

        def _round_of(self, key_id: bytes, peer: str, now_round: int) -> int | None:
            """The round whose message key of ``peer`` is ``key_id`` (rounds this peer can be asked to keep)."""
            for r in range(max(0, now_round - self.back_rounds), now_round + self.ahead_rounds + 1):
                if self._key_id(peer, r) == key_id:
                    return r
            return None

        def reject(self, reason: str, record) -> bool:
            fingerprint = hashlib.sha1(record.key + (record.subkey or b"") + record.value[:4096]
                                       + repr(record.expiration_time).encode()).digest()
            if fingerprint not in self._seen_bad:
                self._seen_bad[fingerprint] = None
                if len(self._seen_bad) > 4096:
                    self._seen_bad.popitem(last=False)
                self.counts[reason] += 1
            return False

        def validate(self, record) -> bool:
            now = time.time()
            if record.expiration_time > now + self.max_ttl:
                return self.reject("bad_expiration", record)
            if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
                return self.reject("unsigned", record)  # a plain value
            try:
                subkey = DHTProtocol.serializer.loads(record.subkey)
            except Exception:
                return self.reject("unsigned", record)
            peer = sender_peer_id(subkey)
            if peer is None:
                return self.reject("unsigned", record)
            now_round = self.clock.round_at(now)
            self.budget.forget_before(now_round - self.back_rounds)
            if record.key == self._address_id(peer):
                return self._valid_addresses(record)
            rnd = self._round_of(record.key, peer, now_round)
            if rnd is None:
                return self.reject("foreign_key", record)
            if rnd > now_round + FUTURE_ROUNDS:
                return self.reject("future_round", record)
            size = self._value_size(record, self.max_value_bytes)
            if size is None:
                return False
            if not self.budget.admit(rnd, peer, size):
                return self.reject("dht_full", record)
            return True

        def _valid_addresses(self, record) -> bool:
            return self._value_size(record, MAX_ADDRESS_BYTES) is not None

        def _value_size(self, record, limit: int) -> int | None:
            """The size of the record's value when it is bytes of at most ``limit``; else refused (None)."""
            try:
                value = DHTProtocol.serializer.loads(record.value)
            except Exception:
                value = None
            if not isinstance(value, bytes):
                self.reject("bad_message", record)
                return None
            if len(value) > limit:
                self.reject("oversized_message", record)
                return None
            return len(value)

        def take_counts(self) -> dict[str, int]:
            out, self.counts = dict(self.counts), Counter()
            return out

    class CountingSignatureValidator(RSASignatureValidator):
        """hivemind's signature check (a record under an owner subkey must be signed by that owner),
        counting the records it refuses as ``bad_signature``."""

        def __init__(self, private_key, rules):
            super().__init__(private_key)
            self.rules = rules

        def validate(self, record) -> bool:
            try:
                ok = super().validate(record)
            except Exception:  # e.g. a malformed public key in a hostile subkey
                ok = False
            return ok or self.rules.reject("bad_signature", record)

    _CLASSES.update(rules=SwarmRecordValidator, signature=CountingSignatureValidator)
    return _CLASSES


def forget_validators(token: str) -> None:
    """Drop a closed transport's validators from this process's registry."""
    _VALIDATORS.pop(token, None)


def take_refusals(token: str) -> tuple[dict[str, int], int]:
    """The refusals of the validators registered under ``token`` since the last call, and the bytes of messages
    their budget keeps (run inside the DHT process)."""
    validator = _VALIDATORS.get(token)
    return (validator.take_counts(), validator.budget.kept_bytes()) if validator is not None else ({}, 0)


def set_trusted(token: str, peers: list[str]) -> None:
    """The peers this node accepted records from recently: the storage budget keeps their messages first."""
    validator = _VALIDATORS.get(token)
    if validator is not None:
        validator.budget.trusted = set(peers)
