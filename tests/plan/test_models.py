"""Model descriptions: built-in table, config.json parsing, layer kinds."""
from __future__ import annotations

import json

import pytest

from wkvlab.errors import ConfigError
from wkvlab.plan import ModelDescription, builtin_model_names, parameter_count, resolve_model
from wkvlab.plan.models import FULL, LINEAR, SLIDING

REQUIRED = ["Llama-3-8B", "Llama-3-70B", "Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B",
            "Mistral-7B", "Mixtral-8x7B", "Qwen2.5-7B", "Qwen2.5-72B", "Qwen3-8B", "Qwen3-32B",
            "Qwen3-30B-A3B", "Gemma-3-270M", "Gemma-3-4B", "Gemma-3-27B", "DeepSeek-V3",
            "SmolLM2-135M"]

# Published parameter counts (billions), text model only; the inventory must land within 1%.
PUBLISHED_B = {"Llama-3-8B": 8.03, "Llama-3-70B": 70.55, "Llama-3.1-405B": 405.85,
               "Mistral-7B": 7.25, "Mixtral-8x7B": 46.7, "Qwen2.5-7B": 7.62, "Qwen2.5-72B": 72.7,
               "Qwen3-8B": 8.19, "Qwen3-32B": 32.8, "Qwen3-30B-A3B": 30.5, "Gemma-3-270M": 0.268,
               "Gemma-3-27B": 27.0, "DeepSeek-V3": 671.0, "SmolLM2-135M": 0.1345,
               "Qwen3-Next-80B-A3B": 80.0}


def test_builtin_table_has_the_required_models():
    names = builtin_model_names()
    for name in REQUIRED:
        assert name in names
        ModelDescription.from_name(name)


@pytest.mark.parametrize("name,billions", sorted(PUBLISHED_B.items()))
def test_parameter_counts_match_published_sizes(name, billions):
    count = parameter_count(ModelDescription.from_name(name)) / 1e9
    assert count == pytest.approx(billions, rel=0.01)


def test_smollm2_fields():
    m = ModelDescription.from_name("SmolLM2-135M")
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (30, 576, 9, 3, 64)
    assert (m.vocab_size, m.intermediate_size, m.max_position_embeddings) == (49152, 1536, 8192)
    assert m.tie_embeddings


def test_lookup_ignores_case_punctuation_and_org():
    assert ModelDescription.from_name("llama-3-70b").name == "Llama-3-70B"
    assert ModelDescription.from_name("meta-llama/Meta-Llama-3-70B").name == "Llama-3-70B"


def test_gemma3_has_five_local_layers_per_global():
    m = ModelDescription.from_name("Gemma-3-27B")
    assert m.layer_types.count(FULL) == 10 and m.layer_types.count(SLIDING) == 52
    assert m.layer_types[:6] == (SLIDING,) * 5 + (FULL,)
    assert m.sliding_window == 1024 and m.tie_embeddings


def test_hybrid_linear_attention_layers_keep_no_kv():
    m = ModelDescription.from_name("Qwen3-Next-80B-A3B")
    assert len(m.kv_layers) == 12 and m.layer_types.count(LINEAR) == 36
    assert m.kv_layers[0] == 3


def test_mla_and_moe():
    m = ModelDescription.from_name("DeepSeek-V3")
    assert m.mla is not None and m.mla.cache_dim == 512 + 64
    assert m.moe is not None and m.moe.dense_layers == (0, 1, 2) and m.moe.num_experts == 256


def test_from_config_dict_file_and_directory(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
           "max_position_embeddings": 256, "torch_dtype": "float16"}
    from_dict = ModelDescription.from_config(cfg, name="tiny")
    assert from_dict.head_dim == 16 and from_dict.dtype == "fp16" and not from_dict.tie_embeddings
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(cfg))
    from_dir = ModelDescription.from_config(tmp_path / "tiny")
    assert from_dir.name == "tiny" and from_dir.num_layers == 2
    assert resolve_model(str(tmp_path / "tiny" / "config.json")).hidden_size == 64


def test_layer_types_list_is_honoured():
    cfg = {"model_type": "x", "num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
           "vocab_size": 10, "sliding_window": 32,
           "layer_types": ["sliding_attention", "full_attention", "mamba", "full_attention"]}
    m = ModelDescription.from_config(cfg)
    assert m.layer_types == (SLIDING, FULL, LINEAR, FULL) and m.kv_layers == (0, 1, 3)
    assert m.notes  # state-space mixers are not modelled, and the description says so


@pytest.mark.parametrize("cfg", [
    {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10},
    {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
     "num_key_value_heads": 3, "vocab_size": 10},
    {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
     "vocab_size": 10, "layer_types": ["full_attention", "weird"]},
])
def test_bad_configs_raise_config_error(cfg):
    with pytest.raises(ConfigError):
        ModelDescription.from_config(cfg)


def test_unknown_name_and_missing_path():
    with pytest.raises(ConfigError, match="unknown model"):
        ModelDescription.from_name("Llama-9-1T")
    with pytest.raises(ConfigError, match="no config.json"):
        ModelDescription.from_config("/nonexistent/config.json")
