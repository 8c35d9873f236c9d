"""Checks of what a run will read, made before it writes anything: the models it names, the identity file of a swarm
node, the data files of a NoLoCo run. Each mistake is a :class:`~swarmlm.config.ConfigError` that says what is wrong
and what is allowed; the command line prints it as one line and exits with code 2 (:func:`swarmlm.cli.main`).

The checks import what the run imports anyway (transformers for the presets' names, huggingface_hub for a hub id),
so the command line calls them after parsing, never while building its ``--help``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from swarmlm.config import ConfigError, NamedSection


def _presets() -> list[str]:
    from swarmlm.models.presets import PRESETS

    return list(PRESETS)


def _allowed() -> str:
    return (f"give a built-in preset ({', '.join(_presets())}), a local model directory, a .gguf file or a Hugging "
            "Face hub id (namespace/name)")


def _check_hub_id(spec: str) -> None:
    """``spec`` as a hub id: well formed, and in the local cache or on the hub."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    try:
        huggingface_hub.utils.validate_repo_id(spec)
    except errors.HFValidationError:
        raise ConfigError(f"model '{spec}' is not a preset, an existing path or a valid hub id; {_allowed()}") from None
    if isinstance(huggingface_hub.try_to_load_from_cache(spec, "config.json"), str):
        return  # downloaded before: loads offline
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f"model '{spec}' is not a preset, an existing path or in the local Hugging Face cache, and "
                          f"the hub is offline (HF_HUB_OFFLINE); {_allowed()}")
    try:
        huggingface_hub.model_info(spec, timeout=15)
    except errors.RepositoryNotFoundError:
        raise ConfigError(f"model '{spec}' is not a preset, an existing path or a model on the Hugging Face hub; "
                          f"{_allowed()}") from None
    except errors.GatedRepoError:
        raise ConfigError(f"model '{spec}' is gated on the Hugging Face hub: accept its terms on its page and log in "
                          "(hf auth login), or give another model") from None
    except Exception as err:  # no network, a proxy, a timeout, the hub's own errors
        message = " ".join(str(err).split()) or type(err).__name__
        raise ConfigError(f"could not reach the Hugging Face hub to look up model '{spec}' ({message[:200]}); "
                          f"{_allowed()}") from None


def check_model(spec: str, *, presets_only: bool = False) -> None:
    """Raise :class:`ConfigError` unless ``spec`` names a model :func:`swarmlm.models.load_model` can load: a preset,
    ``smollm2-135m`` with its package installed, a directory holding a model (``config.json``) or one .gguf file, a
    .gguf file, or a hub id in the local cache or on the hub. ``presets_only``: a built-in preset and nothing else."""
    presets = _presets()
    if spec in presets:
        return
    if presets_only:
        raise ConfigError(f"model '{spec}' is not a built-in preset; presets: {', '.join(presets)}")
    from swarmlm.models.loading import SMOLLM2_NAME, ModelLoadError, _is_path_like, smollm2_gguf_path

    if spec == SMOLLM2_NAME:
        try:
            smollm2_gguf_path()
        except ModelLoadError as err:
            raise ConfigError(str(err)) from None
        return
    path = Path(spec).expanduser()
    if path.exists():
        if not os.access(path, os.R_OK):
            raise ConfigError(f"model path '{spec}' is not readable (permissions)")
        if path.is_dir() and not ((path / "config.json").is_file() or len(list(path.glob("*.gguf"))) == 1):
            raise ConfigError(f"model directory '{spec}' holds neither a model (config.json, as save_pretrained "
                              f"writes) nor one .gguf file; {_allowed()}")
        if path.is_file() and path.suffix != ".gguf":
            raise ConfigError(f"model file '{spec}' is not a .gguf file; {_allowed()}")
        return
    if _is_path_like(spec):
        raise ConfigError(f"model path '{spec}' does not exist; {_allowed()}")
    _check_hub_id(spec)


def _model_specs(config: BaseModel) -> list[str]:
    """Every model a config names: ``model`` (a section with a name, or a string) and ``node_models``."""
    specs = []
    model = getattr(config, "model", None)
    if isinstance(model, NamedSection):
        specs.append(model.name)
    elif isinstance(model, str):
        specs.append(model)
    specs += list(getattr(config, "node_models", None) or [])
    return list(dict.fromkeys(specs))


def check_identity(config: Any) -> None:
    """A swarm node's ``identity`` file: one given explicitly must exist and hold a key, unless ``create_identity``
    asks for a new one there (a typo in the path would otherwise start the node under a new peer id). Left out, or
    given as the default ``OUT/identity.key``, it is created on the first start."""
    if config.identity is None:
        return
    path = Path(config.identity).expanduser()
    default = Path(config.out).expanduser() / "identity.key"
    if path.exists():
        if path.is_dir() or not os.access(path, os.R_OK):
            raise ConfigError(f"identity '{config.identity}' is not a readable file")
        try:
            from swarmlm.sapo.transports.hivemind.identity import load_identity

            load_identity(path, create=False)
        except ImportError:
            return  # hivemind is not installed: the node says so, with the command that installs it
        except ValueError as err:
            raise ConfigError(f"identity: {err}") from None
        return
    if config.create_identity or path.absolute() == default.absolute():
        return
    raise ConfigError(f"identity file '{config.identity}' does not exist; give an existing identity key file, add "
                      "--create-identity to create a new one there, or leave --identity out to use OUT/identity.key "
                      "(created on the first start)")


def check_inputs(config: BaseModel) -> None:
    """Every check above that applies to ``config``, in the order a run would meet them."""
    from swarmlm.sapo.warmstart import WarmstartConfig

    if hasattr(config, "identity") and hasattr(config, "create_identity"):
        check_identity(config)  # first: it imports nothing
    presets_only = isinstance(config, WarmstartConfig)
    for spec in _model_specs(config):
        check_model(spec, presets_only=presets_only)
    data = getattr(config, "data", None)
    source = getattr(data, "source", None)
    if isinstance(source, str) and source != "builtin" and not source.startswith("hf:"):
        from swarmlm.noloco.data import local_files

        try:
            local_files(source)
        except (OSError, ValueError) as err:
            raise ConfigError(f"data.source: {err}") from None
