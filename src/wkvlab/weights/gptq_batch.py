"""How many MoE experts GPTQ quantizes together (wkvlab.weights.gptq), and what one matrix's
quantization holds: shared by the build (which picks the batch) and the memory estimate (which
counts it, wkvlab.eval.memory), so the two cannot drift apart. No torch here: the estimate runs
before any model loads."""
from __future__ import annotations

from wkvlab.units import GIB

# Experts of one shape and spec go through GPTQ's column loop together in batches whose working
# set stays under this many bytes: a Qwen3-30B-A3B layer's 128 gate/up matrices in batches of 31,
# its down matrices in batches of 88 (7 column loops per layer instead of 256,
# benchmarks/gptq_expert_launches.py). An expert too large for it alone (Mixtral-8x7B's down:
# 2.6 GiB in bfloat16) goes one at a time, as before.
EXPERT_BATCH_BYTES = 2 * GIB


def gptq_working_bytes(n_in: int, n_out: int, dtype_bytes: int, *, stacked: bool) -> int:
    """One ``[n_out, n_in]`` matrix's GPTQ beside the weights: its rows stacked into a new 16-bit
    tensor (``stacked``), a float32 copy of them and either three in² float32 matrices while the
    Cholesky factor is inverted (the factor, ``cholesky_inverse``'s working copy — CUDA's solves
    against an identity, as its meta kernel does — and the result) or, in the column loop, the
    inverse factor with the quantized copy and the lazy update's product (in² + 2 more copies)."""
    rows = n_in * n_out
    return (rows * dtype_bytes if stacked else 0) + max(3 * n_in * n_in * 4 + rows * 4, n_in * n_in * 4 + 3 * rows * 4)


def experts_per_batch(n_in: int, n_out: int, experts: int, dtype_bytes: int, budget: int = EXPERT_BATCH_BYTES) -> int:
    """How many of ``experts`` ``[n_out, n_in]`` matrices go through one column loop: as many as
    fit ``budget`` with their weights stacked, at least one."""
    return max(1, min(experts, budget // gptq_working_bytes(n_in, n_out, dtype_bytes, stacked=True)))
