"""Built-in model shapes, built from a config with the byte-level tokenizer: nothing to download.

The tiny presets run on a laptop CPU. The larger Llama shapes follow the NoLoCo reference sizes
(125M, 1.3B, 6.8B) and are meant for GPUs; with the byte tokenizer their embedding is small, so
their parameter counts are a little under the names.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import LlamaConfig, PretrainedConfig, PreTrainedTokenizerBase, Qwen2Config


@dataclass(frozen=True)
class Preset:
    family: str  # "qwen2" or "llama"
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int = 2048
    tie_embeddings: bool = True
    description: str = ""

    def config(self, tokenizer: PreTrainedTokenizerBase) -> PretrainedConfig:
        """The model config for this shape, with the vocabulary and special ids of ``tokenizer``."""
        # Pad the vocabulary to a multiple of 8 for friendlier matmuls.
        vocab = (len(tokenizer) + 7) // 8 * 8
        common = dict(
            vocab_size=vocab,
            hidden_size=self.hidden,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            intermediate_size=self.intermediate,
            max_position_embeddings=self.max_positions,
            tie_word_embeddings=self.tie_embeddings,
            rms_norm_eps=1e-6,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        if self.family == "qwen2":
            return Qwen2Config(**common, rope_theta=10000.0)
        return LlamaConfig(**common, rope_theta=10000.0)


PRESETS: dict[str, Preset] = {
    "tiny-qwen2": Preset("qwen2", 256, 4, 4, 2, 688, description="Qwen2-style, about 3M parameters (CPU default)"),
    "tiny-llama": Preset("llama", 256, 4, 4, 4, 688, description="Llama-style, about 3M parameters"),
    "nano-llama": Preset("llama", 64, 1, 4, 4, 172, description="Llama-style, one layer, about 66k parameters (many-replica studies on one CPU core)"),
    "small-qwen2": Preset("qwen2", 512, 8, 8, 4, 1376, description="Qwen2-style, about 22M parameters"),
    "small-llama": Preset("llama", 512, 8, 8, 8, 1376, description="Llama-style, about 25M parameters"),
    "llama-125m": Preset("llama", 768, 12, 12, 12, 3072, tie_embeddings=False, description="NoLoCo reference 125M shape"),
    "llama-1.3b": Preset("llama", 2048, 24, 16, 16, 5504, tie_embeddings=False, description="NoLoCo reference 1.3B shape"),
    "llama-6.8b": Preset("llama", 4096, 32, 32, 32, 11008, tie_embeddings=False, description="NoLoCo reference 6.8B shape"),
}
