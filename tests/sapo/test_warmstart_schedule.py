"""The warm start's learning-rate schedule and cache key."""

from __future__ import annotations

import math

import pytest

from swarmlm.sapo.warmstart import WarmstartConfig, lr_factor, warmstart_key


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_linear_warmup_over_the_first_tenth(schedule):
    assert [lr_factor(s, steps=100, schedule=schedule) for s in range(10)] == pytest.approx([(s + 1) / 10 for s in range(10)])


def test_constant_holds_the_peak_and_cosine_decays_to_a_tenth():
    assert all(lr_factor(s, steps=100, schedule="constant") == 1.0 for s in range(10, 100))
    cosine = [lr_factor(s, steps=100, schedule="cosine") for s in range(10, 100)]
    assert cosine[0] == pytest.approx(1.0) and cosine[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(cosine, cosine[1:]))
    # half-way through the decay: 0.1 + 0.9 * (1 + cos(pi / 2)) / 2
    assert lr_factor(10 + 89 // 2, steps=100, schedule="cosine") == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 44 / 89)))


def test_the_schedule_is_part_of_the_cache_key_and_the_eval_size_is_not():
    base = WarmstartConfig()
    assert warmstart_key(base) != warmstart_key(WarmstartConfig(schedule="cosine"))
    assert warmstart_key(base) == warmstart_key(WarmstartConfig(tasks={"eval_size": 512}))
