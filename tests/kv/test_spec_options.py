"""KV spec: options, presets, files, per-layer maps, memory accounting."""
import pytest

from wkvlab.errors import ConfigError
from wkvlab.kv import KVSpec
from wkvlab.kv.presets import preset_names
from wkvlab.kv.spec import split_kv_list

SMOL = dict(layers=30, kv_heads=3, head_dim=64)


@pytest.mark.parametrize("text", [
    "int4+sinks=4", "q4_0+rot", "q4_0+rot=32", "int4+rot=full", "int4+residual=128", "int4+window=64", "kivi4", "int2-c32/int2+residual=64", "int4+skip=0,1,29",
    "int4+skip=sliding_window", "q4_0+q=q8_0", "q8_0/q4_0+rot+sinks=1",
])
def test_options_round_trip_through_text_and_json(text):
    spec = KVSpec.parse(text)
    assert KVSpec.parse(spec.label) == spec
    assert KVSpec.from_dict(spec.to_dict()) == spec


def test_option_values():
    spec = KVSpec.parse("int4+sinks=4+residual=128+skip=0-2,29+rot=32+q=fp8_e4m3")
    assert (spec.sinks, spec.residual, spec.skip, spec.rotate, spec.q) == (4, 128, (0, 1, 2, 29), 32, "fp8_e4m3")
    assert KVSpec.parse("int4+rot").rotate == -2 and KVSpec.parse("int4+rot=full").rotate == -1


@pytest.mark.parametrize("bad", ["int4+sinks=x", "int4+foo", "int4+rot=0", "int4+rot=48", "int4+q=int4", "llamacpp:q3_k", "vllm:int3", "exl3:k9v4"])
def test_bad_options_and_presets(bad):
    with pytest.raises(ConfigError):
        KVSpec.parse(bad)


def test_llamacpp_preset_rotates_and_converts_q():
    spec = KVSpec.parse("llamacpp:q4_0")
    assert (spec.k, spec.v, spec.rotate, spec.q, spec.label) == ("q4_0", "q4_0", -2, "q8_0", "llamacpp:q4_0")
    # llama.cpp: K in the largest power of two >= 64 dividing head_dim, V in 64, none below 64
    assert spec.rotation_blocks(64) == (64, 64) and spec.rotation_blocks(128) == (128, 64)
    assert spec.rotation_blocks(256) == (256, 64) and spec.rotation_blocks(192) == (64, 64) and spec.rotation_blocks(32) == (0, 0)
    norot = KVSpec.parse("llamacpp:q4_0+norot")
    assert norot.rotate == 0 and norot.label == "llamacpp:q4_0+norot"
    mixed = KVSpec.parse("llamacpp:q8_0/q4_0")
    assert (mixed.k, mixed.v) == ("q8_0", "q4_0")
    f16 = KVSpec.parse("llamacpp:f16")
    assert f16.is_identity and f16.rotate == 0


def test_every_listed_preset_parses():
    for name in preset_names():
        if "<" not in name:
            KVSpec.parse(name)
    assert KVSpec.parse("exl3:k4v2").v == "exl3_2"
    assert KVSpec.parse("vllm:int8_per_token_head").k == "int8_pth"


def test_split_keeps_skip_lists():
    assert split_kv_list("fp16,int4+skip=0,1,29,q4_0") == ["fp16", "int4+skip=0,1,29", "q4_0"]
    assert split_kv_list("int4+skip=0,sliding_window,q8_0/q4_0") == ["int4+skip=0,sliding_window", "q8_0/q4_0"]


def test_spec_files_yaml_and_json(tmp_path):
    spec = KVSpec(k="int4", v="int4", sinks=2, skip=(0,), layers=((29, "q8_0", "q8_0"), (1, "int8", "int4")))
    for name in ("plan.yaml", "plan.json"):
        spec.save(tmp_path / name)
        assert KVSpec.parse(f"@{tmp_path / name}") == spec
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        KVSpec.parse(f"@{tmp_path / 'bad.yaml'}")
    with pytest.raises(ConfigError, match="not found"):
        KVSpec.parse("@/no/such/plan.yaml")


def test_per_layer_formats_and_skips():
    spec = KVSpec(k="int4", v="int4", skip=(0, "sliding_window"), layers=((2, "q8_0", "q4_0"),))
    assert spec.formats_for(0)[0].name == "fp16"
    assert spec.formats_for(1, sliding=True)[1].name == "fp16"
    assert [f.name for f in spec.formats_for(2)] == ["q8_0", "q4_0"]
    assert spec.formats_for(3)[0].name == "int4"


def test_bytes_with_skips_sinks_and_residual():
    base = KVSpec.parse("q4_0").bytes_per_token(**SMOL)
    assert base == 30 * 3 * 2 * 2 * 18
    skipped = KVSpec.parse("q4_0+skip=0,29").bytes_per_token(**SMOL)
    assert skipped == 28 * 3 * 2 * 2 * 18 + 2 * 3 * 2 * 128
    # 4 sinks + residual 128 at 16 bits amortized over 1024 tokens
    held = 132 / 1024
    per_head = held * 256 + (1 - held) * 72
    assert KVSpec.parse("q4_0+sinks=4+residual=128").bytes_per_token(**SMOL, context=1024) == pytest.approx(30 * 3 * per_head)
    assert KVSpec.parse("q4_0+sinks=4").bytes_per_token(**SMOL) == base  # long-context limit
    assert KVSpec.parse("vllm:int8_per_token_head").bytes_per_token(**SMOL) == 30 * 3 * 2 * (64 + 4)


def test_model_checks():
    with pytest.raises(ConfigError, match="layer 30 does not exist"):
        KVSpec.parse("int4+skip=30").check_model(64, 30)
    with pytest.raises(ConfigError, match="rotation block"):
        KVSpec.parse("int4+rot=128").check_model(64, 30)


def test_sglang_fp4_hand_values():
    import torch

    from wkvlab.kv import get_kv_format

    fmt = get_kv_format("fp4_e2m1")
    # SGLang (kvfp4_tensor.py @0dae407b): magnitude = sum(|x|/scale >= E2M1_BOUNDS), so a tie goes UP.
    # block amax 12 -> scale 2^ceil(log2(12/6)) = 2; 12/2 = 6, 1.1/2 = 0.55 -> 0.5, -0.5/2 = -0.25 (tie) -> -0.5 -> -1
    x = torch.tensor([12.0, 1.1, -0.5, 3.0] + [0.0] * 12)
    out = fmt.quantize(x[None])[0]
    assert out[:4].tolist() == [12.0, 1.0, -1.0, 3.0]
    # every midpoint at scale 1 (amax 6): each tie takes the upper E2M1 value
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 0.2499, 4.99] + [0.0] * 4)
    assert fmt.quantize(ties[None])[0, :12].tolist() == [6.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -6.0, 0.0, 4.0]
    assert fmt.bytes_per_vector(64) == 32 + 4
    assert KVSpec.parse("hf-quanto:int4").residual == 128


def test_semicolon_separates_options_like_weight_configs():
    assert KVSpec.parse("int4;sinks=4;skip=0,1") == KVSpec.parse("int4+sinks=4+skip=0,1")
    assert split_kv_list("int4;skip=0,1,q4_0") == ["int4;skip=0,1", "q4_0"]
