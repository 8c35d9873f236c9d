"""Where a question came from, so that a receiver can regenerate it instead of trusting the sender.

A reasoning-gym item is a pure function of (family, dataset config, dataset seed, index). A node attaches a
:class:`Provenance` to each of its own questions; a receiver checks it (:func:`check_provenance`) and
regenerates the item from its **own** config of that family. The receiver then scores against its own answer
and metadata: no peer decides what is correct.

The config is identified by a digest (:func:`config_digest`) of the family name, every field of the family's
reasoning-gym config class with defaults filled in (so ``{}`` and the explicit defaults agree), and the
reasoning-gym version (another version may generate other items from the same seed).

**Which item a node may send.** Training questions all come from one dataset seed per family (``TRAIN_SEED``);
the *index* of a node's question is drawn from (swarm, node id, global round, slot) by SHA-256
(:func:`stream_index`). A receiver recomputes it from the authenticated sender and the record's round and slot
(:func:`is_stream_item`), so a record is bound to the node that drew it and to its round: re-signing another
node's question, or re-publishing an old record under a new round, is detected without any state. The
held-out evaluation set uses other seeds (``EVAL_SEED``), which peers' provenance can never name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from typing import Any


STREAM_STRIDE = 10_000_019  # > any dataset index: seeds this far apart never share an item
DATASET_SIZE = STREAM_STRIDE - 1  # the virtual size every training dataset is created with
TRAIN_SEED = STREAM_STRIDE  # the dataset seed of every training question (items TRAIN_SEED + index)
EVAL_SEED = 2**62 + 11  # the held-out set's seeds: far from TRAIN_SEED's items (Random() ignores the sign)

try:
    REASONING_GYM_VERSION = importlib_metadata.version("reasoning-gym")
except importlib_metadata.PackageNotFoundError:  # pragma: no cover - installed from a source tree
    REASONING_GYM_VERSION = "unknown"


@dataclass(frozen=True)
class Provenance:
    """The recipe of one question: reasoning-gym family, the dataset's seed, the item's index, config digest."""

    family: str
    seed: int
    index: int
    config: str  # config_digest() of the sender's config of this family

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Any) -> "Provenance | None":
        """A provenance from its JSON form, or None when the shape or a type is wrong."""
        if not isinstance(raw, dict) or set(raw) != {"family", "seed", "index", "config"}:
            return None
        family, seed, index, config = raw["family"], raw["seed"], raw["index"], raw["config"]
        if not isinstance(family, str) or not isinstance(config, str) or len(family) > 128 or len(config) > 128:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (seed, index)):
            return None
        return cls(family, seed, index, config)


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_canonical(v) for v in value), key=repr)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def resolved_config(family: str, config: dict[str, Any]) -> dict[str, Any]:
    """Every field of the family's reasoning-gym config class, defaults filled in; seed and size left out."""
    from reasoning_gym.factory import DATASETS  # here, not at import: reasoning-gym takes seconds to import

    _, config_cls = DATASETS[family]
    instance = config_cls(**config)
    fields = {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}
    fields.pop("seed", None)
    fields.pop("size", None)
    return _canonical(fields)


def config_digest(family: str, config: dict[str, Any]) -> str:
    """A 32-hex-digit digest of (family, resolved config, reasoning-gym version)."""
    blob = json.dumps({"family": family, "config": resolved_config(family, config),
                       "reasoning_gym": REASONING_GYM_VERSION}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:32]


def check_provenance(provenance: Provenance, digests: dict[str, str]) -> tuple[str, str]:
    """``("", "")`` when the receiver may regenerate this item, else ``(drop reason, detail)``.

    ``digests`` maps each family the receiver scores to its own config digest. Reasons: ``foreign_family``
    (a family the receiver does not score), ``foreign_config`` (another config of the family),
    ``bad_provenance`` (a seed other than ``TRAIN_SEED``, or an index outside the dataset).
    """
    if provenance.family not in digests:
        return "foreign_family", provenance.family[:32]
    if provenance.config != digests[provenance.family]:
        return "foreign_config", f"{provenance.family}: {provenance.config[:12]}"
    seed, index = provenance.seed, provenance.index
    if not 0 <= index < DATASET_SIZE:
        return "bad_provenance", f"index {index}"
    if seed != TRAIN_SEED:
        return "bad_provenance", f"seed {seed}"
    return "", ""


def stream_draw(stream: str, round: int, slot: int, purpose: str) -> int:
    """A 64-bit number drawn from (stream, round, slot, purpose) with SHA-256: the same on every machine,
    and unpredictable from any other (stream, round, slot)."""
    blob = "\x1f".join((stream, str(round), str(slot), purpose)).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big")


def stream_index(stream: str, round: int, slot: int, family: str) -> int:
    """The dataset index of question ``slot`` of ``round`` in ``stream`` when that question is of ``family``."""
    return stream_draw(stream, round, slot, "index:" + family) % DATASET_SIZE


def is_stream_item(provenance: Provenance, stream: str, round: int, slot: int) -> bool:
    """Whether ``provenance`` is the question that ``stream`` draws at (``round``, ``slot``) for its family."""
    return provenance.seed == TRAIN_SEED and provenance.index == stream_index(stream, round, slot, provenance.family)
