"""Nodes in one Python process share rollouts through memory."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from swarmlm.sapo.transports.base import Received, RolloutTransport


class InProcessHub:
    """The shared board: ``round -> {node_id: payload}``, keeping only the newest ``keep_rounds`` rounds."""

    def __init__(self, num_nodes: int, keep_rounds: int = 4):
        self.num_nodes = num_nodes
        self.keep_rounds = keep_rounds
        self._board: OrderedDict[int, dict[str, bytes]] = OrderedDict()
        self._cond = threading.Condition()

    def endpoint(self, node_id: str) -> "InProcessTransport":
        return InProcessTransport(self, node_id)

    def _put(self, round: int, node_id: str, payload: bytes) -> None:
        with self._cond:
            self._board.setdefault(round, {})[node_id] = payload
            while len(self._board) > self.keep_rounds:
                self._board.popitem(last=False)
            self._cond.notify_all()

    def _get(self, round: int, node_id: str, timeout: float) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._board.get(round, {})) < self.num_nodes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            posted = dict(self._board.get(round, {}))
        return [Received(sender, round, payload) for sender, payload in sorted(posted.items()) if sender != node_id]


class InProcessTransport(RolloutTransport):
    def __init__(self, hub: InProcessHub, node_id: str):
        self.hub = hub
        self.node_id = node_id

    def publish(self, round: int, payload: bytes) -> None:
        self.hub._put(round, self.node_id, payload)

    def collect(self, round: int, timeout: float) -> list[Received]:
        return self.hub._get(round, self.node_id, timeout)
