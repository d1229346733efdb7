"""Format choices, and the exported plan in each engine's syntax."""
import pytest

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.search.choices import FP16, choice_bytes, choice_label, parse_choices
from wkvlab.search.export import engine_exports, layer_recipe, plan_kvspec


def test_parse_choices():
    assert parse_choices("K8V4,q8_0/q4_0") == (FP16, ("int8", "int4"), ("q8_0", "q4_0"))
    assert [choice_label(c) for c in parse_choices(None)] == ["fp16", "K8V8", "K8V4", "K4V4", "K4V2", "K2V2"]
    assert parse_choices("vllm-fp8") == (FP16, ("fp8_e4m3", "fp8_e4m3"))
    with pytest.raises(ConfigError, match="--formats"):
        parse_choices("K9V9")
    with pytest.raises(ConfigError, match="per-vector"):
        parse_choices("int2-c32")
    with pytest.raises(ConfigError, match="at least one quantized"):
        parse_choices("fp16")
    with pytest.raises(ConfigError, match="carries options"):
        parse_choices("llamacpp:q4_0")
    assert parse_choices("KV4,bf16") == (FP16, ("int4", "int4"))  # the --kv grammar: shorthands and aliases


def test_choice_bytes_match_the_kv_spec():
    spec = KVSpec(k="int8", v="int4")
    per_layer = choice_bytes(("int8", "int4"), kv_heads=3, head_dim=64)
    assert per_layer == 3 * ((64 + 2) + (32 + 4))
    assert spec.bytes_per_token(layers=5, kv_heads=3, head_dim=64) == 5 * per_layer


def test_plan_spec_file_round_trips_through_eval_syntax(tmp_path):
    import yaml

    plan = (FP16, ("int8", "int4"), ("int8", "int4"), ("int4", "int4"))
    spec = plan_kvspec(plan)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict()))
    loaded = KVSpec.parse(f"@{path}")
    assert [tuple(f.name for f in loaded.formats_for(i)) for i in range(4)] == list(plan)


def _exports(plan, weights="bf16", gpu="H100"):
    from wkvlab.plan.models import ModelDescription
    from wkvlab.plan.source import ModelSource
    from wkvlab.weights.spec import WeightSpec

    desc = ModelDescription.from_config({"model_type": "llama", "num_hidden_layers": len(plan), "hidden_size": 512, "num_attention_heads": 4,
                                         "num_key_value_heads": 4, "intermediate_size": 1024, "vocab_size": 256})
    return engine_exports(desc, ModelSource("org/model", "builtin", hub_id="org/model"), WeightSpec.parse(weights), plan_kvspec(plan),
                          gpu=gpu, batch=1, context=4096)


def test_vllm_exact_when_one_dtype_plus_skips():
    line = _exports((FP16, ("fp8_e4m3", "fp8_e4m3"), ("fp8_e4m3", "fp8_e4m3"), FP16))["vllm"]
    assert line["exact"] and line["kv_args"] == ["--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype-skip-layers", "0", "3"]
    assert line["argv"][:3] == ["vllm", "serve", "org/model"] and "--kv-cache-dtype-skip-layers" in line["command"]


def test_vllm_mixed_plan_is_flagged_not_expressible():
    line = _exports((("int8", "int4"), ("int4", "int4")))["vllm"]
    assert not line["exact"] and any("cannot run this per-layer plan exactly" in n for n in line["notes"])
    assert line["kv_args"] == ["--kv-cache-dtype", "int8_per_token_head"]  # the most precise dtype the plan uses
    assert _exports((("int2", "int2"),) * 2)["vllm"]["command"] is None  # vLLM has no 2-bit cache


def test_llamacpp_per_cache_types_only():
    uniform = _exports((("q8_0", "q4_0"),) * 3, weights="q4_0")["llama.cpp"]
    assert uniform["exact"] and uniform["kv_args"] == ["-ctk", "q8_0", "-ctv", "q4_0"]
    assert uniform["env"] == ["LLAMA_ATTN_ROT_DISABLE=1"]  # the plan was measured without llama.cpp's rotation
    mixed = _exports((("q8_0", "q4_0"), ("q8_0", "q4_0"), FP16), weights="q4_0")["llama.cpp"]
    assert not mixed["exact"] and "not expressible in llama.cpp" in mixed["notes"][0]
    assert mixed["kv_args"] == ["-ctk", "q8_0", "-ctv", "q4_0"]
    assert _exports((FP16, FP16), weights="q4_0")["llama.cpp"]["kv_args"] == []


def test_recipe_layers_kvtuner_bits_and_modelopt_globs():
    recipe = layer_recipe((FP16, ("int8", "int4"), ("fp8_e4m3", "fp8_e4m3")), model="m", weights="int4-g128", keep_16bit=(0,))
    assert recipe["kvtuner"] == {"k_bits": [16, 8, 8], "v_bits": [16, 4, 8]}
    cfg = recipe["modelopt"]["quant_cfg"]
    assert cfg["*layers.0.*k_bmm_quantizer"] == {"enable": False}
    assert cfg["*layers.1.*v_bmm_quantizer"]["num_bits"] == 4
    assert cfg["*layers.2.*k_bmm_quantizer"]["num_bits"] == [4, 3]
    assert recipe["layers"][0]["weights_16bit"] is True
