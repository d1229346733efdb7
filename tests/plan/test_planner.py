"""plan(): the 70B / A100 / batch 16 / 8k scenario, JSON round-trip, bad input."""
from __future__ import annotations

import json

import pytest

from wkvlab.errors import ConfigError
from wkvlab.plan import PlanResult, plan


@pytest.fixture(scope="module")
def seed_plan():
    return plan("Llama-3-70B", "A100-80GB", 16, 8192)


def test_which_combinations_fit_the_seed_scenario(seed_plan):
    fitting = {(r.weights, r.kv) for r in seed_plan.rows if r.fits}
    assert ("int4-g128", "fp8_e5m2") in fitting and ("int4-g128", "int8") in fitting
    assert ("int4-g128", "int4") in fitting and ("q4_0", "q8_0") in fitting
    assert ("int4-g128", "bf16") not in fitting  # 40 GiB of bf16 KV does not fit next to W4
    assert not any(w in ("bf16", "fp8", "w8a8-int8") for w, _ in fitting)
    ranks = [r.rank for r in seed_plan.rows if r.rank]
    assert ranks == list(range(1, len(fitting) + 1))
    kv_row = next(r for r in seed_plan.rows if (r.weights, r.kv) == ("int4-g128", "bf16"))
    assert kv_row.kv_bytes.total_bytes * 16 * 8192 == 40 * 2**30


def test_recommendation_follows_the_seed_rules(seed_plan):
    best = next(r for r in seed_plan.rows if r.rank == 1)
    assert best.weights == "int4-g128" and parse_bits(best.kv) >= 8  # lower weights first, KV >= 8 bit
    recs = {r.engine: r for r in seed_plan.recommendations}
    assert set(recs) == {"vllm", "sglang", "llama.cpp"}
    vllm = recs["vllm"].command.argv
    assert vllm[:3] == ("vllm", "serve", "./Meta-Llama-3-70B-int4-g128")
    assert "--quantization" in vllm and "--max-model-len" in vllm and "--max-num-seqs" in vllm
    assert "fp8_e4m3" not in vllm  # not on sm_80
    llama = recs["llama.cpp"].command.argv
    assert llama[llama.index("-c") + 1] == str(16 * 8192) and llama[llama.index("-np") + 1] == "16"


def parse_bits(kv: str) -> int:
    from wkvlab.plan import parse_kv
    return parse_kv(kv).min_bits()


def test_json_round_trip(seed_plan):
    data = json.loads(json.dumps(seed_plan.to_dict()))
    again = PlanResult.from_dict(data)
    assert again == seed_plan
    assert again.rows[0].weight_bytes.total_bytes == seed_plan.rows[0].weight_bytes.total_bytes


def test_plan_accepts_config_paths_and_explicit_grids(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
           "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152,
           "max_position_embeddings": 8192, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    result = plan(str(tmp_path / "config.json"), "L4", 8, 4096, weights=["bf16", "int4-g128;skip=0"],
                  kv=["k=q8_0,v=q4_0", "int8"], engine="llama.cpp")
    assert {(r.weights, r.kv) for r in result.rows} == {
        ("bf16", "q8_0/q4_0"), ("bf16", "int8"), ("int4-g128;skip=0", "q8_0/q4_0"),
        ("int4-g128;skip=0", "int8")}
    assert [r.engine for r in result.rows if (r.weights, r.kv) == ("bf16", "int8")] == ["none"]


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch=0), "at least 1"),
    (dict(ctx=10**6), "max_position_embeddings"),
    (dict(model="NoSuchModel"), "unknown model"),
    (dict(gpu="V100"), "unknown GPU"),
    (dict(engine="ollama"), "unknown engine"),
    (dict(weights=["int9"]), "unknown weight format"),
    (dict(kv=["fp4"]), "unknown KV format"),
])
def test_bad_inputs_raise_config_error(kwargs, match):
    args = dict(model="Llama-3-70B", gpu="A100-80GB", batch=16, ctx=8192) | kwargs
    with pytest.raises(ConfigError, match=match):
        plan(**args)


def test_nothing_fits_is_a_warning_not_an_error():
    result = plan("Llama-3.1-405B", "RTX-4090", 1, 1024)
    assert not result.recommendations and result.warnings


def test_one_axis_given_pairs_with_the_right_engines_defaults():
    only_w = plan("Llama-3-8B", "H100", 4, 4096, weights=["q4_0", "fp8"])
    assert {k for w, k in ((r.weights, r.kv) for r in only_w.rows) if w == "q4_0"} == {"bf16", "q8_0", "q4_0"}
    assert {k for w, k in ((r.weights, r.kv) for r in only_w.rows) if w == "fp8"} == {
        "bf16", "fp8_e4m3", "int8", "int4"}
    only_kv = plan("Llama-3-8B", "H100", 4, 4096, kv=["q8_0"])
    assert {r.weights for r in only_kv.rows} == {"q8_0", "q4_0"}
    assert all(r.engine == "llama.cpp" for r in only_kv.rows)


def test_trtllm_is_evaluated_without_launch_lines():
    result = plan("Llama-3-8B", "H100", 4, 4096, engine="trtllm")
    assert any(r.fits for r in result.rows) and not result.recommendations and not result.warnings
