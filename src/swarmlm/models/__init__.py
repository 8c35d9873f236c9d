"""Models and tokenizers: built-in presets, local directories, GGUF files and hub ids."""

from swarmlm.models.loading import (LoadedModel, ModelLoadError, build_preset, count_parameters, load_model,
                                    model_identity)
from swarmlm.models.presets import PRESETS
from swarmlm.models.tokenizer import build_byte_tokenizer

__all__ = ["PRESETS", "LoadedModel", "ModelLoadError", "build_byte_tokenizer", "build_preset", "count_parameters", "load_model",
           "model_identity"]
