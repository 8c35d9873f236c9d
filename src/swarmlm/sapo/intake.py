"""What a node does with the records other nodes send it, in order, before any of them reaches training.

Every byte from a peer is hostile. :class:`PeerIntake` turns a round's messages into scored groups, and every
record it refuses is counted under a reason (``DropCounter``); nothing raises and nothing waits without a bound.

1. **Order and caps.** Every message of a round up to the current one is read before any message of a later
   round (a peer's current round before anyone's future one); within that, peers whose records were accepted
   recently first, then the others in a random order; one message of each sender per pass, smaller ones first.
   At most ``max_round_bytes`` of messages are read per round (``round_cap``).
2. **Shape** (:func:`swarmlm.sapo.records.decode_message`): JSON, every field's type and size, valid Unicode,
   the round window, a family this node scores (``foreign_family``).
3. **Whose question, and count once** (no tokenizer yet, linear in the bytes read). A record's round must be its
   message's round (``round_mismatch``), and its question must be the one its sender's stream draws for that
   round and slot (:func:`swarmlm.tasks.provenance.is_stream_item`, ``replayed_task``): a copy of another node's
   record re-signed, or an old record under a new round, fails. A group is its question (its provenance) and its
   completions: the same completions for another question are another group, scored against that question. A
   group taken before from the same sender, or this node's own group, is dropped (``duplicate``, logged at INFO
   with both senders; a uniform group, one text L times, has no advantage to copy and is exempt), by a hash of
   its text here and of its trained tokens after step 4; so is a different record for a (sender, round, slot)
   already taken, while the same record read again (a sender republishes its round's message with each step's
   records added) is skipped without a drop. Between two senders, identical groups are both kept: a copier
   cannot put a copy under its author's question (its own stream draws other questions, ``replayed_task``), and
   where two streams draw one question, neither sender can be shown to be the author (a round number can be
   back-dated), so no copy ever gets its original dropped.
4. **Caps, then cut.** Records are taken round-robin, one of each sender at a time, in step 1's phases, within
   ``max_round_records``, ``max_sender_records`` per sender and ``max_round_chars`` characters (``round_cap``).
   Only then is anything tokenized: each completion is cut to the characters ``max_new_tokens`` tokens can span
   (:func:`cut_chars`), a record whose cut text holds a special or added token of this tokenizer (EOS, padding,
   chat markers, nested or not), or encodes to one, is dropped (``control_token``), and the first
   ``max_new_tokens`` ids are kept and decoded back: that text is what is scored, so what is scored is what is
   trained.
5. **Verify** (:class:`swarmlm.verify.verifier.Verifier`): the receiver regenerates the question from its
   provenance with its own config (``forged_task`` when the text differs) and scores the answers against its
   own reference, in bounded worker processes, within ``tasks.verifier.round_seconds`` per round. The
   training prompt is then the receiver's own question text, never the peer's. A peer whose record overran the
   verifier's limits or was forged has none of its records verified for 8 rounds (``penalized``), so that one
   identity cannot cost a worker every round.
"""

from __future__ import annotations

import hashlib
from array import array
import json
import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from transformers import PreTrainedTokenizerBase

from swarmlm.sapo.records import DropCounter, RecordLimits, RolloutRecord, decode_message, encode_message, printable
from swarmlm.sapo.selection import ScoredGroup
from swarmlm.sapo.transports.base import Received
from swarmlm.tasks import extract_answer
from swarmlm.verify import ControlTokenFilter, ScoreRequest, Verifier
from swarmlm.tasks.provenance import Provenance, is_stream_item

log = logging.getLogger(__name__)


def question_stream(swarm: str, node_id: str) -> str:
    """The name of ``node_id``'s question stream in ``swarm``: what its questions are drawn from, and what a
    receiver checks them against."""
    return f"{swarm}/{node_id}"


def question_key(provenance: Provenance) -> bytes:
    """The identity of a question: its recipe (family, dataset seed, index, config digest). Two records hold the
    same question exactly when their provenances are equal (the receiver regenerates the text from it)."""
    return json.dumps([provenance.family, provenance.seed, provenance.index, provenance.config],
                      ensure_ascii=True, separators=(",", ":")).encode("ascii")


def _digest(question: Provenance, parts: list[bytes]) -> bytes | None:
    if len(set(parts)) <= 1:
        return None
    h = hashlib.sha256()
    key = question_key(question)
    h.update(len(key).to_bytes(4, "big") + key)
    for part in sorted(parts):
        h.update(len(part).to_bytes(8, "big") + part)
    return h.digest()


def group_digest(question: Provenance, completion_ids: list[list[int]]) -> bytes | None:
    """A digest of one question's group as it is trained (its token ids, in any order); None for a uniform group
    (every completion the same), which no verifier can give an advantage, so that it never trains and is not worth
    de-duplicating: honest nodes of a peaked policy send such groups ("<answer>5</answer>" L times) often. The
    question is part of the digest: the same completions for two questions are two groups (short answers such as
    "<answer>5</answer>" are common to many questions), each scored against its own question."""
    return _digest(question, [array("q", ids).tobytes() for ids in completion_ids])


def text_digest(question: Provenance, texts: list[str]) -> bytes | None:
    """As :func:`group_digest`, of the completions' text as sent: computed before any tokenization."""
    return _digest(question, [t.encode("utf-8", "surrogatepass") for t in texts])


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


def max_token_chars(tokenizer: PreTrainedTokenizerBase, control: ControlTokenFilter) -> int:
    """The most characters any one ordinary token of ``tokenizer`` stands for, bounded by the longest entry of its
    vocabulary (a byte-level vocabulary spells each byte as one character, so a token's text is never longer than
    its entry; control tokens are left out, a completion holding one is dropped anyway)."""
    longest = 1
    for token, index in tokenizer.get_vocab().items():
        if index not in control.ids and token not in control.tokens:
            longest = max(longest, len(token))
    return longest


def cut_chars(tokenizer: PreTrainedTokenizerBase, control: ControlTokenFilter, max_new_tokens: int) -> int:
    """How many characters of a completion are read at most: enough for ``max_new_tokens`` tokens of the longest
    kind and two more (so that the tokens kept do not depend on where the text was cut)."""
    return (max_new_tokens + 2) * max_token_chars(tokenizer, control)


def trainable(texts: list[str], tokenizer: PreTrainedTokenizerBase, control: ControlTokenFilter,
              max_new_tokens: int, max_chars: int | None = None) -> list[Trainable] | None:
    """Peer completions made into what training uses, or None when one holds a control token (as text, or in
    its encoding: a tokenizer whose normaliser maps other text onto one). Each completion is first cut to
    ``max_chars`` characters (:func:`cut_chars`), so that the work is bounded by what can be trained, not by what
    was sent; the cut text is scanned and tokenized, and its first ``max_new_tokens`` ids kept."""
    if max_chars is not None:
        texts = [t[:max_chars] for t in texts]
    if any(control.find(t) is not None for t in texts):
        return None
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    kept = [list(ids[:max_new_tokens]) for ids in encoded]
    if any(not control.ids.isdisjoint(ids) for ids in kept):  # EOS among them, so no completion is cut short by one
        return None
    texts = tokenizer.batch_decode(kept, skip_special_tokens=True) if kept else []
    return [Trainable(ids, text) for ids, text in zip(kept, texts)]


#: verifier outcomes that cost the receiver a worker or show a forgery: the sender is penalized
PENALIZED_REASONS = frozenset({"scorer_timeout", "scorer_memory", "forged_task"})


class PeerStanding:
    """Which peers had records accepted recently (read and verified first), and which are penalized: a peer whose
    record overran the verifier's limits or was forged has no record verified for ``remember_rounds`` rounds."""

    def __init__(self, remember_rounds: int = 8, capacity: int = 4096):
        self.remember_rounds = remember_rounds
        self.capacity = capacity
        self._last_accepted: OrderedDict[str, int] = OrderedDict()
        self._last_penalized: OrderedDict[str, int] = OrderedDict()

    @staticmethod
    def _mark(table: OrderedDict, peer: str, round: int, capacity: int) -> None:
        table[peer] = max(round, table.get(peer, round))
        table.move_to_end(peer)
        while len(table) > capacity:
            table.popitem(last=False)

    def accepted(self, peer: str, round: int) -> None:
        self._mark(self._last_accepted, peer, round, self.capacity)

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
        """The order messages are read in: every message of a round up to ``round`` before any of a later round
        (a peer's current round before anyone's future one); within that, trusted peers' before the others',
        each group's senders in a random order, and a sender's rounds nearest ``round`` first."""
        rank = {}
        for m in messages:
            rank.setdefault(m.sender, rng.random())
        return sorted(messages, key=lambda m: (m.round > round, not self.trusted(m.sender, round), rank[m.sender],
                                               abs(m.round - round)))


@dataclass
class _Candidate:
    sender: str
    record: RolloutRecord
    slot_key: tuple[str, int, int]  # (sender, round, slot)
    record_digest: bytes  # of the record as sent
    text_digest: bytes | None  # of the question and its completions as sent (None: uniform)
    chars: int  # characters read of its completions (each cut to the intake's bound)
    completions: list[Trainable] | None = None  # as trained, once tokenized
    digest: bytes | None = None  # of the question and its group as trained (None: uniform)


_OWN = ""  # the owner of this node's own groups in ``seen_groups`` (a sender's id is never empty)


def _size(m: Received) -> int:
    return len(m.payload) if isinstance(m.payload, (bytes, bytearray)) else 0


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
        self.max_chars = cut_chars(tokenizer, self.control, max_new_tokens)  # read of each completion, at most
        self.standing = PeerStanding()
        # (owner, digest) -> where it was first taken: digests of groups as sent and as trained, own ones included
        self.seen_groups = BoundedMap(2 * remember_groups)
        self.authors = BoundedMap(remember_groups)  # digest -> the first sender a group was taken from
        self.seen_slots = BoundedMap(remember_groups)  # (sender, round, slot) -> digest of the record taken
        self.last_received = 0  # records of the last round that had the right shape

    def remember_own(self, question: Provenance, texts: list[str], round: int = -1) -> None:
        """An own group (its question and published text): a peer that sends the same completions for the same
        question has them dropped as a duplicate. The digest is of the text as sent and as this node would take it
        in from a peer (re-tokenized and cut), which is not always the ids it generated (a byte-level model's bytes
        need not be valid UTF-8)."""
        where = f"this node's own group of round {round}"
        digest = text_digest(question, texts)
        if digest is not None:
            self.seen_groups.add((_OWN, digest), where)
        completions = trainable(texts, self.tokenizer, self.control, self.max_new_tokens, self.max_chars)
        digest = group_digest(question, [c.ids for c in completions]) if completions is not None else None
        if digest is not None:
            self.seen_groups.add((_OWN, digest), where)

    def _copy_of(self, sender: str, digest: bytes | None) -> str | None:
        """Where a group was taken before, when taking it again would count it twice: this node's own group, or
        the same sender's. None otherwise. Between two senders, the same completions for the same question (both
        their streams draw it) are both kept: neither can be shown to be the author, as a round number can be
        back-dated within the staleness window, so dropping either would let a copier censor its author."""
        if digest is None:
            return None
        return self.seen_groups.get((_OWN, digest)) or self.seen_groups.get((sender, digest))

    def _read(self, messages: list[Received], round: int) -> list[Received]:
        """The messages read this round, within ``max_round_bytes``: in :meth:`PeerStanding.order`'s phases (rounds up
        to this one before later ones, trusted peers before the others), one message of each sender per pass, a
        pass's smaller messages first, so that one sender's large messages cannot take the budget of others."""
        ordered = self.standing.order(messages, round, self.rng)
        phases: dict[tuple[bool, bool], dict[str, list[Received]]] = {}
        for m in ordered:
            key = (m.round > round, not self.standing.trusted(m.sender, round))
            phases.setdefault(key, {}).setdefault(m.sender, []).append(m)
        read, read_bytes = [], 0
        for key in sorted(phases):
            queues = list(phases[key].values())
            for depth in range(max((len(q) for q in queues), default=0)):
                layer = [q[depth] for q in queues if depth < len(q)]
                for m in sorted(layer, key=_size):  # stable: the random sender order breaks ties
                    size = _size(m)
                    if read_bytes + size > self.limits.max_round_bytes:
                        self.drops.drop("round_cap", m.sender, f"over {self.limits.max_round_bytes} bytes this round")
                        continue
                    read_bytes += size
                    read.append(m)
        return read

    def _take(self, queues: dict[tuple[bool, bool], dict[str, list[_Candidate]]]) -> list[_Candidate]:
        """The records taken this round, within ``max_round_records``, ``max_sender_records`` per sender and
        ``max_round_chars`` characters to tokenize: phase by phase (as :meth:`_read`), one record of each sender
        at a time (round-robin), so that every sender gets its share before any sender gets more."""
        limits = self.limits
        taken: list[_Candidate] = []
        per_sender: dict[str, int] = {}
        chars = 0
        for key in sorted(queues):
            pending = [list(reversed(q)) for q in queues[key].values()]
            while pending:
                still = []
                for q in pending:
                    c = q.pop()
                    if len(taken) >= limits.max_round_records:
                        self.drops.drop("round_cap", c.sender, f"over {limits.max_round_records} records this round")
                    elif per_sender.get(c.sender, 0) >= limits.max_sender_records:
                        self.drops.drop("round_cap", c.sender, f"over {limits.max_sender_records} records of one peer "
                                        "this round")
                    elif chars + c.chars > limits.max_round_chars:
                        self.drops.drop("round_cap", c.sender, f"over {limits.max_round_chars} characters to read "
                                        "this round")
                    else:
                        taken.append(c)
                        per_sender[c.sender] = per_sender.get(c.sender, 0) + 1
                        chars += c.chars
                    if q:
                        still.append(q)
                pending = still
        return taken

    def candidates(self, messages: list[Received], round: int) -> list[_Candidate]:
        """The round's records that passed every check a verifier is not needed for, each tokenized as trained
        (the first half of :meth:`accept`, all in this process).
        Everything before tokenization is linear in the bytes read; tokenization sees only records within the
        round's caps, each completion cut to ``max_chars`` characters first."""
        rounds = (round - self.staleness_rounds, round + self.future_rounds)
        self.last_received = 0
        queues: dict[tuple[bool, bool], dict[str, list[_Candidate]]] = {}
        known: Callable[[str], bool] = self.verifier.can_score
        for msg in self._read(messages, round):
            key = (msg.round > round, not self.standing.trusted(msg.sender, round))
            for rec in decode_message(msg.payload, self.limits, sender=msg.sender, rounds=rounds, known_family=known,
                                      drops=self.drops):
                slot_key, digest = (msg.sender, rec.round, rec.slot), record_digest(rec)
                if self.seen_slots.get(slot_key) == digest:
                    continue  # the same record read again (its sender republished its round's message): taken already
                self.last_received += 1
                candidate = self._check(msg, rec, slot_key, digest)
                if candidate is not None:
                    queues.setdefault(key, {}).setdefault(msg.sender, []).append(candidate)
        out: list[_Candidate] = []
        for c in self._take(queues):
            if self.seen_slots.get(c.slot_key) == c.record_digest:
                continue  # one record in two versions of its sender's message, both read in this batch
            if c.slot_key in self.seen_slots:
                self.drops.drop("duplicate", c.sender, f"{c.sender} sent slot {c.record.slot} of round {c.record.round} "
                                "twice with other records")
                continue
            if self._duplicate(c, c.text_digest):
                continue  # the same group twice in this batch, from one sender
            completions = trainable(c.record.completions, self.tokenizer, self.control, self.max_new_tokens,
                                    self.max_chars)
            if completions is None:
                self.seen_slots.add(c.slot_key, c.record_digest)  # refused once, not counted again on every re-read
                self.drops.drop("control_token", c.sender, "a completion still encodes a control token")
                continue
            c.completions = completions
            c.digest = group_digest(c.record.provenance, [t.ids for t in completions])
            if self._duplicate(c, c.digest):
                continue
            self.seen_slots.add(c.slot_key, c.record_digest)
            where = f"{c.sender}'s group of round {c.record.round} slot {c.record.slot}"
            for d in {c.text_digest, c.digest} - {None}:
                self.seen_groups.add((c.sender, d), where)
                first = self.authors.get(d)
                if first is None:
                    self.authors.add(d, c.sender)
                elif first != c.sender:
                    log.info("the same completions for the same question from %s and %s (%s): both kept, as neither "
                             "can be shown to be the author", printable(first, 64), printable(c.sender, 64), where)
            out.append(c)
        return out

    def _duplicate(self, c: _Candidate, digest: bytes | None) -> bool:
        """Drop ``c`` as a duplicate when its group (as sent or as trained) was taken before from this node itself or
        from the same sender (:meth:`_copy_of`)."""
        before = self._copy_of(c.sender, digest)
        if before is None:
            return False
        self.drops.drop("duplicate", c.sender, f"{c.sender} sent round {c.record.round} slot {c.record.slot}: the same "
                        f"completions for the same question as {before}")
        return True

    def _check(self, msg: Received, rec: RolloutRecord, slot_key: tuple[str, int, int], digest_of_record: bytes
               ) -> _Candidate | None:
        """The checks of one record that need neither a verifier nor a tokenizer; None when it is dropped."""
        sender = msg.sender
        if rec.round != msg.round:
            self.drops.drop("round_mismatch", sender, f"record of round {rec.round} in round {msg.round}")
            return None
        if not is_stream_item(rec.provenance, question_stream(self.swarm, sender), rec.round, rec.slot):
            self.drops.drop("replayed_task", sender, f"not its question {rec.slot} of round {rec.round}")
            return None
        if slot_key in self.seen_slots:
            self.drops.drop("duplicate", sender, f"{sender} sent slot {rec.slot} of round {rec.round} again, rewritten")
            return None
        if self.standing.penalized(sender, msg.round):
            self.drops.drop("penalized", sender, "a record of this peer overran the verifier or was forged recently")
            return None
        chars = sum(min(len(t), self.max_chars) for t in rec.completions)
        c = _Candidate(sender, rec, slot_key, digest_of_record, text_digest(rec.provenance, rec.completions), chars)
        if self._duplicate(c, c.text_digest):
            return None
        return c

    def accept(self, messages: list[Received], round: int,
               score: Callable[[list[str], list[float], list[int]], list[float]]) -> list[ScoredGroup]:
        """The round's verified external groups: :meth:`candidates`, then :meth:`verify`. ``score(texts,
        task_scores, lengths)`` gives the training rewards (``lengths``: each completion's token count as this node
        cut it, for a rule on completions at the limit)."""
        return self.verify(self.candidates(messages, round), round, score)

    def verify(self, candidates: list[_Candidate], round: int,
               score: Callable[[list[str], list[float], list[int]], list[float]]) -> list[ScoredGroup]:
        """The ``candidates`` the verifier's workers score within ``tasks.verifier.round_seconds``, with their
        training rewards (the second half of :meth:`accept`)."""
        if not candidates:
            return []
        requests = [ScoreRequest(c.record.family, [extract_answer(t.text) for t in c.completions],
                                 provenance=c.record.provenance, question=c.record.question) for c in candidates]
        results = self.verifier.score_many(requests, deadline=time.monotonic() + self.round_seconds)
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
