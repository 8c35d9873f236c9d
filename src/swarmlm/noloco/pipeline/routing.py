"""Where each micro-batch goes next: NoLoCo's random pipeline routing (arXiv 2506.10911).

With M replicas of S stages, process (replica d, stage s) has global rank ``d * S + s``: a replica's
stages are neighbours in rank order, so ``torchrun --nproc-per-node S`` puts one whole replica on each
node, and the identity routes stay on the node.

At inner step t, micro-batch slot m, boundary s (stage s → s+1), stage s of replica d hands its
activations (and the labels) to stage s+1 of replica π_{s,t,m}(d); gradients return along the same
link. Every process computes the same π from ``numpy.random.SeedSequence([seed, t, s, stream])``, so
no communication is needed to agree on routes:

- π_{s,t,0} is a uniformly random permutation of the M replicas;
- π_{s,t,m} = σ_{s,t,m} ∘ π_{s,t,m-1}, where σ is a uniformly random *derangement* (no fixed point).

Each slot's permutation is therefore still uniformly random, and in addition, consecutive slots
send every replica's output to a *different* next-stage replica (when M ≥ 2). That is what makes a
retry take another route: a micro-batch whose hop failed at slot m (the next-stage peer did not
answer in time) is carried into slot m + 1, whose route from this replica goes elsewhere.

Evaluation uses fixed identity routes (replica d's stages in order), as does ``routing="identity"``
for training (an ablation, and the tests' comparison with the unsplit model).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np

Routing = Literal["random", "identity"]

_STREAM = 0x7070  # separates the routing stream from the group stream (groups.py) of the same seed


def rank_of(replica: int, stage: int, num_stages: int) -> int:
    """Global rank of (replica, stage)."""
    return replica * num_stages + stage


def position(rank: int, num_stages: int) -> tuple[int, int]:
    """(replica, stage) of a global rank."""
    return divmod(rank, num_stages)


def _derangement(rng: np.random.Generator, n: int) -> np.ndarray:
    while True:
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm


@lru_cache(maxsize=256)
def _slot_permutations(num_replicas: int, seed: int, step: int, boundary: int, num_slots: int) -> tuple[tuple[int, ...], ...]:
    rng = np.random.default_rng(np.random.SeedSequence([seed, step, boundary, _STREAM]))
    perm = rng.permutation(num_replicas)
    out = [tuple(int(x) for x in perm)]
    for _ in range(1, num_slots):
        if num_replicas > 1:
            perm = _derangement(rng, num_replicas)[perm]  # σ ∘ π: replica d goes to σ(π(d))
        out.append(tuple(int(x) for x in perm))
    return tuple(out)


def route_permutations(num_replicas: int, seed: int, step: int, boundary: int, num_slots: int,
                       routing: Routing = "random") -> list[list[int]]:
    """π_{boundary,step,m} for m in 0..num_slots-1: entry [m][d] is the stage-(boundary+1) replica that
    receives replica d's stage-``boundary`` output in slot m."""
    if num_replicas < 1 or num_slots < 1:
        raise ValueError("num_replicas and num_slots must be positive")
    if routing == "identity":
        return [list(range(num_replicas)) for _ in range(num_slots)]
    if routing != "random":
        raise ValueError(f"unknown routing {routing!r}")
    return [list(p) for p in _slot_permutations(num_replicas, seed, step, boundary, num_slots)]


class Routes:
    """The routes of one inner step, seen from one process: who sends to it and whom it sends to, per slot."""

    def __init__(self, *, num_replicas: int, num_stages: int, seed: int, step: int, num_slots: int,
                 routing: Routing = "random"):
        self.num_replicas = num_replicas
        self.num_stages = num_stages
        self.num_slots = num_slots
        self._perms = [route_permutations(num_replicas, seed, step, s, num_slots, routing) for s in range(num_stages - 1)]
        self._inverse = [[_inverse(p) for p in perms] for perms in self._perms]

    def next_replica(self, replica: int, stage: int, slot: int) -> int:
        """The stage-(stage+1) replica that receives (replica, stage)'s output in ``slot``."""
        return self._perms[stage][slot][replica]

    def prev_replica(self, replica: int, stage: int, slot: int) -> int:
        """The stage-(stage-1) replica whose output (replica, stage) receives in ``slot``."""
        return self._inverse[stage - 1][slot][replica]

    def path(self, replica: int, slot: int) -> list[int]:
        """The replicas a micro-batch that starts at stage 0 of ``replica`` in ``slot`` visits, stage by stage
        (if none of its hops fails)."""
        out = [replica]
        for s in range(self.num_stages - 1):
            out.append(self._perms[s][slot][out[-1]])
        return out


def _inverse(perm: list[int]) -> list[int]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv
