"""Generation with vLLM (``generation.engine: vllm``): an optional engine for GPU machines.

vLLM is not a dependency of swarmlm: ``pip install vllm`` where it runs (CUDA GPUs). Selecting this engine where
vLLM is not installed raises :class:`VLLMUnavailable` with the install hint.

vLLM keeps its own copy of the weights, so the node calls :meth:`VLLMEngine.sync_weights` after every update: the
training model's parameters are loaded into vLLM's model in place (by name, as in a Hugging Face checkpoint) and
vLLM's prefix cache, which holds KV computed with the old weights, is reset. The engine starts from the training
model's current weights too (saved to a temporary directory), so a warm start or a resumed checkpoint carries over.

Sampling is the same as the ``hf`` engine's: plain temperature sampling (no top-k, top-p, min-p or repetition
penalty), L completions per prompt (vLLM's ``n``, which shares the prompt's prefill), greedy for evaluation.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from swarmlm.sapo.engines.base import Generated, GenerationEngine

INSTALL_HINT = ("generation.engine = vllm needs vLLM, which is not installed here: pip install vllm (CUDA GPUs); "
                "or use the default generation.engine = hf")


class VLLMUnavailable(ImportError):
    """vLLM was selected but cannot be imported."""


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise VLLMUnavailable(f"{INSTALL_HINT} ({err})") from err
    return vllm


class VLLMEngine(GenerationEngine):
    """A vLLM ``LLM`` in this process, fed token ids and returning token ids (our tokenizer decodes)."""

    name = "vllm"

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, gpu_memory_utilization: float = 0.3,
                 max_model_len: int = 1024, seed: int = 0):
        vllm = import_vllm()
        self._vllm = vllm
        self.model = model
        self.tokenizer = tokenizer
        self._dir = tempfile.mkdtemp(prefix="swarmlm-vllm-")
        model.save_pretrained(self._dir)
        tokenizer.save_pretrained(self._dir)
        # the engine core in this process, so that sync_weights can reach its model
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        self.llm = vllm.LLM(model=self._dir, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                            max_model_len=max_model_len, skip_tokenizer_init=True, enable_prefix_caching=True, seed=seed)

    # ------------------------------------------------------------------ generation
    def _sampling_params(self, n: int, max_new_tokens: int, temperature: float, greedy: bool) -> Any:
        return self._vllm.SamplingParams(
            n=n, temperature=0.0 if greedy else temperature, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
            max_tokens=max_new_tokens, stop_token_ids=[self.tokenizer.eos_token_id], detokenize=False)

    def generate(self, prompt_ids, *, num_completions, max_new_tokens, temperature=1.0, max_batch=64, greedy=False):
        eos = self.tokenizer.eos_token_id
        params = self._sampling_params(num_completions, max_new_tokens, temperature, greedy)
        outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids], sampling_params=params,
                                    use_tqdm=False)
        result = []
        for ids, request in zip(prompt_ids, outputs):
            completions, finished = [], []
            for choice in request.outputs:
                tokens = list(choice.token_ids)
                ended = eos in tokens or choice.finish_reason == "stop"
                completions.append(tokens[:tokens.index(eos)] if eos in tokens else tokens)
                finished.append(bool(ended))
            texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
            result.append(Generated(prompt_ids=list(ids), completion_ids=completions, texts=texts, finished=finished))
        return result

    # ------------------------------------------------------------------ weights
    def _named_weights(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, p.detach()) for name, p in self.model.named_parameters()]

    def _inner_model(self) -> Any:
        """vLLM's model object where the engine runs in this process (the paths differ between vLLM versions)."""
        executor = getattr(getattr(self.llm, "llm_engine", None), "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        for path in (("model_runner", "model"), ("worker", "model_runner", "model")):
            obj = worker
            for attr in path:
                obj = getattr(obj, attr, None)
            if obj is not None:
                return obj
        return None

    def sync_weights(self) -> None:
        weights = self._named_weights()
        inner = self._inner_model()
        if inner is not None:
            inner.load_weights(weights)
        elif hasattr(self.llm, "apply_model"):
            self.llm.apply_model(lambda m: m.load_weights(weights))
        else:
            raise RuntimeError("this vLLM version exposes no way to load weights into its model in place; "
                               "use generation.engine = hf")
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        shutil.rmtree(self._dir, ignore_errors=True)
