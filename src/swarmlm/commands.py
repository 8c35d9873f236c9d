"""Handlers of the shared commands (``warmstart``, ``models``); each takes its validated config."""

from __future__ import annotations


from swarmlm.config import StrictModel
from swarmlm.warmstart import WarmstartConfig, warmstart


class ModelsConfig(StrictModel):
    """``swarmlm models`` takes no options."""


def warmstart_command(config: WarmstartConfig) -> int:
    path = warmstart(config)
    print(path)
    return 0


def models_command(config: ModelsConfig) -> int:
    from swarmlm.models import PRESETS, build_preset, count_parameters

    for name, preset in PRESETS.items():
        size = f"{count_parameters(build_preset(name).model) / 1e6:.1f}M" if preset.hidden <= 512 else "(GPU shape)"
        print(f"{name:14s} {preset.family:6s} {size:>12s}  {preset.description}")
    print("Any Hugging Face causal LM also works: a hub id, a local directory, or a .gguf file.")
    return 0
