import json

import pytest
import torch

from wkvlab.errors import ConfigError
from wkvlab.weights import WeightSpec, quantize_weight, weight_storage_bytes


@pytest.mark.parametrize("text", ["none", "bf16", "fp16", "int8", "int4-g128", "int4-g32-fmin", "int3-g64-sym", "fp8", "fp8-wo",
                                  "gptq-int4-g128+grid-from=original+actorder"])
def test_weight_spec_round_trips_through_json(text):
    spec = WeightSpec.parse(text)
    assert WeightSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_weight_spec_defaults():
    assert WeightSpec.parse("int8").symmetric and WeightSpec.parse("int8").group_size is None
    w4 = WeightSpec.parse("int4-g128")
    assert (w4.bits, w4.group_size, w4.symmetric, w4.zero_point) == (4, 128, False, "int")
    assert WeightSpec.parse("fp8").activations == "fp8-token" and WeightSpec.parse("fp8-wo").activations == "none"


@pytest.mark.parametrize("bad", ["int9", "int4-g0", "int4-gx", "int4-sym-asym", "int4-sym-fmin", "q4_k", ""])
def test_bad_weight_specs_say_what_to_use(bad):
    with pytest.raises(ConfigError):
        WeightSpec.parse(bad)


def test_gptq_grid_rule_is_an_option_of_gptq_only():
    assert WeightSpec.parse("gptq-int4-g128").grid_from == "updated"
    spec = WeightSpec.parse("gptq-int4-g128+grid-from=original")
    assert spec.grid_from == "original" and spec.label == "gptq-int4-g128+grid-from=original"
    assert WeightSpec.parse("awq-int4-g128+grid=10").grid == 10  # AWQ's grid= is another option
    with pytest.raises(ConfigError, match="grid-from chooses how GPTQ finds its group grids; awq has no such choice"):
        WeightSpec.parse("awq-int4-g128+grid-from=original")
    with pytest.raises(ConfigError, match="grid-from=original|updated"):
        WeightSpec.parse("gptq-int4-g128+grid-from=static")


def test_ragged_last_group_matches_two_separate_quantizations():
    torch.manual_seed(0)
    w = torch.randn(8, 576)
    spec = WeightSpec.parse("int4-g128")
    q = quantize_weight(w, spec)
    head = quantize_weight(w[:, :512], spec)
    tail = quantize_weight(w[:, 512:], WeightSpec.parse("int4"))
    assert torch.equal(q, torch.cat([head, tail], 1))


def test_storage_bytes_hand_computed():
    # 4-bit, group 128, asymmetric int zero point: 0.5 B/weight + (2 B scale + 0.5 B zero) per group
    assert weight_storage_bytes((10, 256), WeightSpec.parse("int4-g128")) == 10 * 256 * 0.5 + 10 * 2 * 2.5
    assert weight_storage_bytes((10, 256), WeightSpec.parse("int8")) == 10 * 256 + 10 * 2
    assert weight_storage_bytes((10, 256), WeightSpec.parse("bf16")) == 10 * 256 * 2
