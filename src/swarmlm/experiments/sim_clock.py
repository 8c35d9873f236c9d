"""The simulated wall-clock of ``swarmlm noloco compare``: each rank's measured (or calibrated) compute time per
inner step plus the modelled cost of every synchronisation (:class:`~swarmlm.noloco.comm.link_model.LinkModel`),
with every rank's clock held back by the ranks it synchronises with (all of them for an all-reduce, the pair for
NoLoCo). Runs on a busy 2-core machine still get a meaningful time axis, and a training run does not have to
sleep through 100 ms × thousands of hops. The in-process backend (:mod:`swarmlm.noloco.comm.in_process`) keeps the
same clock while it trains, with the same synchronisation rules (:meth:`LinkModel.allreduce_end_s`,
:meth:`LinkModel.pair_end_s`)."""

from __future__ import annotations

import numpy as np

from swarmlm.noloco.comm.link_model import LinkModel


def sync_steps(method: str, steps: int, every: int) -> list[int]:
    """The inner steps after which ``method`` synchronises (as ``swarmlm.noloco.replica`` does)."""
    if method == "ddp":
        return list(range(1, steps + 1))
    return [s for s in range(1, steps + 1) if s % every == 0 or s == steps]


def simulate_clock(method: str, compute_s: np.ndarray, *, link: LinkModel, every: int, nbytes: int,
                   groups=None) -> np.ndarray:
    """Simulated wall-clock of every rank after every inner step, ``[M, steps]``.

    ``compute_s[r, s-1]`` is rank r's compute time for inner step s (measured). Each rank's clock advances
    by its own compute time; at a synchronisation the ranks involved first wait for each other, then pay
    the link's cost:

    - ``ddp``: after every step, all ranks wait for the slowest, then one all-reduce of the gradients;
    - ``diloco`` (any outer optimizer): the same, every ``every`` steps, of the pseudo-gradient;
    - ``noloco``: every ``every`` steps, each pair link (in the global (low, high) order that the
      exchange uses) starts when both of its ranks are there and takes one pair-exchange time.
      ``groups(outer_step)`` returns the groups of that outer step.

    ``nbytes`` is the size of one rank's message (the flat gradient, pseudo-gradient or θ).
    """
    compute_s = np.asarray(compute_s, dtype=float)
    m, steps = compute_s.shape
    clock = np.zeros(m)
    out = np.zeros((m, steps))
    due = set(sync_steps(method, steps, every))
    kind = "noloco" if method == "noloco" else "allreduce"
    for s in range(1, steps + 1):
        clock += compute_s[:, s - 1]
        if s in due and m > 1:
            if kind == "allreduce":
                clock[:] = link.allreduce_end_s(list(clock), nbytes)
            else:
                outer_step = (s + every - 1) // every
                links = sorted((min(a, b), max(a, b)) for g in groups(outer_step) for i, a in enumerate(g) for b in g[i + 1:])
                for a, b in links:
                    clock[a], clock[b], _ = link.pair_end_s(clock[a], clock[b], nbytes)
        out[:, s - 1] = clock
    return out
