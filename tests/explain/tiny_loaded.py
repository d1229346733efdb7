"""A tiny random Llama with a character-level tokenizer, wrapped as a LoadedModel.

With a 128-token vocabulary the logits and full-vocabulary KLD cost nothing, so the whole explain
pipeline runs end to end in seconds; the default model's 49k vocabulary would dominate the time.
"""
from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import tiny_llama
from wkvlab.models.loading import LoadedModel

VOCAB = 128


class CharTokenizer:
    """Enough of a tokenizer for wkvlab.data: one id per character (code point modulo the vocabulary)."""

    bos_token_id = None
    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = False):
        return SimpleNamespace(input_ids=[ord(c) % VOCAB for c in text])

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(chr(int(i)) for i in ids)

    def __len__(self) -> int:
        return VOCAB


def tiny_loaded(seed: int = 0, layers: int = 4) -> LoadedModel:
    model = tiny_llama(seed, num_hidden_layers=layers, vocab_size=VOCAB, max_position_embeddings=512)
    return LoadedModel(name="tiny-llama", model=model, tokenizer=CharTokenizer(), source="memory", fingerprint="t" * 64)
