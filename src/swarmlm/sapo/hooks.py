"""What runs around a SAPO node's round without being part of its method.

:class:`~swarmlm.sapo.node.SAPONode` does the method: generate, score and publish its own groups, take in its
peers', update, checkpoint. It tells its hooks what happened, as small events, and they do the rest;
:class:`~swarmlm.sapo.observer.NodeObserver`, the hook every node has, turns them into the held-out evaluations,
``metrics.jsonl`` and TensorBoard events.

A hook receives the node itself (typed ``Any`` here: the node module imports this one, never the reverse).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager


class NodeHook:
    """The events of a node's round, each a no-op here (see the module docstring)."""

    def started(self, node: Any) -> None:
        """The node is about to play round ``node.round + 1`` for the first time in this process (a fresh node has
        ``node.round == 0``)."""

    def round_begins(self, round: int) -> None:
        """The node starts round ``round`` (1-based): its first half, :meth:`~swarmlm.sapo.node.SAPONode.play`."""

    def phase(self, name: str) -> ContextManager:
        """Around one part of the round: ``generate`` (the own completions), ``publish``, ``collect`` (reading
        the peers' messages), ``intake`` (their records checked and tokenized), ``verify`` (their answers scored)
        and ``update``."""
        return contextlib.nullcontext()

    def round_done(self, node: Any, outcome: Any) -> None:
        """The round's update is applied (``outcome``: its :class:`~swarmlm.sapo.round_metrics.RoundOutcome`); its
        checkpoint, if due, comes next."""

    def close(self) -> None:
        """The node is closing."""
