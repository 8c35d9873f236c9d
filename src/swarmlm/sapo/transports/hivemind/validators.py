"""What this peer's DHT refuses: the swarm's rules for its keys, hivemind's signature check, and a storage budget.

Every honest peer runs :class:`.record_validators.SwarmRecordValidator` on what others ask it to store and on what other peers
return to its queries. The DHT is the swarm's own, so it is strict: a record is accepted only under **its
signer's own key** and subkey, either as a message of a round within the window (:func:`.keys.message_key`, bytes
of at most the size cap), as that message's digest (:func:`.keys.digest_key`, exactly 40 bytes stating a length
within the size cap) or as its addresses (:func:`.keys.address_key`, at most ``MAX_ADDRESS_BYTES``), expiring no
later than the longest TTL. Everything else is refused with a reason:

* ``unsigned``: the subkey is not exactly an owner subkey ``[owner:ssh-rsa …]`` (a plain value, or junk after it);
* ``foreign_key``: not one of the signer's own keys (a write into another peer's key, or any other key);
* ``future_round``: the signer's key of a round more than one ahead of this peer's clock;
* ``bad_message`` / ``oversized_message``: the value is not bytes (or not a digest under a digest key), or too
  large;
* ``bad_expiration``: it would expire later than ``max_ttl`` from now;
* ``dht_full``: the round's storage budget is spent (below);
* ``bad_signature``: hivemind's :class:`~hivemind.dht.crypto.RSASignatureValidator` refused it.

**Storage budget.** It bounds what this peer stores for others, never what it reads (hivemind runs the
validators on both; the budget sits in the peer's storage, :class:`.record_validators.BudgetedStorage`, so a
round whose budget is full can still be read). All peers' messages of one round together may take at most
``round_bytes`` here (one value
per signer and round; a newer one replaces it). This node's own message is always kept; peers this node
accepted records from recently (:func:`set_trusted`) come next; identities it does not know share at most half
the budget, so a flood of new identities can never take the room of known peers. Rounds leave the budget
when they leave the window, so the DHT process holds at most about ``window × round_bytes`` of messages.
Digests have a budget of their own under the same rules, ``round_bytes / 32`` a round, each digest counted as
1 KB (its signed record), so a flood of digests can take neither the messages' room nor the known peers'.

Refusals are counted by reason, each distinct record once, and reach the node's ``drops``. The validators run
inside the DHT process (a fork of the node's process); :func:`take_refusals` and :func:`set_trusted` are called
there (``DHT.run_coroutine``, see :mod:`.dht_process`).
"""

from __future__ import annotations

from typing import Any

from swarmlm.sapo.transports.hivemind import require_hivemind
from swarmlm.sapo.transports.hivemind.clock import RoundClock
from swarmlm.sapo.transports.hivemind.identity import Identity

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
    then the swarm's rules (:class:`.record_validators.SwarmRecordValidator`, last, which also holds the storage
    budget)."""
    require_hivemind()
    from swarmlm.sapo.transports.hivemind.record_validators import (DIGEST_CHARGE, CountingSignatureValidator,
                                                                    SwarmRecordValidator)

    rules = SwarmRecordValidator(run, clock, back_rounds=back_rounds, max_value_bytes=max_value_bytes, max_ttl=max_ttl,
                                 budget=RoundBudget(round_bytes, identity.peer_id),
                                 digest_budget=RoundBudget(max(64 * DIGEST_CHARGE, round_bytes // 32),
                                                           identity.peer_id))
    _VALIDATORS[token] = rules
    return [CountingSignatureValidator(identity.private_key, rules), rules]


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
        validator.budget.trusted = validator.digest_budget.trusted = set(peers)
