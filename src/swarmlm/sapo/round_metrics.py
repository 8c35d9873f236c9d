"""The metrics line of one SAPO round, computed from what the round did.

The node reports the round's outcome (:class:`RoundOutcome`: its own rollouts and their rewards, the pool of
peers' groups and those chosen, the update's statistics) and its observer (:mod:`swarmlm.sapo.observer`) adds the
evaluation and the times (:class:`RoundTimes`); :func:`round_record` turns them into the line ``metrics.jsonl``
and TensorBoard get: the round's algorithm does not compute its own measurements.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from swarmlm.sapo.grpo import is_zero_advantage
from swarmlm.sapo.rollouts import OwnRollouts
from swarmlm.sapo.selection import ScoredGroup
from swarmlm.tasks import extract_answer


@dataclass
class RoundOutcome:
    """What one node's round did."""

    node_id: str
    own: OwnRollouts
    own_rewards: list[list[float]]  # task rewards of each own group's completions (grpo.reward)
    own_training_rewards: list[list[float]]  # the rewards the update saw (with the format bonus)
    pool: list[ScoredGroup]  # the peers' groups this node verified
    chosen: list[ScoredGroup]  # those it trained on
    intake: dict[str, Any]  # the collect's counts and times (peers heard, records accepted, ...)
    train: dict[str, Any]  # the update's statistics
    lr: float
    drops: dict[str, int]  # records dropped so far, by reason
    own_unscored: dict[str, int]  # own completions the verifier could not score, by reason
    transport: dict[str, Any]  # the transport's own statistics
    cumulative_reward_own: float
    task_rewards: Callable[[list[float]], list[float]]  # scores -> task rewards (grpo.reward)


@dataclass
class RoundTimes:
    """Seconds the round spent in each part (:meth:`swarmlm.sapo.hooks.NodeHook.phase`), and in all."""

    generate: float
    publish: float
    collect: float
    intake: float  # the peers' records checked and tokenized, in this process
    verify: float  # their answers scored by the verifier's workers
    update: float
    round: float


def round_record(outcome: RoundOutcome, evaluation: dict[str, Any], times: RoundTimes) -> dict[str, Any]:
    """The round's metrics line (the keys every report reads); ``evaluation``: held-out pass@1 where the round
    evaluated, else ``{"eval_pass1": None}``."""
    own = outcome.own
    # the tokens generated: each completion's, and its EOS where it ended
    gen_tokens = sum(len(c) + f for gen in own.generated for c, f in zip(gen.completion_ids, gen.finished))
    answered = [[extract_answer(t) is not None for t in gen.texts] for gen in own.generated]
    completions = [c for gen in own.generated for c in gen.completion_ids]
    n = max(1, len(completions))
    info = outcome.intake
    return {
        "round": own.round,
        "node": outcome.node_id,
        "reward_own": mean_reward(outcome.own_rewards),
        "reward_external": mean_task_reward(outcome.chosen, outcome.task_rewards),
        "reward_external_pool": mean_task_reward(outcome.pool, outcome.task_rewards),
        **evaluation,
        **outcome.train,
        "lr": outcome.lr,
        "external_used": len(outcome.chosen),
        "external_sources": dict(Counter(g.record.node_id for g in outcome.chosen)),
        "global_round": own.global_round,
        "external_pool": len(outcome.pool),
        **info,
        "transport_seconds": times.collect + times.publish,
        "drops": outcome.drops,
        "own_unscored": outcome.own_unscored,
        "format_rate": sum(map(sum, answered)) / n,
        "completion_tokens": sum(map(len, completions)) / n,
        # the share of completions cut at max_new_tokens (no EOS), and of own groups with no advantage
        "truncated_rate": sum(not f for gen in own.generated for f in gen.finished) / n,
        "zero_adv_groups": sum(map(is_zero_advantage, outcome.own_training_rewards)) / max(1, len(own.scores)),
        "by_family": family_stats(own, outcome.own_rewards, answered),
        "tokens_per_s": gen_tokens / times.generate if times.generate > 0 else None,
        "intake_seconds": times.intake,
        "verify_seconds": times.verify,
        "gen_seconds": times.generate,
        "train_seconds": times.update,
        "round_seconds": times.round,
        "cumulative_reward_own": outcome.cumulative_reward_own,
        **outcome.transport,
    }


def mean_reward(groups_rewards: list[list[float]]) -> float:
    """The mean reward over every completion of the groups (0 for none): a round's ``reward_own``."""
    return sum(map(sum, groups_rewards)) / max(1, sum(map(len, groups_rewards)))


def mean_task_reward(groups: list[ScoredGroup], task_rewards: Callable[[list[float]], list[float]]) -> float | None:
    """The mean task reward of external groups' completions (None for no group)."""
    if not groups:
        return None
    return sum(sum(task_rewards(g.scores if g.scores is not None else g.rewards)) / len(g.rewards)
               for g in groups) / len(groups)


def family_stats(own: OwnRollouts, rewards: list[list[float]], answered: list[list[bool]]) -> dict[str, dict[str, float]]:
    """Per task family of the round's own groups: how many, their mean task reward (``rewards``), the share of
    completions with an answer span (``answered``) and the share cut at ``max_new_tokens`` (a loss of the format
    shows which family)."""
    totals: dict[str, list[float]] = {}
    for family, gen, group_rewards, group_answered in zip(own.families, own.generated, rewards, answered):
        t = totals.setdefault(family, [0, 0, 0.0, 0, 0])
        t[0] += 1
        t[1] += len(gen.texts)
        t[2] += sum(group_rewards)
        t[3] += sum(group_answered)
        t[4] += sum(not f for f in gen.finished)
    return {family: {"groups": groups, "reward": reward / max(1, n), "format_rate": fmt / max(1, n),
                     "truncated_rate": cut / max(1, n)}
            for family, (groups, n, reward, fmt, cut) in sorted(totals.items())}
