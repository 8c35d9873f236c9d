"""reasoning-gym as a task source: a weighted mix of task families, each with its own config.

Each node draws its own question stream (``node_seed``), so nodes do not see identical batches; the
held-out evaluation set is generated from a seed that no training stream uses. reasoning-gym seeds
item ``i`` of a dataset from ``seed + i``, so stream seeds are spaced ``STREAM_STRIDE`` apart.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Literal

import reasoning_gym
from pydantic import Field, field_validator
from reasoning_gym.factory import DATASETS

from swarmlm.config import StrictModel

STREAM_STRIDE = 10_000_019  # > any dataset index a run will reach
EVAL_SEED = 2**62 + 11  # far above any training stream (Random() ignores the sign, so no negatives)
_DATASET_SIZE = STREAM_STRIDE - 1

ScoreFn = Callable[[str | None, dict[str, Any]], float]


class FamilySpec(StrictModel):
    """One reasoning-gym dataset in the mix."""

    name: str = Field(description="reasoning-gym dataset name")
    weight: float = Field(1.0, gt=0, description="relative sampling weight")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own config fields")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in DATASETS:
            raise ValueError(f"unknown reasoning-gym dataset '{name}'; some known ones: {', '.join(sorted(DATASETS)[:12])}, …")
        return name


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


class TaskConfig(StrictModel):
    """Which tasks a node trains and evaluates on."""

    preset: Literal["easy", "paper"] = Field("easy", description="named task mix, used when 'families' is empty")
    families: list[FamilySpec] = Field(default_factory=list, description="explicit mix; overrides 'preset'")
    eval_size: int = Field(64, ge=1, description="questions in the fixed held-out evaluation set")

    def resolved_families(self) -> list[FamilySpec]:
        return list(self.families) if self.families else list(TASK_PRESETS[self.preset])


@dataclass
class Question:
    """One verifiable question: the dataset entry plus the family it came from."""

    family: str
    question: str
    answer: str | None
    metadata: dict[str, Any]

    @property
    def entry(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "metadata": self.metadata}


def _create(spec: FamilySpec, seed: int, size: int = _DATASET_SIZE):
    return reasoning_gym.create_dataset(spec.name, seed=seed, size=size, **spec.config)


@lru_cache(maxsize=256)
def _registered_scorer(name: str) -> ScoreFn:
    return reasoning_gym.get_score_answer_fn(name)


def _to_question(family: str, item: dict[str, Any]) -> Question:
    return Question(family=family, question=item["question"], answer=item.get("answer"), metadata=dict(item.get("metadata") or {}))


class TaskSource:
    """A node's stream of questions and its verifier."""

    def __init__(self, config: TaskConfig, node_seed: int):
        self.config = config
        self.families = config.resolved_families()
        self._weights = [f.weight for f in self.families]
        self._rng = random.Random(node_seed)
        base = (node_seed * len(self.families) + 1) * STREAM_STRIDE
        self._datasets = {f.name: _create(f, seed=base + i * STREAM_STRIDE) for i, f in enumerate(self.families)}
        self._next_index = {f.name: 0 for f in self.families}

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
            out.append(_to_question(family, self._datasets[family][idx]))
        return out

    def score(self, family: str, answer: str | None, entry: dict[str, Any]) -> float:
        """Reward for ``answer`` with this node's verifier; families outside the mix use their registered scorer."""
        dataset = self._datasets.get(family)
        scorer = dataset.score_answer if dataset is not None else _registered_scorer(family)
        return float(scorer(answer, entry))

    def can_score(self, family: str) -> bool:
        return family in self._datasets or family in DATASETS


def eval_questions(config: TaskConfig) -> list[Question]:
    """The fixed held-out set: ``eval_size`` questions, families interleaved by weight, from ``EVAL_SEED``."""
    families = config.resolved_families()
    rng = random.Random(EVAL_SEED)
    picks = rng.choices(range(len(families)), weights=[f.weight for f in families], k=config.eval_size)
    datasets = [_create(f, seed=EVAL_SEED + i * STREAM_STRIDE, size=config.eval_size) for i, f in enumerate(families)]
    counters = [0] * len(families)
    out = []
    for k in picks:
        out.append(_to_question(families[k].name, datasets[k][counters[k]]))
        counters[k] += 1
    return out
