"""Format choices, and the exported plan in each engine's syntax."""
import shlex

import pytest

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.search.choices import FP16, choice_bytes, choice_label, parse_choices
from wkvlab.search.export import layer_recipe, llamacpp_line, plan_kvspec, vllm_line


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


def test_vllm_exact_when_one_dtype_plus_skips():
    plan = (FP16, ("fp8_e4m3", "fp8_e4m3"), ("fp8_e4m3", "fp8_e4m3"), FP16)
    line = vllm_line(plan, "org/model")
    assert line.exact
    assert line.argv == ("vllm", "serve", "org/model", "--kv-cache-dtype", "fp8_e4m3", "--kv-cache-dtype-skip-layers", "0", "3")
    assert shlex.split(line.text()) == list(line.argv)


def test_vllm_mixed_plan_is_flagged_not_expressible():
    plan = (("int8", "int4"), ("int4", "int4"))
    line = vllm_line(plan, "m")
    assert not line.exact and "not expressible" in line.notes[0]
    assert line.argv[-2:] == ("--kv-cache-dtype", "int8_per_token_head")  # the most precise dtype the plan uses
    assert not vllm_line((("int2", "int2"),), "m").exact


def test_llamacpp_per_cache_types_only():
    uniform = llamacpp_line((("q8_0", "q4_0"),) * 3, "m.gguf")
    assert uniform.exact and uniform.argv == ("llama-server", "-m", "m.gguf", "-fa", "on", "-ctk", "q8_0", "-ctv", "q4_0")
    mixed = llamacpp_line((("q8_0", "q4_0"), ("q8_0", "q4_0"), FP16), "m.gguf")
    assert not mixed.exact and "not expressible in llama.cpp" in mixed.notes[0]
    assert mixed.argv[-4:] == ("-ctk", "q8_0", "-ctv", "q4_0")
    assert llamacpp_line((FP16,), "m.gguf").argv == ("llama-server", "-m", "m.gguf")


def test_recipe_layers_kvtuner_bits_and_modelopt_globs():
    recipe = layer_recipe((FP16, ("int8", "int4"), ("fp8_e4m3", "fp8_e4m3")), model="m", weights="int4-g128", keep_16bit=(0,))
    assert recipe["kvtuner"] == {"k_bits": [16, 8, 8], "v_bits": [16, 4, 8]}
    cfg = recipe["modelopt"]["quant_cfg"]
    assert cfg["*layers.0.*k_bmm_quantizer"] == {"enable": False}
    assert cfg["*layers.1.*v_bmm_quantizer"]["num_bits"] == 4
    assert cfg["*layers.2.*k_bmm_quantizer"]["num_bits"] == [4, 3]
    assert recipe["layers"][0]["weights_16bit"] is True
