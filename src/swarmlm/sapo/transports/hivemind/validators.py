"""What this peer's DHT refuses: the swarm's rules for its round keys, and hivemind's signature check.

Every honest peer runs :class:`SwarmRecordValidator` on what others ask it to store and on what other
peers return to its queries. Under this run's round keys it refuses unsigned or plain values (a plain
value would replace every peer's record of the round), values that are not bytes, values over the
size cap, rounds more than one ahead of its clock, and on any key, expirations too far in the future.
Refusals are counted by reason and reach the node's ``drops`` like the node's own checks.

The validators run inside the DHT process (a fork of the node's process); :func:`take_refusals` is a coroutine
run there (``DHT.run_coroutine``) that reads their counts back.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import Counter, OrderedDict
from typing import Any

from swarmlm.sapo.transports.hivemind import require_hivemind
from swarmlm.sapo.transports.hivemind.clock import FUTURE_ROUNDS, RoundClock, round_key
from swarmlm.sapo.transports.hivemind.identity import Identity, owner_public_key

#: validators of the transports of this process, by token: after the DHT process forks, its copy of
#: this registry points at its copies of the validators, so a coroutine run there can read their counts
_VALIDATORS: dict[str, Any] = {}


def make_validators(identity: Identity, run: str, clock: RoundClock, *, back_rounds: int, max_value_bytes: int,
                    max_ttl: float, token: str) -> list:
    """The record validators of one node's DHT: hivemind's signature check (counting what it refuses),
    then the swarm's rules (:class:`SwarmRecordValidator`)."""
    classes = _validator_classes()
    rules = classes["rules"](run, clock, back_rounds=back_rounds, max_value_bytes=max_value_bytes, max_ttl=max_ttl,
                             token=token)
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
        """This run's rules for its round keys (see the module docstring), applied by hivemind to every
        record this peer is asked to store and every record other peers return to it. It runs inside the
        DHT process, after the signature check; refusals are counted by reason, each distinct record once."""

        def __init__(self, run: str, clock: RoundClock, *, back_rounds: int, max_value_bytes: int, max_ttl: float,
                     token: str):
            self.run, self.clock = run, clock
            self.back_rounds, self.max_value_bytes, self.max_ttl = back_rounds, max_value_bytes, max_ttl
            # no record may expire later than max_ttl from now, so keys further ahead than this hold nothing
            self.ahead_rounds = math.ceil(max_ttl / clock.round_length) + FUTURE_ROUNDS + 1
            self.counts: Counter = Counter()
            self._seen_bad: OrderedDict[bytes, None] = OrderedDict()
            self._ids: dict[bytes, int] = {}
            self._span: tuple[int, int] | None = None
            _VALIDATORS[token] = self

        def _round_of(self, key_id: bytes, now_round: int) -> int | None:
            lo, hi = now_round - self.back_rounds, now_round + self.ahead_rounds
            if self._span != (lo, hi):
                keep = {k: r for k, r in self._ids.items() if lo <= r <= hi}
                have = set(keep.values())
                for r in range(max(0, lo), hi + 1):
                    if r not in have:
                        keep[DHTID.generate(source=round_key(self.run, r)).to_bytes()] = r
                self._ids, self._span = keep, (lo, hi)
            return self._ids.get(key_id)

        def reject(self, reason: str, record) -> bool:
            fingerprint = hashlib.sha1(record.key + record.subkey + record.value[:4096]
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
            now_round = self.clock.round_at(now)
            rnd = self._round_of(record.key, now_round)
            if rnd is None:
                return True  # not one of this run's round keys
            if rnd > now_round + FUTURE_ROUNDS:
                return self.reject("future_round", record)
            if record.subkey in DHTProtocol.RESERVED_SUBKEYS:
                return self.reject("unsigned", record)  # a plain value would replace every peer's record
            try:
                subkey = DHTProtocol.serializer.loads(record.subkey)
            except Exception:
                return self.reject("unsigned", record)
            if owner_public_key(subkey) is None:
                return self.reject("unsigned", record)
            try:
                value = DHTProtocol.serializer.loads(record.value)
            except Exception:
                return self.reject("bad_message", record)
            if not isinstance(value, bytes):
                return self.reject("bad_message", record)
            if len(value) > self.max_value_bytes:
                return self.reject("oversized_message", record)
            return True

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


def take_refusals(token: str) -> dict[str, int]:
    """The refusals of the validators registered under ``token`` since the last call (run inside the DHT process)."""
    validator = _VALIDATORS.get(token)
    return validator.take_counts() if validator is not None else {}
