"""What a node does with the records other nodes send it, in order, before any of them reaches training.

Every byte from a peer is hostile. :class:`PeerIntake` turns a round's messages into scored groups, and every
record it refuses is counted under a reason (``DropCounter``); nothing raises and nothing waits without a bound.

1. **Order and caps.** Peers whose records were accepted recently are read first, then the others in a random
   order; at most ``max_round_bytes`` of messages and ``max_round_records`` records are taken per round from all
   peers together (``round_cap``). A crowd of new identities cannot push a known peer out.
2. **Shape** (:func:`swarmlm.sapo.records.decode_message`): JSON, every field's type and size, valid Unicode,
   the round window, a family this node scores (``foreign_family``).
3. **Whose question.** A record's round must be its message's round (``round_mismatch``), and its question
   must be the one its sender's stream draws for that round and slot (:func:`swarmlm.tasks.provenance.is_stream_item`,
   ``replayed_task``): a copy of another node's record re-signed, or an old record under a new round, fails.
4. **Cut, and count once.** A record whose completions hold the text of any of this tokenizer's special or
   added tokens (EOS, padding, chat markers, nested or not), or encode to one, is dropped (``control_token``).
   Each completion is tokenized and cut to ``max_new_tokens`` exactly as training will cut it, and decoded
   back: that text is what is scored, so what is scored is what is trained. A group whose trained tokens equal
   a group seen before (from anyone, this node included) is dropped (``duplicate``; a uniform group, one text L
   times, has no advantage to copy and is exempt), and so is a different
   record for a (sender, round, slot) already taken; the same record read again (a sender republishes its
   round's message with each step's records added) is skipped without a drop. Within one round's messages the
   oldest round's copy of a group is the one kept: a copier can only publish a group after its author did, so a
   copy read in the same batch as its original never displaces it (ties go to the peer trusted longest).
5. **Verify** (:class:`swarmlm.tasks.verifier.Verifier`): the receiver regenerates the question from its
   provenance with its own config (``forged_task`` when the text differs) and scores the answers against its
   own reference, in bounded worker processes, within ``tasks.verifier.round_seconds`` per round. The
   training prompt is then the receiver's own question text, never the peer's. A peer whose record overran the
   verifier's limits or was forged has none of its records verified for 8 rounds (``penalized``), so that one
   identity cannot cost a worker every round.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from transformers import PreTrainedTokenizerBase

from swarmlm.sapo.records import DropCounter, RecordLimits, RolloutRecord, decode_message, encode_message
from swarmlm.sapo.selection import ScoredGroup
from swarmlm.sapo.transports.base import Received
from swarmlm.tasks import ControlTokenFilter, ScoreRequest, Verifier, extract_answer
from swarmlm.tasks.provenance import is_stream_item


def question_stream(swarm: str, node_id: str) -> str:
    """The name of ``node_id``'s question stream in ``swarm``: what its questions are drawn from, and what a
    receiver checks them against."""
    return f"{swarm}/{node_id}"


def group_digest(completion_ids: list[list[int]]) -> bytes | None:
    """A digest of a group's trained token ids, independent of the completions' order; None for a uniform group
    (every completion the same), which no verifier can give an advantage, so that it never trains and is not worth
    de-duplicating: honest nodes of a peaked policy send such groups ("<answer>5</answer>" L times) often."""
    if len({tuple(ids) for ids in completion_ids}) <= 1:
        return None
    h = hashlib.sha256()
    for ids in sorted(completion_ids):
        h.update(len(ids).to_bytes(4, "big"))
        h.update(b"".join(int(i).to_bytes(4, "big", signed=True) for i in ids))
    return h.digest()


class BoundedMap:
    """The last ``capacity`` keys added, each with a value (oldest forgotten first)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[Any, Any] = OrderedDict()

    def __contains__(self, key: Any) -> bool:
        return key in self._items

    def get(self, key: Any, default: Any = None) -> Any:
        return self._items.get(key, default)

    def add(self, key: Any, value: Any = None) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def record_digest(rec: RolloutRecord) -> bytes:
    """A digest of what a record says (question, provenance and completions), to tell a re-read from a rewrite."""
    return hashlib.sha256(encode_message([rec])).digest()


@dataclass
class Trainable:
    """A completion as this node will train it: token ids (cut, no EOS) and the text they decode to."""

    ids: list[int]
    text: str


def trainable(texts: list[str], tokenizer: PreTrainedTokenizerBase, control: ControlTokenFilter,
              max_new_tokens: int) -> list[Trainable] | None:
    """Peer completions made into what training uses, or None when one holds a control token (as text, or in
    its encoding: a tokenizer whose normaliser maps other text onto one)."""
    if any(control.find(t) is not None for t in texts):
        return None
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    out = []
    for ids in encoded:
        if any(i in control.ids for i in ids):  # EOS among them, so no completion is cut short by one
            return None
        ids = list(ids[:max_new_tokens])
        out.append(Trainable(ids, tokenizer.decode(ids, skip_special_tokens=True)))
    return out


#: verifier outcomes that cost the receiver a worker or show a forgery: the sender is penalized
PENALIZED_REASONS = frozenset({"scorer_timeout", "scorer_memory", "forged_task"})


class PeerStanding:
    """Which peers had records accepted recently (read and verified first), and which are penalized: a peer whose
    record overran the verifier's limits or was forged has no record verified for ``remember_rounds`` rounds."""

    def __init__(self, remember_rounds: int = 8, capacity: int = 4096):
        self.remember_rounds = remember_rounds
        self.capacity = capacity
        self._last_accepted: OrderedDict[str, int] = OrderedDict()
        self._trusted_since: dict[str, int] = {}  # peer -> first round of its current run of accepted records
        self._last_penalized: OrderedDict[str, int] = OrderedDict()

    @staticmethod
    def _mark(table: OrderedDict, peer: str, round: int, capacity: int) -> None:
        table[peer] = max(round, table.get(peer, round))
        table.move_to_end(peer)
        while len(table) > capacity:
            table.popitem(last=False)

    def accepted(self, peer: str, round: int) -> None:
        if not self.trusted(peer, round):
            self._trusted_since[peer] = round
        self._mark(self._last_accepted, peer, round, self.capacity)
        if len(self._trusted_since) > self.capacity:
            self._trusted_since = {p: self._trusted_since[p] for p in self._last_accepted if p in self._trusted_since}

    def since(self, peer: str, round: int) -> float:
        """The round since which ``peer`` has been trusted without a break (infinity when it is not trusted)."""
        return self._trusted_since.get(peer, math.inf) if self.trusted(peer, round) else math.inf

    def penalize(self, peer: str, round: int) -> None:
        self._mark(self._last_penalized, peer, round, self.capacity)

    def penalized(self, peer: str, round: int) -> bool:
        last = self._last_penalized.get(peer)
        return last is not None and round - last < self.remember_rounds

    def trusted(self, peer: str, round: int) -> bool:
        last = self._last_accepted.get(peer)
        return last is not None and round - last <= self.remember_rounds and not self.penalized(peer, round)

    def recent(self) -> list[str]:
        """The peers trusted as of the newest round any record was accepted in."""
        if not self._last_accepted:
            return []
        newest = max(self._last_accepted.values())
        return [p for p, r in self._last_accepted.items() if newest - r <= self.remember_rounds
                and not self.penalized(p, newest)]

    def order(self, messages: list[Received], round: int, rng: random.Random) -> list[Received]:
        """Trusted peers' messages first (newest round first), then everyone else's in a random order."""
        known = [m for m in messages if self.trusted(m.sender, round)]
        others = [m for m in messages if not self.trusted(m.sender, round)]
        rng.shuffle(others)
        return sorted(known, key=lambda m: -m.round) + others


@dataclass
class _Candidate:
    sender: str
    record: RolloutRecord
    completions: list[Trainable]
    digest: bytes | None  # of the trained group (None: uniform)
    slot_key: tuple[str, int, int]  # (sender, round, slot)
    record_digest: bytes  # of the record as sent


class PeerIntake:
    """A node's intake of peers' records (see the module docstring)."""

    def __init__(self, *, swarm: str, node_id: str, limits: RecordLimits, verifier: Verifier,
                 tokenizer: PreTrainedTokenizerBase, max_new_tokens: int, staleness_rounds: int, future_rounds: int,
                 round_seconds: float, drops: DropCounter, rng: random.Random, remember_groups: int = 65_536):
        self.swarm, self.node_id, self.limits, self.verifier = swarm, node_id, limits, verifier
        self.tokenizer, self.max_new_tokens = tokenizer, max_new_tokens
        self.staleness_rounds, self.future_rounds, self.round_seconds = staleness_rounds, future_rounds, round_seconds
        self.drops, self.rng = drops, rng
        self.control = ControlTokenFilter(tokenizer)
        self.standing = PeerStanding()
        self.seen_groups = BoundedMap(remember_groups)  # digests of trained groups, own ones included
        self.seen_slots = BoundedMap(remember_groups)  # (sender, round, slot) -> digest of the record taken
        self.last_seconds = 0.0  # time the last round's verification took
        self.last_received = 0  # records of the last round that had the right shape

    def remember_own(self, texts: list[str]) -> None:
        """An own group (its published text): a peer that sends it back has it dropped as a duplicate. The digest
        is of the text as this node would take it in from a peer (re-tokenized and cut), which is not always the
        ids it generated (a byte-level model's bytes need not be valid UTF-8)."""
        completions = trainable(texts, self.tokenizer, self.control, self.max_new_tokens)
        digest = group_digest([c.ids for c in completions]) if completions is not None else None
        if digest is not None:
            self.seen_groups.add(digest)

    def _candidates(self, messages: list[Received], round: int) -> list[_Candidate]:
        rounds = (round - self.staleness_rounds, round + self.future_rounds)
        checked: list[_Candidate] = []
        read_bytes = 0
        self.last_received = 0
        for msg in self.standing.order(messages, round, self.rng):
            size = len(msg.payload) if isinstance(msg.payload, (bytes, bytearray)) else 0
            if read_bytes + size > self.limits.max_round_bytes:
                self.drops.drop("round_cap", msg.sender, f"over {self.limits.max_round_bytes} bytes this round")
                continue
            read_bytes += size
            known: Callable[[str], bool] = self.verifier.can_score
            for rec in decode_message(msg.payload, self.limits, sender=msg.sender, rounds=rounds, known_family=known,
                                      drops=self.drops):
                slot_key, digest = (msg.sender, rec.round, rec.slot), record_digest(rec)
                if self.seen_slots.get(slot_key) == digest:
                    continue  # the same record read again (its sender republished its round's message): taken already
                self.last_received += 1
                candidate = self._check(msg, rec, slot_key, digest)
                if candidate is None:
                    continue
                if len(checked) >= self.limits.max_round_records:
                    self.drops.drop("round_cap", msg.sender, f"over {self.limits.max_round_records} records this round")
                    continue
                checked.append(candidate)
        # count once: the oldest round's copy of a group first (an original precedes its copies), then the peer
        # trusted longest; the sort is stable, so the read order above breaks the remaining ties
        checked.sort(key=lambda c: (c.record.round, self.standing.since(c.sender, round)))
        out: list[_Candidate] = []
        for c in checked:
            if self.seen_slots.get(c.slot_key) == c.record_digest:
                continue  # one record in two versions of its sender's message, both read in this batch
            copied = c.digest is not None and c.digest in self.seen_groups
            if copied or c.slot_key in self.seen_slots:
                self.drops.drop("duplicate", c.sender, "a group seen before" if copied
                                else f"slot {c.record.slot} of round {c.record.round} twice")
                continue
            self.seen_slots.add(c.slot_key, c.record_digest)
            if c.digest is not None:
                self.seen_groups.add(c.digest)
            out.append(c)
        return out

    def _check(self, msg: Received, rec: RolloutRecord, slot_key: tuple[str, int, int], digest_of_record: bytes
               ) -> _Candidate | None:
        """The checks of one record that need no verifier; None when it is dropped."""
        sender = msg.sender
        if rec.round != msg.round:
            self.drops.drop("round_mismatch", sender, f"record of round {rec.round} in round {msg.round}")
            return None
        if not is_stream_item(rec.provenance, question_stream(self.swarm, sender), rec.round, rec.slot):
            self.drops.drop("replayed_task", sender, f"not its question {rec.slot} of round {rec.round}")
            return None
        if slot_key in self.seen_slots:
            self.drops.drop("duplicate", sender, f"slot {rec.slot} of round {rec.round} again, rewritten")
            return None
        if self.standing.penalized(sender, msg.round):
            self.drops.drop("penalized", sender, "a record of this peer overran the verifier or was forged recently")
            return None
        completions = trainable(rec.completions, self.tokenizer, self.control, self.max_new_tokens)
        if completions is None:
            self.seen_slots.add(slot_key, digest_of_record)  # refused once, not counted again on every re-read
            self.drops.drop("control_token", sender, "a completion still encodes a control token")
            return None
        return _Candidate(sender, rec, completions, group_digest([c.ids for c in completions]), slot_key,
                          digest_of_record)

    def accept(self, messages: list[Received], round: int,
               score: Callable[[list[str], list[float], list[int]], list[float]]) -> list[ScoredGroup]:
        """The round's verified external groups. ``score(texts, task_scores, lengths)`` gives the training rewards
        (``lengths``: each completion's token count as this node cut it, for a rule on completions at the limit)."""
        candidates = self._candidates(messages, round)
        if not candidates:
            self.last_seconds = 0.0
            return []
        started = time.monotonic()
        requests = [ScoreRequest(c.record.family, [extract_answer(t.text) for t in c.completions],
                                 provenance=c.record.provenance, question=c.record.question) for c in candidates]
        results = self.verifier.score_many(requests, deadline=started + self.round_seconds)
        self.last_seconds = time.monotonic() - started
        pool = []
        for c, res in zip(candidates, results):
            if not res.ok or res.item is None:
                self.drops.drop(res.drop or "scorer_error", c.sender, res.detail)
                if res.drop in PENALIZED_REASONS:
                    self.standing.penalize(c.sender, round)
                continue
            self.standing.accepted(c.sender, round)
            texts = [t.text for t in c.completions]
            rewards = score(texts, res.scores, [len(t.ids) for t in c.completions])
            pool.append(ScoredGroup(c.record, rewards, res.scores, prompt=res.item.question,
                                    completion_ids=[t.ids for t in c.completions]))
        return pool
