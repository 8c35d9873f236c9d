"""Rollout sharing over ``torch.distributed`` for controlled runs under ``torchrun``.

Each rank is one node. ``collect`` is an ``all_gather_object`` of every rank's message, so all nodes
move in lockstep; the process group's timeout bounds the wait. Messages travel as bytes and are
validated by the receiving node like any other.
"""

from __future__ import annotations

import torch.distributed as dist

from swarmlm.sapo.transports.base import Received, RolloutTransport


class TorchDistributedTransport(RolloutTransport):
    def __init__(self, group=None):
        if not dist.is_initialized():
            raise RuntimeError("TorchDistributedTransport needs an initialised process group (run under torchrun)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.node_id = f"node-{self.rank}"
        self._outbox: dict[int, bytes] = {}

    def publish(self, round: int, payload: bytes) -> None:
        self._outbox = {round: payload}

    def collect(self, round: int, timeout: float) -> list[Received]:
        mine = self._outbox.get(round, b"")
        gathered: list[object] = [None] * self.world_size
        dist.all_gather_object(gathered, (round, mine), group=self.group)
        out = []
        for rank, item in enumerate(gathered):
            if rank == self.rank:
                continue
            sent_round, payload = item if isinstance(item, tuple) and len(item) == 2 else (round, item)
            if payload:
                out.append(Received(f"node-{rank}", sent_round if isinstance(sent_round, int) else round, payload))
        return out
