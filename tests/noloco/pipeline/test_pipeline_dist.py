"""Pipeline training across real processes over gloo (SPEC B.5).

- S = 2 with identity routes in two processes: each micro-batch's loss and every gradient equal the
  unsplit model's (the tied matrix as embedding + head).
- A 2 x 2 run (M = 2 replicas, S = 2 stages) of ``swarmlm noloco train --stages 2``: the loss falls, every
  parameter of every stage (the embedding included) changes, every process used the shared random
  routes, and when a last-stage process stalls for longer than the timeout, the hops to it fail, are
  counted, and their micro-batches are retried on another route without any being lost or anything
  hanging.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
import torch

from swarmlm.cli import main
from swarmlm.models import load_model
from swarmlm.noloco.pipeline.routing import Routes, position, rank_of
from swarmlm.noloco.pipeline.stages import build_stage
from swarmlm.noloco.replica import checkpoint_dir, rank_dir
from swarmlm.runtime.distributed import launch_local
from swarmlm.runtime.metrics import read_jsonl


def _identity_worker(batches: list[torch.Tensor]) -> dict:
    """One process of an M = 1, S = 2 pipeline: one inner step's gradients, with the engine of real runs."""
    from torch.distributed import distributed_c10d as c10d

    from swarmlm.noloco.comm.links import PipeLinks
    from swarmlm.noloco.pipeline.schedule import PipelineSchedule
    from swarmlm.runtime.distributed import destroy_process_group, init_process_group

    torch.set_num_threads(1)
    rank, world = init_process_group("gloo")
    try:
        replica, stage = position(rank, 2)
        module = build_stage(load_model("tiny-llama", seed=0).model.float(), stage, 2)
        links = PipeLinks(store=c10d._get_default_store(), rank=rank, key=lambda name: f"test/{name}", timeout_s=60)
        engine = PipelineSchedule(module, links, replica=replica, stage=stage, num_replicas=1, num_stages=2, seed=0,
                                num_micro_batches=len(batches), retry_slots=1, routing="identity")
        report = engine.train_step(1, batches if stage == 0 else None)
        return {"report": dataclasses.asdict(report),
                "grads": {k: p.grad.clone() for k, p in module.named_parameters()}}
    finally:
        destroy_process_group()


@pytest.mark.slow
def test_two_process_identity_pipeline_equals_the_unsplit_model():
    torch.manual_seed(11)
    batches = [torch.randint(0, 256, (2, 24)) for _ in range(3)]
    results = launch_local(2, _identity_worker, batches)
    first, last = results[0], results[1]

    model = load_model("tiny-llama", seed=0).model.float()
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss / len(batches)
        loss.backward()
        losses.append(loss.item() * len(batches))
    assert first["report"]["pieces_ok"] == last["report"]["pieces_ok"] == 3
    for i, value in enumerate(losses):
        assert first["report"]["own_losses"][i] == pytest.approx(value, abs=1e-5)
    assert sorted(last["report"]["losses"]) == pytest.approx(sorted(losses), abs=1e-5)

    ref = dict(model.named_parameters())
    for rank, result in results.items():
        stage = build_stage(load_model("tiny-llama", seed=0).model, rank, 2)
        for name, grad in result["grads"].items():
            if name in ("embed_tokens.weight", "lm_head.weight"):
                continue
            i, rest = name.split(".", 2)[1:] if name.startswith("layers.") else (None, None)
            key = f"model.layers.{stage.layer_range[int(i)]}.{rest}" if i is not None else f"model.{name}"
            torch.testing.assert_close(grad, ref[key].grad, atol=2e-6, rtol=1e-4, msg=f"stage {rank} {name}")
    embed, head = first["grads"]["embed_tokens.weight"], last["grads"]["lm_head.weight"]
    assert embed.abs().sum() > 0 and head.abs().sum() > 0
    torch.testing.assert_close(embed + head, ref["model.embed_tokens.weight"].grad, atol=2e-6, rtol=1e-4)


M, S, STEPS, H, MICRO, TIMEOUT, STALL_STEP, STALL_S, SEED = 2, 2, 8, 4, 2, 2.0, 3, 5.0, 3
STALLED = rank_of(1, 1, S)  # stage 1 (last) of replica 1


@pytest.mark.slow
def test_two_by_two_pipeline_run_trains_routes_and_retries(tmp_path):
    out = tmp_path / "pp"
    started = time.monotonic()
    code = main(["noloco", "train", "--method", "noloco", "--replicas", str(M), "--stages", str(S), "--out", str(out),
                 "--steps", str(STEPS), "--seq-len", "32", "--batch-size", "4", "--pipeline.micro-batches", str(MICRO),
                 "--outer.every", str(H), "--eval-every", str(H), "--eval-batches", "2", "--checkpoint-every", "0",
                 "--inner.warmup-steps", "2", "--progress", "false", "--seed", str(SEED), "--log.tensorboard", "false",
                 "--pipeline.timeout-s", str(TIMEOUT), "--pipeline.log-routes", "true",
                 "--faults.stall-rank", str(STALLED), "--faults.stall-steps", f"[{STALL_STEP}]",
                 "--faults.stall-s", str(STALL_S)])
    assert code == 0
    assert time.monotonic() - started < 240
    rows = {r: {row["step"]: row for row in read_jsonl(rank_dir(out, r) / "metrics.jsonl")} for r in range(M * S)}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["replicas"] == M and summary["stages"] == S and math.isfinite(summary["val_loss_mean"])

    n = MICRO  # micro-batches per step (grad_accum 1)
    for rank, steps in rows.items():
        replica, stage = position(rank, S)
        assert sorted(steps) == list(range(STEPS + 1))
        # Every process used the routes that the shared seed gives for each step.
        for step in range(1, STEPS + 1):
            routes = Routes(num_replicas=M, num_stages=S, seed=SEED, step=step, num_slots=n + 1)
            if stage == 0:
                assert steps[step]["sent_to"] == [rank_of(routes.next_replica(replica, 0, m), 1, S) for m in range(n + 1)]
            else:
                assert steps[step]["recv_from"] == [rank_of(routes.prev_replica(replica, 1, m), 0, S) for m in range(n + 1)]
        # Evaluation along identity routes: every stage of a replica knows the replica's validation loss.
        first = rows[rank_of(replica, 0, S)]
        assert steps[STEPS]["val_loss"] == pytest.approx(first[STEPS]["val_loss"])
        assert steps[STEPS]["val_loss"] < steps[0]["val_loss"] - 0.3
        # The outer step ran within each stage's replica group.
        for k in (1, 2):
            assert steps[k * H]["outer_step"] == k and steps[k * H]["partners_ok"] == [1 - replica]

    for d in range(M):  # stage 0 logs its own micro-batches' loss, wherever they went: it falls
        losses = [rows[rank_of(d, 0, S)][s]["loss"] for s in range(1, STEPS + 1)]
        assert all(math.isfinite(x) for x in losses)
        assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.3, losses

    # The stall: hops to the stalled process failed, were counted, and were retried elsewhere; no
    # micro-batch of that step was lost. In the other steps nothing failed.
    stall = {r: rows[r][STALL_STEP] for r in rows}
    senders = [stall[rank_of(d, 0, S)] for d in range(M)]
    assert sum(r["pipe_failures"] for r in senders) >= 1
    assert sum(r["pipe_retried"] for r in senders) == sum(r["pipe_failures"] for r in senders)
    assert sum(r["pipe_dropped"] for r in senders) == 0
    assert sum(stall[rank_of(d, 1, S)]["pieces_ok"] for d in range(M)) == M * n
    assert stall[rank_of(0, 1, S)]["pieces_ok"] > n  # the healthy last stage took the retried micro-batches
    assert max(r["elapsed_s"] for r in stall.values()) < 60
    for r in rows:
        assert rows[r][STEPS]["pipe_dropped_total"] == 0 and rows[r][STEPS]["pipe_grad_lost_total"] == 0

    # Every parameter of every stage changed, the embedding (stage 0) and the untied head (stage 1) included.
    initial = load_model("tiny-llama", seed=SEED).model
    for rank in range(M * S):
        replica, stage = position(rank, S)
        before = build_stage(initial, stage, S)
        after = build_stage(load_model("tiny-llama", seed=SEED).model, stage, S)
        after.load_saved(checkpoint_dir(out, rank) / f"step-{STEPS:06d}" / "model")
        names = [name for name, _ in after.named_parameters()]
        assert ("embed_tokens.weight" in names) == (stage == 0) and ("lm_head.weight" in names) == (stage == S - 1)
        for (name, a), (_, b) in zip(before.named_parameters(), after.named_parameters()):
            assert not torch.equal(a, b), f"rank {rank}: {name} did not change"
