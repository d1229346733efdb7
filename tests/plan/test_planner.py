"""plan(): the 70B / A100 / batch 16 / 8k scenario, grids in the one spec language, JSON round-trip, bad input."""
from __future__ import annotations

import json

import pytest

from wkvlab.errors import ConfigError, DataError
from wkvlab.plan import PlanResult, plan


@pytest.fixture(scope="module")
def seed_plan():
    return plan("Llama-3-70B", "A100-80GB", 16, 8192)


def test_which_combinations_fit_the_seed_scenario(seed_plan):
    fitting = {(r.weights, r.kv) for r in seed_plan.rows if r.fits}
    assert ("int4-g128", "fp8_e5m2") in fitting and ("int4-g128", "int8") in fitting
    assert ("int4-g128", "int4") in fitting and ("q4_0", "llamacpp:q8_0") in fitting
    assert ("int4-g128", "bf16") not in fitting  # 40 GiB of bf16 KV does not fit next to W4
    assert not any(w in ("bf16", "fp8", "w8a8-int8") for w, _ in fitting)
    assert [r.rank for r in seed_plan.rows if r.rank] == list(range(1, len(fitting) + 1))
    kv_row = next(r for r in seed_plan.rows if (r.weights, r.kv) == ("int4-g128", "bf16"))
    assert kv_row.kv_bytes.total_bytes * 16 * 8192 == 40 * 2**30


def test_recommendation_and_launch_lines(seed_plan):
    best = next(r for r in seed_plan.rows if r.rank == 1)
    assert best.weights == "int4-g128" and best.kv_min_bits >= 8  # lower weights first, KV >= 8 bit
    recs = {r.engine: r for r in seed_plan.recommendations}
    assert set(recs) == {"vllm", "sglang", "llama.cpp"}
    vllm = recs["vllm"].command
    assert vllm.argv[:3] == ("vllm", "serve", "meta-llama/Meta-Llama-3-70B")  # the model the user named, not a made-up path
    assert not vllm.ready and any("--model-id" in n for n in vllm.notes)  # AWQ weights need an AWQ checkpoint
    assert "fp8_e4m3" not in vllm.argv  # not on sm_80
    llama = recs["llama.cpp"].command
    assert llama.argv[llama.argv.index("-c") + 1] == str(16 * 8192) and llama.argv[llama.argv.index("-np") + 1] == "16"
    assert [p.split()[0] for p in llama.prepare] == ["huggingface-cli", "python", "llama-quantize"]
    assert llama.argv[2] == "./Meta-Llama-3-70B-Q4_0.gguf" and llama.prepare[-1].endswith("./Meta-Llama-3-70B-Q4_0.gguf Q4_0")


def test_json_round_trip(seed_plan):
    again = PlanResult.from_dict(json.loads(json.dumps(seed_plan.to_dict())))
    assert again == seed_plan


def test_config_paths_and_grids_in_the_eval_grammar(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
           "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
           "max_position_embeddings": 8192, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    result = plan(str(tmp_path / "config.json"), "L4", 8, 4096, weights=["bf16", "int4-g128+skip=0"],
                  kv=["q8_0/q4_0+rot", "int8"], engine="llama.cpp")
    assert {(r.weights, r.kv) for r in result.rows} == {
        ("bf16", "q8_0/q4_0+rot"), ("bf16", "int8"), ("int4-g128+skip=0", "q8_0/q4_0+rot"), ("int4-g128+skip=0", "int8")}
    assert [r.engine for r in result.rows if (r.weights, r.kv) == ("bf16", "int8")] == ["none"]
    # a config.json without weights next to it: shapes only, the engines' lines ask for --model-id
    rec = plan(str(tmp_path / "config.json"), "L4", 8, 4096, weights=["bf16"], kv=["bf16"], engine="vllm").recommendations[0]
    assert rec.command.argv[2] == "<checkpoint>" and not rec.command.ready


def test_packaged_default_is_described_from_its_gguf():
    result = plan("default", "RTX-4090", 8, 8192, engine="llama.cpp", weights=["bf16", "q4_0"], kv=["llamacpp:q8_0"])
    assert result.model.num_layers == 30 and result.model.num_kv_heads == 3 and result.model.head_dim == 64
    assert result.source.kind == "packaged" and result.source.gguf.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    cmd = result.recommendations[0].command
    assert cmd.prepare == () or cmd.prepare[0].startswith(("llama-quantize", "python convert_hf_to_gguf.py", "huggingface-cli"))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(batch=0), ConfigError, "at least 1"),
    (dict(ctx=10**6), ConfigError, "max_position_embeddings"),
    (dict(model="NoSuchModel"), ConfigError, "unknown model"),
    (dict(gpu="V100"), ConfigError, "unknown GPU"),
    (dict(engine="ollama"), ConfigError, "unknown engine"),
    (dict(weights=["int9"]), ConfigError, "unknown weight config"),
    (dict(kv=["fp5"]), ConfigError, "unknown KV format"),
    (dict(gpus=0), ConfigError, "--gpus"),
])
def test_bad_inputs_raise_one_line_errors(kwargs, error, match):
    args = dict(model="Llama-3-70B", gpu="A100-80GB", batch=16, ctx=8192) | kwargs
    with pytest.raises(error, match=match) as info:
        plan(**args)
    assert "\n" not in str(info.value)


def test_nothing_fits_is_a_warning_not_an_error():
    result = plan("Llama-3.1-405B", "RTX-4090", 1, 1024)
    assert not result.recommendations and result.warnings and "--gpus" in result.warnings[0]


def test_one_axis_given_pairs_with_the_right_engines_defaults():
    only_w = plan("Llama-3-8B", "H100", 4, 4096, weights=["q4_0", "fp8"])
    assert {k for w, k in ((r.weights, r.kv) for r in only_w.rows) if w == "q4_0"} == {"bf16", "llamacpp:q8_0", "llamacpp:q4_0"}
    assert {k for w, k in ((r.weights, r.kv) for r in only_w.rows) if w == "fp8"} == {"bf16", "fp8_e4m3", "int8", "int4"}
    only_kv = plan("Llama-3-8B", "H100", 4, 4096, kv=["llamacpp:q8_0"])
    assert {r.weights for r in only_kv.rows} == {"q8_0", "q4_0"} and all(r.engine == "llama.cpp" for r in only_kv.rows)


def test_trtllm_is_evaluated_without_launch_lines():
    result = plan("Llama-3-8B", "H100", 4, 4096, engine="trtllm")
    assert any(r.fits for r in result.rows) and not result.recommendations and not result.warnings


def test_bad_results_file_is_one_line(tmp_path):
    from wkvlab.plan.measured import load_results

    bad = tmp_path / "r.json"
    bad.write_text('{"model": "x"}')
    with pytest.raises(DataError, match="not a wkvlab result"):
        load_results(bad)
