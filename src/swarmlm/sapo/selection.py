"""Choosing the J external groups a node trains on in a SAPO round (Swarm sAmpling Policy Optimization,
arXiv 2509.08721). A group whose rewards are all equal has zero GRPO advantage everywhere and teaches nothing,
so such groups are dropped before the J are picked."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Literal

from swarmlm.sapo.records import RolloutRecord

SelectionPolicy = Literal["uniform", "first_valid", "top_reward"]


@dataclass
class ScoredGroup:
    """An external record, re-scored with the receiving node's own verifier."""

    record: RolloutRecord
    rewards: list[float]  # what the update trains on (the task score, plus any format bonus)
    scores: list[float] | None = None  # the task's own scores, when they differ from ``rewards``
    prompt: str | None = None  # the receiver's own text of the question (regenerated), trained on instead of the peer's
    completion_ids: list[list[int]] | None = None  # the completions as the receiver tokenized and cut them

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards)

    @property
    def mean_score(self) -> float:
        scores = self.rewards if self.scores is None else self.scores
        return sum(scores) / len(scores)


def select_external(pool: list[ScoredGroup], j: int, policy: SelectionPolicy, rng: random.Random,
                    advantages: Callable[[ScoredGroup], list[float]] | None = None) -> list[ScoredGroup]:
    """Drop zero-advantage groups, then pick up to ``j`` of the rest. ``advantages`` gives a group's advantages
    where they are not GRPO's within-group ones (``external_advantage: own_baseline``): a group then counts as
    zero-advantage when all of those are 0.

    ``uniform`` samples without replacement, ``first_valid`` keeps arrival order, and ``top_reward``
    takes the highest mean rewards (ties keep arrival order). Fewer than ``j`` valid groups means
    all of them; an empty pool means none.
    """
    if j <= 0:
        return []
    from swarmlm.sapo.grpo import is_zero_advantage  # imports torch: not at import, where the configs need this module

    if advantages is None:
        valid = [g for g in pool if not is_zero_advantage(g.rewards)]
    else:
        valid = [g for g in pool if any(abs(a) > 1e-9 for a in advantages(g))]
    if policy == "uniform":
        return rng.sample(valid, min(j, len(valid)))
    if policy == "first_valid":
        return valid[:j]
    if policy == "top_reward":
        return sorted(valid, key=lambda g: -g.mean_reward)[:j]
    raise ValueError(f"unknown selection policy '{policy}' (allowed: uniform, first_valid, top_reward)")
