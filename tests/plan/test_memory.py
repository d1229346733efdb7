"""Engine allocation rules and the max-batch / max-context inversions."""
from __future__ import annotations

import pytest

from wkvlab.plan import EngineSettings, ModelDescription, find_gpu, fit, kv_bytes_per_token, memory_budget
from wkvlab.plan.memory import kv_needed_bytes

GIB = 2**30


@pytest.fixture(scope="module")
def setup():
    m = ModelDescription.from_name("Llama-3-70B")
    return m, find_gpu("A100-80GB")


def test_vllm_budget(setup):
    m, gpu = setup
    b = memory_budget("vllm", m, gpu, weights_bytes=40 * 10**9)
    assert b.usable_bytes == int(0.90 * 80 * GIB)
    assert b.kv_pool_bytes == b.usable_bytes - 40 * 10**9 - b.reserve_bytes
    assert b.block_size == 16 and "gpu_memory_utilization" in b.rule


def test_sglang_budget_excludes_activations(setup):
    m, gpu = setup
    b = memory_budget("sglang", m, gpu, weights_bytes=40 * 10**9, settings=EngineSettings(sglang_mem_fraction_static=0.8))
    assert b.kv_pool_bytes == int(0.8 * 80 * GIB) - 40 * 10**9 and b.block_size == 1


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "trtllm", None])
@pytest.mark.parametrize("kv", ["bf16", "fp8_e5m2", "int4", "q8_0/q4_0"])
def test_max_batch_and_max_ctx_are_exact_inversions(setup, engine, kv):
    m, gpu = setup
    per_token = kv_bytes_per_token(m, kv)
    budget = memory_budget(engine, m, gpu, weights_bytes=39_767_785_472)
    r = fit(budget, per_token, m, batch=16, ctx=8192)
    pool = budget.kv_pool_bytes
    need = lambda b, t: kv_needed_bytes(budget, per_token, b, t)  # noqa: E731
    assert r.max_batch >= 1
    assert need(r.max_batch, 8192) <= pool < need(r.max_batch + 1, 8192)
    assert r.fits == (r.max_batch >= 16)
    if r.max_ctx_capped:
        assert r.max_ctx == m.max_position_embeddings and need(16, r.max_ctx) <= pool
    else:
        assert need(16, r.max_ctx) <= pool < need(16, r.max_ctx + 1)


def test_block_rounding_lowers_max_batch(setup):
    m, gpu = setup
    per_token = kv_bytes_per_token(m, "bf16")
    budget = memory_budget("vllm", m, gpu, weights_bytes=39_767_785_472)
    assert kv_needed_bytes(budget, per_token, 1, 8193) == 8208 * per_token.total_bytes


def test_llamacpp_pads_to_256_cells(setup):
    m, gpu = setup
    per_token = kv_bytes_per_token(m, "q8_0")
    budget = memory_budget("llama.cpp", m, gpu, weights_bytes=39_961_870_336)
    assert kv_needed_bytes(budget, per_token, 3, 1000) == 3072 * per_token.total_bytes
    assert budget.usable_bytes == gpu.memory_bytes


def test_weights_that_do_not_fit_give_zero(setup):
    m, gpu = setup
    budget = memory_budget("vllm", m, gpu, weights_bytes=141 * 10**9)
    r = fit(budget, kv_bytes_per_token(m, "bf16"), m, 1, 1)
    assert budget.kv_pool_bytes < 0 and not r.fits and r.max_batch == 0 and r.max_ctx == 0


def test_seed_scenario_w4a16_bf16_kv_does_not_fit_but_fp8_does(setup):
    """Seed 000: 37-40 GB of W4A16 weights leave ~40 GB, which 40 GiB of bf16 KV overflows."""
    m, gpu = setup
    budget = memory_budget("vllm", m, gpu, weights_bytes=39_767_785_472)
    assert not fit(budget, kv_bytes_per_token(m, "bf16"), m, 16, 8192).fits
    assert fit(budget, kv_bytes_per_token(m, "fp8_e5m2"), m, 16, 8192).fits
