"""torch.distributed plumbing shared by both methods: local launches with torch's elastic launcher,
and process-group set-up that works the same under a user's own ``torchrun``."""

from __future__ import annotations

import datetime
import os
import socket
import uuid
from typing import Any, Callable

import torch
import torch.distributed as dist


def under_torchrun() -> bool:
    """True inside a worker started by ``torchrun`` (or our own launcher)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_process_group(backend: str = "auto", timeout_s: float = 300.0) -> tuple[int, int]:
    """Join the job's process group (gloo on CPU, NCCL when every rank has a GPU); returns (rank, world size)."""
    if not dist.is_initialized():
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def launch_local(nproc: int, entrypoint: Callable[..., Any], *args: Any, max_restarts: int = 0) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` in ``nproc`` local worker processes with torch's elastic launcher
    (the machinery behind ``torchrun``), rendezvous on loopback. Returns each rank's return value;
    a failed worker raises ``ChildFailedError`` naming the rank and its error."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"swarmlm-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"is_host": True},
        max_restarts=max_restarts,
        monitor_interval=0.5,
        start_method="spawn",
        logs_specs=None,
    )
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))}
    os.environ.update(env)
    return elastic_launch(config, entrypoint)(*args)
