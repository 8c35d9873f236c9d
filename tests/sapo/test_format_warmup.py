"""The format warm-up of a model that is not a preset (:func:`swarmlm.sapo.warmstart.format_warmup`): its cache key,
when it runs, what it writes, and the learning rate a node then takes. A real pretrained model's warm-up is in
tests/models/test_format_warmup_smollm2.py; here a saved tiny preset (random weights, no answer format) stands in
for one."""

from __future__ import annotations

import json
import os

import pytest

from swarmlm.models import build_preset, model_identity
from swarmlm.sapo import warmstart as ws
from swarmlm.sapo.config import SAPOConfig
from swarmlm.sapo.node import PRETRAINED_LR, default_lr, initial_model_path
from swarmlm.sapo.warmstart import FormatWarmupConfig, format_warmup, format_warmup_dir, format_warmup_key

SMALL = dict(max_steps=2, batch_size=2, check_every=1, probe_questions=2, probe_samples=2, max_new_tokens=24)


@pytest.fixture()
def plain_dir(tmp_path):
    """A model directory that is not a preset's warm start: random tiny weights, which never write the format."""
    built = build_preset("tiny-qwen2", seed=3)
    path = tmp_path / "plain-model"
    built.model.save_pretrained(path)
    built.tokenizer.save_pretrained(path)
    return path


def test_model_identity_follows_the_files_without_loading_them(plain_dir):
    assert model_identity("tiny-qwen2") == "preset:tiny-qwen2"
    assert model_identity("someone/some-model") == "hub:someone/some-model"
    before = model_identity(str(plain_dir))
    assert before.startswith("dir:") and model_identity(str(plain_dir)) == before
    config = plain_dir / "config.json"
    config.write_text(config.read_text() + "\n")  # a changed file: another identity, so another cache entry
    assert model_identity(str(plain_dir)) != before


def test_the_key_holds_what_changes_the_result_and_not_the_device_or_held_out_set(plain_dir):
    base = FormatWarmupConfig(model=str(plain_dir))
    key = format_warmup_key(base)
    assert key == format_warmup_key(FormatWarmupConfig(model=str(plain_dir), device="cuda", tasks={"eval_size": 7}))
    for change in ({"lr": 1e-5}, {"prompt_style": "plain"}, {"max_new_tokens": 64}, {"target": 0.9}, {"seed": 1},
                   {"max_steps": 3}, {"tasks": {"preset": "easy"}}, {"model": "someone/some-model"}):
        assert format_warmup_key(FormatWarmupConfig(**{"model": str(plain_dir), **change})) != key, change
    assert format_warmup_dir(base).name.startswith("plain-model-")


def test_a_model_without_the_format_is_trained_until_the_target_or_the_step_limit_then_cached(plain_dir, monkeypatch):
    config = FormatWarmupConfig(model=str(plain_dir), **SMALL)
    out = format_warmup(config, progress=False)
    assert out == str(format_warmup_dir(config)) != str(plain_dir)
    info = json.loads((format_warmup_dir(config) / "warmstart.json").read_text())
    assert info["kind"] == "format" and info["trained"] and info["steps"] == 2 and len(info["losses"]) == 2
    assert info["final_loss"] == info["losses"][-1]
    assert [p["step"] for p in info["probes"]] == [0, 1, 2]  # before training, then every check_every steps
    assert info["format_rate_before"] == info["probes"][0]["format_rate"] == 0.0
    assert info["config"]["model"] == str(plain_dir)
    # a pretrained model's warm-up trains at the pretrained models' rate, named either way
    assert default_lr(str(plain_dir)) == default_lr(out) == PRETRAINED_LR
    # cached: the second call neither probes nor trains
    stamp = os.stat(os.path.join(out, "model.safetensors")).st_mtime_ns
    monkeypatch.setattr(ws, "_run_format_warmup", lambda *a, **k: pytest.fail("ran again"))
    assert format_warmup(config, progress=False) == out
    assert os.stat(os.path.join(out, "model.safetensors")).st_mtime_ns == stamp
    # a warm start given as the model is used as it is (no warm-up of a warm-up)
    assert format_warmup(FormatWarmupConfig(model=out, **SMALL), progress=False) == out


def test_a_model_that_has_the_format_is_used_as_it_is_and_the_probe_is_cached(plain_dir, monkeypatch):
    calls = []

    def probe(model, tok, questions, config, seed):
        calls.append(seed)
        return {"format_rate": 1.0, "completion_tokens": 5.0, "truncated_rate": 0.0, "example": "<answer>3</answer>"}

    monkeypatch.setattr(ws, "probe_format", probe)
    config = FormatWarmupConfig(model=str(plain_dir), **SMALL)
    assert format_warmup(config, progress=False) == str(plain_dir)
    assert calls == [0]
    check = json.loads((format_warmup_dir(config) / ws.FORMAT_CHECK).read_text())
    assert check["trained"] is False and check["steps"] == 0 and check["format_rate_after"] == 1.0
    assert not (format_warmup_dir(config) / "warmstart.json").exists()
    assert format_warmup(config, progress=False) == str(plain_dir) and calls == [0]


def test_initial_model_path_runs_the_format_warm_up_for_models_that_are_not_presets(plain_dir, monkeypatch):
    seen = []
    monkeypatch.setattr("swarmlm.sapo.node.format_warmup", lambda cfg, progress=True: seen.append(cfg) or "/warm")
    base = {"model": {"name": str(plain_dir), "format_warmup_steps": 3, "format_warmup_lr": 2e-5, "warmstart_seed": 4},
            "generation": {"max_new_tokens": 40, "prompt_style": "chat", "temperature": 0.7}}
    assert initial_model_path(SAPOConfig.model_validate(base), progress=False) == "/warm"
    (cfg,) = seen
    assert (cfg.model, cfg.max_steps, cfg.lr, cfg.seed, cfg.max_new_tokens, cfg.prompt_style, cfg.temperature) == \
        (str(plain_dir), 3, 2e-5, 4, 40, "chat", 0.7)
    never = SAPOConfig.model_validate({**base, "model": {"name": str(plain_dir), "warmstart": "never"}})
    assert initial_model_path(never, progress=False) == str(plain_dir) and len(seen) == 1
    with pytest.raises(ValueError, match="preset"):
        format_warmup(FormatWarmupConfig(model="tiny-qwen2"))


def test_no_warm_up_when_the_answer_format_cannot_fit_in_the_budget(plain_dir, monkeypatch):
    """'<answer>12</answer>' is 19 byte-level tokens: with a budget of 8 no completion can hold it, so no warm-up
    could reach the target, and none runs (nor any probe); the decision is cached."""
    monkeypatch.setattr(ws, "probe_format", lambda *a, **k: pytest.fail("probed"))
    config = FormatWarmupConfig(model=str(plain_dir), **{**SMALL, "max_new_tokens": 8})
    assert format_warmup(config, progress=False) == str(plain_dir)
    check = json.loads((format_warmup_dir(config) / ws.FORMAT_CHECK).read_text())
    assert check["answers_fit"] == 0.0 and check["trained"] is False and check["format_rate_before"] is None
    assert format_warmup(config, progress=False) == str(plain_dir)
