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
from hivemind.dht.storage import DHTLocalStorage
from hivemind.dht.validation import RecordValidatorBase

from swarmlm.sapo.transports.hivemind.clock import FUTURE_ROUNDS, RoundClock
from swarmlm.sapo.transports.hivemind.identity import sender_peer_id
from swarmlm.sapo.transports.hivemind.keys import (DIGEST_BYTES, MAX_ADDRESS_BYTES, address_key, digest_key,
                                                   digest_length, message_key)

#: what a digest record counts for in the digests' storage budget: its 40 bytes, the signer's public key in the
#: subkey and the signature
DIGEST_CHARGE = 1024


class SwarmRecordValidator(RecordValidatorBase):
    """This run's rules (:mod:`.validators`), applied by hivemind to every record this peer is asked
    to store and every record other peers return to it, after the signature check; refusals are counted by
    reason, each distinct record once."""

    def __init__(self, run: str, clock: RoundClock, *, back_rounds: int, max_value_bytes: int, max_ttl: float,
                 budget: Any, digest_budget: Any):  # validators.RoundBudget (not imported: validators imports this)
        self.run, self.clock = run, clock
        self.back_rounds, self.max_value_bytes, self.max_ttl = back_rounds, max_value_bytes, max_ttl
        self.budget, self.digest_budget = budget, digest_budget
        # no record may expire later than max_ttl from now, so rounds further ahead than this hold nothing
        self.ahead_rounds = math.ceil(max_ttl / clock.round_length) + FUTURE_ROUNDS + 1
        self.counts: Counter = Counter()
        self._seen_bad: OrderedDict[bytes, None] = OrderedDict()
        self._ids: OrderedDict[tuple[str, int], bytes] = OrderedDict()

    def _key_id(self, peer: str, round: int, kind: str = "message") -> bytes:
        key = (peer, round, kind)
        found = self._ids.get(key)
        if found is None:
            source = (message_key if kind == "message" else digest_key)(self.run, round, peer)
            found = self._ids[key] = DHTID.generate(source=source).to_bytes()
            if len(self._ids) > 131_072:
                self._ids.popitem(last=False)
        return found

    def _address_id(self, peer: str) -> bytes:
        key = (peer, -1, "addresses")
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = DHTID.generate(source=address_key(self.run, peer)).to_bytes()
        return found

    def _round_of(self, key_id: bytes, peer: str, now_round: int) -> tuple[int, str] | None:
        """The round and kind (``message`` or ``digest``) of ``peer``'s key ``key_id``, among the rounds this peer
        can be asked to keep."""
        for r in range(max(0, now_round - self.back_rounds), now_round + self.ahead_rounds + 1):
            for kind in ("message", "digest"):
                if self._key_id(peer, r, kind) == key_id:
                    return r, kind
        return None

    def reject(self, reason: str, record) -> bool:
        return self._count_refusal(reason, record.key + (record.subkey or b"") + record.value[:4096]
                                   + repr(record.expiration_time).encode())

    def _count_refusal(self, reason: str, identity: bytes) -> bool:
        """Count a refusal by its reason, each distinct record (``identity``) once; returns False."""
        fingerprint = hashlib.sha1(identity).digest()
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
        if record.key == self._address_id(peer):
            return self._valid_addresses(record)
        found = self._round_of(record.key, peer, now_round)
        if found is None:
            return self.reject("foreign_key", record)
        rnd, kind = found
        if rnd > now_round + FUTURE_ROUNDS:
            return self.reject("future_round", record)
        if kind == "digest":
            return self._valid_digest(record)
        return self._value_size(record, self.max_value_bytes) is not None

    def _valid_digest(self, record) -> bool:
        """A digest (:func:`.keys.message_digest`): exactly its 40 bytes, stating a length within the size cap."""
        size = self._value_size(record, DIGEST_BYTES)
        if size is None:
            return False
        try:
            length = digest_length(DHTProtocol.serializer.loads(record.value))
        except Exception:
            length = None
        if size != DIGEST_BYTES or length is None or length > self.max_value_bytes:
            return self.reject("bad_message", record)
        return True

    def admit_stored(self, key_id: bytes, subkey: Any, value: bytes) -> bool:
        """Whether this peer keeps a record it was asked to store (already validated): the storage budget of its
        round (:class:`.validators.RoundBudget`), messages and digests each their own. Records this peer only reads
        are not charged: the budget bounds what it holds, never what it can read. Refusals count as ``dht_full``."""
        peer = sender_peer_id(subkey) if isinstance(subkey, bytes) else None
        if peer is None or key_id == self._address_id(peer):
            return True
        now_round = self.clock.round_at(time.time())
        self.budget.forget_before(now_round - self.back_rounds)
        self.digest_budget.forget_before(now_round - self.back_rounds)
        found = self._round_of(key_id, peer, now_round)
        if found is None:
            return True  # not a key of the swarm's: the validators refused it before it came here
        rnd, kind = found
        admitted = (self.digest_budget.admit(rnd, peer, DIGEST_CHARGE) if kind == "digest"
                    else self.budget.admit(rnd, peer, len(value)))
        return admitted or self._count_refusal("dht_full", key_id + subkey + value[:4096])

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


class BudgetedStorage(DHTLocalStorage):
    """hivemind's local storage of a DHT peer, keeping a record under a subkey only within its round's storage
    budget (:meth:`SwarmRecordValidator.admit_stored`). Installed by :func:`.dht_process.dht_class` in the DHT
    process, so that the budget applies to what the peer stores and never to what it reads."""

    def __init__(self, rules: SwarmRecordValidator, maxsize: int | None = None):
        super().__init__(maxsize=maxsize)
        self.rules = rules

    def store_subkey(self, key, subkey, value, expiration_time) -> bool:
        if not self.rules.admit_stored(key.to_bytes(), subkey, value):
            return False
        return super().store_subkey(key, subkey, value, expiration_time)
