"""Several GPUs: the seed's Llama-3-70B on 1, 2 and 4 A100-80GB and on 4 L40S, with the byte arithmetic written out.

Llama-3-70B: 80 layers, hidden 8192, 64 heads / 8 KV heads x 128, MLP 28672, vocabulary 128256 (a multiple
of 64, so vLLM's padding adds nothing). One layer's linears: q, o 8192 x 8192; k, v 1024 x 8192; gate, up,
down 28672 x 8192 = 855,638,016 parameters. Norms: 2 x 8192 per layer + 8192 final = 1,318,912 parameters.
"""
from __future__ import annotations

import pytest

from wkvlab.plan import ModelDescription, find_gpu, gpu_shares, parallel_for, plan
from wkvlab.plan.engines import check_support
from wkvlab.plan.parallel import llamacpp_layer_devices, pp_layers

GIB = 2**30
LAYER_LINEAR = 2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 28672 * 8192
EMBED = 128256 * 8192  # embedding, and again the untied lm_head
NORM_BYTES = (2 * 8192 * 80 + 8192) * 2
BF16 = 80 * LAYER_LINEAR * 2 + 2 * EMBED * 2 + NORM_BYTES
# int4-g128: 4-bit values + per 128 inputs an fp16 scale and a 4-bit zero (2.5 B per group and row)
W4_LINEAR = 80 * (LAYER_LINEAR // 2 + LAYER_LINEAR // 128 * 5 // 2)
# vLLM's activation peak (estimate) at max_num_batched_tokens 8192 on one of tp ranks, + graphs, runtime, NCCL
LOGITS = 256 * 128256 * 4 * 2


def reserve(tp: int) -> int:
    per_token = (2 * 28672 + (64 + 16) * 128) // tp + 4 * 8192
    return per_token * 8192 * 2 + LOGITS + GIB // 2 * 2 + (GIB // 2 if tp > 1 else 0)


def kv_int8_vllm(tp: int) -> int:
    """vLLM's int8_per_token_head row: 128 int8 values + an fp32 scale; K and V; KV heads split by tp."""
    return 80 * (8 // tp) * 2 * (128 + 4)


@pytest.fixture(scope="module")
def llama70():
    return ModelDescription.from_name("Llama-3-70B")


def vllm_row(result, weights="int4-g128", kv="int8"):
    row = next(r for r in result.rows if (r.weights, r.kv) == (weights, kv))
    return row, row.evaluation("vllm")


def test_one_a100(llama70):
    assert BF16 == 141_107_412_992 and W4_LINEAR + 2 * EMBED * 2 + NORM_BYTES == 39_767_785_472
    row, ev = vllm_row(plan(llama70, "A100-80GB", 16, 8192))
    gpu = ev.gpus[0]
    usable = int(0.90 * 81920 * 2**20)
    assert gpu.weights_bytes == 39_767_785_472
    assert gpu.kv_bytes_per_token == kv_int8_vllm(1) == 168_960
    assert gpu.budget.reserve_bytes == reserve(1) == 2_980_577_280
    assert gpu.budget.kv_pool_bytes == usable - 39_767_785_472 - reserve(1) == 34_561_048_576
    assert gpu.fit.kv_needed_bytes == 16 * 8192 * 168_960
    assert ev.fit.max_batch == 34_561_048_576 // (8192 * 168_960) == 24


def test_two_a100_tensor_parallel(llama70):
    """tp 2: half of every matrix, half of the vocabulary, norms on both; 4 of the 8 KV heads per GPU."""
    result = plan(llama70, "A100-80GB", 16, 8192, gpus=2)
    row, ev = vllm_row(result)
    weights = W4_LINEAR // 2 + EMBED * 2 + NORM_BYTES  # both ends split: (2 x EMBED x 2) / 2
    assert ev.parallel.tp == 2 and len(ev.gpus) == 1 and ev.gpus[0].count == 2
    assert ev.gpus[0].weights_bytes == weights == 19_885_211_648
    assert ev.gpus[0].kv_bytes_per_token == kv_int8_vllm(2) == 84_480
    pool = int(0.90 * 81920 * 2**20) - weights - reserve(2)
    assert ev.gpus[0].budget.kv_pool_bytes == pool
    assert ev.fit.max_batch == pool // (8192 * 84_480) == 78
    # bf16 weights need 70.6 GB per GPU: the 16-bit cache of 16 x 8k sequences does not fit next to them
    bf16 = next(r for r in result.rows if (r.weights, r.kv) == ("bf16", "bf16")).evaluation("vllm")
    assert bf16.gpus[0].weights_bytes == (BF16 - NORM_BYTES) // 2 + NORM_BYTES == 70_555_025_408
    assert not bf16.fit.fits and bf16.fit.max_batch == (int(0.90 * 81920 * 2**20) - 70_555_025_408 - reserve(2)) // (8192 * 163_840) == 2
    cmd = next(r for r in result.recommendations if r.engine == "vllm").command.argv
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    sglang = next(r for r in result.recommendations if r.engine == "sglang").command.argv
    assert sglang[sglang.index("--tp-size") + 1] == "2"


def test_four_a100_fit_16_bit_weights(llama70):
    result = plan(llama70, "A100-80GB", 16, 8192, gpus=4)
    row, ev = vllm_row(result, "bf16", "int8")
    weights = (BF16 - NORM_BYTES) // 4 + NORM_BYTES
    assert ev.gpus[0].weights_bytes == weights == 35_278_831_616
    assert ev.gpus[0].budget.reserve_bytes == reserve(4) == 2_686_976_000
    pool = int(0.90 * 81920 * 2**20) - weights - reserve(4)
    assert ev.fit.fits and ev.fit.max_batch == pool // (8192 * kv_int8_vllm(4)) == 113
    best = next(r for r in result.rows if r.rank == 1)
    assert best.weights == "bf16"  # with four GPUs the plan stops quantizing the weights


def test_four_l40s(llama70):
    """L40S: 46,068 MiB, no NVLink. bf16 weights leave 5.5 GB per GPU: 15 sequences of int8 KV, one short of 16;
    int4-g128 weights leave 30.8 GB (89 sequences)."""
    result = plan(llama70, "L40S", 16, 8192, gpus=4)
    usable = int(0.90 * 46068 * 2**20)
    _, bf16 = vllm_row(result, "bf16", "int8")
    pool = usable - ((BF16 - NORM_BYTES) // 4 + NORM_BYTES) - reserve(4)
    assert bf16.gpus[0].budget.kv_pool_bytes == pool == 5_509_411_635
    assert not bf16.fit.fits and bf16.fit.max_batch == pool // (8192 * kv_int8_vllm(4)) == 15
    _, w4 = vllm_row(result)
    w4_weights = W4_LINEAR // 4 + EMBED * 2 * 2 // 4 + NORM_BYTES
    assert w4.gpus[0].weights_bytes == w4_weights == 9_943_924_736
    assert w4.fit.max_batch == (usable - w4_weights - reserve(4)) // (8192 * kv_int8_vllm(4)) == 89
    row = next(r for r in result.rows if (r.weights, r.kv) == ("int4-g128", "int8"))
    assert row.throughput.decode.comm_time_s > 0  # PCIe all-reduces are part of the step


def test_side_by_side_counts_are_one_plan_per_count(llama70):
    maxima = [vllm_row(plan(llama70, "A100-80GB", 16, 8192, gpus=n))[1].fit.max_batch for n in (1, 2, 4)]
    four = (int(0.90 * 81920 * 2**20) - (W4_LINEAR // 4 + EMBED + NORM_BYTES) - reserve(4)) // (8192 * kv_int8_vllm(4))
    assert maxima == [24, 78, four] and four == 186


def test_kv_heads_replicate_when_tp_exceeds_them(llama70):
    """vLLM QKVParallelLinear: tp 16 > 8 KV heads -> one replicated head per rank (and its k/v projection)."""
    par = parallel_for("vllm", 16)
    share = gpu_shares("vllm", llama70, par)[0]
    assert share.kv_heads == 1
    tiny = ModelDescription.from_config({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 768, "num_attention_heads": 12,
                                         "num_key_value_heads": 3, "vocab_size": 64, "intermediate_size": 1536})
    s = check_support("vllm", tiny, "bf16", "fp16", find_gpu("H100"), parallel_for("vllm", 4))
    assert not s.accepted and "one must divide the other" in s.reasons[0]  # 3 KV heads, tp 4


def test_pipeline_and_llamacpp_layer_splits():
    assert [len(s) for s in pp_layers("vllm", 30, 4)] == [7, 8, 8, 7]  # remainder before the last stage
    assert [len(s) for s in pp_layers("sglang", 30, 4)] == [7, 7, 8, 8]  # remainder on the last stages
    devices = llamacpp_layer_devices(80, 2)  # layer il goes to upper_bound([0.5, 1.0], il / 81)
    assert devices.count(0) == 41 and devices[40] == 0 and devices[41] == 1 and devices[80] == 1  # output layer last
    m = ModelDescription.from_name("Llama-3-70B")
    shares = gpu_shares("llama.cpp", m, parallel_for("llama.cpp", 2))
    assert [len(s.kv_layers) for s in shares] == [41, 39] and not shares[0].shard.embedding and shares[1].shard.lm_head
    row = gpu_shares("llama.cpp", m, parallel_for("llama.cpp", 2, split="row"))
    assert row[0].kv_layers == tuple(range(80)) and row[1].kv_layers == ()  # -sm row: KV on the main GPU


def test_bad_layouts():
    from wkvlab.errors import ConfigError

    with pytest.raises(ConfigError, match="--tp 3 does not divide --gpus 4"):
        parallel_for("vllm", 4, tp=3)
    with pytest.raises(ConfigError, match="--tp 3 does not divide --gpus 1") as refused:  # issue 41: --pp defaults to 1, never "0"
        parallel_for(None, 1, tp=3)
    assert "--pp 0" not in str(refused.value)
    with pytest.raises(ConfigError, match="must equal"):
        parallel_for("vllm", 4, tp=3, pp=2)
    with pytest.raises(ConfigError, match="split"):
        parallel_for("llama.cpp", 2, split="column")
