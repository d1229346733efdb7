"""Roofline estimate of prefill and decode speed. An estimate, not a measurement.

A decode step of batch B at context T moves the weights once (for MoE, only the experts the B
tokens were routed to) plus B x T tokens of KV cache, and performs 2 x active parameters x B
FLOPs in the GEMMs plus 4 x heads x head_dim x T x B per attention layer. Its time is the larger
of bytes / (bandwidth x efficiency) and FLOPs / (peak x efficiency), where the GEMM peak is that
of the format the GPU runs natively (FP8 W8A8 on FP8 tensor cores, INT8 W8A8 on INT8, weight-only
formats on BF16 after dequantization, which adds ``dequant_overhead`` to GEMM time). Attention
runs at the BF16 rate. Prefill of one prompt of T tokens: the same with B = 1 and T queries.

Assumptions (all in :class:`RooflineAssumptions`): every sequence holds the full context (a
lower bound on tokens/s for a batch still filling up); no overlap losses, kernel launch gaps,
tensor parallelism, speculative decoding or prefix caching; quantized-KV dequantization is free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.gpus import GPU
from wkvlab.plan.kv import KVBytes, per_layer_tokens
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import active_linear_params
from wkvlab.plan.weights import WeightBytes, parse_weight_spec, weight_format

LABEL = "estimate (roofline model, not measured)"


@dataclass(frozen=True)
class RooflineAssumptions(JsonMixin):
    bandwidth_efficiency: float = 0.80  # achievable fraction of peak DRAM bandwidth
    compute_efficiency: float = 0.70  # achievable fraction of peak dense tensor FLOP/s
    # cuBLAS INT8 GEMMs on Ampere are not always faster than FP16 (seed study 004): assume half
    # of the INT8 peak is reachable before Hopper.
    int8_efficiency_pre_hopper: float = 0.50
    curve_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class StepEstimate(JsonMixin):
    batch: int
    ctx: int
    bytes_moved: int
    flops: float
    memory_time_s: float
    compute_time_s: float
    tokens_per_s: float
    bound: str  # "memory" | "compute"

    @property
    def step_time_s(self) -> float:
        return max(self.memory_time_s, self.compute_time_s)


@dataclass(frozen=True)
class ThroughputEstimate(JsonMixin):
    label: str
    gemm: str  # which tensor-core path the GEMMs take, in words
    decode: StepEstimate
    prefill: StepEstimate  # one prompt of ctx tokens; tokens_per_s = prompt tokens / s
    curve: tuple[StepEstimate, ...]  # decode tokens/s versus batch
    critical_batch: int | None  # smallest batch at which decode turns compute-bound


def gemm_path(weights: str, gpu: GPU, a: RooflineAssumptions = RooflineAssumptions()) -> tuple[float, float, str]:
    """(effective GEMM FLOP/s, dequantization overhead, description) for a weight format."""
    fmt = weight_format(parse_weight_spec(weights).format)
    eff = a.compute_efficiency
    if fmt.compute in ("fp8", "fp4") and gpu.has_native(fmt.compute):
        return gpu.peak_flops(fmt.compute) * eff, 0.0, f"native {fmt.compute.upper()} tensor cores"
    if fmt.compute == "int8":
        if gpu.sm < 90:
            eff = min(eff, a.int8_efficiency_pre_hopper)
        return gpu.peak_flops("int8") * eff, fmt.dequant_overhead, "INT8 tensor cores"
    if fmt.compute in ("fp8", "fp4"):
        # No native path: the weights are dequantized into a BF16 GEMM (Marlin-style W*A16).
        return gpu.peak_flops("bf16") * eff, 0.10 if fmt.bits == 8 else 0.25, \
            f"BF16 tensor cores after {fmt.compute.upper()} dequantization (no native {fmt.compute.upper()})"
    if fmt.weight_only:
        return gpu.peak_flops("bf16") * eff, fmt.dequant_overhead, "BF16 tensor cores after dequantization"
    return gpu.peak_flops("bf16") * eff, 0.0, "BF16 tensor cores"


def estimate_throughput(model: ModelDescription, gpu: GPU, wbytes: WeightBytes, kv: KVBytes,
                        batch: int, ctx: int,
                        a: RooflineAssumptions = RooflineAssumptions()) -> ThroughputEstimate:
    gemm_flops, overhead, gemm = gemm_path(wbytes.weights, gpu, a)
    attn_flops_rate = gpu.peak_flops("bf16") * a.compute_efficiency
    bw = gpu.bandwidth_bytes_s * a.bandwidth_efficiency
    active = active_linear_params(model)
    lm_head = model.vocab_size * model.hidden_size
    kv_seq = sum((layer.data_bytes + layer.scale_bytes) * kept
                 for layer, kept in per_layer_tokens(kv, ctx)) + kv.state_bytes_per_sequence
    attn_seq = _attention_flops_per_query(model, kv, ctx)

    def times(b: int) -> tuple[int, float, float]:
        weights_read = wbytes.total_bytes - wbytes.routed_expert_bytes * (1 - _expert_fraction(model, b))
        moved = int(weights_read + b * kv_seq)
        gemm_f = 2.0 * (active + lm_head) * b
        return moved, moved / bw, gemm_f / gemm_flops * (1 + overhead) + attn_seq * b / attn_flops_rate

    def decode(b: int) -> StepEstimate:
        moved, memory, compute = times(b)
        flops = 2.0 * (active + lm_head) * b + attn_seq * b
        return StepEstimate(b, ctx, moved, flops, memory, compute, b / max(memory, compute),
                            "compute" if compute > memory else "memory")

    # Prefill: ctx queries over a causal prefix (average ctx / 2 keys per query).
    moved = wbytes.total_bytes + ctx * kv.total_bytes
    gemm_f = 2.0 * active * ctx + 2.0 * lm_head
    attn_f = sum(_attention_flops_per_query(model, kv, t) for t in _sample_points(ctx)) / 8 * ctx
    compute = gemm_f / gemm_flops * (1 + overhead) + attn_f / attn_flops_rate
    memory = moved / bw
    prefill = StepEstimate(1, ctx, moved, gemm_f + attn_f, memory, compute, ctx / max(memory, compute),
                           "compute" if compute > memory else "memory")
    curve = tuple(decode(b) for b in a.curve_batches)
    critical = _first_compute_bound(lambda b: times(b)[2] > times(b)[1], 8192)
    return ThroughputEstimate(LABEL, gemm, decode(batch), prefill, curve, critical)


def _first_compute_bound(compute_bound: Callable[[int], bool], upper: int) -> int | None:
    """Smallest batch in [1, upper] that is compute-bound, None if none is.

    compute(b) - memory(b) is convex in b (linear terms minus the concave expected-expert
    count) and negative at b = 0, so the compute-bound batches form one interval [b*, inf):
    bisection finds b*.
    """
    if not compute_bound(upper):
        return None
    lo, hi = 0, upper  # compute_bound(hi) holds; lo is 0 or a memory-bound batch
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compute_bound(mid) else (mid, hi)
    return hi


def _expert_fraction(model: ModelDescription, batch: int) -> float:
    """Expected fraction of routed experts a decode step of ``batch`` tokens touches."""
    if model.moe is None:
        return 1.0
    p = model.moe.experts_per_token / model.moe.num_experts
    return 1.0 - (1.0 - p) ** batch


def _attention_flops_per_query(model: ModelDescription, kv: KVBytes, ctx: int) -> float:
    """QK^T and PV FLOPs of one query token against ``ctx`` cached tokens, all layers."""
    if model.mla is not None:
        # Absorbed MLA: scores over (latent + rope) dims, values over the latent.
        per_key = 2 * model.num_heads * (2 * model.mla.kv_lora_rank + model.mla.qk_rope_head_dim)
    else:
        per_key = 4 * model.num_heads * model.head_dim
    return float(sum(per_key * kept for _, kept in per_layer_tokens(kv, ctx)))


def _sample_points(ctx: int) -> list[int]:
    """Eight midpoints of the prefix lengths 0..ctx (sliding windows make FLOPs non-linear)."""
    return [max(1, int(ctx * (i + 0.5) / 8)) for i in range(8)]
