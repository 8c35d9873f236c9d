"""How NoLoCo's replicas talk: the :class:`~swarmlm.noloco.comm.base.Communicator` interface of the outer step,
its torch.distributed implementation (:mod:`.exchange`), the injected link (:mod:`.emulated`) and the in-process
backend (:mod:`.in_process`: M replicas in one process, on a simulated clock), the deadline rendezvous both the
outer exchange and the pipeline hops use (:mod:`.rendezvous`), the pipeline's hops (:mod:`.links`) and the α-β
link model (:mod:`.link_model`).

:func:`make_communicator` picks the implementation; a new backend is one more module here and one more branch.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from swarmlm.runtime.lazy import lazy_exports

if TYPE_CHECKING:
    from swarmlm.noloco.comm.base import Communicator
    from swarmlm.noloco.comm.emulated import EmulatedCommunicator
    from swarmlm.noloco.comm.exchange import DistributedCommunicator, launch_key
    from swarmlm.noloco.comm.in_process import InProcessHub
    from swarmlm.noloco.comm.link_model import LinkModel
    from swarmlm.noloco.config import NetworkSection

log = logging.getLogger(__name__)

# imported on first use (PEP 562): the link model (:mod:`.link_model`, pure Python) is read by the command line's
# configs, which must not import torch
_HOME = {"Communicator": "base", "EmulatedCommunicator": "emulated", "DistributedCommunicator": "exchange",
         "launch_key": "exchange", "InProcessHub": "in_process", "LinkModel": "link_model"}


__getattr__ = lazy_exports(__name__, _HOME)


def make_communicator(network: "NetworkSection", *, rank: int, world_size: int, timeout_s: float,
                      hub: InProcessHub | None = None) -> Communicator:
    """The communicator of one rank: with ``hub``, replica ``rank`` of the in-process backend (the hub holds the
    link model); otherwise one rank of a torch.distributed run, plain or over the injected link (``network.inject``).
    Every rank of a torch.distributed run calls it at the same point (it agrees on a launch key)."""
    if hub is not None:
        return hub.communicator(rank)
    import torch.distributed as dist

    from swarmlm.noloco.comm.emulated import EmulatedCommunicator
    from swarmlm.noloco.comm.exchange import DistributedCommunicator, launch_key
    from swarmlm.noloco.comm.link_model import LinkModel

    run_key = launch_key(rank, world_size)
    if not network.inject:
        return DistributedCommunicator(rank=rank, world_size=world_size, timeout_s=timeout_s, run_key=run_key)
    link = LinkModel.from_config(network)
    p2p_group = None
    if dist.is_initialized() and dist.get_backend() != "gloo":
        p2p_group = dist.new_group(backend="gloo")  # the emulation sends host tensors point to point
    log.info("rank %d: injecting a network of %s into every message", rank, link.describe())
    return EmulatedCommunicator(link=link, p2p_group=p2p_group, rank=rank, world_size=world_size, timeout_s=timeout_s,
                                run_key=run_key)
