"""The swarm's round clock: records are keyed by the *global* round, never by a node's local count.

``g = floor((unix_time - epoch) / round_length)``. Every peer computes the same ``g`` from its own clock
with no coordinator and no message: two swarm-wide constants (``round_length``, ``epoch``) and a clock
kept by NTP. A node that restarts, joins late or runs slowly publishes under the round the rest of
the swarm is reading, and no peer can move the swarm's round (a round "seen in the DHT" could be
pushed forward by any hostile peer). A node's own training step counter stays local: it counts
its optimizer steps and checkpoints, not the swarm's time.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

#: rounds ahead of this node's clock still accepted: a peer whose clock runs slightly ahead, or one that
#: started its step just after the tick
FUTURE_ROUNDS = 1


@dataclass(frozen=True)
class RoundClock:
    """The swarm's global round: ``floor((time - epoch) / round_length)``, the same on every machine."""

    round_length: float
    epoch: float = 0.0

    def __post_init__(self) -> None:
        if not self.round_length > 0:
            raise ValueError("round_length must be positive")

    def round_at(self, unix_time: float) -> int:
        return max(0, math.floor((unix_time - self.epoch) / self.round_length))

    def now(self) -> int:
        return self.round_at(time.time())
