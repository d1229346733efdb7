"""The precision an engine's attention reads dequantized K/V in, and the dtype a simulated layer computes in.

A 16-bit run (``--dtype bfloat16|float16``) models the engine serving the model at that dtype. Where
the engine's attention consumes the dequantized cache at the model's dtype, the simulation's one
rounding of the float32 ``code · scale`` to the run dtype is what the engine holds. Two engines read
it otherwise, and a bf16 tensor cannot hold what they hold:

* **llama.cpp (CPU)** never rounds dequantized K/V to 16 bits: its flash attention
  (``ggml_compute_forward_flash_attn_ext_f16_one_chunk``, ``ggml/src/ggml-cpu/ops.cpp`` at
  ggml-org/llama.cpp@0c1e57098bba43ac29e6e3b677cdceebdd22334f, the build llama-cpp-python 0.3.36
  vendors and the ``llamacpp:`` presets are checked against) scores a quantized K with K's own
  ``vec_dot`` against Q converted to K's ``vec_dot_type`` (f32 result), and turns a quantized V into
  float32 with ``v_to_float`` before ``ggml_vec_mad_f32``. Read dtype: float32. (Its CUDA
  tensor-core kernels convert quantized K/V to f16 first — ``launch_fattn`` →
  ``ggml_get_to_fp16_cuda`` in ``ggml/src/ggml-cuda/fattn-common.cuh``, same commit; not the build
  the presets model.)
* **ExLlamaV3** dequantizes its cache to fp16 (``cache.get_layer`` in ``exllamav3/modules/attn.py``
  at turboderp-org/exllamav3@00ad26e8) and attends in fp16. Read dtype: float16.

Every other preset (vLLM, SGLang, transformers' QuantizedCache) and every plain format reads at the
model's dtype: vLLM's FlashAttention/FlashInfer kernels convert FP8 or NVFP4 K/V to the query dtype
(:mod:`wkvlab.formats.nvfp4_kv` says what FA2 does), a bf16 model's quanto/hqq cache computes in bf16.

So a quantized layer of such an engine computes its attention in the read dtype's container
(:func:`work_dtype`): the keys and values enter it exactly (bf16 → float32 is exact), are quantized
in float32 as before and rounded once, to what the engine reads; the output returns to the run's
dtype. A float32 run changes nothing: it measures the cache alone, as every table in the docs does.

The table and :func:`engine_read` import no torch (the memory estimate uses them before any model loads).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# preset family (the part of KVSpec.name before ":") -> the dtype its attention reads dequantized K/V in
ENGINE_READ = {"llamacpp": "float32", "llamacpp-x86": "float32", "exl3": "float16", "exl3-fa": "float16"}
READ_BYTES = {"float32": 4, "float16": 2}


def engine_read(spec_name: str) -> str | None:
    """The read dtype's name for the preset family ``spec_name`` belongs to (options appended keep
    its family, and so does a release, ``exl3-fa@0.0.28:``), or None: the model's dtype."""
    family, colon, _ = spec_name.partition(":")
    return ENGINE_READ.get(family.strip().lower().partition("@")[0]) if colon else None


def engine_read_dtype(spec_name: str) -> "torch.dtype | None":
    """:func:`engine_read` as a torch dtype."""
    import torch

    read = engine_read(spec_name)
    return getattr(torch, read) if read else None


def work_dtype(run_dtype: torch.dtype, read: torch.dtype | None) -> torch.dtype:
    """The dtype a quantized layer's K/V and attention are held in: the run's, unless a 16-bit run
    models an engine that reads K/V in another precision — then that precision (float32 holds it
    exactly; float16 is ExLlamaV3's own attention dtype)."""
    if read is None or run_dtype.itemsize >= 4:  # float32/float64 runs: the cache alone
        return run_dtype
    return read


def mask_to(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """An additive float mask in ``dtype`` (sdpa wants the query's), its lowest value kept finite
    (a bf16 minimum is -inf in float16, and a fully masked row would turn NaN); bool masks as they are."""
    import torch

    if mask is None or not mask.is_floating_point() or mask.dtype == dtype:
        return mask
    return mask.to(dtype).clamp_(min=torch.finfo(dtype).min)
