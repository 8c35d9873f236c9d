"""Injected faults (``--faults.*``): a rank that exits, or stalls, at a chosen outer step, to test what the
others do. Outside the method: a :class:`~swarmlm.noloco.hooks.ReplicaHook` acting just before the outer step."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from swarmlm.noloco.hooks import ReplicaHook

if TYPE_CHECKING:
    import torch

    from swarmlm.noloco.comm.clock import RunClock

log = logging.getLogger(__name__)

EXIT_CODE_INJECTED = 17


class FaultInjector(ReplicaHook):
    """``--faults.exit-rank`` ends the process (exit code :data:`EXIT_CODE_INJECTED`) before its outer step;
    ``--faults.stall-rank`` stalls it there for ``--faults.stall-s`` seconds on its clock (real time sleeps, a
    simulated clock advances), with no sign of life meanwhile."""

    def __init__(self, replica: Any, clock: "RunClock"):
        self.replica = replica
        self.clock = clock
        self.faults = replica.config.faults

    def before_outer(self, outer_step: int, theta: "torch.Tensor") -> None:
        faults, rank = self.faults, self.replica.rank
        if faults.exit_rank == rank and faults.exit_outer_step == outer_step:
            log.error("rank %d: injected exit at outer step %d", rank, outer_step)
            logging.shutdown()
            os._exit(EXIT_CODE_INJECTED)
        if faults.stall_rank == rank and outer_step in faults.stall_outer_steps and faults.stall_s > 0:
            log.warning("rank %d: injected stall of %.1fs at outer step %d", rank, faults.stall_s, outer_step)
            with self.replica.inner_step.stalled():
                self.clock.stall(faults.stall_s)
