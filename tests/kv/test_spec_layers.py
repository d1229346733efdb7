"""The KV grammar's per-layer option, shorthands and aliases: every spec reads back from its own text."""
from __future__ import annotations

import pytest

from wkvlab.errors import ConfigError
from wkvlab.kv.presets import preset_names
from wkvlab.kv.spec import KVSpec, split_kv_list


def test_per_layer_option_is_the_string_form_of_layers():
    spec = KVSpec.parse("int4+0-3,76-79=int8+5=q8_0/q4_0")
    assert spec.layers[:4] == ((0, "int8", "int8"), (1, "int8", "int8"), (2, "int8", "int8"), (3, "int8", "int8"))
    assert (5, "q8_0", "q4_0") in spec.layers and (76, "int8", "int8") in spec.layers
    assert spec.canonical() == "int4+0-3,76-79=int8+5=q8_0/q4_0"
    assert KVSpec.parse("int4+0-3=int8+2=int2").formats_for(2)[0].name == "int2"  # a later entry replaces an earlier one
    file_form = KVSpec.from_dict({"k": "int4", "v": "int4", "layers": {"0": "int8", "1": "int8", "5": "q8_0/q4_0"}})
    assert KVSpec.parse(file_form.canonical()) == file_form


@pytest.mark.parametrize("text", ["int4", "q8_0/q4_0+rot+sinks=4", "int4+skip=0,29,sliding_window", "int4+0-3,76-79=int8+skip=0",
                                  "int2-g32+residual=64+q=q8_0", "fp8_e4m3+scales=tensor+5,7=fp16"])
def test_canonical_reads_back(text):
    spec = KVSpec.parse(text)
    assert KVSpec.parse(spec.canonical()) == spec


@pytest.mark.parametrize("name", [p for p in preset_names() if "<" not in p])
def test_every_preset_reads_back_from_its_canonical_form(name):
    from dataclasses import replace

    spec = KVSpec.parse(name)
    assert replace(KVSpec.parse(spec.canonical()), name="") == replace(spec, name="")


def test_shorthands_and_aliases():
    assert (KVSpec.parse("K8V4").k, KVSpec.parse("K8V4").v) == ("int8", "int4")
    assert KVSpec.parse("kv2") == KVSpec(k="int2", v="int2") and KVSpec.parse("KV16") == KVSpec()
    assert KVSpec.parse("bf16") == KVSpec.parse("auto") == KVSpec.parse("fp16") == KVSpec()
    assert KVSpec.parse("int4;skip=0;sinks=4") == KVSpec.parse("int4+skip=0+sinks=4")  # ';' is an alias of '+'
    with pytest.raises(ConfigError):
        KVSpec.parse("K3V4")


def test_layer_bytes_add_up_to_bytes_per_token():
    spec = KVSpec.parse("int4+0-1=int8+skip=3+sinks=4")
    total = sum(spec.layer_bytes_per_token(i, head_dim=64, context=1024) for i in range(4))
    assert spec.bytes_per_token(layers=4, kv_heads=3, head_dim=64, context=1024) == pytest.approx(3 * total)
    assert spec.layer_bytes_per_token(0, head_dim=64) == 2 * (64 + 2)  # int8 rows, fp16 scale


@pytest.mark.parametrize("bad", ["int4+0-3", "int4+3-1=int8", "int4+a-b=int8", "int4+0=int9"])
def test_bad_layer_options(bad):
    with pytest.raises(ConfigError):
        KVSpec.parse(bad)


def test_lists_keep_layer_lists():
    assert split_kv_list("int4+0-3,76-79=int8,q8_0") == ["int4+0-3,76-79=int8", "q8_0"]
    assert split_kv_list("int4+skip=0,1,sliding_window,K8V4") == ["int4+skip=0,1,sliding_window", "K8V4"]
