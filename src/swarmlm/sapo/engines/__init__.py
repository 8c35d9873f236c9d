"""Generation engines behind one interface (:class:`~swarmlm.sapo.engines.base.GenerationEngine`), and the
factory that picks one. A new engine is a module here implementing that interface, plus one branch below."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swarmlm.runtime.devices import use_bf16
from swarmlm.sapo.engines.base import GenerationEngine
from swarmlm.sapo.engines.hf import HFEngine

if TYPE_CHECKING:
    from swarmlm.sapo.config import GenerationSection


def make_engine(section: "GenerationSection", model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> GenerationEngine:
    """The engine ``generation.engine`` names, for this policy."""
    if section.engine == "hf":
        device = next(model.parameters()).device
        return HFEngine(model, tokenizer, bf16=use_bf16(section.precision, device, "generation.precision"))
    if section.engine == "vllm":
        from swarmlm.sapo.engines.vllm import VLLMEngine  # optional: raises a clear error where vLLM is absent

        return VLLMEngine(model, tokenizer, gpu_memory_utilization=section.vllm_gpu_memory_utilization,
                          max_model_len=section.max_prompt_tokens + section.max_new_tokens)
    raise ValueError(f"unknown generation engine '{section.engine}' (hf or vllm)")
