"""A byte-level tokenizer that needs no download: 256 byte symbols plus a few special tokens.

Every string round-trips exactly, every language and every answer format is representable, and
the vocabulary is small enough for the tiny presets. It is a real Hugging Face fast tokenizer, so it
saves, loads and batches like any other.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, BOS_TOKEN)


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """Build the byte-level tokenizer (ids 0-255 are bytes in GPT-2's printable mapping, then specials)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: idx for idx, symbol in enumerate(alphabet)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        model_max_length=4096,
    )
    tokenizer.padding_side = "left"
    return tokenizer

