"""The DHT record validators themselves, on hivemind's base classes (imported here, so this module is loaded only
where hivemind is installed, by :func:`.validators.make_validators`). The rules they apply, and why, are
:mod:`.validators`'s docstring."""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter, OrderedDict
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import RecordValidatorBase

from swarmlm.sapo.transports.hivemind.clock import FUTURE_ROUNDS, RoundClock
from swarmlm.sapo.transports.hivemind.identity import sender_peer_id
from swarmlm.sapo.transports.hivemind.keys import MAX_ADDRESS_BYTES, address_key, message_key


class SwarmRecordValidator(RecordValidatorBase):
    """This run's rules (:mod:`.validators`), applied by hivemind to every record this peer is asked
    to store and every record other peers return to it, after the signature check; refusals are counted by
    reason, each distinct record once."""

    def __init__(self, run: str, clock: RoundClock, *, back_rounds: int, max_value_bytes: int, max_ttl: float,
                 budget: Any):  # a validators.RoundBudget (not imported: validators imports this module)
        self.run, self.clock = run, clock
        self.back_rounds, self.max_value_bytes, self.max_ttl = back_rounds, max_value_bytes, max_ttl
        self.budget = budget
        # no record may expire later than max_ttl from now, so rounds further ahead than this hold nothing
        self.ahead_rounds = math.ceil(max_ttl / clock.round_length) + FUTURE_ROUNDS + 1
        self.counts: Counter = Counter()
        self._seen_bad: OrderedDict[bytes, None] = OrderedDict()
        self._ids: OrderedDict[tuple[str, int], bytes] = OrderedDict()

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
