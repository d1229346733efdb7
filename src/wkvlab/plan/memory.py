"""How much memory each engine leaves for the KV cache, and what fits in it.

Engine rules (stated in every budget's ``rule`` text):

* vLLM: ``gpu_memory_utilization`` (printed explicitly in the launch line, default 0.90 here;
  recent main defaults to 0.92) of the device's total memory is the budget; the profiling run
  subtracts the weights, the activation peak of a ``max_num_batched_tokens`` forward pass, CUDA
  graphs and non-torch memory; the rest becomes KV blocks of 16 tokens (``CacheConfig.
  DEFAULT_BLOCK_SIZE``). A sequence occupies ceil(tokens / 16) blocks.
* SGLang: ``mem_fraction_static`` of total memory holds weights + KV pool; activations and CUDA
  graphs live in the remaining fraction. Token-granular pages (page size 1).
* llama.cpp: allocates the KV cache for the whole ``-c`` context up front, padded to a multiple
  of 256 cells when flash attention is on (``llama_kv_cache::get_padding``); ``-np`` slots share
  it (each gets ``c / np``). Weights, KV and the compute buffer must fit in device memory.
* TensorRT-LLM: ``kv_cache_free_gpu_memory_fraction`` (0.9) of the memory left after weights and
  activations becomes KV blocks of 32 tokens (``KvCacheConfig.tokens_per_block``).

Activation peaks, CUDA-graph, runtime and communication reserves are estimates (see
:class:`EngineSettings`). With several GPUs every GPU applies its engine's rule to the share it
holds (:mod:`.parallel`); vLLM sizes one KV pool for all workers from the smallest one
(``num_gpu_blocks`` is the minimum over workers), so the tightest GPU decides what fits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.gpus import GPU
from wkvlab.plan.kv import KVBytes, kv_cache_bytes, round_up
from wkvlab.plan.models import ModelDescription

GIB = 2**30


@dataclass(frozen=True)
class EngineSettings(JsonMixin):
    """Allocation knobs; defaults are the engines' defaults where they have one."""

    vllm_gpu_memory_utilization: float = 0.90
    vllm_block_size: int = 16
    vllm_max_num_batched_tokens: int = 8192  # V1 default for the OpenAI server
    sglang_mem_fraction_static: float = 0.90  # SGLang docs: "default value is 0.9"
    llamacpp_ubatch: int = 512  # llama.cpp -ub default
    llamacpp_padding: int = 256  # KV cells, with flash attention
    trtllm_free_gpu_memory_fraction: float = 0.90
    trtllm_tokens_per_block: int = 32
    # Assumptions, not engine defaults: CUDA graphs and non-torch memory (CUDA context, NCCL,
    # cuBLAS workspaces) are typically a few hundred MiB each.
    cuda_graph_bytes: int = GIB // 2
    runtime_overhead_bytes: int = GIB // 2
    # With more than one GPU: NCCL communicators (NCCL_BUFFSIZE, 4 MiB by default, per channel and
    # peer) and vLLM's custom all-reduce IPC buffers; an assumption, not measured.
    comm_reserve_bytes: int = GIB // 2


@dataclass(frozen=True)
class MemoryBudget(JsonMixin):
    engine: str
    gpu_memory_bytes: int
    usable_bytes: int  # what the engine lets itself use
    weights_bytes: int
    reserve_bytes: int  # activations, CUDA graphs, runtime (estimate)
    kv_pool_bytes: int  # negative: the weights alone do not fit
    block_size: int
    rule: str


@dataclass(frozen=True)
class FitResult(JsonMixin):
    batch: int
    ctx: int
    kv_needed_bytes: int
    kv_pool_bytes: int
    fits: bool
    max_batch: int  # at ctx
    max_ctx: int  # at batch, capped at the model's max_position_embeddings
    max_ctx_capped: bool  # True when the memory would allow more than the model supports
    binding_gpu: str = "GPU 0"  # the GPU whose memory runs out first

    @property
    def headroom_bytes(self) -> int:
        return self.kv_pool_bytes - self.kv_needed_bytes


def activation_bytes(model: ModelDescription, tokens: int, bytes_per_value: int = 2,
                     logit_rows: int = 256, tp: int = 1) -> int:
    """Rough peak of one forward pass over ``tokens`` tokens on one of ``tp`` ranks (estimate, not profiled)."""
    if model.moe is not None:
        inter = model.moe.experts_per_token * model.moe.expert_intermediate_size
        inter += model.moe.shared_experts * model.moe.expert_intermediate_size
        inter += model.moe.shared_expert_intermediate_size
    else:
        inter = model.intermediate_size
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim
    # gate/up outputs and qkv are split across tensor-parallel ranks; the residual stream is not
    per_token = (2 * inter + qkv) // tp + 4 * model.hidden_size
    # Logits and probabilities in fp32 for the rows the sampler sees.
    logits = min(tokens, logit_rows) * model.vocab_size * 4 * 2
    return tokens * per_token * bytes_per_value + logits


def memory_budget(engine: str | None, model: ModelDescription, gpu: GPU, weights_bytes: int,
                  settings: EngineSettings = EngineSettings(), *, tp: int = 1, gpus: int = 1) -> MemoryBudget:
    """KV pool one GPU has left under ``engine``'s allocation rule (None: vLLM's rule, as a neutral
    default), holding ``weights_bytes`` of weights as one of ``tp`` tensor-parallel ranks."""
    s, total = settings, gpu.memory_bytes
    comm = s.comm_reserve_bytes if gpus > 1 else 0
    graphs_runtime = s.cuda_graph_bytes + s.runtime_overhead_bytes + comm
    if engine == "sglang":
        usable = int(s.sglang_mem_fraction_static * total)
        return MemoryBudget(engine, total, usable, weights_bytes, total - usable + comm,
                            usable - weights_bytes - comm, 1,
                            f"SGLang: mem_fraction_static {s.sglang_mem_fraction_static:.2f} x total "
                            "holds weights + KV pool; activations and CUDA graphs use the rest")
    if engine == "llama.cpp":
        # llama.cpp keeps intermediate results in f32 for one ubatch.
        reserve = activation_bytes(model, s.llamacpp_ubatch, 4, s.llamacpp_ubatch) + s.runtime_overhead_bytes + comm
        return MemoryBudget(engine, total, total, weights_bytes, reserve,
                            total - weights_bytes - reserve, 1,
                            "llama.cpp: KV for the whole -c allocated up front (padded to "
                            f"{s.llamacpp_padding} cells), shared by the -np slots; weights + KV + "
                            f"compute buffer (ubatch {s.llamacpp_ubatch}) must fit in device memory")
    if engine == "trtllm":
        reserve = activation_bytes(model, s.vllm_max_num_batched_tokens, tp=tp) + graphs_runtime
        free = total - weights_bytes - reserve
        pool = int(s.trtllm_free_gpu_memory_fraction * free) if free > 0 else free
        return MemoryBudget(engine, total, total, weights_bytes, reserve, pool,
                            s.trtllm_tokens_per_block,
                            f"TensorRT-LLM: kv_cache_free_gpu_memory_fraction "
                            f"{s.trtllm_free_gpu_memory_fraction:.2f} of the memory left after weights "
                            f"and activations, blocks of {s.trtllm_tokens_per_block} tokens")
    usable = int(s.vllm_gpu_memory_utilization * total)
    reserve = activation_bytes(model, s.vllm_max_num_batched_tokens, tp=tp) + graphs_runtime
    name = engine or "none"
    return MemoryBudget(name, total, usable, weights_bytes, reserve, usable - weights_bytes - reserve,
                        s.vllm_block_size,
                        f"vLLM: gpu_memory_utilization {s.vllm_gpu_memory_utilization:.2f} x total, "
                        f"minus weights, activation peak at max_num_batched_tokens "
                        f"{s.vllm_max_num_batched_tokens}, CUDA graphs and runtime; KV in blocks of "
                        f"{s.vllm_block_size} tokens")


def kv_needed_bytes(budget: MemoryBudget, per_token: KVBytes, batch: int, ctx: int,
                    settings: EngineSettings = EngineSettings()) -> int:
    """Bytes the engine allocates for ``batch`` sequences of ``ctx`` tokens."""
    if budget.engine == "llama.cpp":
        # One buffer of -c = batch x ctx cells (each cell holds a token for every full layer);
        # sliding-window layers keep their own smaller buffer.
        cells = round_up(batch * ctx, settings.llamacpp_padding)
        total = 0
        for layer in per_token.per_layer:
            kept = cells if layer.window is None else min(cells, batch * min(ctx, layer.window))
            total += layer.bytes * kept
        return total + per_token.state_bytes_per_sequence * batch
    return kv_cache_bytes(per_token, batch, ctx, budget.block_size).total_bytes


def fit(budget: MemoryBudget, per_token: KVBytes, model: ModelDescription, batch: int, ctx: int,
        settings: EngineSettings = EngineSettings(), gpu_name: str = "GPU 0") -> FitResult:
    """Does ``batch`` x ``ctx`` fit, and the largest batch at ctx / context at batch."""
    def need(b: int, t: int) -> int:
        return kv_needed_bytes(budget, per_token, b, t, settings)

    pool = budget.kv_pool_bytes
    needed = need(batch, ctx)
    limit = model.max_position_embeddings
    max_batch = _largest(lambda b: need(b, ctx) <= pool, 1 << 24)
    max_ctx = _largest(lambda t: need(batch, t) <= pool, 1 << 34)
    return FitResult(batch=batch, ctx=ctx, kv_needed_bytes=needed, kv_pool_bytes=pool,
                     fits=pool >= 0 and needed <= pool, max_batch=max_batch,
                     max_ctx=min(max_ctx, limit), max_ctx_capped=max_ctx > limit, binding_gpu=gpu_name)


def tightest(fits: list[FitResult]) -> FitResult:
    """What several GPUs fit together: every one must fit, the tightest bounds batch and context."""
    worst = min(fits, key=lambda f: (f.max_batch, f.max_ctx, f.headroom_bytes))
    return FitResult(batch=worst.batch, ctx=worst.ctx, kv_needed_bytes=worst.kv_needed_bytes, kv_pool_bytes=worst.kv_pool_bytes,
                     fits=all(f.fits for f in fits), max_batch=min(f.max_batch for f in fits),
                     max_ctx=min(f.max_ctx for f in fits), max_ctx_capped=all(f.max_ctx_capped for f in fits),
                     binding_gpu=worst.binding_gpu)


def _largest(ok: Callable[[int], bool], upper: int) -> int:
    """Largest n in [0, upper] with ok(n), for a monotone predicate (0 if none)."""
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= upper and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, upper + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
