"""The checkpoint format is what the loaders read, pinned: the files of a checkpoint and the keys of its
``state.json`` and ``tensors.pt``, for a SAPO node and a NoLoCo replica (DiLoCo, whose outer momentum is saved too).
A checkpoint written by an earlier version must stay loadable, so a change here has to be a deliberate one (with
a loader that still reads the old layout). Each test also resumes from what it wrote."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

CHECKPOINT_FILES = {"model", "optimizer.pt", "rng.pt", "state.json"}
SAPO_STATE = {"step", "node_id", "cumulative_reward_own", "slots", "rng", "drops"}
# before question streams were stateless, a node saved its stream's position ("tasks") and no slots
SAPO_STATE_BEFORE_STATELESS_STREAMS = {"step", "node_id", "cumulative_reward_own", "tasks", "rng", "drops"}
NOLOCO_STATE = {"step", "method", "scheduler", "sampler", "bytes_sent", "bytes_recv", "comm_s", "skipped_total",
                "compute_s", "tokens"}
PIPELINE_STATE = {"stages", "pipe_totals", "pipe_traffic"}  # added by a pipeline stage (checked in the pipeline tests)
PIPELINE_TRAFFIC = {"hops", "abandoned", "transfer_failures", "bytes_sent", "bytes_recv", "seconds"}


def _files(path) -> set[str]:
    return {p.name for p in path.iterdir()}


def test_sapo_node_checkpoint_layout_and_resume(tmp_path):
    from swarmlm.runtime.checkpoints import latest_checkpoint
    from swarmlm.sapo.config import SAPOConfig
    from swarmlm.sapo.node import SAPONode
    from swarmlm.sapo.transports.in_process import InProcessHub

    config = SAPOConfig(model={"warmstart": "never", "device": "cpu"}, tasks={"eval_size": 2}, local=1, external=0,
                        rounds=1, generation={"group_size": 2, "max_new_tokens": 4})
    node = SAPONode(config, 0, InProcessHub(1).endpoint("node-0"), tmp_path, "tiny-qwen2", tensorboard=False)
    node.run_round(1)  # the last round: a checkpoint
    node.close()
    directory = tmp_path / "checkpoints"
    assert (directory / "latest").read_text().strip() == "step-000001"
    step = directory / "step-000001"
    assert _files(step) == CHECKPOINT_FILES
    assert (step / "model" / "model.safetensors").is_file() and (step / "model" / "config.json").is_file()
    assert set(json.loads((step / "state.json").read_text())) == SAPO_STATE

    resumed = SAPONode(config, 0, InProcessHub(1).endpoint("node-0"), tmp_path, "tiny-qwen2", tensorboard=False)
    assert resumed.round == 1 and resumed.cumulative_reward_own == node.cumulative_reward_own
    assert resumed.rng.getstate() == node.rng.getstate()
    for a, b in zip(node.model.parameters(), resumed.model.parameters()):
        assert torch.equal(a, b)
    assert latest_checkpoint(directory).step == 1
    resumed.close()

    # a checkpoint of the earlier layout (the stream's position, no slots) still resumes
    state = json.loads((step / "state.json").read_text())
    old = {k: v for k, v in state.items() if k != "slots"} | {"tasks": {"rng": [3, [1, 2], None], "next_index": {}}}
    assert set(old) == SAPO_STATE_BEFORE_STATELESS_STREAMS
    (step / "state.json").write_text(json.dumps(old))
    older = SAPONode(config, 0, InProcessHub(1).endpoint("node-0"), tmp_path, "tiny-qwen2", tensorboard=False)
    assert older.round == 1 and older.rng.getstate() == node.rng.getstate()
    older.close()


def test_noloco_replica_checkpoint_layout_and_resume(tmp_path):
    from swarmlm.noloco.config import TrainConfig
    from swarmlm.noloco.replica import Replica, checkpoint_dir

    config = TrainConfig(method="diloco", replicas=1, out=str(tmp_path / "run"), steps=2, seq_len=16, batch_size=2,
                         eval_every=0, eval_batches=1, checkpoint_every=0, progress=False, device="cpu",
                         outer={"every": 1}, log={"tensorboard": False}, inner={"warmup_steps": 1})
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        replica = Replica(config, 0, 1)
        result = replica.run(progress=False)
        assert result["step"] == 2 and result["completed"]
        step = checkpoint_dir(config.out, 0) / "step-000002"
        assert _files(step) == CHECKPOINT_FILES | {"tensors.pt"}
        state = json.loads((step / "state.json").read_text())
        assert set(state) == NOLOCO_STATE and state["method"] == "diloco"
        tensors = torch.load(step / "tensors.pt", weights_only=True)
        assert set(tensors) == {"phi", "delta"}
        assert torch.equal(tensors["delta"], replica.diloco.momentum_buffer())  # DiLoCo's Δ is its SGD momentum

        again = Replica(config.model_copy(update={"resume": 2}), 0, 1)
        assert again.resume() == 2
        assert torch.equal(again.phi, replica.phi) and torch.equal(again.delta, tensors["delta"])
        assert torch.equal(again.diloco.momentum_buffer(), tensors["delta"])
        assert again.tokens == replica.tokens and again.comm.traffic.bytes_sent == replica.comm.traffic.bytes_sent
        assert again.scheduler.state_dict() == replica.scheduler.state_dict()
    finally:
        dist.destroy_process_group()
