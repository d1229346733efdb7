"""A model's shape read from its files without loading it (GGUF header, config.json)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from wkvlab.errors import ModelError
from wkvlab.models.facts import ModelFacts, check_model_source, gguf_metadata, model_facts


def _tiny_gguf(path, arch="llama", key_length=None):
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(7)
    writer.add_context_length(4096)
    writer.add_embedding_length(384)
    writer.add_head_count(6)
    writer.add_head_count_kv(2)
    if key_length:
        writer.add_key_length(key_length)
    writer.add_token_list([f"tok{i}" for i in range(50)])  # a string array, as tokenizers write
    writer.add_tensor("w", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_facts_from_the_header(tmp_path):
    path = tmp_path / "tiny.gguf"
    _tiny_gguf(path)
    assert model_facts(str(path)) == ModelFacts(layers=7, kv_heads=2, head_dim=64, max_context=4096)  # 384 / 6
    with_key = tmp_path / "gemma-like.gguf"
    _tiny_gguf(with_key, arch="gemma3", key_length=256)
    assert model_facts(str(with_key)) == ModelFacts(7, 2, 256, 4096)
    assert gguf_metadata(path, ("{arch}.block_count",)) == {"{arch}.block_count": 7}


def test_config_json_facts_and_unknowns(tmp_path):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
                                                    "hidden_size": 64, "max_position_embeddings": 256}))
    assert model_facts(str(folder)) == ModelFacts(2, 1, 16, 256)
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF\x03")
    assert model_facts(str(broken)) is None and model_facts(str(tmp_path / "missing.gguf")) is None


def test_check_model_source_refuses_what_loading_refuses(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    for spec, message in ((str(tmp_path / "nope.gguf"), "model not found"), (str(tmp_path / "notes.txt"), "is not a .gguf file"),
                          (str(tmp_path), "has no config.json")):
        with pytest.raises(ModelError, match=message):
            check_model_source(spec)


@pytest.mark.slow
def test_packaged_model_facts_match_the_loaded_config(default_model):
    facts = model_facts("default")
    cfg = default_model.model.config
    assert facts == ModelFacts(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, cfg.max_position_embeddings)
