"""Checkpoints (save / latest / load, atomic ``latest``, pruning) and metrics files (resume truncation)."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from swarmlm.models import build_preset, load_model
from swarmlm.runtime.checkpoints import (
    checkpoint_at,
    checkpoint_steps,
    latest_checkpoint,
    load_optimizer_state,
    load_rng_state,
    load_tensors,
    save_checkpoint,
)
from swarmlm.runtime.metrics import MetricsWriter, read_jsonl


def _trained_step(model, optimizer):
    ids = torch.arange(20).unsqueeze(0)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


# ----------------------------------------------------------------------------- checkpoints
def test_save_latest_load_round_trip(tmp_path):
    loaded = build_preset("tiny-qwen2", seed=2)
    model = loaded.model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    _trained_step(model, optimizer)
    tensors = {"phi": torch.randn(3, 4), "delta": torch.zeros(2)}

    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    path = save_checkpoint(tmp_path, 7, model=model, tokenizer=loaded.tokenizer, optimizer=optimizer,
                           state={"note": "hello", "nested": {"a": [1, 2]}}, tensors=tensors)
    after_save = (random.random(), float(np.random.rand()), torch.rand(2))

    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.path == path and ckpt.step == 7
    assert ckpt.state["note"] == "hello" and ckpt.state["nested"] == {"a": [1, 2]}
    assert (ckpt.model_dir / "model.safetensors").exists()

    again = load_model(str(ckpt.model_dir))
    for (name, p), q in zip(model.named_parameters(), again.model.parameters()):
        assert torch.equal(p, q), name
    new_opt = torch.optim.Adam(again.model.parameters(), lr=1e-3)
    load_optimizer_state(ckpt, new_opt)
    old_state, new_state = optimizer.state_dict(), new_opt.state_dict()
    assert new_state["param_groups"] == old_state["param_groups"]
    assert len(new_state["state"]) == len(old_state["state"]) > 0
    for k, v in old_state["state"].items():
        assert torch.equal(v["exp_avg"], new_state["state"][k]["exp_avg"])
        assert torch.equal(v["exp_avg_sq"], new_state["state"][k]["exp_avg_sq"])
    loaded_tensors = load_tensors(ckpt)
    assert set(loaded_tensors) == set(tensors) and all(torch.equal(loaded_tensors[k], tensors[k]) for k in tensors)

    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    load_rng_state(ckpt)
    assert (random.random(), float(np.random.rand())) == after_save[:2]
    assert torch.equal(torch.rand(2), after_save[2])


def test_no_checkpoint_yet(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None


def test_latest_ignores_a_half_written_checkpoint(tmp_path):
    save_checkpoint(tmp_path, 3, state={"v": 3})
    # a process killed while writing step 4: the temporary directory and pointer file are left behind
    tmp = tmp_path / ".tmp-step-000004"
    (tmp / "model").mkdir(parents=True)
    (tmp / "model" / "model.safetensors").write_bytes(b"\x00" * 10)
    (tmp_path / "latest.tmp").write_text("step-0000")
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.step == 3 and ckpt.state["v"] == 3
    # the next save cleans up and moves on
    save_checkpoint(tmp_path, 4, state={"v": 4})
    assert latest_checkpoint(tmp_path).step == 4
    assert not tmp.exists()


def test_latest_survives_a_kill_while_a_step_is_rewritten(tmp_path):
    """Re-saving a step removes the old copy before the new one lands; killed in between, the pointer names a
    directory that is gone. The newest complete checkpoint must still be found, not none at all."""
    save_checkpoint(tmp_path, 3, state={"v": 3})
    save_checkpoint(tmp_path, 4, state={"v": 4})
    import shutil

    shutil.rmtree(tmp_path / "step-000004")
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.step == 3
    # killed before the very first pointer was written: the complete step directory is still used
    other = tmp_path / "other"
    save_checkpoint(other, 1, state={})
    (other / "latest").unlink()
    assert latest_checkpoint(other).step == 1


def test_keep_prunes_to_the_newest(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, state={"step_note": step}, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000004", "step-000005"]
    assert not list(tmp_path.glob(".tmp-*"))
    assert latest_checkpoint(tmp_path).step == 5
    save_checkpoint(tmp_path, 6, state={}, keep=3)
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000004", "step-000005", "step-000006"]


def test_resaving_a_step_replaces_it(tmp_path):
    save_checkpoint(tmp_path, 2, state={"v": "first"})
    save_checkpoint(tmp_path, 2, state={"v": "second"})
    assert latest_checkpoint(tmp_path).state["v"] == "second"


def _steps_on_disk(directory):
    return sorted(int(p.name.split("-")[1]) for p in directory.glob("step-*"))


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_retention_keeps_exactly_the_newest_k(tmp_path, keep):
    for step in (5, 10, 15, 20, 25):
        save_checkpoint(tmp_path, step, state={"v": step}, keep=keep)
        assert latest_checkpoint(tmp_path).step == step
    assert _steps_on_disk(tmp_path) == [5, 10, 15, 20, 25][-keep:]
    assert checkpoint_steps(tmp_path) == [5, 10, 15, 20, 25][-keep:]
    # nothing else is left behind: no temporary, trash or old copies
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["latest"] + [f"step-{s:06d}" for s in _steps_on_disk(tmp_path)])


def test_keep_zero_keeps_all_and_order_is_by_step_not_name(tmp_path):
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, state={}, keep=0)
    assert _steps_on_disk(tmp_path) == [1, 2, 3]
    # past six digits the names no longer sort as numbers: retention still keeps the newest steps
    save_checkpoint(tmp_path, 999_999, state={}, keep=0)
    save_checkpoint(tmp_path, 1_000_000, state={}, keep=0)
    save_checkpoint(tmp_path, 1_000_001, state={}, keep=2)
    assert _steps_on_disk(tmp_path) == [1_000_000, 1_000_001]
    assert latest_checkpoint(tmp_path).step == 1_000_001
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, 1_000_002, state={}, keep=-1)


def test_a_failed_write_leaves_the_only_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, state={"v": 1}, keep=1)
    real_save = torch.save

    def failing_save(obj, path, *args, **kwargs):
        if str(path).endswith("optimizer.pt"):
            real_save(obj, path, *args, **kwargs)
            raise OSError("disk full")
        return real_save(obj, path, *args, **kwargs)

    model = build_preset("tiny-qwen2", seed=0).model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, model=model, optimizer=optimizer, state={"v": 2}, keep=1)
    monkeypatch.setattr(torch, "save", real_save)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.step == 1 and ckpt.state["v"] == 1 and checkpoint_steps(tmp_path) == [1]
    # the next save clears the half-written one and, with keep 1, only then removes step 1
    save_checkpoint(tmp_path, 2, state={"v": 2}, keep=1)
    assert _steps_on_disk(tmp_path) == [2] and not list(tmp_path.glob(".tmp-*"))


def test_a_kill_while_the_only_checkpoint_is_rewritten_keeps_it(tmp_path, monkeypatch):
    """keep 1, and the same step saved again (Ctrl+C right after a scheduled checkpoint): killed after the old copy
    was moved aside and before the new one landed, the old copy is still found, by every reader."""
    save_checkpoint(tmp_path, 4, state={"v": "first"}, keep=1)
    real_replace = os.replace

    def killed_at_publish(src, dst):
        if Path(src).name.startswith(".tmp-step-"):
            raise KeyboardInterrupt  # the process dies here
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_at_publish)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 4, state={"v": "second"}, keep=1)
    monkeypatch.setattr(os, "replace", real_replace)
    assert not (tmp_path / "step-000004").exists()  # the state the kill left
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt is not None and ckpt.step == 4 and ckpt.state["v"] == "first"
    assert checkpoint_steps(tmp_path) == [4] and checkpoint_at(tmp_path, 4).state["v"] == "first"
    # the next save puts the old copy back first, then writes and prunes as usual
    save_checkpoint(tmp_path, 5, state={"v": 5}, keep=1)
    assert _steps_on_disk(tmp_path) == [5] and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_kill_while_pruning_leaves_nothing_that_looks_like_a_checkpoint(tmp_path, monkeypatch):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, state={"v": step}, keep=0)
    real_rmtree = shutil.rmtree

    def killed_mid_delete(path, *args, **kwargs):
        path = Path(path)
        if path.exists() and (path / "model").exists() is False and (path / "state.json").exists():
            (path / "rng.pt").unlink()  # part of it is gone, state.json not yet
            raise KeyboardInterrupt
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", killed_mid_delete)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 3, state={"v": 3}, keep=1)
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    # step 1 was renamed away before its files went: no reader takes the half-deleted directory for a checkpoint
    assert checkpoint_steps(tmp_path) == [2, 3] and latest_checkpoint(tmp_path).step == 3
    assert list(tmp_path.glob(".trash-*"))
    save_checkpoint(tmp_path, 4, state={"v": 4}, keep=1)
    assert _steps_on_disk(tmp_path) == [4] and not list(tmp_path.glob(".trash-*"))


def test_resume_after_retention_is_exact(tmp_path):
    """Train 6 steps saving each with keep 1, resume from what is left and train 3 more: the same weights and
    Adam state, bit for bit, as 9 steps without a stop."""

    def batch(step):
        gen = torch.Generator().manual_seed(100 + step)
        ids = torch.randint(0, 250, (2, 12), generator=gen)
        return ids

    def train(model, optimizer, steps):
        for step in steps:
            ids = batch(step)
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    def fresh():
        model = build_preset("tiny-qwen2", seed=3).model.train()
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    straight, straight_opt = fresh()
    train(straight, straight_opt, range(9))

    model, optimizer = fresh()
    for step in range(6):
        train(model, optimizer, [step])
        save_checkpoint(tmp_path, step + 1, model=model, optimizer=optimizer, state={}, keep=1)
    assert _steps_on_disk(tmp_path) == [6]
    ckpt = latest_checkpoint(tmp_path)
    resumed = load_model(str(ckpt.model_dir)).model.train()
    resumed_opt = torch.optim.Adam(resumed.parameters(), lr=1e-3)
    load_optimizer_state(ckpt, resumed_opt)
    train(resumed, resumed_opt, range(ckpt.step, 9))
    for (name, p), q in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name
    for a, b in zip(straight_opt.state_dict()["state"].values(), resumed_opt.state_dict()["state"].values()):
        assert torch.equal(a["exp_avg_sq"], b["exp_avg_sq"]) and torch.equal(a["step"], b["step"])


# ----------------------------------------------------------------------------- metrics
def test_metrics_resume_truncates_to_the_checkpoint(tmp_path):
    with MetricsWriter(tmp_path, step_key="round", tensorboard=False) as w:
        for r in range(1, 6):
            w.log({"round": r, "loss": r / 10})
    assert [r["round"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4, 5]

    # the run resumes from the round-3 checkpoint: rounds 4 and 5 will be redone, so they go
    with MetricsWriter(tmp_path, step_key="round", resume_from=3, tensorboard=False) as w:
        assert [r["round"] for r in w.records()] == [1, 2, 3]
        w.log({"round": 4, "loss": 0.44})
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3, 4] and rows[-1]["loss"] == 0.44

    # a fresh start (no checkpoint) in the same directory starts a new file
    with MetricsWriter(tmp_path, step_key="round", tensorboard=False) as w:
        w.log({"round": 1, "loss": 1.0})
    assert [r["round"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1]


def test_torn_last_line_is_ignored(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n" + '{"step": 3, "lo')
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    with MetricsWriter(tmp_path, resume_from=2, tensorboard=False) as w:
        w.log({"step": 3})
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]


def test_values_are_written_as_valid_json(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=True) as w:
        w.log({"step": 1, "nan": math.nan, "inf": math.inf, "t": torch.tensor(0.5), "none": None, "flag": True})
    text = (tmp_path / "metrics.jsonl").read_text()
    row = json.loads(text)  # strict JSON: no NaN / Infinity tokens
    assert "NaN" not in text and "Infinity" not in text
    assert row == {"step": 1, "nan": None, "inf": "inf", "t": 0.5, "none": None, "flag": True}
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_nested_numbers_reach_tensorboard_as_key_slash_subkey(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsWriter(tmp_path, step_key="round", tensorboard=True) as w:
        w.log({"round": 3, "loss": 0.5, "drops": {"duplicate": 2},
               "by_family": {"chain_sum": {"format_rate": 0.75, "groups": 2}}, "note": "text", "flag": True})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {"loss", "drops/duplicate", "by_family/chain_sum/format_rate", "by_family/chain_sum/groups"}
    point = events.Scalars("by_family/chain_sum/format_rate")[0]
    assert point.step == 3 and point.value == 0.75
