"""What a node generated in a round, between its two halves (:meth:`~swarmlm.sapo.node.SAPONode.play` and
:meth:`~swarmlm.sapo.node.SAPONode.learn`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from swarmlm.sapo.engines.base import Generated


@dataclass
class OwnRollouts:
    """What a node generated in :meth:`SAPONode.play`, kept for :meth:`SAPONode.learn`."""

    round: int
    generated: list[Generated]
    scores: list[list[float]]  # the task's scores of each group's completions (before ``grpo.reward``)
    global_round: int | None = None  # the swarm-wide round its records were published under
    families: list[str] = field(default_factory=list)  # each group's task family
