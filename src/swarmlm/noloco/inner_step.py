"""How one process of a replica computes an inner step's gradients: the step strategy a
:class:`~swarmlm.noloco.replica.Replica` holds.

The replica's loop (outer steps, optimizer, schedule, metrics, checkpoints, stopping) is the same for every
layout; what differs is where the model lives and how its gradients come about:

* :class:`DataParallelStep` (the default): the whole model in this process, forward and backward on the
  replica's own batches, and for DDP the gradients averaged over all replicas;
* :class:`~swarmlm.noloco.pipeline.step.PipelineStep` (``--stages`` > 1): one pipeline stage in this process,
  the micro-batches routed through the stages of all replicas.

A new layout implements :class:`InnerStep` and is chosen in :func:`swarmlm.noloco.launch.worker_main`.
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ContextManager

import torch

from swarmlm.noloco.comm.base import Communicator
from swarmlm.runtime.devices import autocast


def load_model_weights(model: torch.nn.Module, model_dir: Path) -> None:
    """Load a checkpoint's safetensors (sharded or not) into ``model``; tied weights are tied again."""
    from safetensors.torch import load_file

    index = model_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(model_dir / name)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"checkpoint {model_dir} does not fit the model: missing {missing}, unexpected {unexpected}")
    if tied:
        model.tie_weights()


class InnerStep(ABC):
    """The step strategy interface (see the module docstring), with the defaults of a whole model in one process.

    The replica calls :meth:`build_model` on the freshly built model, then :meth:`attach` once its model,
    optimizer, data and communicator exist; the other methods during training.
    """

    replica: Any  # the swarmlm.noloco.replica.Replica that holds this step (set by attach)

    @property
    def stop_in_store(self) -> bool:
        """Whether the ranks agree on stopping through the store (else the step's own collective carries it)."""
        return True

    def build_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The part of ``model`` this process trains."""
        return model

    def attach(self, replica: Any) -> None:
        self.replica = replica

    @property
    def outer_comm(self) -> Communicator:
        """The communicator of the outer step and of gradient averaging (the replica's, unless the layout splits it)."""
        return self.replica.comm

    def load_weights(self, model_dir: Path) -> None:
        load_model_weights(self.replica.model, model_dir)

    @abstractmethod
    def gradients(self, stop_flag: bool) -> tuple[float, bool]:
        """Leave this step's gradients in the parameters' ``.grad``; returns (loss, whether any rank asked to stop,
        where the step's own communication carries that request)."""

    def tokens_per_step(self) -> int:
        """Training tokens this process consumes per inner step (counted once per replica)."""
        config = self.replica.config
        return config.grad_accum * config.batch_size * config.seq_len

    def validation_loss(self) -> tuple[float, int]:
        """Summed next-token loss and token count over the fixed validation batches (the model is in eval mode)."""
        replica = self.replica
        total, count = 0.0, 0
        for batch in replica.val:
            batch = batch.to(replica.device)
            with autocast(replica.device, replica.bf16):
                loss = replica.model(input_ids=batch, labels=batch).loss
            tokens = batch.numel() - batch.shape[0]  # predictions per sequence: seq_len - 1
            total += float(loss) * tokens
            count += tokens
        return total, count

    def record(self) -> dict[str, Any]:
        """This step's figures for the metrics line."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What this layout adds to a checkpoint's ``state.json``."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def waiting(self) -> ContextManager:
        """Around a long wait that is not part of the step (the outer step, a checkpoint): this process is alive."""
        return contextlib.nullcontext()

    def stalled(self) -> ContextManager:
        """Around an injected stall: this process shows no sign of life."""
        return contextlib.nullcontext()


class DataParallelStep(InnerStep):
    """The whole model in this process: forward and backward on the replica's own batches (``grad_accum`` of
    them); with DDP, the gradients (and the stop request) are then averaged over all replicas."""

    def __init__(self, method: str):
        self.method = method

    @property
    def stop_in_store(self) -> bool:
        return self.method != "ddp"  # DDP agrees on stopping through its gradient all-reduce

    def gradients(self, stop_flag: bool) -> tuple[float, bool]:
        loss = self.local_gradients()
        stop = stop_flag
        if self.method == "ddp" and self.replica.world > 1:
            stop = self.replica.all_reduce_gradients(stop_flag)
        return loss, stop

    def local_gradients(self) -> float:
        """This replica's own gradients, left in ``.grad``, from its next ``grad_accum`` batches; returns its loss."""
        replica, config = self.replica, self.replica.config
        total = 0.0
        for _ in range(config.grad_accum):
            batch = replica.data.sampler.next_batch().to(replica.device)
            with autocast(replica.device, replica.bf16):
                loss = replica.model(input_ids=batch, labels=batch).loss / config.grad_accum
            loss.backward()
            total += float(loss.detach())
        return total
