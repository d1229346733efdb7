"""GGUF → safetensors conversion: transformers' values, one tensor alive at a time."""
from __future__ import annotations

import gguf
import pytest
import torch

from tests.conftest import tiny_llama
from tests.host_memory import assert_loads_a_few_tensors_at_a_time, wide_llama
from wkvlab.models import gguf_convert
from wkvlab.models.fingerprint import file_sha256
from wkvlab.models.loading import load_model
from wkvlab.weights.checkpoints.gguf_file import write_llama_gguf

VOCAB = [f"t{i}" for i in range(128)]


@pytest.fixture
def scored_tokens(monkeypatch):
    """write_llama_gguf's token list, with the scores transformers' GGUF tokenizer needs to build merges."""
    plain = gguf.GGUFWriter.add_token_list

    def add_token_list(self, tokens):
        plain(self, tokens)
        self.add_token_scores([0.0] * len(tokens))

    monkeypatch.setattr(gguf.GGUFWriter, "add_token_list", add_token_list)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "f16"])
def test_conversion_gives_transformers_values_bit_for_bit(tmp_path, monkeypatch, scored_tokens, kind):
    from transformers import AutoModelForCausalLM

    model = tiny_llama(vocab_size=128)
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(model, path, kind, VOCAB)  # Q/K rows permuted as llama.cpp writes them: the processor undoes it
    monkeypatch.setattr(gguf_convert, "SLICE_BYTES", 1000)  # several row slices per tensor
    gguf_convert.convert_gguf(path, tmp_path / "out", torch.float32)
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).state_dict()
    ours = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32).state_dict()
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    assert (tmp_path / "out" / "wkvlab-source.json").is_file()


def test_conversion_holds_one_tensor_not_the_model(tmp_path, monkeypatch, scored_tokens):
    """Host allocations made while a GGUF is converted and loaded (numpy's, which tracemalloc sees:
    the dequantized tensors) peak at a few tensors — one dequantized, gguf-py's block arithmetic on
    it, the Q/K un-permuted copy —, not at the model: transformers' loader kept every dequantized
    tensor in a dictionary until the model was built (31 MiB here)."""
    model = wide_llama()
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(model, path, "q8_0", VOCAB)
    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path / "cache"))
    file_sha256(path)  # memoized: its 8 MiB reads are no part of the conversion
    warm = tmp_path / "warm.gguf"  # a first conversion imports the tokenizer converters, the loaders...: not counted
    write_llama_gguf(tiny_llama(vocab_size=128), warm, "q8_0", VOCAB)
    load_model(str(warm))
    assert_loads_a_few_tensors_at_a_time(model, lambda: load_model(str(path)).model)
