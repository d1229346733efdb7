"""Roofline estimate: the seeds' qualitative rules must come out of the arithmetic."""
from __future__ import annotations

import pytest

from wkvlab.plan import ModelDescription, estimate_throughput, find_gpu, kv_bytes_per_token, weight_bytes
from wkvlab.plan.throughput import LABEL, gemm_path


def estimate(model, gpu, w, kv, batch, ctx):
    m = ModelDescription.from_name(model)
    return estimate_throughput(m, find_gpu(gpu), weight_bytes(m, w), kv_bytes_per_token(m, kv), batch, ctx)


def test_decode_at_batch_1_is_memory_bound_and_labeled():
    t = estimate("Llama-3-8B", "H100", "bf16", "bf16", 1, 2048)
    assert t.decode.bound == "memory" and t.label == LABEL and "not measured" in t.label
    # batch 1: ~weights / (0.8 x bandwidth) per token
    assert t.decode.tokens_per_s == pytest.approx(0.8 * 3350e9 / (16.06e9 + 2048 * 131072), rel=0.01)


def test_w4a16_helps_small_batches_and_turns_compute_bound_earlier():
    """Seed 004: W4A16 wins at batch 1-4 (memory-bound) but its dequantization hurts at >= 32."""
    bf16 = estimate("Llama-3-8B", "H100", "bf16", "bf16", 1, 256)
    w4 = estimate("Llama-3-8B", "H100", "int4-g128", "bf16", 1, 256)
    assert w4.decode.tokens_per_s > 2 * bf16.decode.tokens_per_s
    assert w4.critical_batch is not None and bf16.critical_batch is not None
    assert w4.critical_batch < bf16.critical_batch
    w4_big = next(s for s in w4.curve if s.batch == 256)
    assert w4_big.bound == "compute"


def test_fp8_needs_native_tensor_cores():
    """Seed 004: on A100 FP8 weights are dequantized into a BF16 GEMM — no FP8 speed-up."""
    a100 = find_gpu("A100-80GB")
    h100 = find_gpu("H100")
    rate_a, _, how_a = gemm_path("fp8", a100)
    rate_h, _, how_h = gemm_path("fp8", h100)
    assert "no native FP8" in how_a and rate_a == pytest.approx(312e12 * 0.7)
    assert "native FP8" in how_h and rate_h == pytest.approx(1979e12 * 0.7)


def test_int8_gemm_on_ampere_is_derated():
    rate, _, how = gemm_path("w8a8-int8", find_gpu("A100-80GB"))
    assert "INT8" in how and rate == pytest.approx(624e12 * 0.5)


def test_long_context_keeps_kv_the_bottleneck():
    """Seed: long contexts keep the KV cache the bottleneck — decode never turns compute-bound."""
    t = estimate("Llama-3-70B", "A100-80GB", "int4-g128", "bf16", 16, 8192)
    assert t.critical_batch is None or t.critical_batch > 256
    assert t.decode.bound == "memory"


def test_tokens_per_s_grow_with_batch_and_moe_reads_fewer_weights():
    t = estimate("Qwen3-30B-A3B", "H100", "bf16", "bf16", 1, 1024)
    speeds = [s.tokens_per_s for s in t.curve]
    assert speeds == sorted(speeds)
    assert t.curve[0].bytes_moved < weight_bytes(ModelDescription.from_name("Qwen3-30B-A3B"), "bf16").total_bytes / 4
