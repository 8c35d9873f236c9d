"""Models: presets, the byte tokenizer, save_pretrained / load_model round trips, clear load errors."""

from __future__ import annotations

import pytest
import torch

from swarmlm.models import PRESETS, ModelLoadError, build_byte_tokenizer, build_preset, count_parameters, load_model


def _logits(model, ids):
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


IDS = torch.tensor([[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]])


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama"])
def test_preset_save_and_load_round_trip(tmp_path, name):
    loaded = build_preset(name, seed=1)
    loaded.model.save_pretrained(tmp_path, safe_serialization=True)
    loaded.tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()

    again = load_model(str(tmp_path))
    assert type(again.model) is type(loaded.model)
    assert torch.equal(_logits(loaded.model, IDS), _logits(again.model, IDS))
    assert again.name == str(tmp_path)
    text = "Ünïcode ✓ <answer>42</answer>\n"
    ids = again.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids == loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert again.tokenizer.decode(ids) == text
    assert again.tokenizer.eos_token_id == loaded.tokenizer.eos_token_id
    assert again.tokenizer.pad_token_id == loaded.tokenizer.pad_token_id
    assert again.tokenizer.padding_side == "left"


def test_load_model_from_a_local_directory_of_a_trained_model(tmp_path):
    """A model that changed after init (as a checkpoint would) loads with its new weights, not a fresh init."""
    loaded = build_preset("tiny-qwen2", seed=0)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.mul_(1.5)
    loaded.model.save_pretrained(tmp_path / "ckpt")
    loaded.tokenizer.save_pretrained(tmp_path / "ckpt")
    fresh = build_preset("tiny-qwen2", seed=0)
    again = load_model(str(tmp_path / "ckpt"))
    assert torch.equal(_logits(loaded.model, IDS), _logits(again.model, IDS))
    assert not torch.allclose(_logits(fresh.model, IDS), _logits(again.model, IDS))
    half = load_model(str(tmp_path / "ckpt"), dtype=torch.bfloat16)
    assert next(half.model.parameters()).dtype == torch.bfloat16


def test_presets_are_seeded_and_small():
    a, b, c = (load_model("tiny-qwen2", seed=s).model for s in (0, 0, 1))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    assert 1_000_000 < count_parameters(a) < 6_000_000
    # building a preset does not disturb the global RNG
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    build_preset("tiny-llama", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_preset_vocabulary_covers_the_tokenizer():
    tok = build_byte_tokenizer()
    config = PRESETS["tiny-qwen2"].config(tok)
    assert config.vocab_size >= len(tok) and config.vocab_size % 8 == 0
    assert config.eos_token_id == tok.eos_token_id and config.pad_token_id == tok.pad_token_id
    assert len({tok.eos_token_id, tok.pad_token_id, tok.bos_token_id}) == 3
    everything = bytes(range(256)).decode("latin-1") + "日本語 🙂"
    assert tok.decode(tok(everything, add_special_tokens=False)["input_ids"]) == everything


def test_missing_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "no" / "such" / "model"
    with pytest.raises(ModelLoadError) as err:
        load_model(str(missing))
    message = str(err.value)
    assert str(missing) in message and "does not exist" in message and "tiny-qwen2" in message


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ModelLoadError) as err:
        load_model("no-such-model-anywhere-xyz")  # not a preset, not a directory, not cached (hub offline)
    message = str(err.value)
    assert "no-such-model-anywhere-xyz" in message and "tiny-qwen2" in message
    with pytest.raises(ModelLoadError, match="unknown preset"):
        build_preset("tiny-gpt")


def test_existing_directory_that_is_not_a_model_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelLoadError, match="local path"):
        load_model(str(tmp_path))
