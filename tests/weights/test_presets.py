"""The spec's string form, presets, JSON/YAML round trips and byte counts."""
import json

import pytest
import torch

from wkvlab.errors import ConfigError
from wkvlab.weights import PRESETS, WeightSpec, weight_storage_bytes
from wkvlab.weights.parse import split_weight_list

EXAMPLES = list(PRESETS) + ["gptq-int3-g64-sym+actorder+damp=0.05", "int4-g128+skip=0,1,5-7+skip-last=2+a=int8",
                            "nvfp4+override=mlp\\.down:int8", "int8+wscale=tensor+a=int8-tensor", "awq-int4-g32+noclip+grid=10",
                            "int4-g64+skip-re=self_attn+emb+head", "w8a8-int8+alpha=0.8+wo", "q4_0", "q8_0+skip=0", "q5_1"]


@pytest.mark.parametrize("text", EXAMPLES)
def test_round_trips_through_json_and_yaml(text, tmp_path):
    spec = WeightSpec.parse(text)
    assert WeightSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    path = tmp_path / "spec.yaml"
    path.write_text(spec.to_yaml())
    assert WeightSpec.parse(str(path)).with_label(spec.label) == spec


def test_presets_mean_what_the_docs_say():
    assert WeightSpec.parse("gptq-int4-g128").method == "gptq" and not WeightSpec.parse("gptq-int4-g128").symmetric
    sq = WeightSpec.parse("w8a8-int8")
    assert (sq.method, sq.bits, sq.symmetric, sq.activations, sq.alpha) == ("smoothquant", 8, True, "int8-token", 0.5)
    assert WeightSpec.parse("llm-int8").threshold == 6.0
    assert WeightSpec.parse("nvfp4-mlp").overrides == ((r"self_attn\.", "fp8"),)
    assert WeightSpec.parse("fp8+wo").activations == "none" == WeightSpec.parse("fp8-wo").activations
    assert WeightSpec.parse("int4-g128+skip=3,0-1").skip_layers == (0, 1, 3)
    assert WeightSpec.parse("gptq-int4-g128").needs_calibration and not WeightSpec.parse("fp8").needs_calibration
    assert WeightSpec.parse("nvfp4").needs_calibration and not WeightSpec.parse("nvfp4-wo").needs_calibration


@pytest.mark.parametrize("bad", ["gptq-fp8", "int4-g128+a=int4", "int4-g128+skip=x", "int4+foo", "nvfp4+a=mxfp4",
                                 "int4+override=x:int9", "int4+skip-re=(", "bf16+a=int8", "w8a8-int8+alpha=2",
                                 "int4+damp=abc", "missing.yaml", "q4_0+a=int8", "gptq-q4_0"])
def test_bad_specs_raise_config_errors(bad):
    with pytest.raises(ConfigError):
        WeightSpec.parse(bad)


def test_weight_list_split_keeps_layer_lists():
    assert split_weight_list("int8,int4-g128+skip=0,1,5-7,fp8") == ["int8", "int4-g128+skip=0,1,5-7", "fp8"]


def test_semicolon_is_an_alias_and_labels_use_plus():
    """';' (the old weight separator) reads the same; the label is written with '+' either way."""
    for old, new in [("int4-g128;skip=0,1", "int4-g128+skip=0,1"), ("gptq-int3-g64-sym;actorder;damp=0.05", "gptq-int3-g64-sym+actorder+damp=0.05")]:
        assert WeightSpec.parse(old) == WeightSpec.parse(new)
        assert WeightSpec.parse(old).label == new
    # a '+' inside an override regex is part of the regex unless an option name follows it
    spec = WeightSpec.parse(r"int4+override=layers\.\d+\.mlp:fp8+skip=3")
    assert spec.overrides == ((r"layers\.\d+\.mlp", "fp8"),) and spec.skip_layers == (3,)


@pytest.mark.parametrize("name,values,nbytes,symmetric", [("q8_0", 32, 34, True), ("q4_0", 32, 18, True), ("q4_1", 32, 20, False),
                                                           ("q5_0", 32, 22, True), ("q5_1", 32, 24, False)])
def test_llamacpp_block_weights(name, values, nbytes, symmetric):
    """GGUF block types as weight formats: blocks of 32 along the input, bytes from ggml-common.h."""
    from wkvlab.formats import fake_quant_ggml
    from wkvlab.weights import quantize_weight

    spec = WeightSpec.parse(name)
    assert (spec.method, spec.format, spec.group_size, spec.symmetric) == ("rtn", name, 32, symmetric)
    assert weight_storage_bytes((1536, 576), spec) == 1536 * 576 // values * nbytes
    torch.manual_seed(0)
    w = torch.randn(8, 64)
    assert torch.equal(quantize_weight(w, spec), fake_quant_ggml(w, name))


def test_fp4_and_per_tensor_quantize_weight():
    from wkvlab.weights import quantize_weight

    torch.manual_seed(0)
    w = torch.randn(8, 64)
    for text in ("nvfp4", "mxfp4", "int8;wscale=tensor", "fp8;wscale=tensor"):
        q = quantize_weight(w, WeightSpec.parse(text))
        assert q.shape == w.shape and 0 < (q - w).abs().max() < 1.0  # MXFP4 saturates up to 25% of a block max
