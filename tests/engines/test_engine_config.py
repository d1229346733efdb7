"""llama.cpp cache names and the flash-attention rule (no llama-cpp-python needed)."""
import pytest

from wkvlab.engines.compare import sim_preset
from wkvlab.engines.llamacpp import flash_attention_on, parse_cache_types
from wkvlab.errors import ConfigError


def test_cache_type_names_and_flash_attention_rule():
    assert parse_cache_types("q8_0/q4_0") == ("q8_0", "q4_0")
    assert parse_cache_types("q4_0") == ("q4_0", "q4_0")
    assert parse_cache_types("fp16") == ("f16", "f16")
    assert parse_cache_types("f16") == parse_cache_types("llamacpp:f16") == ("f16", "f16")  # the --kv grammar of wkvlab eval
    assert parse_cache_types("llamacpp:q8_0/q4_0") == ("q8_0", "q4_0")
    with pytest.raises(ConfigError, match="unknown KV format 'q3_0'"):
        parse_cache_types("q3_0")
    with pytest.raises(ConfigError, match="no KV cache type 'int8'"):
        parse_cache_types("int8")  # a wkvlab format llama.cpp has no type for
    with pytest.raises(ConfigError, match="only in wkvlab's simulation"):
        parse_cache_types("q4_0+sinks=4")
    assert flash_attention_on("auto", "q4_0") and not flash_attention_on("auto", "f16")
    with pytest.raises(ConfigError, match="needs flash attention"):
        flash_attention_on("off", "q4_0")
    assert flash_attention_on("on", "f16")


def test_simulated_preset_for_each_engine_setting():
    assert sim_preset("q4_0").canonical() == sim_preset("q4_0/q4_0").canonical()
    assert sim_preset("q8_0/q4_0").rotate == -2 and sim_preset("q8_0/q4_0").q == "q8_0"
    assert sim_preset("q4_0", rotation=False).rotate == 0
