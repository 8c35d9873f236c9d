"""A network model for replicas that all run on one host: what a chosen link would cost each method.

Which model, and why
--------------------
This machine is one host, so a real inter-replica link has to be emulated. Linux ``tc netem`` on
network namespaces was the other option, and it does not work here: namespaces can be made, but the
kernel has no ``sch_netem`` ("Specified qdisc kind is unknown"; it boots with ``nomodule``). It would
also need root, delay the job's key-value store with the data, and leave the 2 shared cores just as noisy.
So the link is modelled in the transport, in two ways that use the same cost functions:

1. **Injected** (:class:`swarmlm.noloco.comm.emulated.EmulatedCommunicator`, ``--network.inject true``). Every message really waits
   ``latency + bytes / bandwidth`` (a sleep before its send) on top of its real loopback transfer:
   - NoLoCo's pair exchange: one message each way, at the same time (full duplex): one delay per link.
   - All-reduce: run as the chosen algorithm over point-to-point messages (ring, binomial tree, or
     recursive halving-doubling), each hop delayed. Latency then adds up hop by hop, and a slow rank
     holds up everyone behind it, as on a real network.
   The all-reduce algorithms here are emulations for timing. Without injection, DiLoCo and DDP use
   torch's own all-reduce.
2. **Modelled** (:func:`swarmlm.experiments.sim_clock.simulate_clock`): a simulated wall-clock built from each rank's measured compute
   time per inner step plus the modelled cost of each synchronisation, with every rank's clock held back
   by the partners it synchronises with (all ranks for all-reduce, the pair for NoLoCo). ``swarmlm noloco
   compare`` uses this: runs on a busy 2-core machine still give a meaningful axis, and a training run
   does not have to sleep through 100 ms × thousands of hops. The in-process backend
   (:mod:`swarmlm.noloco.comm.in_process`) keeps the same clock while it trains. Both use
   :meth:`LinkModel.allreduce_end_s` and :meth:`LinkModel.pair_end_s` for the synchronisations.

The α-β cost model (α = one-way latency per message, β = seconds per byte, n = bytes per rank):

=====================  ===================================  ============================
operation              messages on the critical path        seconds
=====================  ===================================  ============================
pair exchange          1 each way, concurrently             α + nβ
ring all-reduce        2(M−1) of n/M                        2(M−1)·(α + nβ/M)
binomial tree          ⌈log₂M⌉ up (reduce), ⌈log₂M⌉ down    2⌈log₂M⌉·(α + nβ)
halving-doubling       2·log₂P, of n/2, n/4, … then back    2·log₂P·α + 2(P−1)/P·nβ (+ 2(α + nβ)
                       (P = largest power of two ≤ M)       to fold in M − P extra ranks)
=====================  ===================================  ============================

``best`` picks the cheapest of the three all-reduce algorithms for (n, M), as a tuned library would.
"""

from __future__ import annotations

import math

from swarmlm.noloco.config import Algorithm, NetworkSection

ALGORITHMS: tuple[str, ...] = ("ring", "tree", "halving_doubling")


class LinkModel:
    """Costs in seconds of messages and collectives over a uniform link (see the module docstring)."""

    def __init__(self, latency_s: float = 0.0, bandwidth_bytes_per_s: float = math.inf, allreduce: Algorithm = "best"):
        if latency_s < 0 or bandwidth_bytes_per_s <= 0:
            raise ValueError("latency must be >= 0 and bandwidth > 0")
        self.latency_s = float(latency_s)
        self.bandwidth = float(bandwidth_bytes_per_s)
        self.algorithm = allreduce

    @classmethod
    def from_config(cls, section: NetworkSection) -> "LinkModel":
        bandwidth = section.bandwidth_gbit * 1e9 / 8 if section.bandwidth_gbit > 0 else math.inf
        return cls(section.latency_ms / 1000.0, bandwidth, section.allreduce)

    @property
    def is_free(self) -> bool:
        return self.latency_s == 0 and math.isinf(self.bandwidth)

    def describe(self) -> str:
        bw = "unlimited" if math.isinf(self.bandwidth) else f"{self.bandwidth * 8 / 1e9:g} Gbit/s"
        return f"{self.latency_s * 1000:g} ms, {bw}, all-reduce {self.algorithm}"

    # ----- one message, and NoLoCo's pair exchange
    def message_s(self, nbytes: float) -> float:
        """One message of ``nbytes``: α + nβ."""
        return self.latency_s + (0.0 if math.isinf(self.bandwidth) else nbytes / self.bandwidth)

    def pair_exchange_s(self, nbytes: float) -> float:
        """Both partners send ``nbytes`` to each other at the same time (full duplex): one message time."""
        return self.message_s(nbytes)

    # ----- all-reduce algorithms
    def ring_s(self, nbytes: float, m: int) -> float:
        return 0.0 if m <= 1 else 2 * (m - 1) * self.message_s(nbytes / m)

    def tree_s(self, nbytes: float, m: int) -> float:
        return 0.0 if m <= 1 else 2 * math.ceil(math.log2(m)) * self.message_s(nbytes)

    def halving_doubling_s(self, nbytes: float, m: int) -> float:
        if m <= 1:
            return 0.0
        p = 1 << (m.bit_length() - 1)  # largest power of two <= m
        rounds = int(math.log2(p))
        beta = 0.0 if math.isinf(self.bandwidth) else 1.0 / self.bandwidth
        cost = 2 * rounds * self.latency_s + 2 * (p - 1) / p * nbytes * beta
        if m > p:  # the extra ranks first hand their tensor to a partner, and get the result back at the end
            cost += 2 * self.message_s(nbytes)
        return cost

    def allreduce_s(self, nbytes: float, m: int, algorithm: Algorithm | None = None) -> float:
        algorithm = algorithm or self.algorithm
        if algorithm == "best":
            algorithm = self.best_algorithm(nbytes, m)
        return {"ring": self.ring_s, "tree": self.tree_s, "halving_doubling": self.halving_doubling_s}[algorithm](nbytes, m)

    def best_algorithm(self, nbytes: float, m: int) -> str:
        costs = {a: self.allreduce_s(nbytes, m, a) for a in ALGORITHMS}
        return min(ALGORITHMS, key=lambda a: (costs[a], ALGORITHMS.index(a)))

    # ----- synchronisations on a simulated clock
    def allreduce_end_s(self, arrivals: list[float], nbytes: float) -> float:
        """When an all-reduce of ``nbytes`` per rank ends, on a simulated clock, for ranks that arrive at ``arrivals``:
        every rank waits for the last one, then the algorithm takes its time."""
        return max(arrivals) + self.allreduce_s(nbytes, len(arrivals))

    def pair_end_s(self, t_a: float, t_b: float, nbytes: float, timeout_s: float = math.inf) -> tuple[float, float, bool]:
        """NoLoCo's pair link on a simulated clock, for partners that arrive at ``t_a`` and ``t_b``: (when a is done,
        when b is done, whether they exchanged). As in the deadline rendezvous (:mod:`swarmlm.noloco.comm.rendezvous`),
        the first waits at most ``timeout_s``; a partner later than that finds the link abandoned and skips at once,
        and the first gives up at its deadline. Otherwise both send at once and are done one message time later."""
        if abs(t_a - t_b) > timeout_s:
            return (t_a + timeout_s, t_b, False) if t_a < t_b else (t_a, t_b + timeout_s, False)
        end = max(t_a, t_b) + self.pair_exchange_s(nbytes)
        return end, end, True

    def hops(self, m: int, algorithm: str) -> int:
        """Messages on the critical path of one all-reduce (for fitting a per-message overhead)."""
        if m <= 1:
            return 0
        if algorithm == "ring":
            return 2 * (m - 1)
        if algorithm == "tree":
            return 2 * math.ceil(math.log2(m))
        if algorithm == "halving_doubling":
            p = 1 << (m.bit_length() - 1)
            return 2 * int(math.log2(p)) + (2 if m > p else 0)
        raise ValueError(f"unknown algorithm {algorithm!r}")
