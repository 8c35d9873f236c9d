"""The α-β link model: message and collective costs computed by hand."""

from __future__ import annotations

import pytest

from swarmlm.noloco.comm.link_model import LinkModel
from swarmlm.noloco.config import NetworkSection

# 100 ms and 1 Gbit/s (125e6 bytes/s); a 12.5 MB message takes 0.1 s on the wire: 0.2 s in all
LINK = LinkModel(0.1, 125e6)
N = 12.5e6


def test_link_costs_by_hand():
    assert LINK.message_s(N) == pytest.approx(0.2)
    assert LINK.pair_exchange_s(N) == pytest.approx(0.2)  # both directions at once
    assert LINK.ring_s(N, 4) == pytest.approx(6 * (0.1 + 0.025))  # 2(M-1) messages of n/M
    assert LINK.tree_s(N, 4) == pytest.approx(4 * 0.2)  # 2 log2 M full messages
    assert LINK.tree_s(N, 5) == pytest.approx(6 * 0.2)  # ceil(log2 5) = 3 rounds each way
    assert LINK.halving_doubling_s(N, 4) == pytest.approx(4 * 0.1 + 2 * 0.75 * 0.1)
    assert LINK.halving_doubling_s(N, 6) == pytest.approx(4 * 0.1 + 2 * 0.75 * 0.1 + 2 * 0.2)  # 2 extra ranks fold in
    assert LINK.allreduce_s(N, 4) == pytest.approx(0.55) and LINK.best_algorithm(N, 4) == "halving_doubling"
    # small messages at M = 64: ring pays 126 latencies, tree and halving-doubling 12
    assert LINK.best_algorithm(1000, 64) in ("tree", "halving_doubling")
    assert LINK.ring_s(1000, 64) == pytest.approx(126 * (0.1 + 1000 / 64 / 125e6))
    for m in (1,):
        assert LINK.ring_s(N, m) == LINK.tree_s(N, m) == LINK.halving_doubling_s(N, m) == 0
    assert [LINK.hops(m, "ring") for m in (2, 4, 8)] == [2, 6, 14]
    assert [LINK.hops(m, "tree") for m in (2, 4, 5, 8)] == [2, 4, 6, 6]
    assert [LINK.hops(m, "halving_doubling") for m in (2, 4, 6, 8)] == [2, 4, 6, 6]
    free = LinkModel.from_config(NetworkSection())
    assert free.is_free and free.message_s(1e12) == 0
    gbit = LinkModel.from_config(NetworkSection(latency_ms=100, bandwidth_gbit=1))
    assert gbit.latency_s == 0.1 and gbit.bandwidth == 125e6
