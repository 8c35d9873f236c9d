"""The in-process backend's inner step for many small replicas: all M forward and backward passes as one computation.

With ``--backend in_process`` the M replicas of a run share one device and take turns; for a small model each
replica's step is mostly per-operation overhead, paid M times. :class:`StackedStep` pays it once: every replica's
weights live in one row of a stacked tensor ``[M, ...]`` per parameter (the replica's own parameters are views of
its row), and one call of the model, vectorised over the replicas with :func:`torch.func.vmap`, gives all M losses
and gradients (and, at an evaluation, all M validation losses). Each replica then clips, steps its own optimizer
and takes its outer steps exactly as it would alone (:class:`~swarmlm.noloco.replica.Replica`): only where its
gradients come from changes. A model with dropout draws each replica's masks in the stacked call, from that call's
random state rather than the replica's own.

The replicas stay independent: replica i's gradient is the gradient of its own loss on its own batch at its own
weights (the sum of the M losses has no cross terms). The results equal the one-replica-at-a-time step
(:class:`~swarmlm.noloco.inner_step.DataParallelStep`) up to floating-point rounding, tested; over hundreds of steps
the two drift apart in the last bits, as two runs on different hardware do. The stacked call uses the model's
eager attention, which vmap batches (PyTorch's fused CPU attention has no batching rule). Each replica's simulated
clock is charged an equal share of the stacked training call (evaluation stays off the clock).

``--stack-replicas auto`` (the default) stacks every in-process run of more than one replica (a model that
vmap cannot vectorise stops the run at its first step, saying to use ``never``); ``never`` keeps the step of one
replica at a time.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from swarmlm.noloco.inner_step import DataParallelStep
from swarmlm.runtime.devices import autocast


class StackedWeights:
    """The weights of the M replicas of one in-process run, one stacked tensor ``[M, *shape]`` per parameter, and the
    model function that computes all M losses at once. Each replica :meth:`adopt`\\ s its model once; from then on
    its parameters are views of its row, so its optimizer and outer step write the stack in place."""

    def __init__(self, m: int):
        self.m = m
        self.stacks: dict[str, torch.Tensor] = {}
        self._shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}
        self._template: torch.nn.Module | None = None
        self._losses: Any = None

    def adopt(self, row: int, model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
        """Move ``model``'s trainable parameters into row ``row`` of the stacks; returns them by name (tied
        parameters once)."""
        params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        shapes = {name: (p.shape, p.dtype) for name, p in params.items()}
        if not self.stacks:
            self._shapes = shapes
            self.stacks = {name: torch.zeros((self.m, *p.shape), dtype=p.dtype, device=p.device)
                           for name, p in params.items()}
            self._template, self._losses = self._vectorised(model)
        elif shapes != self._shapes:
            raise RuntimeError(f"stacked replicas: replica {row}'s parameters differ from replica 0's; every replica "
                               "must be the same model (use --stack-replicas never otherwise)")
        with torch.no_grad():
            for name, p in params.items():
                self.stacks[name][row].copy_(p)
                p.data = self.stacks[name][row]
        return params

    @staticmethod
    def _vectorised(model: torch.nn.Module) -> tuple[torch.nn.Module, Any]:
        """A private copy of the model with eager attention, and ``f(params, ids[M, B, T]) -> losses[M]``: its
        causal-LM loss, vectorised over the parameters' leading dimension."""
        from torch.func import functional_call, vmap

        template = copy.deepcopy(model)
        template.config._attn_implementation = "eager"  # vmap batches eager attention; the fused CPU kernel it loops

        def loss(params: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
            return functional_call(template, params, (), {"input_ids": ids, "labels": ids}).loss

        return template, vmap(loss, in_dims=(0, 0), randomness="different")

    def step(self, batches: list[torch.Tensor], *, bf16: bool, device: torch.device
             ) -> tuple[list[float], dict[str, torch.Tensor]]:
        """Every replica's loss and gradients for one inner step. ``batches[i]``: replica i's micro-batches
        ``[A, B, T]`` (A = grad_accum); returns (each replica's loss, the gradients stacked ``[M, ...]``)."""
        ids = torch.stack(batches).to(device)
        leaves = {name: stack.detach().requires_grad_() for name, stack in self.stacks.items()}
        total = torch.zeros(self.m, dtype=torch.float64)
        accum = ids.shape[1]
        for a in range(accum):
            try:
                with autocast(device, bf16):
                    losses = self._losses(leaves, ids[:, a]) / accum
                losses.sum().backward()
            except (RuntimeError, NotImplementedError) as err:
                raise RuntimeError(f"stacked replicas: the model could not be vectorised over its replicas "
                                   f"({type(err).__name__}: {err}); run with --stack-replicas never") from err
            total += losses.detach().to(torch.float64).cpu()
        return total.tolist(), {name: leaf.grad for name, leaf in leaves.items()}

    @torch.no_grad()
    def validation(self, batches: list[list[torch.Tensor]], *, bf16: bool, device: torch.device
                   ) -> list[tuple[float, int]]:
        """Every replica's summed next-token loss and token count over its validation batches (``batches[i]``:
        replica i's), in eval mode, as :meth:`~swarmlm.noloco.inner_step.InnerStep.validation_loss` computes them."""
        assert self._template is not None
        totals = [0.0] * self.m
        count = 0
        self._template.eval()
        try:
            for b in range(len(batches[0])):
                ids = torch.stack([mine[b] for mine in batches]).to(device)
                with autocast(device, bf16):
                    losses = self._losses(self.stacks, ids)
                tokens = ids[0].numel() - ids.shape[1]  # predictions per sequence: seq_len - 1
                for row, loss in enumerate(losses.tolist()):
                    totals[row] += loss * tokens
                count += tokens
        finally:
            self._template.train()
        return [(total, count) for total in totals]


class StackedStep(DataParallelStep):
    """One replica's share of the stacked inner step (see the module docstring): it hands its batches in, the
    in-process communicator has the M replicas' step computed once (:meth:`StackedWeights.step`), and the replica
    takes its own loss and gradients (:meth:`local_gradients`); validation is stacked the same way. DDP's gradient
    average and the stop check are the data-parallel step's own."""

    def __init__(self, method: str, weights: StackedWeights):
        super().__init__(method)
        self.weights = weights
        self.params: dict[str, torch.nn.Parameter] = {}

    def attach(self, replica: Any) -> None:
        super().attach(replica)
        self.params = self.weights.adopt(replica.rank, replica.model)

    def local_gradients(self) -> float:
        replica, config = self.replica, self.replica.config
        batches = torch.stack([replica.data.sampler.next_batch() for _ in range(config.grad_accum)])
        losses, grads = replica.comm.compute_together(
            batches, lambda parts: self.weights.step(parts, bf16=replica.bf16, device=replica.device))
        for name, p in self.params.items():
            p.grad = grads[name][replica.rank]
        return losses[replica.rank]

    def validation_loss(self) -> tuple[float, int]:
        replica = self.replica
        results = replica.comm.compute_together(
            replica.val, lambda parts: self.weights.validation(parts, bf16=replica.bf16, device=replica.device),
            on_clock=False)
        return results[replica.rank]
