"""Roofline estimate of prefill and decode speed, on one GPU or several. An estimate, not a measurement.

A decode step of batch B at context T moves, on each GPU, the weights it holds once (for MoE, only
the experts the B tokens were routed to) plus its B x T tokens of KV cache, and performs 2 x its
active parameters x B FLOPs in the GEMMs plus 4 x its heads x head_dim x T x B per attention layer.
Its time is the larger of bytes / (bandwidth x efficiency) and FLOPs / (peak x efficiency), where
the GEMM peak is that of the format the GPU runs natively (FP8 W8A8 on FP8 tensor cores, INT8
W8A8 on INT8, weight-only formats on BF16 after dequantization, which adds ``dequant_overhead`` to
GEMM time). Attention runs at the BF16 rate. Prefill of one prompt of T tokens: the same with
B = 1 and T queries.

Several GPUs: tensor parallelism adds two ring all-reduces of the B x hidden activations per layer
(each GPU sends 2 (tp - 1) / tp of them over its link, plus a fixed latency); pipeline stages run
concurrently on different micro-batches (vLLM), so a step takes as long as the slowest stage; a
llama.cpp ``-sm layer`` split runs its devices one after another, so its stages add up.

Assumptions (all in :class:`RooflineAssumptions`): every sequence holds the full context (a
lower bound on tokens/s for a batch still filling up); no overlap losses, kernel launch gaps,
speculative decoding or prefix caching; quantized-KV dequantization is free.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.gpus import GPU
from wkvlab.plan.kv import KVBytes, per_layer_tokens
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.weights import Execution, WeightBytes

LABEL = "estimate (roofline model, not measured)"


@dataclass(frozen=True)
class RooflineAssumptions(JsonMixin):
    bandwidth_efficiency: float = 0.80  # achievable fraction of peak DRAM bandwidth
    compute_efficiency: float = 0.70  # achievable fraction of peak dense tensor FLOP/s
    # cuBLAS INT8 GEMMs on Ampere are not always faster than FP16: assume half of the INT8 peak is
    # reachable before Hopper.
    int8_efficiency_pre_hopper: float = 0.50
    link_efficiency: float = 0.70  # achievable fraction of the GPU-to-GPU link bandwidth
    allreduce_latency_s: float = 20e-6  # fixed cost of one small all-reduce (NCCL / custom all-reduce)
    curve_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class StageLoad(JsonMixin):
    """What one GPU of a stage holds and computes (every GPU of a tensor-parallel group alike)."""

    weights: WeightBytes
    kv: KVBytes  # per token, this GPU's KV heads and layers
    linear_params: int  # GEMM parameters this GPU multiplies per token (routed experts: all of them)
    routed_params: int  # of which in routed experts (a token uses top-k of them)
    lm_head_params: int
    heads: int  # attention heads this GPU computes
    layers: int  # layers this GPU computes (for the all-reduces)
    tp: int = 1


@dataclass(frozen=True)
class StepEstimate(JsonMixin):
    batch: int
    ctx: int
    bytes_moved: int  # on the busiest GPU
    flops: float  # on the busiest GPU
    memory_time_s: float
    compute_time_s: float
    comm_time_s: float
    tokens_per_s: float
    bound: str  # "memory" | "compute"

    @property
    def step_time_s(self) -> float:
        return max(self.memory_time_s, self.compute_time_s) + self.comm_time_s


@dataclass(frozen=True)
class ThroughputEstimate(JsonMixin):
    label: str
    gemm: str  # which tensor-core path the GEMMs take, in words
    decode: StepEstimate
    prefill: StepEstimate  # one prompt of ctx tokens; tokens_per_s = prompt tokens / s
    curve: tuple[StepEstimate, ...]  # decode tokens/s versus batch
    critical_batch: int | None  # smallest batch at which decode turns compute-bound


def gemm_path(ex: Execution, gpu: GPU, a: RooflineAssumptions = RooflineAssumptions()) -> tuple[float, float, str]:
    """(effective GEMM FLOP/s, dequantization overhead, description) for a weight execution class."""
    eff = a.compute_efficiency
    if ex.compute in ("fp8", "fp4") and gpu.has_native(ex.compute):
        return gpu.peak_flops(ex.compute) * eff, 0.0, f"native {ex.compute.upper()} tensor cores"
    if ex.compute == "int8":
        if gpu.sm < 90:
            eff = min(eff, a.int8_efficiency_pre_hopper)
        return gpu.peak_flops("int8") * eff, ex.dequant_overhead, "INT8 tensor cores"
    if ex.compute in ("fp8", "fp4"):
        # No native path: the weights are dequantized into a BF16 GEMM (Marlin-style W*A16).
        return gpu.peak_flops("bf16") * eff, 0.10 if ex.bits == 8 else 0.25, \
            f"BF16 tensor cores after {ex.compute.upper()} dequantization (no native {ex.compute.upper()})"
    if ex.weight_only:
        return gpu.peak_flops("bf16") * eff, ex.dequant_overhead, "BF16 tensor cores after dequantization"
    return gpu.peak_flops("bf16") * eff, 0.0, "BF16 tensor cores"


def estimate_throughput(model: ModelDescription, gpu: GPU, ex: Execution, stages: list[StageLoad], batch: int, ctx: int,
                        a: RooflineAssumptions = RooflineAssumptions(), sequential: bool = False) -> ThroughputEstimate:
    """Decode and prefill speed of ``stages`` (one entry per pipeline stage / llama.cpp device)."""
    gemm_flops, overhead, gemm = gemm_path(ex, gpu, a)
    attn_rate = gpu.peak_flops("bf16") * a.compute_efficiency
    bw = gpu.bandwidth_bytes_s * a.bandwidth_efficiency
    link = gpu.link_gb_s * 1e9 * a.link_efficiency
    fraction = _expert_fraction(model)

    if model.mla is not None:  # absorbed MLA: scores over (latent + rope) dims, values over the latent
        per_key_head = 2 * (2 * model.mla.kv_lora_rank + model.mla.qk_rope_head_dim)
    else:
        per_key_head = 4 * model.head_dim

    def kept(st: StageLoad, tokens: int) -> float:
        return float(sum(n for _, n in per_layer_tokens(st.kv, tokens)))

    def stage_times(st: StageLoad, b: int, queries: int) -> tuple[int, float, float, float, float]:
        active = st.linear_params - st.routed_params * (1 - model.moe.experts_per_token / model.moe.num_experts if model.moe else 0)
        if queries == 1:
            weights_read = st.weights.total_bytes - st.weights.routed_expert_bytes * (1 - fraction(b))
            kv_seq = sum(layer.bytes * n for layer, n in per_layer_tokens(st.kv, ctx)) + st.kv.state_bytes_per_sequence
            moved = int(weights_read + b * kv_seq)
            keys = kept(st, ctx)
        else:  # one causal prompt: a query sees the prefix before it (sliding layers cap it)
            moved = int(st.weights.total_bytes + queries * st.kv.total_bytes)
            keys = sum(kept(st, t) for t in _sample_points(ctx)) / 8 * queries
        gemm_f = 2.0 * (active * queries * b + st.lm_head_params * b)
        attn_f = per_key_head * st.heads * keys * b
        comm = 0.0
        if st.tp > 1:
            message = b * queries * model.hidden_size * 2  # bf16 activations
            comm = 2 * st.layers * (2 * (st.tp - 1) / st.tp * message / link + a.allreduce_latency_s)
        return moved, moved / bw, gemm_f / gemm_flops * (1 + overhead) + attn_f / attn_rate, comm, gemm_f + attn_f

    def step(b: int, queries: int) -> StepEstimate:
        rows = [stage_times(st, b, queries) for st in stages]
        times = [max(m, c) + comm for _, m, c, comm, _ in rows]
        total = sum(times) if sequential or queries > 1 else max(times)
        busiest = max(range(len(rows)), key=lambda i: times[i])
        moved, memory, compute, comm, flops = rows[busiest]
        produced = b if queries == 1 else queries
        return StepEstimate(b, ctx, moved, flops, memory, compute, comm, produced / total,
                            "compute" if compute > memory else "memory")

    curve = tuple(step(b, 1) for b in a.curve_batches)
    critical = _first_compute_bound(lambda b: step(b, 1).bound == "compute", 8192)
    return ThroughputEstimate(LABEL, gemm, step(batch, 1), step(1, ctx), curve, critical)


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


def _expert_fraction(model: ModelDescription) -> Callable[[int], float]:
    """Expected fraction of routed experts a decode step of ``batch`` tokens touches."""
    if model.moe is None:
        return lambda _b: 1.0
    p = model.moe.experts_per_token / model.moe.num_experts
    return lambda batch: 1.0 - (1.0 - p) ** batch


def _sample_points(ctx: int) -> list[int]:
    """Eight midpoints of the prefix lengths 0..ctx (sliding windows make FLOPs non-linear)."""
    return [max(1, int(ctx * (i + 0.5) / 8)) for i in range(8)]
