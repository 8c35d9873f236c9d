"""The in-process backend: M replicas as threads of one process taking turns, exchanging through memory, on a
simulated clock. Its collectives and pair links against direct computation, its clock against the offline
simulated clock of ``noloco compare`` (the same synchronisation rules, driven by the same compute times), the
deadline of the pair rendezvous on that clock, stalls and failures, and a short training run with a straggler."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch

from swarmlm.cli import main
from swarmlm.experiments.sim_clock import simulate_clock
from swarmlm.noloco.comm import make_communicator
from swarmlm.noloco.comm.in_process import InProcessAborted, InProcessDeadlock, InProcessHub
from swarmlm.noloco.comm.link_model import LinkModel
from swarmlm.noloco.config import NetworkSection
from swarmlm.noloco.groups import make_groups
from swarmlm.noloco.replica import rank_dir
from swarmlm.runtime.metrics import read_jsonl


def _run(m: int, body, **hub_kwargs) -> tuple[InProcessHub, dict]:
    hub = InProcessHub(m, **hub_kwargs)
    comms = {r: make_communicator(NetworkSection(), rank=r, world_size=m, timeout_s=60, hub=hub) for r in range(m)}
    return hub, hub.run(lambda r: body(r, comms[r]))


def test_collectives_and_pairs_through_memory():
    m = 5
    data = {r: torch.arange(6, dtype=torch.float32) * (r + 1) for r in range(m)}

    def body(rank, comm):
        x = data[rank].clone()
        comm.all_reduce_mean_(x)
        std = comm.replica_std(data[rank])
        everyone = comm.gather_objects({"rank": rank})
        groups = make_groups(m, 2, seed=1, outer_step=3)  # 5 replicas: a pair and a group of three
        group = next(g for g in groups if rank in g)
        result = comm.exchange(3, group, data[rank] + 100)
        return x, std, everyone, group, result

    hub, out = _run(m, body)
    stack = torch.stack([data[r] for r in range(m)])
    expected_std = float(((stack - stack.mean(0)) ** 2).mean().sqrt())
    for rank, (x, std, everyone, group, result) in out.items():
        torch.testing.assert_close(x, stack.mean(0))
        assert std == pytest.approx(expected_std)
        assert everyone == [{"rank": r} for r in range(m)]
        assert sorted(result.received) == [p for p in group if p != rank] and not result.skipped
        for peer, payload in result.received.items():
            assert torch.equal(payload, data[peer] + 100)
        assert result.traffic.bytes_sent == 24 * (len(group) - 1)
    assert hub.collectives == {} and hub.links == {}  # nothing left in flight


def test_each_replica_keeps_its_own_random_state():
    """Draws interleaved across turns are those each replica would make alone in its own process."""
    def body(rank, comm):
        torch.manual_seed(rank)
        draws = []
        for _ in range(3):
            draws.append(torch.rand(2))
            comm.agree_stop(None)  # gives the turn to the others
        return torch.cat(draws)

    _, out = _run(3, body)
    for rank, draws in out.items():
        torch.manual_seed(rank)
        assert torch.equal(draws, torch.rand(6))


def test_replicas_take_turns_one_at_a_time():
    running, most, order = [0], [0], []
    lock = threading.Lock()

    def body(rank, comm):
        for step in range(4):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            order.append((step, rank))
            with lock:
                running[0] -= 1
            comm.agree_stop(None)

    _run(4, body)
    assert most[0] == 1
    assert order == [(s, r) for s in range(4) for r in range(4)]  # step by step, in rank order


def test_mismatched_calls_fail_instead_of_hanging():
    def disagree_on_groups(rank, comm):  # 0 waits for 1, 1 for 2, 2 for 0
        comm.exchange(1, [[0, 1], [1, 2], [0, 2]][rank], torch.zeros(3))

    with pytest.raises(InProcessDeadlock, match="wait for each other"):
        _run(3, disagree_on_groups)

    def disagree_on_collectives(rank, comm):
        comm.all_reduce_mean_(torch.zeros(3)) if rank == 0 else comm.gather_objects(rank)

    with pytest.raises(RuntimeError, match="called gather_objects where another replica called all_reduce"):
        _run(2, disagree_on_collectives)


def test_a_failing_replica_stops_the_others():
    def body(rank, comm):
        if rank == 2:
            raise ValueError("replica 2 broke")
        comm.all_reduce_mean_(torch.zeros(3))

    with pytest.raises(ValueError, match="replica 2 broke"):
        _run(3, body)
    assert issubclass(InProcessAborted, Exception) and not issubclass(InProcessAborted, RuntimeError)


def test_stop_agreement_first_proposal_wins():
    def body(rank, comm):
        return comm.agree_stop(10 + rank if rank in (1, 2) else None), comm.agree_stop(None)

    _, out = _run(3, body)
    assert {v[1] for v in out.values()} == {11}  # replica 1 proposed first (rank order)


@pytest.mark.parametrize("method, m", [("noloco", 5), ("diloco", 4), ("ddp", 3)])
def test_clock_equals_the_offline_simulated_clock(method, m):
    """Compute times driven through stall(): the replicas' simulated clocks after every step are exactly what
    ``simulate_clock`` (the clock of ``noloco compare``) computes from the same times."""
    steps, every, nbytes = 9, 3, 4000
    link = LinkModel(0.05, 1e6)
    compute = np.random.default_rng(0).uniform(0.1, 2.0, size=(m, steps))
    groups = lambda k: make_groups(m, 2, seed=7, outer_step=k)  # noqa: E731

    def body(rank, comm):
        clocks = []
        for s in range(1, steps + 1):
            comm.sim_clock.stall(compute[rank, s - 1])
            payload = torch.zeros(nbytes // 4)
            if method == "ddp":
                comm.all_reduce_mean_(payload)
            elif s % every == 0 or s == steps:
                k = (s + every - 1) // every
                if method == "diloco":
                    comm.all_reduce_mean_(payload)
                else:
                    comm.exchange(k, next(g for g in groups(k) if rank in g), payload)
            clocks.append(comm.sim_clock.sim_s)
        return clocks

    _, out = _run(m, body, link=link)
    offline = simulate_clock(method, compute, link=link, every=every, nbytes=nbytes, groups=groups)
    np.testing.assert_allclose(np.array([out[r] for r in range(m)]), offline, rtol=1e-12)


def test_a_late_partner_is_skipped_on_the_simulated_clock():
    """The deadline rendezvous on the simulated clock: a partner later than the timeout is skipped by both sides;
    the early one gives up at its deadline, the late one at once; a partner within it is waited for."""
    link = LinkModel(0.1, math.inf)

    def body(rank, comm):
        comm.sim_clock.stall({0: 0.0, 1: 5.0, 2: 1.0, 3: 2.5}[rank])
        result = comm.exchange(1, [0, 1] if rank < 2 else [2, 3], torch.ones(4) * rank)
        return comm.sim_clock.sim_s, result

    _, out = _run(4, body, link=link, timeout_s=2.0)
    assert out[0][0] == pytest.approx(2.0) and out[1][0] == pytest.approx(5.0)  # 5 s apart > 2 s: skipped
    assert 1 in out[0][1].skipped and 0 in out[1][1].skipped and not out[0][1].received
    assert out[2][0] == out[3][0] == pytest.approx(2.6)  # 1.5 s apart: the early one waits, then one message
    assert torch.equal(out[2][1].received[3], torch.full((4,), 3.0))
    assert out[2][1].traffic.seconds == pytest.approx(1.6) and out[3][1].traffic.seconds == pytest.approx(0.1)


def test_compute_goes_on_the_clock_only_inside_on_clock():
    def body(rank, comm):
        with comm.sim_clock.on_clock():
            t = torch.randn(200, 200)
            for _ in range(20):
                t = t @ t.T / 200
        busy = comm.sim_clock.sim_s
        sum(range(200_000))  # outside: not charged
        return busy, comm.sim_clock.sim_s

    _, out = _run(2, body)
    for busy, after in out.values():
        assert busy > 0 and after == busy


TINY = ["--backend", "in_process", "--replicas", "4", "--steps", "8", "--seq-len", "32", "--batch-size", "2",
        "--outer.every", "4", "--eval-every", "4", "--eval-batches", "1", "--inner.warmup-steps", "2", "--progress",
        "false", "--model", "nano-llama", "--inner.lr", "1e-2"]


@pytest.mark.slow
def test_training_with_a_straggler(tmp_path):
    """Replica 1 stalls 100 simulated seconds before outer step 1 (nothing sleeps): its partner skips it after
    the 30 s deadline, the other pair exchanges without waiting, and training goes on to the end. The run's
    summary and metrics carry the simulated clock and the link's cost."""
    out = tmp_path / "straggler"
    assert main(["--log-level", "ERROR", "noloco", "train", "--method", "noloco", "--out", str(out), *TINY,
                 "--faults.stall-rank", "1", "--faults.stall-outer-steps", "[1]", "--faults.stall-s", "100",
                 "--exchange.timeout-s", "30", "--network.latency-ms", "50", "--seed", "3"]) == 0
    rows = {r: {row["step"]: row for row in read_jsonl(rank_dir(out, r) / "metrics.jsonl")} for r in range(4)}
    pair = next(g for g in make_groups(4, 2, seed=3, outer_step=1) if 1 in g)
    partner = next(r for r in pair if r != 1)
    for rank in range(4):
        first, second = rows[rank][4], rows[rank][8]
        if rank in pair:
            assert first["skipped_partners"] == 1 and first["partners_ok"] == []
        else:
            assert first["skipped_partners"] == 0 and len(first["partners_ok"]) == 1
            assert first["sim_s"] < 30  # never waited for the straggler
        assert math.isfinite(second["val_loss"]) and second["val_loss"] < rows[rank][0]["val_loss"]
    assert rows[partner][4]["outer_comm_s"] == pytest.approx(30.0)  # waited until its deadline
    assert rows[1][4]["sim_s"] > 100 and rows[1][4]["outer_comm_s"] == pytest.approx(0.0)  # found it abandoned
    others = [r for r in range(4) if r not in pair]
    assert all(rows[r][4]["outer_comm_s"] >= 0.05 - 1e-9 for r in others)  # one 50 ms message, plus any wait
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "in_process" and summary["sim_s"] == max(r["sim_s"] for r in summary["ranks"].values())
    assert summary["sim_s"] > 100


@pytest.mark.parametrize("argv, message", [
    (["--backend", "threads"], "allowed values: 'auto', 'gloo', 'nccl', 'in_process'"),
    (["--backend", "in_process", "--stages", "2"], "stages"),
    (["--backend", "in_process", "--network.inject", "true"], "network.inject"),
    (["--backend", "in_process", "--faults.exit-rank", "1", "--faults.exit-outer-step", "1"], "faults.exit_rank"),
])
def test_backend_mistakes_are_reported_by_name(capsys, argv, message):
    assert main(["noloco", "train", *argv]) == 2
    assert message in capsys.readouterr().err


def test_replicas_has_one_name(capsys):
    from swarmlm.config import ConfigError, validate_config
    from swarmlm.noloco.config import TrainConfig

    assert TrainConfig(replicas=16, backend="in_process").replicas == 16
    with pytest.raises(ConfigError, match="nproc: the number of replicas is called replicas"):
        validate_config(TrainConfig, {"nproc": 4})
    with pytest.raises(SystemExit):
        main(["noloco", "train", "--nproc", "4"])
    assert "--nproc is now --replicas" in capsys.readouterr().err


@pytest.mark.slow
def test_stop_and_resume_keep_the_clock(tmp_path):
    """A run stopped at step 4 (as Ctrl+C stops one: every replica at one step, with a checkpoint) and resumed
    ends with the losses, weights and simulated clock's link charges of an uninterrupted run; the checkpoint holds
    the replica's clock beside the usual state."""
    import json

    from swarmlm.noloco.replica import checkpoint_dir

    common = ["--log-level", "ERROR", "noloco", "train", "--method", "diloco", *TINY, "--seed", "5",
              "--network.latency-ms", "200", "--checkpoint-every", "0"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert main([*common, "--out", str(whole)]) == 0
    assert main([*common, "--out", str(parts), "--stop-after", "4"]) == 0
    state = json.loads((checkpoint_dir(parts, 2) / "step-000004" / "state.json").read_text())
    assert main([*common, "--out", str(parts)]) == 0
    a = {row["step"]: row for row in read_jsonl(rank_dir(whole, 2) / "metrics.jsonl")}
    b = {row["step"]: row for row in read_jsonl(rank_dir(parts, 2) / "metrics.jsonl")}
    assert b[8]["loss"] == pytest.approx(a[8]["loss"], rel=1e-5) and b[8]["val_loss"] == pytest.approx(a[8]["val_loss"], rel=1e-5)
    # two all-reduces of 4 replicas over 200 ms hops, the cheapest in 4 hops (tree, halving-doubling): 0.8 s each,
    # plus the waits for the slowest replica on the clock (measured compute: they vary with the machine's load)
    hops = LinkModel(0.2).allreduce_s(1, 4)
    assert hops == pytest.approx(0.8)
    for rows in (a, b):
        assert 2 * hops - 1e-9 <= rows[8]["comm_s"] < rows[8]["sim_s"]
        assert rows[8]["sim_s"] > 2 * hops  # after resuming, the clock goes on from the checkpoint's
    assert state["sim_s"] >= hops and b[4]["sim_s"] == pytest.approx(state["sim_s"])
