"""The spec's string form, presets, JSON/YAML round trips and byte counts shared with the planner."""
import json

import pytest
import torch

from wkvlab.errors import ConfigError
from wkvlab.plan.weights import matrix_bytes, weight_format
from wkvlab.weights import PRESETS, WeightSpec, weight_storage_bytes
from wkvlab.weights.parse import split_weight_list

EXAMPLES = list(PRESETS) + ["gptq-int3-g64-sym;actorder;damp=0.05", "int4-g128;skip=0,1,5-7;skip-last=2;a=int8",
                            "nvfp4;override=mlp\\.down:int8", "int8;wscale=tensor;a=int8-tensor", "awq-int4-g32;noclip;grid=10",
                            "int4-g64;skip-re=self_attn;emb;head", "w8a8-int8;alpha=0.8;wo"]


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
    assert WeightSpec.parse("fp8;wo").activations == "none" == WeightSpec.parse("fp8-wo").activations
    assert WeightSpec.parse("int4-g128;skip=3,0-1").skip_layers == (0, 1, 3)
    assert WeightSpec.parse("gptq-int4-g128").needs_calibration and not WeightSpec.parse("fp8").needs_calibration
    assert WeightSpec.parse("nvfp4").needs_calibration and not WeightSpec.parse("nvfp4-wo").needs_calibration


@pytest.mark.parametrize("bad", ["gptq-fp8", "int4-g128;a=int4", "int4-g128;skip=x", "int4;foo", "nvfp4;a=mxfp4",
                                 "int4;override=x:int9", "int4;skip-re=(", "bf16;a=int8", "w8a8-int8;alpha=2",
                                 "int4;damp=abc", "missing.yaml"])
def test_bad_specs_raise_config_errors(bad):
    with pytest.raises(ConfigError):
        WeightSpec.parse(bad)


def test_weight_list_split_keeps_layer_lists():
    assert split_weight_list("int8,int4-g128;skip=0,1,5-7,fp8") == ["int8", "int4-g128;skip=0,1,5-7", "fp8"]


@pytest.mark.parametrize("name", ["gptq-int4-g128", "awq-int4-g128", "w8a8-int8", "llm-int8", "fp8", "fp8-wo", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("shape", [(1536, 576), (640, 2048), (4096, 4096)])
def test_bytes_agree_with_the_planner(name, shape):
    out, inp = shape
    assert sum(matrix_bytes(weight_format(name), inp, out)) == weight_storage_bytes(shape, WeightSpec.parse(name))


def test_fp4_and_per_tensor_quantize_weight():
    from wkvlab.weights import quantize_weight

    torch.manual_seed(0)
    w = torch.randn(8, 64)
    for text in ("nvfp4", "mxfp4", "int8;wscale=tensor", "fp8;wscale=tensor"):
        q = quantize_weight(w, WeightSpec.parse(text))
        assert q.shape == w.shape and 0 < (q - w).abs().max() < 1.0  # MXFP4 saturates up to 25% of a block max
