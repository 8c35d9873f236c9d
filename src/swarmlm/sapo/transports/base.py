"""The one interface every SAPO transport implements: publish this round's message, collect others'.

The node hands a transport opaque bytes and gets opaque bytes back, tagged with the sender's id as
the transport authenticated it. How the bytes travel (memory, torch.distributed, a DHT) is the
transport's business; what they mean, and whether to trust them, is the node's.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Received:
    """A message from another node: who sent it (as the transport knows it), for which round, and its bytes."""

    sender: str
    round: int
    payload: bytes


class RolloutTransport(ABC):
    """Moves each node's per-round message to the other nodes."""

    #: This node's identity on the transport; records it publishes carry it as ``node_id``.
    node_id: str

    #: Rounds ahead of :meth:`global_round` still accepted from peers (clock skew in asynchronous swarms).
    future_rounds: int = 0

    def global_round(self, local_round: int) -> int:
        """The swarm-wide round that records published now belong to. Lockstep transports (every node
        in the same round) use the node's own round; an asynchronous transport has its own clock."""
        return local_round

    @abstractmethod
    def publish(self, round: int, payload: bytes) -> None:
        """Make this node's message for ``round`` available to the others."""

    @abstractmethod
    def collect(self, round: int, timeout: float) -> list[Received]:
        """Messages from other nodes for ``round`` (and, for asynchronous transports, recent rounds),
        waiting at most ``timeout`` seconds. Whatever has arrived by then is returned."""

    def stats(self) -> dict[str, float]:
        """Transport-specific counters for the metrics (peers seen, bytes, ...)."""
        return {}

    def close(self) -> None:
        """Release sockets, processes and threads."""
