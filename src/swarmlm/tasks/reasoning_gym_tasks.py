"""reasoning-gym as a task source: a weighted mix of task families, each with its own config.

Each node draws its own question stream (``node_seed``), so nodes do not see identical batches; the
held-out evaluation set is generated from a seed that no training stream uses. reasoning-gym seeds
item ``i`` of a dataset from ``seed + i``, so stream seeds are spaced ``STREAM_STRIDE`` apart. Every question
carries its :class:`~swarmlm.tasks.provenance.Provenance` (family, dataset seed, index, config digest), from
which a receiving node regenerates it.

Only families that passed the scorer audit (:mod:`swarmlm.tasks.scorer_audit`) can be in a mix; they are scored
with :func:`swarmlm.tasks.safe_scorers.scorer_for`. A node scores through :class:`swarmlm.tasks.verifier.Verifier`,
which adds time and memory limits; :meth:`TaskSource.score` scores in this process, without them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

import reasoning_gym
from pydantic import Field, field_validator, model_validator
from reasoning_gym.factory import DATASETS

from swarmlm.config import StrictModel
from swarmlm.tasks.provenance import DATASET_SIZE as _DATASET_SIZE
from swarmlm.tasks.provenance import EVAL_SEED, STREAM_STRIDE, Provenance, config_digest
from swarmlm.tasks.safe_scorers import scorer_for
from swarmlm.tasks.scorer_audit import allowed_families, audit_of

__all__ = ["EVAL_SEED", "STREAM_STRIDE", "AllowedFamily", "FamilySpec", "Question", "TaskConfig", "TaskSource",
           "VerifierConfig", "eval_questions"]


def _known_family(name: str) -> str:
    if name not in DATASETS:
        raise ValueError(f"unknown reasoning-gym dataset '{name}'; some known ones: {', '.join(sorted(DATASETS)[:12])}, …")
    return name


class FamilySpec(StrictModel):
    """One reasoning-gym dataset in the mix."""

    name: str = Field(description="reasoning-gym dataset name")
    weight: float = Field(1.0, gt=0, description="relative sampling weight")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own config fields")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        return _known_family(name)


# Settings a model of a few million parameters can partly learn after a short warm start.
EASY_FAMILIES = [
    FamilySpec(name="chain_sum", config=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
    FamilySpec(name="basic_arithmetic", config=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1,
                                                    operators=["+", "-"], allow_parentheses=False, allow_negation=False)),
    FamilySpec(name="products", config=dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)),
    FamilySpec(name="spell_backward", config=dict(min_word_len=3, max_word_len=4)),
]

# The nine families of the SAPO paper, sampled uniformly, with reasoning-gym's default settings.
PAPER_FAMILIES = [
    FamilySpec(name=n) for n in (
        "base_conversion", "basic_arithmetic", "arc_1d", "bf", "propositional_logic",
        "fraction_simplification", "decimal_arithmetic", "calendar_arithmetic", "binary_matrix")
]

TASK_PRESETS: dict[str, list[FamilySpec]] = {"easy": EASY_FAMILIES, "paper": PAPER_FAMILIES}


class AllowedFamily(StrictModel):
    """A family this node scores for its peers without drawing questions from it."""

    name: str = Field(description="reasoning-gym dataset name")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset config peers must use (regenerated from it)")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        return _known_family(name)


class VerifierConfig(StrictModel):
    """Limits of the verifier (:class:`swarmlm.tasks.verifier.Verifier`): every score and every regeneration
    runs in a pool of worker processes under these limits."""

    workers: int = Field(2, ge=1, le=32, description="scoring worker processes (started once, replaced when they overrun)")
    cpu_seconds: float = Field(1.0, gt=0, le=600, description="CPU time scoring one group's answers may use")
    generate_cpu_seconds: float = Field(
        5.0, gt=0, le=600, description="CPU time regenerating a peer's question (then scoring its group) may use")
    wall_seconds: float = Field(10.0, gt=0, le=3600, description="wall-clock time one job may take before its worker is killed")
    memory_mb: int = Field(512, ge=64, le=65536, description="address space (MiB) a worker may add to its start-up size")
    start_timeout: float = Field(180.0, gt=0, description="seconds a worker may take to start (imports, datasets)")
    dataset_cache: int = Field(32, ge=1, le=4096, description="regeneration datasets (family, seed) each worker keeps")
    item_cache: int = Field(4096, ge=0, le=1_000_000, description="regenerated items the node keeps (by provenance)")


def _check_audited(name: str) -> None:
    audit = audit_of(name)
    if audit.verdict == "refused":
        raise ValueError(f"family '{name}' is refused by the scorer audit ({audit.finding}); "
                         f"allowed families: {', '.join(allowed_families())}")


class TaskConfig(StrictModel):
    """Which tasks a node trains and evaluates on, and which families it verifies."""

    preset: Literal["easy", "paper"] = Field("easy", description="named task mix, used when 'families' is empty")
    families: list[FamilySpec] = Field(default_factory=list, description="explicit mix; overrides 'preset'")
    eval_size: int = Field(64, ge=1, description="questions in the fixed held-out evaluation set")
    allow_families: list[AllowedFamily] = Field(
        default_factory=list, description="families scored for peers besides the node's own mix (name and config); "
        "records of any other family are dropped as foreign_family")
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)

    @model_validator(mode="after")
    def _audited(self) -> "TaskConfig":
        names = [f.name for f in self.resolved_families()]
        if len(set(names)) != len(names):
            raise ValueError(f"a family appears twice in the task mix: {', '.join(names)}")
        for name in names + [f.name for f in self.allow_families]:
            _check_audited(name)
        for extra in self.allow_families:
            if extra.name in names:
                raise ValueError(f"allow_families: '{extra.name}' is already in the task mix")
        return self

    def resolved_families(self) -> list[FamilySpec]:
        return list(self.families) if self.families else list(TASK_PRESETS[self.preset])

    def scored_families(self) -> dict[str, dict[str, Any]]:
        """Every family this node scores, with the dataset config it scores and regenerates with."""
        out = {f.name: dict(f.config) for f in self.resolved_families()}
        out.update({f.name: dict(f.config) for f in self.allow_families})
        return out


@dataclass
class Question:
    """One verifiable question: the dataset entry plus the family it came from."""

    family: str
    question: str
    answer: str | None
    metadata: dict[str, Any]
    provenance: Provenance | None = None  # how any node regenerates this question

    @property
    def entry(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "metadata": self.metadata}


def _create(spec: FamilySpec, seed: int, size: int = _DATASET_SIZE):
    return reasoning_gym.create_dataset(spec.name, seed=seed, size=size, **spec.config)


def _to_question(family: str, item: dict[str, Any], provenance: Provenance | None = None) -> Question:
    return Question(family=family, question=item["question"], answer=item.get("answer"),
                    metadata=dict(item.get("metadata") or {}), provenance=provenance)


class TaskSource:
    """A node's stream of questions and its verifier."""

    def __init__(self, config: TaskConfig, node_seed: int):
        self.config = config
        self.families = config.resolved_families()
        self._weights = [f.weight for f in self.families]
        self._rng = random.Random(node_seed)
        base = (node_seed * len(self.families) + 1) * STREAM_STRIDE
        self._seeds = {f.name: base + i * STREAM_STRIDE for i, f in enumerate(self.families)}
        self._datasets = {f.name: _create(f, seed=self._seeds[f.name]) for f in self.families}
        self._digests = {f.name: config_digest(f.name, f.config) for f in self.families}
        self._next_index = {f.name: 0 for f in self.families}
        self._scored = config.scored_families()
        self._scoring_datasets: dict[str, Any] = {}

    def state(self) -> dict[str, Any]:
        return {"rng": self._rng.getstate(), "next_index": dict(self._next_index)}

    def load_state(self, state: dict[str, Any]) -> None:
        rng_state = state["rng"]
        self._rng.setstate((rng_state[0], tuple(rng_state[1]), rng_state[2]))
        self._next_index.update(state["next_index"])

    def sample(self, n: int) -> list[Question]:
        """The next ``n`` questions: each family chosen by weight, then the family's next item."""
        out = []
        for _ in range(n):
            family = self._rng.choices(self.families, weights=self._weights)[0].name
            idx = self._next_index[family]
            self._next_index[family] = idx + 1
            provenance = Provenance(family, self._seeds[family], idx, self._digests[family])
            out.append(_to_question(family, self._datasets[family][idx], provenance))
        return out

    def score(self, family: str, answer: str | None, entry: dict[str, Any]) -> float:
        """Reward for ``answer`` with this node's safe scorer of ``family``, in this process (no time or memory
        limit: :class:`~swarmlm.tasks.verifier.Verifier` adds them). Raises ValueError for a family this node does
        not score."""
        if family not in self._scored:
            raise ValueError(f"family '{family}' is not scored by this node")
        dataset = self._datasets.get(family) or self._scoring_datasets.get(family)
        if dataset is None:
            dataset = self._scoring_datasets[family] = reasoning_gym.create_dataset(
                family, seed=0, size=_DATASET_SIZE, **self._scored[family])
        return float(scorer_for(family)(dataset, answer, entry))

    def can_score(self, family: str) -> bool:
        """Whether ``family`` is in this node's mix or its ``allow_families``."""
        return family in self._scored


def eval_questions(config: TaskConfig) -> list[Question]:
    """The fixed held-out set: ``eval_size`` questions, families interleaved by weight, from ``EVAL_SEED``."""
    families = config.resolved_families()
    rng = random.Random(EVAL_SEED)
    picks = rng.choices(range(len(families)), weights=[f.weight for f in families], k=config.eval_size)
    datasets = [_create(f, seed=EVAL_SEED + i * STREAM_STRIDE, size=config.eval_size) for i, f in enumerate(families)]
    counters = [0] * len(families)
    out = []
    for k in picks:
        spec = families[k]
        provenance = Provenance(spec.name, EVAL_SEED + k * STREAM_STRIDE, counters[k], config_digest(spec.name, spec.config))
        out.append(_to_question(spec.name, datasets[k][counters[k]], provenance))
        counters[k] += 1
    return out
