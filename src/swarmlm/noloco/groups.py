"""Which replicas average together at an outer step: NoLoCo's random groups (arXiv 2506.10911).

Every replica derives the same random permutation of 0..M-1 from the shared seed and the outer
step number, so no communication is needed to agree on the groups. The permutation is cut into
groups of n. When M is not divisible by n, the r = M mod n replicas at the end of the permutation are
handled by ``leftover``:

- ``join`` (default): they join the last full group, which then has n + r members. Every replica
  averages at every outer step; one group pays for a slightly larger exchange.
- ``wait``: each of them forms a group of one and sits the outer step out (it still takes its local
  outer step, with its own pseudo-gradient, so its inner progress is kept).

Since the permutation changes every step, a different replica is the spare each time.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

Leftover = Literal["join", "wait"]

_STREAM = 0x6E6C  # separates the group stream from other uses of the same seed


def permutation(num_replicas: int, seed: int, outer_step: int) -> list[int]:
    """The shared random permutation of replicas for ``outer_step``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, outer_step, _STREAM]))
    return [int(x) for x in rng.permutation(num_replicas)]


def make_groups(num_replicas: int, group_size: int, seed: int, outer_step: int, leftover: Leftover = "join"
                ) -> list[list[int]]:
    """The groups of ``outer_step``: disjoint, covering 0..M-1, each sorted."""
    if num_replicas < 1 or group_size < 1:
        raise ValueError("num_replicas and group_size must be positive")
    perm = permutation(num_replicas, seed, outer_step)
    full = num_replicas // group_size
    groups = [perm[k * group_size:(k + 1) * group_size] for k in range(full)]
    rest = perm[full * group_size:]
    if rest:
        if leftover == "join" and groups:
            groups[-1] = groups[-1] + rest
        elif leftover == "join":  # fewer replicas than one group: they all average together
            groups.append(rest)
        elif leftover == "wait":
            groups.extend([r] for r in rest)
        else:
            raise ValueError(f"unknown leftover policy {leftover!r}")
    return [sorted(g) for g in groups]


def group_of(rank: int, groups: list[list[int]]) -> list[int]:
    for group in groups:
        if rank in group:
            return group
    raise ValueError(f"rank {rank} is in no group")
