"""What a SAPO node's run reports, measured from outside its method: :class:`NodeObserver`.

It times the parts of each round, evaluates the policy on the held-out set (before the first update, every
``eval_every`` rounds and at the last), and writes one line per round to ``metrics.jsonl`` with TensorBoard events
beside it (:class:`~swarmlm.runtime.metrics.MetricsWriter`); the line is
:func:`~swarmlm.sapo.round_metrics.round_record` of the round's outcome.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterator

from swarmlm.runtime.metrics import MetricsWriter
from swarmlm.sapo.hooks import NodeHook
from swarmlm.sapo.round_metrics import RoundTimes, round_record


class NodeObserver(NodeHook):
    """One node's evaluations, timings and metrics (see the module docstring)."""

    def __init__(self, out_dir: str | Path, *, resume_from: int, eval_every: int, rounds: int, tensorboard: bool = True):
        self.metrics = MetricsWriter(out_dir, step_key="round", resume_from=resume_from, tensorboard=tensorboard)
        self.eval_every, self.rounds = eval_every, rounds
        self.last: dict[str, Any] = {}  # the last round's metrics line
        self._seconds: dict[str, float] = defaultdict(float)
        self._round_started = time.perf_counter()

    def started(self, node: Any) -> None:
        """Held-out pass@1 before any update, as the ``round: 0`` line (once: a resumed run has it already)."""
        if node.round > 0 or any(r.get("round") == 0 for r in self.metrics.records()):
            return
        self.metrics.log({"round": 0, "node": node.node_id, **node.evaluate(), "cumulative_reward_own": 0.0})

    def round_begins(self, round: int) -> None:
        self._round_started = time.perf_counter()
        self._seconds.clear()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] += time.perf_counter() - started

    def round_done(self, node: Any, outcome: Any) -> None:
        round = outcome.own.round
        due = round == self.rounds or (self.eval_every > 0 and round % self.eval_every == 0)
        evaluation = node.evaluate() if due else {"eval_pass1": None}
        s = self._seconds
        times = RoundTimes(generate=s["generate"], publish=s["publish"], collect=s["collect"], intake=s["intake"],
                           verify=s["verify"], update=s["update"], round=time.perf_counter() - self._round_started)
        self.last = round_record(outcome, evaluation, times)
        self.metrics.log(self.last)

    def records(self) -> list[dict[str, Any]]:
        """Every line written so far (this run's and, resumed, the earlier ones kept)."""
        return self.metrics.records()

    def close(self) -> None:
        self.metrics.close()
