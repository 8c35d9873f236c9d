"""Transports for SAPO rollouts, all behind :class:`RolloutTransport`."""

from swarmlm.sapo.transports.base import Received, RolloutTransport
from swarmlm.sapo.transports.in_process import InProcessHub, InProcessTransport

__all__ = ["InProcessHub", "InProcessTransport", "Received", "RolloutTransport"]
