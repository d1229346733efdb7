import json

import pytest

from wkvlab.errors import ConfigError
from wkvlab.kv import KVSpec, get_kv_format


@pytest.mark.parametrize("text", ["fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2", "q8_0", "q4_0", "q8_0/q4_0", "int4-g32"])
def test_kv_spec_round_trips(text):
    spec = KVSpec.parse(text)
    assert KVSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert KVSpec.parse(spec.label) == spec


def test_aliases_normalize():
    assert KVSpec.parse("f16") == KVSpec.parse("fp16") == KVSpec()
    assert KVSpec.parse("fp8").k == "fp8_e4m3"
    assert KVSpec.parse("q8_0/q4_0").label == "q8_0/q4_0"


@pytest.mark.parametrize("bad", ["int9", "q3_k", "fp4", "q8_0/", "a/b/c", "int4-g0"])
def test_unknown_formats(bad):
    with pytest.raises(ConfigError):
        KVSpec.parse(bad)


def test_group_must_divide_head_dim():
    with pytest.raises(ConfigError, match="does not divide head_dim 64"):
        get_kv_format("int4-g48").check_head_dim(64)


def test_bytes_per_token_hand_computed():
    # SmolLM2: 30 layers, 3 KV heads, head_dim 64
    shape = dict(layers=30, kv_heads=3, head_dim=64)
    assert KVSpec.parse("fp16").bytes_per_token(**shape) == 2 * 30 * 3 * 64 * 2
    assert KVSpec.parse("q8_0").bytes_per_token(**shape) == 2 * 30 * 3 * 2 * 34
    assert KVSpec.parse("q4_0").bytes_per_token(**shape) == 2 * 30 * 3 * 2 * 18
    assert KVSpec.parse("int4").bytes_per_token(**shape) == 2 * 30 * 3 * (32 + 4)
    assert KVSpec.parse("q8_0/q4_0").bytes_per_token(**shape) == 30 * 3 * (68 + 36)
