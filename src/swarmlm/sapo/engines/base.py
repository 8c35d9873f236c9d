"""What a generation engine is: prompt token ids in, L completions per prompt out (:class:`Generated`).

A node holds one engine (``generation.engine``): ``hf`` decodes with the training model itself
(:mod:`swarmlm.sapo.engines.hf`), ``vllm`` with a vLLM engine that keeps its own copy of the weights
(:mod:`swarmlm.sapo.engines.vllm`). :func:`swarmlm.sapo.engines.make_engine` builds the one a config names.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase


@dataclass
class Generated:
    """Completions for one prompt: token ids (without EOS) and decoded text, L of each."""

    prompt_ids: list[int]
    completion_ids: list[list[int]]
    texts: list[str]
    finished: list[bool]  # whether the completion ended with EOS (not cut at max_new_tokens)


def tokenize_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str], max_prompt_tokens: int) -> list[list[int]]:
    """Token ids per prompt, keeping the *last* ``max_prompt_tokens`` (the question's end and the instruction)."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    return [seq[-max_prompt_tokens:] for seq in ids]


class GenerationEngine(ABC):
    """Generates a node's rollouts. The node calls :meth:`sync_weights` after every update of its policy."""

    name: str = "?"

    @abstractmethod
    def generate(self, prompt_ids: list[list[int]], *, num_completions: int, max_new_tokens: int,
                 temperature: float = 1.0, max_batch: int = 64, greedy: bool = False) -> list[Generated]:
        """``num_completions`` samples per prompt, in the order of ``prompt_ids``."""

    def sync_weights(self) -> None:
        """Make generation use the policy's current weights (a no-op for engines that share them)."""

    def close(self) -> None:
        """Release what the engine holds (processes, device memory)."""
