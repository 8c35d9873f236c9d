"""Groups for the outer step: the same on every rank, a permutation, new at every step, leftovers handled."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from swarmlm.noloco.groups import group_of, make_groups, permutation


def test_permutation_is_a_permutation():
    for replicas in (1, 2, 5, 8, 64):
        for step in range(1, 6):
            assert sorted(permutation(replicas, seed=3, outer_step=step)) == list(range(replicas))


@pytest.mark.parametrize("replicas, size, leftover", [(8, 2, "join"), (7, 2, "join"), (7, 2, "wait"), (10, 3, "join"),
                                                      (10, 3, "wait"), (3, 4, "join")])
def test_groups_partition_the_replicas(replicas, size, leftover):
    for step in range(1, 20):
        groups = make_groups(replicas, size, seed=0, outer_step=step, leftover=leftover)
        members = sorted(r for g in groups for r in g)
        assert members == list(range(replicas))  # disjoint and covering
        for rank in range(replicas):
            assert rank in group_of(rank, groups)


def test_leftover_policies():
    join = make_groups(5, 2, seed=0, outer_step=1, leftover="join")
    assert sorted(len(g) for g in join) == [2, 3]
    wait = make_groups(5, 2, seed=0, outer_step=1, leftover="wait")
    assert sorted(len(g) for g in wait) == [1, 2, 2]
    # the spare replica changes from step to step
    spares = {next(g[0] for g in make_groups(5, 2, seed=0, outer_step=s, leftover="wait") if len(g) == 1) for s in range(1, 30)}
    assert len(spares) >= 3
    assert make_groups(8, 2, seed=0, outer_step=1, leftover="wait") == make_groups(8, 2, seed=0, outer_step=1, leftover="join")


def test_groups_differ_across_steps_and_seeds():
    steps = [tuple(map(tuple, make_groups(8, 2, seed=0, outer_step=s))) for s in range(1, 21)]
    assert len(set(steps)) >= 15
    assert make_groups(8, 2, seed=0, outer_step=1) != make_groups(8, 2, seed=1, outer_step=1)
    # each rank meets several different partners
    partners = {tuple(p for p in group_of(0, make_groups(8, 2, seed=0, outer_step=s)) if p != 0) for s in range(1, 21)}
    assert len(partners) >= 4


def test_groups_are_identical_in_separate_processes():
    """Every rank derives the groups on its own: fresh interpreters, with different hash seeds and RNG states, agree."""
    code = ("import json, random, sys; random.seed(sys.argv[1]);"
            "from swarmlm.noloco.groups import make_groups;"
            "print(json.dumps([make_groups(6, 2, 11, s, 'join') for s in range(1, 8)]))")
    outputs = []
    for rank in range(3):
        env_seed = str(1000 + rank)
        done = subprocess.run([sys.executable, "-c", code, env_seed], capture_output=True, text=True, timeout=60,
                              env={"PYTHONHASHSEED": env_seed, "PATH": "/usr/bin:/bin"}, check=True)
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0] == [make_groups(6, 2, 11, s, "join") for s in range(1, 8)]
