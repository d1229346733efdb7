"""Roofline estimate: the seeds' qualitative rules must come out of the arithmetic."""
from __future__ import annotations

import pytest

from wkvlab.plan import ModelDescription, find_gpu, plan
from wkvlab.plan.throughput import LABEL, gemm_path
from wkvlab.plan.weights import as_weight_spec, execution


def estimate(model, gpu, w, kv, batch, ctx, gpus=1):
    result = plan(model, gpu, batch, ctx, weights=[w], kv=[kv], engine="vllm", gpus=gpus)
    return result.rows[0].throughput


def test_decode_at_batch_1_is_memory_bound_and_labeled():
    t = estimate("Llama-3-8B", "H100", "bf16", "bf16", 1, 2048)
    assert t.decode.bound == "memory" and t.label == LABEL and "not measured" in t.label
    # batch 1: ~weights / (0.8 x bandwidth) per token
    assert t.decode.tokens_per_s == pytest.approx(0.8 * 3350e9 / (16.06e9 + 2048 * 131072), rel=0.01)


def test_w4a16_helps_small_batches_and_turns_compute_bound_earlier():
    bf16 = estimate("Llama-3-8B", "H100", "bf16", "bf16", 1, 256)
    w4 = estimate("Llama-3-8B", "H100", "int4-g128", "bf16", 1, 256)
    assert w4.decode.tokens_per_s > 2 * bf16.decode.tokens_per_s
    assert w4.critical_batch is not None and bf16.critical_batch is not None and w4.critical_batch < bf16.critical_batch
    assert next(s for s in w4.curve if s.batch == 256).bound == "compute"


def test_fp8_needs_native_tensor_cores():
    a100, h100 = find_gpu("A100-80GB"), find_gpu("H100")
    fp8 = execution(as_weight_spec("fp8"))
    rate_a, _, how_a = gemm_path(fp8, a100)
    rate_h, _, how_h = gemm_path(fp8, h100)
    assert "no native FP8" in how_a and rate_a == pytest.approx(312e12 * 0.7)
    assert "native FP8" in how_h and rate_h == pytest.approx(1979e12 * 0.7)


def test_int8_gemm_on_ampere_is_derated():
    rate, _, how = gemm_path(execution(as_weight_spec("w8a8-int8")), find_gpu("A100-80GB"))
    assert "INT8" in how and rate == pytest.approx(624e12 * 0.5)


def test_long_context_keeps_kv_the_bottleneck():
    t = estimate("Llama-3-70B", "A100-80GB", "int4-g128", "fp8_e5m2", 16, 8192)
    assert t.critical_batch is None or t.critical_batch > 256
    assert t.decode.bound == "memory"


def test_tokens_per_s_grow_with_batch_and_moe_reads_fewer_weights():
    result = plan("Qwen3-30B-A3B", "H100", 1, 1024, weights=["bf16"], kv=["bf16"], engine="vllm")
    t = result.rows[0].throughput
    speeds = [s.tokens_per_s for s in t.curve]
    assert speeds == sorted(speeds)
    assert t.curve[0].bytes_moved < result.rows[0].weight_bytes.total_bytes / 4


def test_tensor_parallel_pays_all_reduces():
    """Two ring all-reduces of B x hidden bf16 values per layer: on 4 L40S (PCIe, 32 GB/s x 0.7) per step
    2 x 80 x (2 x 3/4 x 16 x 8192 x 2 B / 22.4e9 B/s + 20 us) = 6.0 ms."""
    t = estimate("Llama-3-70B", "L40S", "int4-g128", "int8", 16, 8192, gpus=4)
    assert t.decode.comm_time_s == pytest.approx(2 * 80 * (2 * 3 / 4 * 16 * 8192 * 2 / (32e9 * 0.7) + 20e-6))
    nvlink = estimate("Llama-3-70B", "A100-80GB", "int4-g128", "int8", 16, 8192, gpus=4)
    # NVLink (300 GB/s per direction): the fixed per-all-reduce latency dominates at this message size
    assert nvlink.decode.comm_time_s == pytest.approx(2 * 80 * (2 * 3 / 4 * 16 * 8192 * 2 / (300e9 * 0.7) + 20e-6))
