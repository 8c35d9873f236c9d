"""Choosing the J external groups: zero-advantage filter, then uniform / first_valid / top_reward."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from swarmlm.sapo.records import RolloutRecord
from swarmlm.sapo.selection import ScoredGroup, select_external
from swarmlm.tasks.provenance import TRAIN_SEED, Provenance

POLICIES = ["uniform", "first_valid", "top_reward"]


def group(name: str, rewards: list[float]) -> ScoredGroup:
    record = RolloutRecord(node_id="peer", round=1, slot=0, family="chain_sum", question=name,
                           provenance=Provenance("chain_sum", TRAIN_SEED, 0, "c" * 32), completions=[f"c{i}" for i in range(len(rewards))], model="tiny-qwen2")
    return ScoredGroup(record, rewards)


@pytest.fixture
def pool() -> list[ScoredGroup]:
    return [
        group("all-zero", [0.0, 0.0, 0.0, 0.0]),
        group("a", [1.0, 0.0, 0.0, 0.0]),        # mean 0.25
        group("all-one", [1.0, 1.0, 1.0, 1.0]),
        group("b", [1.0, 1.0, 0.0, 1.0]),        # mean 0.75
        group("all-half", [0.5, 0.5, 0.5, 0.5]),
        group("c", [0.0, 0.5, 0.0, 0.5]),        # mean 0.25 (ties with a, arrives later)
        group("d", [1.0, 1.0, 1.0, 0.99]),       # mean 0.9975, nearly constant but not zero-advantage
    ]


VALID = ["a", "b", "c", "d"]


def names(groups):
    return [g.record.question for g in groups]


@pytest.mark.parametrize("policy", POLICIES)
def test_zero_advantage_groups_are_never_chosen(pool, policy):
    for seed in range(20):
        chosen = select_external(pool, 3, policy, random.Random(seed))
        assert len(chosen) == 3
        assert set(names(chosen)) <= set(VALID)
        assert len(set(names(chosen))) == 3  # without replacement


@pytest.mark.parametrize("policy", POLICIES)
def test_j_larger_than_the_pool_gives_every_valid_group_once(pool, policy):
    chosen = select_external(pool, 50, policy, random.Random(0))
    assert sorted(names(chosen)) == VALID


@pytest.mark.parametrize("policy", POLICIES)
def test_empty_pool_and_j_zero(pool, policy):
    assert select_external([], 4, policy, random.Random(0)) == []
    assert select_external(pool, 0, policy, random.Random(0)) == []
    only_constant = [g for g in pool if g.record.question.startswith("all-")]
    assert select_external(only_constant, 4, policy, random.Random(0)) == []


def test_first_valid_keeps_arrival_order(pool):
    assert names(select_external(pool, 2, "first_valid", random.Random(0))) == ["a", "b"]
    assert names(select_external(pool, 4, "first_valid", random.Random(0))) == ["a", "b", "c", "d"]


def test_top_reward_takes_highest_means_ties_in_arrival_order(pool):
    assert names(select_external(pool, 2, "top_reward", random.Random(0))) == ["d", "b"]
    assert names(select_external(pool, 4, "top_reward", random.Random(0))) == ["d", "b", "a", "c"]


def test_uniform_is_deterministic_given_the_rng_and_covers_the_valid_groups(pool):
    a = [names(select_external(pool, 2, "uniform", random.Random(seed))) for seed in range(30)]
    b = [names(select_external(pool, 2, "uniform", random.Random(seed))) for seed in range(30)]
    assert a == b
    assert len({tuple(x) for x in a}) > 3  # different seeds give different picks
    counts = Counter(name for pick in a for name in pick)
    # 60 picks over 4 valid groups: each is chosen, none dominates (expected 15 each)
    assert set(counts) == set(VALID) and min(counts.values()) >= 5
    # the rng is the only source of randomness: a shared rng advances
    rng = random.Random(7)
    first, second = select_external(pool, 2, "uniform", rng), select_external(pool, 2, "uniform", rng)
    rng2 = random.Random(7)
    assert names(select_external(pool, 2, "uniform", rng2)) == names(first)
    assert names(select_external(pool, 2, "uniform", rng2)) == names(second)


def test_first_valid_and_top_reward_do_not_use_the_rng(pool):
    for policy in ("first_valid", "top_reward"):
        rng = random.Random(3)
        state = rng.getstate()
        select_external(pool, 2, policy, rng)
        assert rng.getstate() == state


def test_unknown_policy_is_an_error(pool):
    with pytest.raises(ValueError, match="uniform, first_valid, top_reward"):
        select_external(pool, 2, "best", random.Random(0))  # type: ignore[arg-type]


def test_mean_reward():
    assert group("x", [1.0, 0.0, 0.5, 0.5]).mean_reward == pytest.approx(0.5)
