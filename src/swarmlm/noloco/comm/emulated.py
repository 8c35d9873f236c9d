"""The injected network model: a communicator whose every message waits for the modelled link
(see :mod:`swarmlm.noloco.comm.link_model` for the model and why it was chosen), and all-reduce algorithms run
over point-to-point messages so that their hops can be delayed one by one."""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from swarmlm.noloco.comm.exchange import DistributedCommunicator, send_recv
from swarmlm.noloco.comm.link_model import LinkModel


class EmulatedCommunicator(DistributedCommunicator):
    """:class:`DistributedCommunicator` over an emulated link: every message sleeps ``link.message_s(bytes)`` before
    it is sent. NoLoCo's exchange keeps its rendezvous and fresh per-link groups; DiLoCo's and DDP's
    all-reduce runs as ``link.algorithm`` over point-to-point messages (gloo), so latency accumulates hop by
    hop. The store operations (rendezvous, heartbeats) are not delayed."""

    def __init__(self, *, link: LinkModel, p2p_group: dist.ProcessGroup | None = None, **kwargs):
        super().__init__(**kwargs)
        self.link = link
        self.p2p_group = p2p_group  # a gloo group over all ranks (None = the default group)
        self.delay_s = 0.0  # injected seconds, cumulative

    def _delay(self, nbytes: int) -> None:
        seconds = self.link.message_s(nbytes)
        if seconds > 0:
            time.sleep(seconds)
            self.delay_s += seconds

    # NoLoCo: one delayed message each way, concurrently, per link
    def pair_transfer(self, pg, ranks, payload, buffer, peer_index):
        self._delay(payload.numel() * payload.element_size())
        return send_recv(pg, ranks, payload, buffer, peer_index)

    # DiLoCo / DDP
    def all_reduce_mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        if self.world_size > 1:
            direct = tensor.device.type == "cpu" and tensor.is_contiguous()
            host = tensor if direct else tensor.detach().to("cpu").contiguous().clone()
            algorithm = self.link.algorithm
            if algorithm == "best":
                algorithm = self.link.best_algorithm(host.numel() * host.element_size(), self.world_size)
            emulated_allreduce_sum_(host, self.rank, self.world_size, algorithm, self._delay, self.p2p_group)
            if host is not tensor:
                tensor.copy_(host)
            tensor.div_(self.world_size)
            self.traffic.count_allreduce(tensor, self.world_size)
        self.traffic.seconds += time.perf_counter() - started
        return tensor


def _exchange(tensor_out: torch.Tensor, tensor_in: torch.Tensor, peer: int, group) -> None:
    """Send ``tensor_out`` to ``peer`` and receive ``tensor_in`` from it, concurrently."""
    ops = [dist.P2POp(dist.isend, tensor_out, peer, group=group), dist.P2POp(dist.irecv, tensor_in, peer, group=group)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def emulated_allreduce_sum_(x: torch.Tensor, rank: int, world: int, algorithm: str, delay, group=None) -> torch.Tensor:
    """Sum ``x`` (1-D, CPU, contiguous) over all ranks in place, by ``algorithm`` over point-to-point
    messages; ``delay(nbytes)`` is called before every send. Ranks are global ranks of ``group``."""
    x = x.view(-1)
    if world <= 1:
        return x
    if algorithm == "ring":
        _ring(x, rank, world, delay, group)
    elif algorithm == "tree":
        _tree(x, rank, world, delay, group)
    elif algorithm == "halving_doubling":
        _halving_doubling(x, rank, world, delay, group)
    else:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}")
    return x


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _ring(x: torch.Tensor, rank: int, world: int, delay, group) -> None:
    chunks = list(torch.tensor_split(x, world))
    buffer = torch.empty(chunks[0].numel(), dtype=x.dtype)
    # reduce-scatter: after it, rank r holds the full sum of chunk (r + 1) % world; then the all-gather
    _ring_pass(chunks, rank, world, delay, group, buffer, shift=0, reduce=True)
    _ring_pass(chunks, rank, world, delay, group, buffer, shift=1, reduce=False)


def _ring_pass(chunks: list[torch.Tensor], rank: int, world: int, delay, group, buffer: torch.Tensor, *, shift: int,
               reduce: bool) -> None:
    """world - 1 steps of the ring: at step s a rank sends chunk (rank - s + shift) to its right neighbour and adds
    (``reduce``) or copies what its left neighbour sends into chunk (rank - s + shift - 1)."""
    right, left = (rank + 1) % world, (rank - 1) % world
    for s in range(world - 1):
        send, recv = chunks[(rank - s + shift) % world], chunks[(rank - s + shift - 1) % world]
        delay(_nbytes(send))
        ops = [dist.P2POp(dist.isend, send.clone(), right, group=group),
               dist.P2POp(dist.irecv, buffer[:recv.numel()], left, group=group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if reduce:
            recv.add_(buffer[:recv.numel()])
        else:
            recv.copy_(buffer[:recv.numel()])


def _tree(x: torch.Tensor, rank: int, world: int, delay, group) -> None:
    buffer = torch.empty_like(x)
    mask = 1
    while mask < world:  # binomial reduce to rank 0
        if rank & mask:
            delay(_nbytes(x))
            dist.send(x, rank - mask, group=group)
            break
        if rank + mask < world:
            dist.recv(buffer, rank + mask, group=group)
            x.add_(buffer)
        mask <<= 1
    # binomial broadcast from rank 0, in the reverse order
    top = 1 << max(0, math.ceil(math.log2(world)) - 1)
    mask = top
    received = rank == 0
    while mask >= 1:
        if received and rank + mask < world and rank % (2 * mask) == 0:
            delay(_nbytes(x))
            dist.send(x, rank + mask, group=group)
        elif not received and rank % (2 * mask) == mask:
            dist.recv(x, rank - mask, group=group)
            received = True
        mask >>= 1


def _halving_doubling(x: torch.Tensor, rank: int, world: int, delay, group) -> None:
    p = 1 << (world.bit_length() - 1)
    extra = world - p
    if rank >= p:  # fold in: hand the tensor to rank - p, get the sum back at the end
        delay(_nbytes(x))
        dist.send(x, rank - p, group=group)
        dist.recv(x, rank - p, group=group)
        return
    if rank < extra:
        buffer = torch.empty_like(x)
        dist.recv(buffer, rank + p, group=group)
        x.add_(buffer)
    lo, hi = 0, x.numel()
    segments = []
    mask = p >> 1
    while mask >= 1:  # reduce-scatter by recursive halving
        partner = rank ^ mask
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if rank & mask == 0 else ((mid, hi), (lo, mid))
        incoming = torch.empty(keep[1] - keep[0], dtype=x.dtype)
        outgoing = x[give[0]:give[1]]
        delay(_nbytes(outgoing))
        _exchange(outgoing.clone(), incoming, partner, group)
        x[keep[0]:keep[1]].add_(incoming)
        segments.append(((lo, hi), keep, give, partner))
        lo, hi = keep
        mask >>= 1
    for (_whole, keep, give, partner) in reversed(segments):  # all-gather by recursive doubling
        incoming = torch.empty(give[1] - give[0], dtype=x.dtype)
        outgoing = x[keep[0]:keep[1]]
        delay(_nbytes(outgoing))
        _exchange(outgoing.clone(), incoming, partner, group)
        x[give[0]:give[1]].copy_(incoming)
    if rank < extra:
        delay(_nbytes(x))
        dist.send(x, rank + p, group=group)
