"""One process's share of a pipelined inner step with NoLoCo's random routing (NoLoCo,
arXiv 2506.10911; the routing is in :mod:`swarmlm.noloco.pipeline.routing`).

One inner step (:class:`PipelineSchedule`)
------------------------------------------
Stage 0 of each replica draws ``grad_accum`` batches from its own shard and cuts each into
``pipeline.micro_batches`` micro-batches: n micro-batches in all, each a *piece* with an id
(origin replica, index). The step has n + ``pipeline.retry_slots`` *slots*. In slot m, every stage-s
process hands what it has to stage s+1 of replica π_{s,t,m}(d): activations and labels forward.
Then, in reverse slot order, gradients come back over the same links (GPipe order: all forwards, then
all backwards; every hop is a blocking hand-over, so no process ever holds more than one step's
activations, and the schedule cannot deadlock because every slot is a perfect matching and all
processes walk the slots in the same order).

A hop whose peer does not answer in time (:class:`~swarmlm.noloco.comm.links.PipeLinks`) fails cleanly on
both sides. The sender counts the failure and keeps the activations: they are *carried* into the next
slot and sent together with that slot's micro-batch, along that slot's route, which goes to a
different next-stage replica (consecutive slots' permutations differ everywhere). The retry slots at
the end exist for this: they carry no new micro-batch, only what earlier slots could not deliver.
What is still undelivered after the last slot is dropped (counted) and its stages upstream are told,
so they never wait for its gradient. A piece whose gradient cannot come back is dropped upstream the
same way. The loss of every piece travels back with its gradient, so stage 0 logs the loss of its
own data wherever it went.

Gradients at each stage are the mean over the pieces whose gradient reached it (normally all n of them).

Evaluation runs the fixed validation batches along identity routes (replica d's stages in order),
forward only, and the last stage's total is relayed back to every stage of the replica.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch

from swarmlm.noloco.comm.links import PipeLinks
from swarmlm.noloco.pipeline.routing import Routes, Routing, rank_of
from swarmlm.noloco.pipeline.stages import StageModule
from swarmlm.runtime.devices import autocast

log = logging.getLogger(__name__)


@dataclass
class Chunk:
    """Micro-batch pieces that a stage computed in one go (received together, or one own micro-batch)."""

    pieces: list[list[int]]  # [origin replica, micro-batch index, rows] per piece, in row order
    labels: torch.Tensor  # [rows, T] token ids
    x: torch.Tensor | None  # the received activations (leaf, requires grad); None on stage 0
    out: torch.Tensor | None = None  # this stage's output (non-last stages)
    loss_terms: torch.Tensor | None = None  # per-piece mean losses, with graph (last stage)
    losses: list[float] | None = None  # per-piece loss values, once known
    upstream: int | None = None  # rank it came from
    done: bool = False  # its backward ran (the gradient reached this stage)

    @property
    def rows(self) -> int:
        return sum(p[2] for p in self.pieces)


@dataclass
class StepReport:
    """What one process saw in one inner step."""

    own_losses: dict[int, float] = field(default_factory=dict)  # stage 0: micro-batch index -> loss
    losses: list[float] = field(default_factory=list)  # every piece loss this process learned
    pieces_ok: int = 0  # pieces whose gradient reached this stage (the gradient is their mean)
    piece_ids: list[tuple[int, int]] = field(default_factory=list)  # (origin replica, micro-batch index) of those pieces
    failures: int = 0  # forward hops carrying pieces that failed (peer did not answer in time)
    retried: int = 0  # pieces delivered in a later slot after a failed hop
    dropped: int = 0  # pieces this stage could not deliver in any slot
    grad_lost: int = 0  # pieces whose gradient never came back to this stage
    sent_to: list[int | None] = field(default_factory=list)  # per slot: the rank this stage sent to
    recv_from: list[int | None] = field(default_factory=list)  # per slot: the rank this stage received from

    @property
    def loss(self) -> float:
        values = list(self.own_losses.values()) or self.losses
        return sum(values) / len(values) if values else math.nan


class PipelineSchedule:
    """Runs one process's share of the pipeline schedule (see the module docstring)."""

    def __init__(self, module: StageModule, links: PipeLinks, *, replica: int, stage: int, num_replicas: int,
                 num_stages: int, seed: int, num_micro_batches: int, retry_slots: int, routing: Routing = "random",
                 device: torch.device | str = "cpu", bf16: bool = False):
        self.module = module
        self.links = links
        self.replica = replica
        self.stage = stage
        self.M = num_replicas
        self.S = num_stages
        self.rank = rank_of(replica, stage, num_stages)
        self.seed = seed
        self.n = num_micro_batches
        self.slots = num_micro_batches + retry_slots
        self.routing = routing
        self.device = torch.device(device)
        self.bf16 = bf16
        self.first = stage == 0
        self.last = stage == num_stages - 1
        self._eval_count = 0

    # ----- naming: both sides of a hop derive the same name
    @staticmethod
    def _name(kind: str, step: int, slot: int, up: int, down: int) -> str:
        return f"{kind}{step}/{slot}/{up}-{down}"

    def routes(self, step: int) -> Routes:
        return Routes(num_replicas=self.M, num_stages=self.S, seed=self.seed, step=step, num_slots=self.slots,
                      routing=self.routing)

    # ----- compute
    def _forward(self, inputs: torch.Tensor, labels: torch.Tensor, pieces: list[list[int]], **kw) -> Chunk:
        x = None
        if not self.first:
            x = inputs.to(self.device).requires_grad_(True)
            inputs = x
        else:
            inputs = inputs.to(self.device)
        chunk = Chunk(pieces=pieces, labels=labels, x=x, **kw)
        with autocast(self.device, self.bf16):
            out = self.module(inputs)
        if self.last:
            sums, counts = StageModule.token_losses(out, labels)
            terms, row = [], 0
            for piece in pieces:
                r = piece[2]
                terms.append(sums[row:row + r].sum() / counts[row:row + r].sum().clamp(min=1))
                row += r
            chunk.loss_terms = torch.stack(terms)
            chunk.losses = [float(v) for v in chunk.loss_terms.detach()]
        else:
            chunk.out = out
        return chunk

    # ----- one inner step
    def train_step(self, step: int, micro_batches: list[torch.Tensor] | None = None) -> StepReport:
        """Forward and backward of every slot of ``step``; leaves in each parameter's ``.grad`` the mean
        gradient over the pieces that reached this stage. Stage 0 passes its ``micro_batches``."""
        if self.first and (micro_batches is None or len(micro_batches) != self.n):
            raise ValueError(f"stage 0 needs {self.n} micro-batches")
        routes = self.routes(step)
        report = StepReport()
        own, received, sent = self._forward_slots(step, routes, micro_batches, report)
        self._backward_slots(step, received, sent, report)
        if self.first:
            for slot, chunk in own.items():
                if chunk.done and chunk.losses:
                    report.own_losses[slot] = chunk.losses[0]
        if report.pieces_ok > 0:
            scale = 1.0 / report.pieces_ok
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        return report

    def _forward_slots(self, step: int, routes: Routes, micro_batches: list[torch.Tensor] | None,
                       report: StepReport) -> tuple[dict[int, Chunk], dict[int, Chunk], dict[int, tuple[int, list[Chunk]]]]:
        """The forward pass, slot by slot: this stage's chunk of each slot (its own micro-batch on stage 0, what
        arrived from upstream otherwise) goes downstream with the pieces a failed hop carried. Returns stage 0's own
        chunks, the received chunks and, per slot, the downstream rank and the chunks delivered to it."""
        own: dict[int, Chunk] = {}
        received: dict[int, Chunk] = {}
        sent: dict[int, tuple[int, list[Chunk]]] = {}
        carry: list[Chunk] = []
        carried_since: int | None = None
        for slot in range(self.slots):
            chunk = None
            if self.first:
                report.recv_from.append(None)
                if slot < self.n:
                    batch = micro_batches[slot]
                    chunk = own[slot] = self._forward(batch, batch, [[self.replica, slot, int(batch.shape[0])]])
            else:
                chunk = self._receive_forward(step, routes, slot, report)
                if chunk is not None:
                    received[slot] = chunk
            if self.last:
                report.sent_to.append(None)
                continue
            bundle = carry + ([chunk] if chunk is not None else [])
            down = rank_of(routes.next_replica(self.replica, self.stage, slot), self.stage + 1, self.S)
            if self._send_forward(step, slot, down, bundle, report):
                if bundle:
                    sent[slot] = (down, bundle)
                    if carry:
                        report.retried += sum(len(c.pieces) for c in carry)
                        log.info("rank %d step %d: %d piece(s) from slot %d delivered in slot %d to rank %d", self.rank,
                                 step, sum(len(c.pieces) for c in carry), carried_since, slot, down)
                carry, carried_since = [], None
            elif bundle:
                carry = bundle
                carried_since = slot if carried_since is None else carried_since
        if carry:
            report.dropped += sum(len(c.pieces) for c in carry)
        return own, received, sent

    def _receive_forward(self, step: int, routes: Routes, slot: int, report: StepReport) -> Chunk | None:
        """The activations of ``slot`` from upstream, run through this stage; None where nothing came."""
        up = rank_of(routes.prev_replica(self.replica, self.stage, slot), self.stage - 1, self.S)
        report.recv_from.append(up)
        result = self.links.recv(self._name("f", step, slot, up, self.rank), up)
        if result.ok and result.tensors:
            activations, labels = result.tensors
            return self._forward(activations, labels, result.header["pieces"], upstream=up)
        if not result.ok and result.reason.startswith("transfer"):
            self.links.abandon(self._name("b", step, slot, up, self.rank))  # the sender may think it delivered
        return None

    def _send_forward(self, step: int, slot: int, down: int, bundle: list[Chunk], report: StepReport) -> bool:
        """Send ``bundle``'s outputs and labels downstream in ``slot`` (an empty message where there is none);
        whether the hop succeeded. A failed hop with pieces counts as a failure and closes the way back."""
        report.sent_to.append(down)
        tensors, header = [], {"pieces": []}
        if bundle:
            tensors = [torch.cat([c.out.detach() for c in bundle]), torch.cat([c.labels for c in bundle])]
            header["pieces"] = [p for c in bundle for p in c.pieces]
        result = self.links.send(self._name("f", step, slot, self.rank, down), down, header, tensors)
        if result.ok:
            return True
        if result.reason.startswith("transfer"):
            self.links.abandon(self._name("b", step, slot, self.rank, down))
        if bundle:
            report.failures += 1
            log.warning("rank %d step %d slot %d: hop to rank %d failed (%s); %d piece(s) %s", self.rank, step,
                        slot, down, result.reason, len(header["pieces"]),
                        "carried to the next slot" if slot + 1 < self.slots else "dropped")
        return False

    def _backward_slots(self, step: int, received: dict[int, Chunk], sent: dict[int, tuple[int, list[Chunk]]],
                        report: StepReport) -> None:
        """The backward pass, in reverse slot order: the loss on the last stage, the gradient from downstream on
        the others; then the gradient of what was received goes back upstream (or word that it was dropped)."""
        for slot in reversed(range(self.slots)):
            if self.last:
                chunk = received.get(slot)
                if chunk is not None:
                    chunk.loss_terms.sum().backward()
                    chunk.done = True
                    self._count_done(chunk, report)
            elif slot in sent:
                self._backward_from_downstream(step, slot, *sent[slot], report)
            if not self.first and slot in received:
                self._send_backward(step, slot, received[slot])

    def _backward_from_downstream(self, step: int, slot: int, down: int, bundle: list[Chunk],
                                  report: StepReport) -> None:
        """Backpropagate the gradient ``down`` returned for ``bundle`` (the losses come with it); a gradient that
        never came, or came as dropped, counts its pieces as lost."""
        result = self.links.recv(self._name("b", step, slot, self.rank, down), down)
        if not (result.ok and result.tensors and not result.header.get("dropped")):
            report.grad_lost += sum(len(c.pieces) for c in bundle)
            return
        grads = torch.split(result.tensors[0], [c.rows for c in bundle])
        torch.autograd.backward([c.out for c in bundle], [g.to(self.device, c.out.dtype) for c, g in zip(bundle, grads)])
        losses = result.header.get("losses", [])
        at = 0
        for c in bundle:
            c.done = True
            c.losses = losses[at:at + len(c.pieces)]
            at += len(c.pieces)
            c.out = None  # free the graph's output
            self._count_done(c, report)

    @staticmethod
    def _count_done(chunk: Chunk, report: StepReport) -> None:
        report.pieces_ok += len(chunk.pieces)
        report.piece_ids.extend((p[0], p[1]) for p in chunk.pieces)
        report.losses.extend(chunk.losses)

    def _send_backward(self, step: int, slot: int, chunk: Chunk) -> None:
        """The gradient of ``chunk``'s received activations back upstream, with its losses; ``dropped`` where its
        gradient never reached this stage."""
        if chunk.done and chunk.x.grad is not None:
            header, tensors = {"losses": chunk.losses, "dropped": False}, [chunk.x.grad]
        else:
            header, tensors = {"dropped": True}, []
        self.links.send(self._name("b", step, slot, chunk.upstream, self.rank), chunk.upstream, header, tensors)
        chunk.x = None

    # ----- evaluation along identity routes
    @torch.no_grad()
    def evaluate(self, batches: list[torch.Tensor] | None, num_batches: int) -> tuple[float, int]:
        """Summed next-token loss and token count of the validation batches, through replica d's own stages;
        every stage returns the totals. Stage 0 passes the ``batches``."""
        key = self._eval_count
        self._eval_count += 1
        up = rank_of(self.replica, self.stage - 1, self.S) if not self.first else None
        down = rank_of(self.replica, self.stage + 1, self.S) if not self.last else None
        total, tokens = 0.0, 0
        for k in range(num_batches):
            inputs = labels = None
            if self.first:
                inputs = labels = batches[k]
            else:
                result = self.links.recv(self._name("e", key, k, up, self.rank), up)
                if result.ok and result.tensors:
                    inputs, labels = result.tensors
            out = None
            if inputs is not None:
                with autocast(self.device, self.bf16):
                    out = self.module(inputs.to(self.device))
            if self.last:
                if out is not None:
                    sums, counts = StageModule.token_losses(out, labels)
                    total += float(sums.sum())
                    tokens += int(counts.sum())
                continue
            tensors = [out, labels] if out is not None else []
            self.links.send(self._name("e", key, k, self.rank, down), down, {}, tensors)
        if not self.last:
            result = self.links.recv(self._name("r", key, 0, self.rank, down), down)
            total, tokens = (float(result.header["loss_sum"]), int(result.header["tokens"])) if result.ok else (0.0, 0)
        if not self.first:
            self.links.send(self._name("r", key, 0, up, self.rank), up, {"loss_sum": total, "tokens": tokens})
        return total, tokens
