"""The injected link in real processes: every emulated all-reduce algorithm sums exactly and takes at least its
messages' delays, and NoLoCo's pair exchange pays one delay per link."""

from __future__ import annotations

import math
import multiprocessing as mp
import time

import pytest

from swarmlm.noloco.comm.link_model import LinkModel

LATENCY = 0.05


def _emulation_worker(rank: int, world: int, port: int, queue) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from swarmlm.noloco.comm.emulated import EmulatedCommunicator

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    out = {}
    for algorithm in ("ring", "tree", "halving_doubling"):
        comm = EmulatedCommunicator(link=LinkModel(LATENCY, math.inf, algorithm), rank=rank, world_size=world,
                                    timeout_s=30, run_key="emu")
        x = torch.arange(10, dtype=torch.float32) * (rank + 1)
        dist.barrier()
        started = time.perf_counter()
        comm.all_reduce_mean_(x)
        seconds = time.perf_counter() - started
        expected = torch.arange(10, dtype=torch.float32) * sum(range(1, world + 1)) / world
        out[algorithm] = {"ok": bool(torch.allclose(x, expected)), "seconds": seconds, "delay_s": comm.delay_s}
    # NoLoCo's exchange over the emulated link: rank 2 has no partner this time
    comm = EmulatedCommunicator(link=LinkModel(LATENCY, math.inf), rank=rank, world_size=world, timeout_s=30, run_key="emu")
    dist.barrier()
    started = time.perf_counter()
    result = comm.exchange(1, [0, 1] if rank < 2 else [2], torch.full((10,), float(rank)))
    out["pair"] = {"seconds": time.perf_counter() - started, "received": {str(k): float(v[0]) for k, v in result.received.items()}}
    queue.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_emulated_allreduce_and_pair_in_processes():
    """Three processes (not a power of two): every algorithm sums exactly, and takes at least its messages' delays."""
    from swarmlm.runtime.distributed import free_port

    world = 3
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_emulation_worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * world
    link = LinkModel(LATENCY, math.inf)
    for algorithm in ("ring", "tree", "halving_doubling"):
        slowest = max(results[r][algorithm]["seconds"] for r in range(world))
        assert all(results[r][algorithm]["ok"] for r in range(world)), algorithm
        # ring: 4 messages in a row; halving-doubling: fold in, one exchange, fold out = 4; the binomial tree
        # for M = 3 overlaps two of its four (the model's formula is an upper bound there)
        floor = {"ring": 4, "tree": 3, "halving_doubling": 4}[algorithm] * LATENCY
        assert floor - 0.01 <= slowest < link.allreduce_s(40, world, algorithm) + 1.5, (algorithm, slowest)
    assert results[0]["pair"]["received"] == {"1": 1.0} and results[1]["pair"]["received"] == {"0": 0.0}
    assert LATENCY - 0.01 <= results[0]["pair"]["seconds"] < LATENCY + 1.5
    assert results[2]["pair"]["received"] == {} and results[2]["pair"]["seconds"] < LATENCY
