"""reasoning-gym as a task source: a weighted mix of task families, each with its own config.

Each node draws its own question stream, named by a string (the swarm's name and the node's id), so nodes do
not see identical batches. Question ``slot`` of global round ``g`` is a pure function of (stream, g, slot): its
family is drawn by weight and its index in the family's training dataset by SHA-256
(:func:`~swarmlm.tasks.provenance.stream_index`), so the stream needs no state to resume and a receiver can tell
whether a record's question really is its sender's for that round. The held-out evaluation set is generated
from seeds no training question uses. Every question carries its :class:`~swarmlm.tasks.provenance.Provenance`
(family, dataset seed, index, config digest), from which a receiving node regenerates it.

Only families that passed the scorer audit (:mod:`swarmlm.verify.scorer_audit`) can be in a mix. Scoring is
:mod:`swarmlm.verify`'s: a node scores through :class:`swarmlm.verify.verifier.Verifier`, in bounded workers;
:func:`swarmlm.verify.verifier.score_in_process` scores trusted answers in this process, without limits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from swarmlm.config import StrictModel, parse_list
from swarmlm.tasks.provenance import DATASET_SIZE as _DATASET_SIZE
from swarmlm.tasks.provenance import (EVAL_SEED, STREAM_STRIDE, TRAIN_SEED, Provenance, config_digest, stream_draw,
                                      stream_index)
from swarmlm.verify.scorer_audit import allowed_families, audit_of

__all__ = ["EVAL_SEED", "STREAM_STRIDE", "AllowedFamily", "FamilySpec", "Question", "TaskConfig", "TaskSource",
           "VerifierConfig", "eval_questions"]


def _known_family(name: str) -> str:
    # reasoning-gym is imported here, when a config naming a family is validated for a run, not when this module is
    # imported (it takes seconds, and the command line's --help needs only the fields)
    from reasoning_gym.factory import DATASETS

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


def _preset(name: str, **config: Any) -> FamilySpec:
    """A family of the built-in mixes below, built without validation so that importing this module does not import
    reasoning-gym (tests/test_config.py checks that every preset validates)."""
    return FamilySpec.model_construct(name=name, config=config)


# The default mix: one-digit arithmetic, which a model of a few million parameters partly learns in a 10-minute warm
# start (greedy pass@1 about 0.3, with 60% of 8-completion groups holding both a right and a wrong answer: the groups
# GRPO learns from).
ARITHMETIC_FAMILIES = [
    _preset("chain_sum", min_terms=2, max_terms=2, min_digits=1, max_digits=1),
    _preset("basic_arithmetic", min_terms=2, max_terms=2, min_digits=1, max_digits=1, operators=["+", "-"],
            allow_parentheses=False, allow_negation=False),
    _preset("products", min_terms=2, max_terms=2, min_digits=1, max_digits=1),
]

# The arithmetic mix and reversing short words. Such a model does not learn spell_backward in its warm start (greedy
# pass@1 0.00-0.02 after 1000 steps), so a quarter of its groups carry no signal.
EASY_FAMILIES = ARITHMETIC_FAMILIES + [_preset("spell_backward", min_word_len=3, max_word_len=4)]

# The nine families of the SAPO paper, sampled uniformly, with reasoning-gym's default settings.
PAPER_FAMILIES = [
    _preset(n) for n in (
        "base_conversion", "basic_arithmetic", "arc_1d", "bf", "propositional_logic",
        "fraction_simplification", "decimal_arithmetic", "calendar_arithmetic", "binary_matrix")
]

TASK_PRESETS: dict[str, list[FamilySpec]] = {"arithmetic": ARITHMETIC_FAMILIES, "easy": EASY_FAMILIES,
                                              "paper": PAPER_FAMILIES}


class AllowedFamily(StrictModel):
    """A family this node scores for its peers without drawing questions from it."""

    name: str = Field(description="reasoning-gym dataset name")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset config peers must use (regenerated from it)")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        return _known_family(name)


class VerifierConfig(StrictModel):
    """Limits of the verifier (:class:`swarmlm.verify.verifier.Verifier`): every score and every regeneration
    runs in a pool of worker processes under these limits."""

    workers: int = Field(2, ge=1, le=32, description="scoring worker processes (started once, replaced when they overrun)")
    cpu_seconds: float = Field(1.0, gt=0, le=600, description="CPU time scoring one group's answers may use")
    generate_cpu_seconds: float = Field(
        5.0, gt=0, le=600, description="CPU time regenerating a peer's question (then scoring its group) may use")
    wall_seconds: float = Field(10.0, gt=0, le=3600, description="wall-clock time one job may take before its worker is killed")
    memory_mb: int = Field(512, ge=64, le=65536, description="address space (MiB) a worker may add to its start-up size")
    start_timeout: float = Field(180.0, gt=0, description="seconds a worker may take to start (imports, datasets)")
    item_cache: int = Field(4096, ge=0, le=1_000_000, description="regenerated items the node keeps (by provenance)")
    round_seconds: float = Field(10.0, gt=0, le=3600, description=(
        "wall-clock seconds one round may spend verifying peers' records; those not verified by then are dropped "
        "as verify_budget (the node's own completions are always scored)"))


def _check_audited(name: str) -> None:
    audit = audit_of(name)
    if audit.verdict == "refused":
        raise ValueError(f"family '{name}' is refused by the scorer audit ({audit.finding}); "
                         f"allowed families: {', '.join(allowed_families())}")


class TaskConfig(StrictModel):
    """Which tasks a node trains and evaluates on, and which families it verifies."""

    preset: Literal["arithmetic", "easy", "paper"] = Field(
        "arithmetic", description="named task mix, used when 'families' is empty")
    families: list[FamilySpec] = Field(default_factory=list, description="explicit mix; overrides 'preset'")
    draw_families: list[str] = Field(default_factory=list, description=(
        "the families of the mix this node draws its own questions from, by their weights (a specialist node); "
        "empty = all of them. The node still evaluates on, scores and accepts from peers every family of the mix"))
    _draw_families = field_validator("draw_families", mode="before")(parse_list)
    eval_size: int = Field(256, ge=1, description="questions in the fixed held-out evaluation set. Near pass@1 0.35 "
                           "the standard error of 256 is 0.03, of 64 0.06")
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
        for name in self.draw_families:
            if name not in names:
                raise ValueError(f"draw_families: '{name}' is not in the task mix; allowed: {', '.join(names)}")
        if len(set(self.draw_families)) != len(self.draw_families):
            raise ValueError(f"draw_families: a family appears twice: {', '.join(self.draw_families)}")
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
    import reasoning_gym

    return reasoning_gym.create_dataset(spec.name, seed=seed, size=size, **spec.config)


def _to_question(family: str, item: dict[str, Any], provenance: Provenance | None = None) -> Question:
    return Question(family=family, question=item["question"], answer=item.get("answer"),
                    metadata=dict(item.get("metadata") or {}), provenance=provenance)


class TaskSource:
    """A node's stream of questions (``stream`` names it, e.g. ``"<swarm>/<node id>"``) and its in-process scorer."""

    def __init__(self, config: TaskConfig, stream: str):
        self.config = config
        self.stream = stream
        self.families = config.resolved_families()
        drawn = [f for f in self.families if f.name in config.draw_families] if config.draw_families else self.families
        total = sum(f.weight for f in drawn)
        self._drawn = drawn
        self._cumulative = [sum(f.weight for f in drawn[: i + 1]) / total for i in range(len(drawn))]
        self._datasets = {f.name: _create(f, seed=TRAIN_SEED) for f in self.families}
        self._digests = {f.name: config_digest(f.name, f.config) for f in self.families}
        self._scored = config.scored_families()
        self._scoring_datasets: dict[str, Any] = {}

    def family_at(self, round: int, slot: int) -> str:
        """The family of question ``slot`` of global round ``round``, drawn by weight among ``draw_families``
        (without generating it)."""
        u = stream_draw(self.stream, round, slot, "family") / 2.0**64
        return next((f for f, edge in zip(self._drawn, self._cumulative) if u < edge), self._drawn[-1]).name

    def question(self, round: int, slot: int) -> Question:
        """Question ``slot`` of global round ``round``: the family by weight, then the family's item."""
        family = self.family_at(round, slot)
        index = stream_index(self.stream, round, slot, family)
        provenance = Provenance(family, TRAIN_SEED, index, self._digests[family])
        return _to_question(family, self._datasets[family][index], provenance)

    def sample(self, n: int, round: int, first_slot: int = 0) -> list[Question]:
        """Questions ``first_slot … first_slot + n - 1`` of ``round``."""
        return [self.question(round, slot) for slot in range(first_slot, first_slot + n)]

    def dataset(self, family: str) -> Any:
        """The reasoning-gym dataset an answer of ``family`` is scored against: the training dataset for a family of
        the mix, one made on first use for an allowed family outside it. Raises ValueError for a family this node
        does not score. (Scoring is :mod:`swarmlm.verify`'s.)"""
        if family not in self._scored:
            raise ValueError(f"family '{family}' is not scored by this node")
        dataset = self._datasets.get(family) or self._scoring_datasets.get(family)
        if dataset is None:
            import reasoning_gym

            dataset = self._scoring_datasets[family] = reasoning_gym.create_dataset(
                family, seed=0, size=_DATASET_SIZE, **self._scored[family])
        return dataset

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
