"""What a KV spec does to one layer's queries, keys and values (pure tensor code, no hooks).

Order of operations, each optional, mirroring the engines:

0. In a 16-bit run of an engine whose attention reads dequantized K/V in another precision
   (llama.cpp's CPU kernel: float32; ExLlamaV3: fp16), Q, K and V enter that dtype first, so every
   stored copy is computed and held as the engine holds it (:mod:`wkvlab.kv.readprec`).
1. SmoothAttention (QServe): K / λ and Q · λ per channel, λ = (max pair norm of K)^α from
   calibration, shared by the two channels of each RoPE pair — equivalent to folding it into
   k_proj/q_proj before RoPE. Scores are unchanged without quantization.
2. Hadamard rotation of Q and K (when K is quantized) and of V (when V is; the output is rotated
   back by the caller). Scores and outputs are unchanged without quantization.
3. Quantization of K and V by their formats — keys before RoPE when the spec says ``prerope``
   (RoPE re-applied after dequantization); calibrated FP8 formats use per-layer or per-head scales
   instead of 1.0 (amax/448, the llm-compressor checkpoint convention — compressed-tensors ``calculate_qparams``, or vLLM's runtime
   ``calculate_kv_scales``: amax/200 for K, amax/100 for V); KVQuant's ``nuq`` formats use
   codebooks fitted on calibration samples.
4. Sink tokens restored to full precision: the first N, and with ``sinks=auto`` any token whose
   residual-stream peak marks it as an attention sink (KVSink).
5. Queries quantized where the spec says (vLLM's FP8 query on FlashAttention-3/Triton with its
   static per-tensor ``q_scale``, llama.cpp's Q conversion to K's ``vec_dot_type``: q8_0, or fp16 for
   an f16 K beside a quantized V).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from wkvlab.errors import ConfigError
from wkvlab.formats import fake_quant_fp8, fake_quant_ggml
from wkvlab.formats.hadamard import rotate
from wkvlab.kv.attention import KVSelection
from wkvlab.kv.calibrate import KVStats
from wkvlab.kv.formats import KVFormat
from wkvlab.kv.kvquant import fit_layer
from wkvlab.kv.override import apply_rope, undo_rope
from wkvlab.kv.readprec import engine_read_dtype, work_dtype
from wkvlab.kv.requant import FlushChain
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.tokens import quanto_prompt_exact

# preset families whose QuantizedCache backend stores a one-group prompt exactly (optimum-quanto 0.2.7)
SINGLE_GROUP_EXACT = ("hf-quanto",)

_FP8 = {"fp8_e4m3": ("e4m3", 448.0), "fp8_e5m2": ("e5m2", 57344.0)}
# vLLM's runtime rule (vllm/attention/layer.py ``calc_kv_scales`` @5d4420da, constants in vllm/envs.py):
# scale = amax over the first batch / Q_SCALE_CONSTANT (200), K_SCALE_CONSTANT (200), V_SCALE_CONSTANT (100).
VLLM_SCALE_CONSTANTS = {"q": 200.0, "k": 200.0, "v": 100.0}


def _quantize_query(query: torch.Tensor, q_format: str, scale: torch.Tensor | float = 1.0) -> torch.Tensor:
    if q_format == "q8_0":
        return fake_quant_ggml(query, "q8_0").to(query.dtype)
    if q_format == "q8_0-x86":
        from wkvlab.formats.ggml_x86 import fake_quant_q8_0_x86

        return fake_quant_q8_0_x86(query).to(query.dtype)
    if q_format == "fp16":
        return query.to(torch.float16).to(query.dtype)
    return fake_quant_fp8(query, "e4m3", scale).to(query.dtype)


def _fp8_scale(absmax: torch.Tensor, mode: str, side: str, fmax: float) -> torch.Tensor:
    """Calibrated scale: amax/448 per layer (``amax448``) or per KV head (``amax448-head``) — what
    llm-compressor stores as k_scale/v_scale (vllm-project/compressed-tensors@dc235db7
    ``calculate_qparams``: symmetric FP8, max|x| / 448) —, or vLLM's ``calculate`` rule."""
    amax = absmax.amax(dim=-1)[None, :, None, None] if mode == "amax448-head" else absmax.amax()
    divisor = VLLM_SCALE_CONSTANTS[side] if mode == "calculate" else fmax
    return torch.where(amax > 0, amax / divisor, torch.ones_like(amax))


class LayerStore:
    """Built once per layer and spec; applied on every forward."""

    def __init__(self, spec: KVSpec, layer: int, k_fmt: KVFormat, v_fmt: KVFormat, head_dim: int, stats: KVStats | None,
                 device: torch.device | str | None = None, kv_heads: int | None = None) -> None:
        # calibrated tensors (scales, λ, codebooks) live where the layer runs: stats read back from
        # the disk cache are CPU tensors, and a model spread over GPUs has layers on each
        layer_stats = stats.layer(layer, device) if stats is not None else None
        self.k_fmt, self.v_fmt = k_fmt, v_fmt
        k_block, v_block = spec.rotation_blocks(head_dim)
        self.rot_k = k_block if not k_fmt.is_identity else 0
        # the dtype the engine's attention reads dequantized K/V in (None: the model's); a layer that
        # quantizes nothing stays bit-identical to the model, so only quantized layers use it
        self.read = engine_read_dtype(spec.name) if not (k_fmt.is_identity and v_fmt.is_identity) else None
        self.rot_v = v_block if not v_fmt.is_identity else 0
        self.k_policy, self.v_policy = spec.token_policies(k_fmt, v_fmt)
        if kv_heads and spec.prefill and spec.name.partition(":")[0].strip().lower() in SINGLE_GROUP_EXACT:
            # one sequence per generate (batch 1): the prompt tensor holds kv_heads · prefill · head_dim values
            exact = lambda fmt: quanto_prompt_exact(kv_heads * spec.prefill * head_dim, fmt.block)  # noqa: E731
            self.k_policy = replace(self.k_policy, prompt_exact=exact(k_fmt))
            self.v_policy = replace(self.v_policy, prompt_exact=exact(v_fmt))
        self.sinks = spec.sinks
        self.sink_peak = spec.sink_ratio * float(layer_stats.hidden_peak_median) if spec.sink_ratio and stats is not None else 0.0
        # Q follows K's dot-product type where K is quantized; llama.cpp's fp16 Q (f16 K) wherever K or V is
        quantized = not k_fmt.is_identity or (spec.q == "fp16" and not v_fmt.is_identity)
        self.q_format = spec.q if quantized else "none"
        if spec.needs_calibration and stats is None:
            raise ConfigError(f"KV config {spec.label} needs calibration statistics; run it through wkvlab eval, which calibrates on held-out text")
        self.smooth = None
        if spec.smooth and not k_fmt.is_identity:
            lam = layer_stats.k_pair_absmax.clamp_min(1e-5) ** spec.smooth  # [kv_heads, head_dim/2]
            self.smooth = torch.cat([lam, lam], dim=-1)[None, :, None, :]
        self.prerope = spec.prerope and not k_fmt.is_identity
        self.k_quant = self._quantizer(k_fmt, spec.scales, "k", layer_stats.k_absmax if stats is not None else None)
        self.v_quant = self._quantizer(v_fmt, spec.scales, "v", layer_stats.v_absmax if stats is not None else None)
        # whole-cache formats (HQQ's QuantizedCache) are quantized per flush, not per write (kv/requant.py)
        self.k_whole, self.v_whole = k_fmt.requantizes, v_fmt.requantizes
        # vLLM quantizes Q with its static per-tensor q_scale: 1.0, or amax/200 with calculate_kv_scales
        self.q_scale = _fp8_scale(layer_stats.q_absmax, "calculate", "q", 448.0) if (spec.scales == "calculate" and self.q_format == "fp8_e4m3") else 1.0
        if k_fmt.calibrated or v_fmt.calibrated:
            bits = lambda f: int(f.name[3])  # noqa: E731 - nuq<b>[-c]
            fitted = fit_layer(layer_stats.k_pre_samples, layer_stats.v_samples,
                               bits(k_fmt) if k_fmt.calibrated else 4, bits(v_fmt) if v_fmt.calibrated else 4, spec.outliers)
            self.k_quant = fitted.quantize_keys if k_fmt.calibrated else self.k_quant
            self.v_quant = fitted.quantize_values if v_fmt.calibrated else self.v_quant

    @property
    def selection(self) -> KVSelection | None:
        """Per-side selections for :func:`mixed_attention`, or None when no view depends on the query."""
        if self.k_quant is None and self.v_quant is None:
            return None
        k = self.k_policy.selection() if self.k_quant is not None else None
        v = self.v_policy.selection() if self.v_quant is not None else None
        return None if (k is None and v is None) else KVSelection(k, v)

    @staticmethod
    def _quantizer(fmt: KVFormat, scales: str, side: str, absmax: torch.Tensor | None):
        if fmt.is_identity:
            return None
        if scales != "static" and fmt.name in _FP8:
            kind, fmax = _FP8[fmt.name]
            scale = _fp8_scale(absmax, scales, side, fmax)
            return lambda x: fake_quant_fp8(x, kind, scale)
        return fmt.quantize

    def flush_chains(self) -> tuple[FlushChain | None, FlushChain | None] | None:
        """Fresh per-side chains of a whole-cache format (None on a side stored per write), or None."""
        if not (self.k_whole or self.v_whole):
            return None
        return (FlushChain(self.k_quant, self.k_policy) if self.k_whole else None,
                FlushChain(self.v_quant, self.v_policy) if self.v_whole else None)

    def quantize_prerope(self, key: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Post-RoPE keys quantized before RoPE: undo RoPE, quantize, re-apply (no sinks)."""
        if rope is None:
            raise ConfigError("prerope needs the layer's rotary angles; this architecture does not pass position_embeddings")
        cos, sin = rope
        work = torch.promote_types(key.dtype, torch.float32)
        return apply_rope(self.k_quant(undo_rope(key.to(work), cos, sin)), cos, sin).to(key.dtype)

    def store_keys(self, key: torch.Tensor, rope, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Keys as stored; with ``prerope`` they are quantized before RoPE and RoPE is re-applied."""
        if self.k_whole:  # stored per flush: the chain builds what each query sees
            return key
        if not self.prerope:
            return self._store(key, self.k_quant, keep)
        return self.restore(key, self.quantize_prerope(key, rope), keep)

    def store_values(self, value: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """Values as stored on write (a whole-cache format's are built per flush: returned as given)."""
        return value if self.v_whole else self._store(value, self.v_quant, keep)

    def kept_tokens(self, n_tokens: int, residual: torch.Tensor | None, offset: int = 0, device: torch.device | None = None) -> torch.Tensor | None:
        """Bool ``[batch or 1, tokens]``: positions kept at model precision (first N, detected sinks)."""
        keep = None
        if self.sinks:
            keep = (torch.arange(offset, offset + n_tokens, device=device) < self.sinks)[None]
        if self.sink_peak:
            if residual is None:
                raise ConfigError("sinks=auto needs the decoder layers' inputs; this architecture does not expose them")
            # the residual is recorded at the decoder layer's input, before accelerate moves it to
            # this layer's GPU: the (tiny) mask goes where the keys are
            detected = (residual.float().abs().amax(-1) > self.sink_peak).to(device if device is not None else residual.device)
            keep = detected if keep is None else keep | detected
        return keep

    @staticmethod
    def restore(x: torch.Tensor, stored: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        return stored if keep is None else torch.where(keep[:, None, :, None], x, stored)

    def _store(self, x: torch.Tensor, quantize, keep: torch.Tensor | None = None) -> torch.Tensor:
        return x if quantize is None else self.restore(x, quantize(x).to(x.dtype), keep)

    def _smooth(self, query: torch.Tensor, key: torch.Tensor):
        if self.smooth is None:
            return query, key
        lam = self.smooth.to(key.dtype)
        n_rep = query.shape[1] // key.shape[1]
        return query * lam.repeat_interleave(n_rep, dim=1), key / lam

    def work_dtype(self, run_dtype: torch.dtype) -> torch.dtype:
        """What this layer's K/V and attention are held in, in a run at ``run_dtype`` (:mod:`wkvlab.kv.readprec`)."""
        return work_dtype(run_dtype, self.read)

    def query_side(self, query: torch.Tensor) -> torch.Tensor:
        """The query as the attention sees it when K/V come from a quantize-on-write cache."""
        query = query.to(self.work_dtype(query.dtype))  # llama.cpp's Q rounding is kept exact in float32 too
        if self.smooth is not None:
            n_rep = query.shape[1] // self.smooth.shape[1]
            query = query * self.smooth.to(query.dtype).repeat_interleave(n_rep, dim=1)
        if self.rot_k:
            query = rotate(query, self.rot_k)
        return _quantize_query(query, self.q_format, self.q_scale) if self.q_format != "none" else query

    def key_value_side(self, key: torch.Tensor, value: torch.Tensor):
        """Keys and values in the space the cache stores them (smoothed, rotated), not yet quantized,
        in the layer's work dtype: from there on every stored copy is computed and held in it."""
        work = self.work_dtype(key.dtype)
        key, value = key.to(work), value.to(work)
        if self.smooth is not None:
            key = key / self.smooth.to(key.dtype)
        if self.rot_k:
            key = rotate(key, self.rot_k)
        if self.rot_v:
            value = rotate(value, self.rot_v)
        return key, value

    def apply(self, query, key, value, rope=None, residual=None):
        """Transformed Q, K, V and their stored versions (for the teacher-forced simulation)."""
        query = self.query_side(query)
        key, value = self.key_value_side(key, value)
        keep = self.kept_tokens(key.shape[-2], residual, device=key.device)
        return query, key, self.store_keys(key, rope, keep), value, self.store_values(value, keep)
