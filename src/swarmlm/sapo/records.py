"""Shared rollout records: the only thing SAPO nodes send each other, and the checks on what arrives.

A node publishes one *message* per round: a JSON object ``{"v": 1, "records": [...]}`` whose records
each carry ``(node_id, round, family, question, answer, metadata, completions, model)``. Rewards are
never sent. Every record from the network is checked field by field against :class:`RecordLimits`;
a bad record is dropped with a reason (counted per reason) and never raises.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import Field

from swarmlm.config import StrictModel

log = logging.getLogger(__name__)

WIRE_VERSION = 1
_RECORD_KEYS = {"node_id", "round", "family", "question", "answer", "metadata", "completions", "model"}


class RecordLimits(StrictModel):
    """What a node accepts from the network."""

    max_message_bytes: int = Field(2_000_000, ge=1024, description="largest accepted message (all records of a round)")
    max_records_per_message: int = Field(64, ge=1, description="most records one peer may send per round")
    max_question_chars: int = Field(8192, ge=16, description="longest accepted question")
    max_answer_chars: int = Field(2048, ge=1, description="longest accepted reference answer")
    max_completion_chars: int = Field(8192, ge=1, description="longest accepted completion")
    max_metadata_bytes: int = Field(32_768, ge=2, description="largest accepted task metadata, as JSON")
    min_group_size: int = Field(2, ge=1, description="fewest completions per record (a group of one has no advantage)")
    max_group_size: int = Field(64, ge=1, description="most completions per record")
    group_sizes: list[int] = Field(default_factory=list, description="if set, the only accepted group sizes L")
    max_id_chars: int = Field(128, ge=1, description="longest accepted node id, task family or model name")


@dataclass
class RolloutRecord:
    """One question and the L completions a node generated for it."""

    node_id: str
    round: int
    family: str
    question: str
    answer: str | None
    metadata: dict[str, Any]
    completions: list[str]
    model: str

    @property
    def entry(self) -> dict[str, Any]:
        """The reasoning-gym entry a verifier scores against."""
        return {"question": self.question, "answer": self.answer, "metadata": self.metadata}


@dataclass
class DropCounter:
    """Reasons records or messages were dropped, and how often."""

    counts: Counter = field(default_factory=Counter)

    def drop(self, reason: str, sender: str, detail: str = "") -> None:
        self.counts[reason] += 1
        log.warning("dropped record from %s: %s%s", sender[:64], reason, f" ({detail})" if detail else "")

    def total(self) -> int:
        return sum(self.counts.values())


def encode_message(records: list[RolloutRecord]) -> bytes:
    return json.dumps({"v": WIRE_VERSION, "records": [asdict(r) for r in records]}, ensure_ascii=False,
                      separators=(",", ":")).encode("utf-8")


def _is_json_scalar_tree(value: Any, depth: int = 0) -> bool:
    if depth > 16:
        return False
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json_scalar_tree(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_scalar_tree(v, depth + 1) for k, v in value.items())
    return False


def check_record(raw: Any, limits: RecordLimits, *, sender: str, rounds: tuple[int, int],
                 known_family) -> tuple[RolloutRecord | None, str, str]:
    """Validate one decoded record. Returns ``(record, "", "")`` or ``(None, reason, detail)``.

    ``rounds`` is the inclusive window of acceptable rounds; ``known_family(name)`` says whether this
    node's verifier can score the family.
    """
    if not isinstance(raw, dict):
        return None, "not_an_object", type(raw).__name__
    keys = set(raw)
    if keys != _RECORD_KEYS:
        missing, extra = sorted(_RECORD_KEYS - keys), sorted(keys - _RECORD_KEYS)
        return None, "bad_fields", f"missing={missing} unexpected={extra[:5]}"
    node_id, rnd, family = raw["node_id"], raw["round"], raw["family"]
    if not isinstance(node_id, str) or not 0 < len(node_id) <= limits.max_id_chars:
        return None, "bad_type", "node_id"
    if node_id != sender:
        return None, "forged_node_id", f"record claims {node_id[:32]!r}"
    if not isinstance(rnd, int) or isinstance(rnd, bool):
        return None, "bad_type", "round"
    if rnd < rounds[0]:
        return None, "stale_round", f"round {rnd} < {rounds[0]}"
    if rnd > rounds[1]:
        return None, "future_round", f"round {rnd} > {rounds[1]}"
    for name, limit in (("family", limits.max_id_chars), ("model", limits.max_id_chars), ("question", limits.max_question_chars)):
        value = raw[name]
        if not isinstance(value, str):
            return None, "bad_type", name
        if len(value) > limit:
            return None, "oversized", name
    answer = raw["answer"]
    if answer is not None and not isinstance(answer, str):
        return None, "bad_type", "answer"
    if answer is not None and len(answer) > limits.max_answer_chars:
        return None, "oversized", "answer"
    metadata = raw["metadata"]
    if not isinstance(metadata, dict) or not _is_json_scalar_tree(metadata):
        return None, "bad_type", "metadata"
    if len(json.dumps(metadata)) > limits.max_metadata_bytes:
        return None, "oversized", "metadata"
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
        return None, "unknown_family", family[:32]
    return RolloutRecord(node_id, rnd, family, raw["question"], answer, metadata, list(completions), raw["model"]), "", ""


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
        drops.drop("bad_message", sender, "expected {'v': 1, 'records': [...]}")
        return []
    raws = message["records"]
    if len(raws) > limits.max_records_per_message:
        drops.drop("flood", sender, f"{len(raws)} records")
        return []
    accepted = []
    for raw in raws:
        record, reason, detail = check_record(raw, limits, sender=sender, rounds=rounds, known_family=known_family)
        if record is None:
            drops.drop(reason, sender, detail)
        else:
            accepted.append(record)
    return accepted
