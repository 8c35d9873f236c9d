"""Shared rollout records: the only thing SAPO nodes send each other, and the checks on what arrives.

A node publishes one *message* per round: a JSON object ``{"v": 2, "records": [...]}`` whose records each
carry ``(node_id, round, slot, family, question, provenance, completions, model)``. Neither rewards nor
reference answers nor task metadata are sent: a receiver regenerates the question from its provenance and
scores it against its own answer (:mod:`swarmlm.verify.verifier`). Every record from the network is checked
field by field against :class:`RecordLimits`; a bad record is dropped with a reason (counted per reason) and
never raises. Text that is not valid Unicode (a lone surrogate is valid JSON) is refused here, before any
tokenizer sees it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from swarmlm.config import StrictModel
from swarmlm.tasks.provenance import Provenance
from swarmlm.verify.text_hygiene import invalid_unicode

log = logging.getLogger(__name__)

WIRE_VERSION = 2
_RECORD_KEYS = {"node_id", "round", "slot", "family", "question", "provenance", "completions", "model"}


class RecordLimits(StrictModel):
    """What a node accepts from the network."""

    max_message_bytes: int = Field(2_000_000, ge=1024, le=3_500_000, description=(
        "largest accepted message (all records of one peer's round); at most 3.5 MB, so that one DHT reply, which "
        "carries one message, stays under hivemind's 4 MiB limit"))
    max_records_per_message: int = Field(64, ge=1, description="most records one peer may send per round")
    max_question_chars: int = Field(8192, ge=16, description="longest accepted question")
    max_completion_chars: int = Field(8192, ge=1, description="longest accepted completion")
    max_slot: int = Field(4096, ge=1, description="records' slots (question numbers within a round) must be below this")
    min_group_size: int = Field(2, ge=1, description="fewest completions per record (a group of one has no advantage)")
    max_group_size: int = Field(64, ge=1, description="most completions per record")
    group_sizes: list[int] = Field(default_factory=list, description="if set, the only accepted group sizes L")
    max_id_chars: int = Field(128, ge=1, description="longest accepted node id, task family or model name")
    max_round_records: int = Field(256, ge=1, description="most records accepted per round from all peers together")
    max_round_bytes: int = Field(16_000_000, ge=1024, description="most message bytes read per round from all peers together")
    max_sender_records: int = Field(64, ge=1, description="most records accepted per round from one peer")
    max_round_chars: int = Field(1_000_000, ge=1024, description=(
        "most completion characters tokenized per round from all peers together (each completion is first cut to "
        "what max_new_tokens tokens can span)"))


@dataclass
class RolloutRecord:
    """One question and the L completions a node generated for it. ``slot`` numbers the question within the
    sender's round (its stream draws question ``slot`` of ``round``); ``provenance`` says how to regenerate it."""

    node_id: str
    round: int
    slot: int
    family: str
    question: str
    provenance: Provenance
    completions: list[str]
    model: str

    def to_json(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "round": self.round, "slot": self.slot, "family": self.family,
                "question": self.question, "provenance": self.provenance.to_json(), "completions": self.completions,
                "model": self.model}


ROUTINE_DROPS = frozenset({"duplicate"})


@dataclass
class DropCounter:
    """Reasons records or messages were dropped, and how often."""

    counts: Counter = field(default_factory=Counter)

    def drop(self, reason: str, sender: str, detail: str = "") -> None:
        self.counts[reason] += 1
        # A duplicate (the same sender's, or this node's own, completions for the same question again) is logged at
        # INFO with the senders involved: rare among honest nodes, but what a copier's attempts look like.
        level = logging.INFO if reason in ROUTINE_DROPS else logging.WARNING
        log.log(level, "dropped record from %s: %s%s", printable(sender, 64), reason,
                f" ({printable(detail, 160)})" if detail else "")

    def total(self) -> int:
        return sum(self.counts.values())


def printable(text: str, limit: int) -> str:
    """Peer text made safe to log: at most ``limit`` characters, anything that is not valid Unicode escaped."""
    return str(text)[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def encode_message(records: list[RolloutRecord]) -> bytes:
    return json.dumps({"v": WIRE_VERSION, "records": [r.to_json() for r in records]}, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")


def round_message(records: list[RolloutRecord], limits: RecordLimits) -> bytes:
    """One message holding as many of a round's records as ``limits`` allow, the newest kept (``records`` oldest
    first): a node that takes several steps within one global round republishes them all under its round key."""
    kept = records[-limits.max_records_per_message:]
    payload = encode_message(kept)
    while len(kept) > 1 and len(payload) > limits.max_message_bytes:
        kept = kept[1:]
        payload = encode_message(kept)
    return payload


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_record(raw: Any, limits: RecordLimits, *, sender: str, rounds: tuple[int, int],
                 known_family) -> tuple[RolloutRecord | None, str, str]:
    """Validate one decoded record. Returns ``(record, "", "")`` or ``(None, reason, detail)``.

    ``rounds`` is the inclusive window of acceptable rounds; ``known_family(name)`` says whether this
    node's verifier scores the family (else ``foreign_family``).
    """
    if not isinstance(raw, dict):
        return None, "not_an_object", type(raw).__name__
    keys = set(raw)
    if keys != _RECORD_KEYS:
        missing, extra = sorted(_RECORD_KEYS - keys), sorted(k for k in keys - _RECORD_KEYS if isinstance(k, str))
        return None, "bad_fields", f"missing={missing} unexpected={[k[:32] for k in extra[:5]]}"
    where = invalid_unicode(raw)
    if where is not None:
        return None, "invalid_unicode", where[:64] if not invalid_unicode(where) else "?"
    node_id, rnd, slot, family = raw["node_id"], raw["round"], raw["slot"], raw["family"]
    if not isinstance(node_id, str) or not 0 < len(node_id) <= limits.max_id_chars:
        return None, "bad_type", "node_id"
    if node_id != sender:
        return None, "forged_node_id", f"record claims {node_id[:32]!r}"
    if not _is_int(rnd):
        return None, "bad_type", "round"
    if rnd < rounds[0]:
        return None, "stale_round", f"round {rnd} < {rounds[0]}"
    if rnd > rounds[1]:
        return None, "future_round", f"round {rnd} > {rounds[1]}"
    if not _is_int(slot) or not 0 <= slot < limits.max_slot:
        return None, "bad_type", "slot"
    for name, limit in (("family", limits.max_id_chars), ("model", limits.max_id_chars), ("question", limits.max_question_chars)):
        value = raw[name]
        if not isinstance(value, str):
            return None, "bad_type", name
        if len(value) > limit:
            return None, "oversized", name
    provenance = Provenance.from_json(raw["provenance"])
    if provenance is None or provenance.family != family:
        return None, "bad_provenance", "shape" if provenance is None else "family differs"
    completions = raw["completions"]
    if not isinstance(completions, list):
        return None, "bad_type", "completions"
    size = len(completions)
    if size < limits.min_group_size or size > limits.max_group_size or (limits.group_sizes and size not in limits.group_sizes):
        return None, "wrong_group_size", f"L={size}"
    for c in completions:
        if not isinstance(c, str):
            return None, "bad_type", "completion"
        if len(c) > limits.max_completion_chars:
            return None, "oversized", "completion"
    if not known_family(family):
        return None, "foreign_family", family[:32]
    return RolloutRecord(node_id, rnd, slot, family, raw["question"], provenance, list(completions), raw["model"]), "", ""


def decode_message(payload: Any, limits: RecordLimits, *, sender: str, rounds: tuple[int, int], known_family,
                   drops: DropCounter) -> list[RolloutRecord]:
    """All valid records of one peer's message; everything else is counted in ``drops`` and logged."""
    if not isinstance(payload, (bytes, bytearray)):
        drops.drop("bad_message", sender, f"payload is {type(payload).__name__}")
        return []
    if len(payload) > limits.max_message_bytes:
        drops.drop("oversized_message", sender, f"{len(payload)} bytes")
        return []
    try:
        message = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        drops.drop("malformed", sender, str(err)[:80])
        return []
    if not isinstance(message, dict) or message.get("v") != WIRE_VERSION or not isinstance(message.get("records"), list):
        drops.drop("bad_message", sender, f"expected {{'v': {WIRE_VERSION}, 'records': [...]}}")
        return []
    raws = message["records"]
    if len(raws) > limits.max_records_per_message:
        drops.drop("too_many_records", sender, f"{len(raws)} records")
        return []
    accepted = []
    for raw in raws:
        record, reason, detail = check_record(raw, limits, sender=sender, rounds=rounds, known_family=known_family)
        if record is None:
            drops.drop(reason, sender, detail)
        else:
            accepted.append(record)
    return accepted
