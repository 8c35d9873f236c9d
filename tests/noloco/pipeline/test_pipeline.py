"""NoLoCo's pipeline stages and random routing (SPEC B.5), in one process.

- The stage modules, run in sequence, compute the unsplit model's loss and gradients.
- Routes are permutations, the same in every interpreter, and every retry goes elsewhere.
- Hops between threads over a real TCP store and real gloo links: delivery, abandonment of a stalled
  peer, and a fresh hop afterwards.
- The whole engine (micro-batches, random routes, retries) on M x S threads, one per process of a
  real run, each with its own store connection and gloo links: gradients are the mean of the unsplit
  model's per-micro-batch gradients over the pieces that reached each stage, also when a stalled
  next-stage peer makes micro-batches fail and be retried on another route.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from swarmlm.experiments.gpipe_time import activation_bytes
from swarmlm.models import load_model
from swarmlm.noloco.comm.links import PipeLinks
from swarmlm.noloco.config import TrainConfig
from swarmlm.noloco.pipeline.routing import Routes, position, rank_of, route_permutations
from swarmlm.noloco.pipeline.schedule import PipelineSchedule
from swarmlm.noloco.pipeline.stages import StageModule, build_stage, build_stages, split_layers
from swarmlm.runtime.distributed import free_port


# ----------------------------------------------------------------------------------------------
# splitting the model
# ----------------------------------------------------------------------------------------------
def _reference(name: str, ids: torch.Tensor):
    model = load_model(name, seed=0).model.float()
    ref = copy.deepcopy(model)
    out = ref(input_ids=ids, labels=ids)
    out.loss.backward()
    return model, ref, out


def _run_in_sequence(stages: list[StageModule], ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward through the stages with a detached hand-over between them (as over the wire), then backward."""
    outputs, inputs = [], []
    x = ids
    for stage in stages:
        if stage.first:
            y = stage(x)
        else:
            x = x.detach().requires_grad_(True)
            inputs.append(x)
            y = stage(x)
        outputs.append(y)
        x = y
    logits = outputs[-1]
    loss = stages[-1].loss(logits, ids)
    loss.backward()
    for y, x in zip(reversed(outputs[:-1]), reversed(inputs)):
        y.backward(x.grad)
    return loss, logits


@pytest.mark.parametrize("name,num_stages,recompute", [
    ("tiny-llama", 2, False), ("tiny-llama", 2, True), ("tiny-qwen2", 2, False), ("tiny-llama", 4, True)])
def test_stages_in_sequence_equal_the_unsplit_model(name, num_stages, recompute):
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (3, 24))
    model, ref, out = _reference(name, ids)
    stages = build_stages(model, num_stages, recompute=recompute)
    assert [list(s.layer_range) for s in stages] == [list(r) for r in split_layers(len(model.model.layers), num_stages)]
    loss, logits = _run_in_sequence(stages, ids)

    assert loss.item() == pytest.approx(out.loss.item(), abs=1e-6)
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)
    grads = dict(ref.named_parameters())
    split = dict(model.named_parameters())  # the stages share these parameters, except the untied head
    for key, p in grads.items():
        if key in ("model.embed_tokens.weight", "lm_head.weight"):
            continue
        torch.testing.assert_close(split[key].grad, p.grad, atol=1e-6, rtol=1e-5, msg=key)
    # Tied embeddings: the unsplit model's gradient of the shared matrix is the sum of the first stage's
    # embedding gradient and the last stage's (untied) head gradient. Both are really there.
    embed, head = stages[0].embed_tokens.weight, stages[-1].lm_head.weight
    assert stages[-1].untied and head is not embed
    assert embed.grad is not None and embed.grad.abs().sum() > 0
    assert head.grad is not None and head.grad.abs().sum() > 0
    torch.testing.assert_close(embed.grad + head.grad, grads["model.embed_tokens.weight"].grad, atol=1e-6, rtol=1e-5)
    # Each stage holds only its own parameters.
    for stage in stages:
        names = {n for n, _ in stage.named_parameters()}
        assert ("embed_tokens.weight" in names) == stage.first and ("lm_head.weight" in names) == stage.last


def test_untied_model_is_split_without_copies():
    model = load_model("tiny-llama", seed=0).model
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    last = build_stage(model, 1, 2)
    assert not last.untied and last.lm_head is model.lm_head


def test_stage_checkpoint_round_trip_and_mismatch(tmp_path):
    model = load_model("tiny-llama", seed=0).model
    stage = build_stage(model, 1, 2)
    stage.save_pretrained(tmp_path / "s1")
    other = build_stage(load_model("tiny-llama", seed=7).model, 1, 2)
    other.load_saved(tmp_path / "s1")
    for (k, a), (_, b) in zip(stage.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), k
    with pytest.raises(RuntimeError, match="not stage 0 of 2"):
        build_stage(load_model("tiny-llama", seed=0).model, 0, 2).load_saved(tmp_path / "s1")
    with pytest.raises(ValueError, match="cannot cut"):
        split_layers(4, 5)


# ----------------------------------------------------------------------------------------------
# routes
# ----------------------------------------------------------------------------------------------
def test_routes_are_permutations_that_move_every_retry_elsewhere():
    for m in (1, 2, 3, 8):
        perms = route_permutations(m, seed=4, step=9, boundary=0, num_slots=6)
        for perm in perms:
            assert sorted(perm) == list(range(m))
        for a, b in zip(perms, perms[1:]):  # consecutive slots send every replica somewhere else
            assert m == 1 or all(x != y for x, y in zip(a, b))
    big = [route_permutations(8, 4, step, b, 3) for step in range(5) for b in range(2)]
    assert len({json.dumps(p) for p in big}) == len(big)  # different across steps and boundaries
    assert route_permutations(8, 4, 3, 0, 3) != route_permutations(8, 5, 3, 0, 3)  # and seeds
    assert route_permutations(5, 4, 3, 0, 2, "identity") == [list(range(5))] * 2
    # Over many steps, slot 0 sends replica 0 everywhere about equally often (uniform permutations).
    counts = [0] * 4
    for step in range(400):
        counts[route_permutations(4, 1, step, 0, 1)[0][0]] += 1
    assert min(counts) > 60


def test_routes_seen_from_both_ends_agree():
    M, S, slots = 4, 3, 5
    routes = Routes(num_replicas=M, num_stages=S, seed=2, step=11, num_slots=slots)
    for slot in range(slots):
        for s in range(S - 1):
            for d in range(M):
                e = routes.next_replica(d, s, slot)
                assert routes.prev_replica(e, s + 1, slot) == d
        paths = [routes.path(d, slot) for d in range(M)]
        for s in range(S):  # at every stage, the M micro-batches of a slot are at M different replicas
            assert sorted(p[s] for p in paths) == list(range(M))
    for rank in range(M * S):
        assert rank_of(*position(rank, S), S) == rank


def test_routes_are_identical_in_separate_interpreters():
    code = ("import json, hashlib; from swarmlm.noloco.pipeline.routing import route_permutations as r;"
            "print(hashlib.sha256(json.dumps([r(16, 123, t, b, 4) for t in range(50) for b in range(3)]).encode()).hexdigest())")
    here = hashlib.sha256(json.dumps([route_permutations(16, 123, t, b, 4) for t in range(50) for b in range(3)]).encode()).hexdigest()
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        assert out.stdout.strip() == here


# ----------------------------------------------------------------------------------------------
# hops and the engine, on threads that stand for processes
# ----------------------------------------------------------------------------------------------
class Cluster:
    """A TCP store and one client connection per simulated process (thread)."""

    def __init__(self, size: int):
        self.port = free_port()
        self.master = dist.TCPStore("127.0.0.1", self.port, size + 1, True, timeout=datetime.timedelta(seconds=60),
                                    wait_for_workers=False)
        self.run = f"r{time.monotonic_ns()}"

    def links(self, rank: int, timeout_s: float, **kw) -> PipeLinks:
        store = dist.TCPStore("127.0.0.1", self.port, is_master=False, timeout=datetime.timedelta(seconds=60))
        return PipeLinks(store=store, rank=rank, key=lambda name: f"{self.run}/{name}", timeout_s=timeout_s, **kw)


def _threads(targets: dict[int, callable], limit_s: float = 120) -> dict[int, object]:
    results: dict[int, object] = {}

    def run(rank, fn):
        try:
            results[rank] = fn()
        except BaseException as err:  # noqa: BLE001 - reported below
            results[rank] = err

    threads = [threading.Thread(target=run, args=(r, fn), daemon=True) for r, fn in targets.items()]
    for t in threads:
        t.start()
    deadline = time.monotonic() + limit_s
    for t in threads:
        t.join(max(0.1, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a simulated process hung"
    for r, value in results.items():
        if isinstance(value, BaseException):
            raise value
    return results


def test_hops_deliver_abandon_a_stalled_peer_and_recover():
    cluster = Cluster(2)
    a, b = cluster.links(0, timeout_s=1.0), cluster.links(1, timeout_s=1.0, dead_after_s=1.5)
    x = torch.randn(3, 5)
    labels = torch.arange(6).reshape(2, 3)

    # Delivery: header through the store, tensors over a gloo link.
    got = _threads({0: lambda: a.send("h1", 1, {"pieces": [[0, 1, 3]]}, [x, labels]), 1: lambda: b.recv("h1", 0)})
    assert got[0].ok and got[1].ok and got[1].header == {"pieces": [[0, 1, 3]]}
    assert torch.equal(got[1].tensors[0], x) and torch.equal(got[1].tensors[1], labels)
    hop_keys = dist.PrefixStore(f"{cluster.run}/pp/h1/", cluster.master)
    assert not hop_keys.check(["hdr"]) and not hop_keys.check(["arrived"])  # a finished hop leaves no keys behind

    # A stalled receiver: the sender gives up after about the timeout; the receiver, arriving late, finds
    # the hop abandoned and returns at once. Nothing is delivered to either side.
    def late_recv():
        time.sleep(2.5)
        started = time.monotonic()
        result = b.recv("h2", 0)
        return result, time.monotonic() - started

    started = time.monotonic()
    got = _threads({0: lambda: (a.send("h2", 1, {}, [x]), time.monotonic() - started), 1: late_recv})
    (sent, sent_s), (recv, recv_s) = got[0], got[1]
    assert not sent.ok and sent.reason == "abandoned" and 0.9 <= sent_s < 2.4
    assert not recv.ok and recv.reason == "abandoned" and recv_s < 0.5
    assert a.traffic.skipped == 1 and b.traffic.skipped == 1

    # A peer that is itself waiting (for rank 2, who never comes) keeps beating, so rank 0 does not give up
    # on it although it waits longer than the timeout; and the same pair's link still works.
    def wait_elsewhere_then_recv():
        assert not b.recv("h3-wait", 2).ok  # rank 2 shows no progress: abandoned after ~1 s
        return b.recv("h3", 0)

    started = time.monotonic()
    got = _threads({0: lambda: (a.send("h3", 1, {"n": 3}, [x * 3]), time.monotonic() - started),
                    1: wait_elsewhere_then_recv})
    (sent, sent_s), recv = got[0], got[1]
    assert sent.ok and sent_s > 0.9 and recv.ok and recv.header == {"n": 3} and torch.equal(recv.tensors[0], x * 3)

    # Rank 2 is still silent (dead). Until it has been silent for dead_after_s, each hop with it still waits
    # a timeout (a merely slow peer must not be raced past); after that, hops with it are given up at once.
    started = time.monotonic()
    assert not b.recv("h4", 2).ok and time.monotonic() - started > 0.9
    started = time.monotonic()
    assert not b.recv("h5", 2).ok and time.monotonic() - started < 0.5


def _stage_worker(cluster: Cluster, rank: int, M: int, S: int, batches: dict, *, n: int, retry: int, routing: str,
                  timeout_s: float, stall_s: float = 0.0):
    replica, stage = position(rank, S)
    torch.manual_seed(0)
    module = build_stage(load_model("tiny-llama", seed=0).model.float(), stage, S)
    links = cluster.links(rank, timeout_s=timeout_s)
    engine = PipelineSchedule(module, links, replica=replica, stage=stage, num_replicas=M, num_stages=S, seed=3,
                            num_micro_batches=n, retry_slots=retry, routing=routing)

    def run():
        if stall_s:
            time.sleep(stall_s)
        report = engine.train_step(1, batches[replica] if stage == 0 else None)
        grads = {k: p.grad.clone() for k, p in module.named_parameters() if p.grad is not None}
        report.bytes_sent = links.traffic.bytes_sent
        return report, grads
    return run


def first_links(results, rank: int) -> int:
    return results[rank][0].bytes_sent


def _per_piece_grads(batches: dict) -> dict[tuple[int, int], dict[str, torch.Tensor]]:
    """The unsplit model's gradient for each micro-batch on its own, named as the stage modules name them."""
    out = {}
    for d, mbs in batches.items():
        for i, ids in enumerate(mbs):
            model = load_model("tiny-llama", seed=0).model.float()
            model(input_ids=ids, labels=ids).loss.backward()
            out[(d, i)] = {n: p.grad.clone() for n, p in model.named_parameters()}
    return out


def _expected(stage_module: StageModule, per_piece, piece_ids) -> dict[str, torch.Tensor]:
    """Mean over ``piece_ids`` of the unsplit gradients, for the parameters of ``stage_module``."""
    def unsplit_name(name: str) -> str:
        if name.startswith("layers."):
            i, rest = name.split(".", 2)[1:]
            return f"model.layers.{stage_module.layer_range[int(i)]}.{rest}"
        return {"embed_tokens.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                "lm_head.weight": "model.embed_tokens.weight"}[name]  # tied: one matrix, both uses summed

    expected = {}
    for name, _ in stage_module.named_parameters():
        expected[name] = sum(per_piece[p][unsplit_name(name)] for p in piece_ids) / len(piece_ids)
    return expected


def _check_stage_grads(M, S, results, per_piece, *, identity_tied=False):
    for rank, (report, grads) in results.items():
        replica, stage = position(rank, S)
        if not report.piece_ids:  # a stage that no micro-batch reached has no gradient at all
            assert grads == {}
            continue
        module = build_stage(load_model("tiny-llama", seed=0).model, stage, S)
        expected = _expected(module, per_piece, report.piece_ids)
        for name, value in expected.items():
            if name in ("embed_tokens.weight", "lm_head.weight"):
                continue  # checked below: the unsplit gradient holds both uses of the tied matrix
            torch.testing.assert_close(grads[name], value, atol=2e-6, rtol=1e-4, msg=f"rank {rank} {name}")
        assert all(g.abs().sum() > 0 for g in grads.values())
    for d in range(M):  # embedding (stage 0 of d) + heads (last stages) = tied gradient, per micro-batch mix
        first = results[rank_of(d, 0, S)]
        assert "embed_tokens.weight" in first[1] and first[1]["embed_tokens.weight"].abs().sum() > 0


def test_engine_identity_routes_match_the_unsplit_model():
    """M = 1, S = 2, two micro-batches: the loss of each micro-batch and the gradient (mean over the two)
    of every parameter equal the unsplit model's, the tied matrix as the sum of embedding and head."""
    M, S, n = 1, 2, 2
    torch.manual_seed(5)
    batches = {0: [torch.randint(0, 256, (2, 16)) for _ in range(n)]}
    cluster = Cluster(M * S)
    results = _threads({r: _stage_worker(cluster, r, M, S, batches, n=n, retry=1, routing="identity", timeout_s=20)
                        for r in range(M * S)})
    per_piece = _per_piece_grads(batches)
    (first, g0), (last, g1) = results[0], results[1]
    assert first.pieces_ok == last.pieces_ok == n and first.failures == last.failures == 0
    assert first.sent_to == [1, 1, 1] and last.recv_from == [0, 0, 0]
    model = load_model("tiny-llama", seed=0).model.float()
    for i, ids in enumerate(batches[0]):
        assert first.own_losses[i] == pytest.approx(model(input_ids=ids, labels=ids).loss.item(), abs=1e-5)
    _check_stage_grads(M, S, results, per_piece)
    # What travelled: each micro-batch's activations and labels forward, its gradient back; the size the
    # compare command's clock charges per hand-over (activation_bytes) is what was really sent.
    act = activation_bytes(TrainConfig(model="tiny-llama", batch_size=2 * n, seq_len=16, stages=2,
                                       pipeline={"micro_batches": n}))
    assert first_links(results, 0) == n * (act + 2 * 16 * 8) and first_links(results, 1) == n * act
    tied = sum(per_piece[(0, i)]["model.embed_tokens.weight"] for i in range(n)) / n
    torch.testing.assert_close(g0["embed_tokens.weight"] + g1["lm_head.weight"], tied, atol=2e-6, rtol=1e-4)


def test_engine_random_routes_retry_around_a_stalled_peer():
    """M = 2, S = 2 with random routes; stage 1 of replica 1 stalls for 2.5 timeouts at the start of the
    step. The hops to it fail (counted), their micro-batches are carried into the next slot, whose route
    goes to the other replica, and delivered there. No micro-batch is lost, nothing hangs, and every
    stage's gradient is the mean of the unsplit model's gradients over the micro-batches it processed."""
    M, S, n, timeout = 2, 2, 2, 1.0
    torch.manual_seed(6)
    batches = {d: [torch.randint(0, 256, (2, 16)) for _ in range(n)] for d in range(M)}
    cluster = Cluster(M * S)
    stalled = rank_of(1, 1, S)
    started = time.monotonic()
    results = _threads({r: _stage_worker(cluster, r, M, S, batches, n=n, retry=1, routing="random", timeout_s=timeout,
                                         stall_s=2.5 * timeout if r == stalled else 0.0) for r in range(M * S)})
    elapsed = time.monotonic() - started
    reports = {r: rep for r, (rep, _) in results.items()}
    routes = Routes(num_replicas=M, num_stages=S, seed=3, step=1, num_slots=n + 1)
    for d in range(M):  # the routes each process used are the shared ones
        assert reports[rank_of(d, 0, S)].sent_to == [rank_of(routes.next_replica(d, 0, m), 1, S) for m in range(n + 1)]
        assert reports[rank_of(d, 1, S)].recv_from == [rank_of(routes.prev_replica(d, 1, m), 0, S) for m in range(n + 1)]
    senders = [reports[rank_of(d, 0, S)] for d in range(M)]
    assert sum(r.failures for r in senders) >= 1  # the hops to the stalled peer failed...
    assert sum(r.retried for r in senders) == sum(r.failures for r in senders)  # ...and were all retried
    assert sum(r.dropped for r in senders) == 0
    assert sorted(p for d in range(M) for p in reports[rank_of(d, 1, S)].piece_ids) == \
        [(d, i) for d in range(M) for i in range(n)]  # every micro-batch reached a last stage exactly once
    assert reports[rank_of(0, 1, S)].pieces_ok > n  # the healthy last stage took the retried ones
    for d in range(M):
        assert sorted(reports[rank_of(d, 0, S)].own_losses) == list(range(n))
    assert elapsed < 20
    _check_stage_grads(M, S, results, _per_piece_grads(batches))
