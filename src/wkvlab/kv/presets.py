"""Named KV configurations that reproduce how an engine or paper stores its cache.

Each preset is a :class:`KVSpec` plus its source. Presets that need calibration, token-axis
groups or outlier handling (KIVI, KVQuant, QServe, HF quanto with its residual window of 128) are
added as the simulation grows; ``wkvlab eval --kv <preset>`` refuses names it does not know.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from wkvlab.kv.spec import KVSpec

LLAMACPP_TYPES = ("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
VLLM_DTYPES = {
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "int8_per_token_head": "int8_pth",
    "fp8_per_token_head": "fp8_pth",
    "int4_per_token_head": "int4_pth",
}


@dataclass(frozen=True)
class Preset:
    spec: KVSpec
    source: str


def _llamacpp(k: str, v: str) -> Preset:
    """llama.cpp ``-ctk k -ctv v`` as of 2026.

    * The cache stores blocks of 32 along head_dim (ggml types, bit-exact with ``gguf.quants``).
    * PR #21038 rotates Q/K/V by a Hadamard transform before quantized caches (blocks of 64 along
      head_dim, only when head_dim is a multiple of 64; ``LLAMA_ATTN_ROT_DISABLE=1`` turns it off:
      append ``+norot``). K is rotated when
      K is quantized, V (with the inverse on the output) when V is.
    * A quantized V needs flash attention; ggml's CPU flash attention converts Q to K's dot
      type — q8_0 for every quantized K here — before the Q·K products.
    """
    quantized_k = k != "f16"
    spec = KVSpec(
        k=k, v=v, rotate=-2 if (quantized_k or v != "f16") else 0, q="q8_0" if quantized_k else "none",
        name=f"llamacpp:{k}" if k == v else f"llamacpp:{k}/{v}",
    )
    return Preset(spec, "llama.cpp -ctk/-ctv with PR #21038 rotation and CPU flash-attention Q conversion")


def lookup_preset(text: str) -> KVSpec | None:
    """The spec of a preset name, or None when ``text`` is not a preset (a plain format)."""
    preset = describe_preset(text)
    return preset.spec if preset else None


def describe_preset(text: str) -> Preset | None:
    key = text.strip().lower()
    if key in ("kivi2", "kivi4"):
        bits = key[-1]
        # KIVI (Liu et al. 2024, github.com/jy-yuan/KIVI): keys per channel in groups of 32 tokens,
        # values per token (groups of 32 along head_dim), both asymmetric with a float minimum;
        # the newest tokens stay full precision until 128 of them have accumulated.
        spec = KVSpec(k=f"int{bits}-c32", v=f"int{bits}-g32-asym", residual=128, name=key)
        return Preset(spec, "KIVI: per-channel K (32-token groups), per-token V, residual 128 (flushed)")
    shorthand = re.fullmatch(r"k(16|8|4|2)v(16|8|4|2)|kv(16|8|4|2)", key)
    if shorthand:
        # KVTuner's bit-pair names (Li et al., ICML 2025: KV8, K8V4, KV4, K4V2, KV2) as wkvlab's own
        # per-(token, head) integer formats; 16 = the cache at model precision. A shorthand, not KVTuner's quantizer.
        kb, vb = (shorthand.group(3),) * 2 if shorthand.group(3) else shorthand.group(1, 2)
        k, v = ("fp16" if b == "16" else f"int{b}" for b in (kb, vb))
        return Preset(KVSpec(k=k, v=v), f"bit pair K{kb}V{vb}: wkvlab {k} keys, {v} values (per token and head)")
    engine, sep, rest = key.partition(":")
    if engine == "kvquant":
        match = re.fullmatch(r"([2-4])(-1%)?", rest)
        if match:
            bits, sparse = int(match.group(1)), bool(match.group(2))
            spec = KVSpec(k=f"nuq{bits}-c", v=f"nuq{bits}", prerope=True, sinks=1, outliers=0.01 if sparse else 0.0, name=f"kvquant:{rest}")
            return Preset(spec, "KVQuant: pre-RoPE per-channel keys, per-token values, non-uniform codebooks, first token fp16, optional 1% outliers")
    if not sep:
        return None
    if engine == "llamacpp":
        k, _, v = rest.partition("/")
        v = v or k
        if k in LLAMACPP_TYPES and v in LLAMACPP_TYPES:
            return _llamacpp(k, v)
    elif engine == "vllm" and rest in VLLM_DTYPES:
        fmt = VLLM_DTYPES[rest]
        source = "vLLM --kv-cache-dtype " + rest + (" (per-tensor scale 1.0: vLLM's default without calibrated scales)" if "pth" not in fmt else " (Triton backend, fp32 scale per token and head)")
        return Preset(KVSpec(k=fmt, v=fmt, name=f"vllm:{rest}"), source)
    elif engine == "sglang" and rest in ("fp4_e2m1", "fp8_e4m3", "fp8_e5m2"):
        spec = KVSpec(k=rest, v=rest, name=f"sglang:{rest}")
        return Preset(spec, "SGLang --kv-cache-dtype (FP8 with scale 1.0 unless the checkpoint has scales; FP4 per KVFP4QuantizeUtil)")
    elif engine == "hf-quanto" and rest in ("int2", "int4"):
        # transformers' QuantizedCache with the quanto backend: nbits, q_group_size 64 (consecutive
        # values of a token, i.e. along head_dim), affine with a float offset, residual_length 128
        # flushed all at once. At each flush quanto re-quantizes the dequantized old tokens too; with
        # groups inside one token that reproduces the same codes, so it is not simulated separately.
        bits = rest[-1]
        spec = KVSpec(k=f"int{bits}-g64-asym", v=f"int{bits}-g64-asym", residual=128, name=f"hf-quanto:{rest}")
        return Preset(spec, "transformers QuantizedCache(backend='quanto'): groups of 64 per token, residual 128")
    elif engine == "qserve" and rest == "kv4":
        # QServe/QoQ (Lin et al. 2024): SmoothAttention with α = 0.5, then per-head asymmetric 4-bit.
        spec = KVSpec(k="int4", v="int4", smooth=0.5, name="qserve:kv4")
        return Preset(spec, "QServe KV4: SmoothAttention (λ = max|K|^0.5, RoPE pairs shared) + per-head asymmetric INT4")
    elif engine == "exl3":
        match = re.fullmatch(r"k([2-8])v([2-8])", rest)
        if match:
            kb, vb = match.groups()
            spec = KVSpec(k=f"int{kb}-g32-sym", v=f"int{vb}-g32-sym", rotate=-1, name=f"exl3:{rest}")
            return Preset(spec, "exllamav3 cache: K and V bits separately, groups of 32 along head_dim, Hadamard rotation, fp16 absmax scale")
    from wkvlab.errors import ConfigError

    raise ConfigError(f"unknown KV preset {text!r}; known: {', '.join(preset_names())}")


def preset_names() -> list[str]:
    return (
        [f"llamacpp:{t}" for t in LLAMACPP_TYPES]
        + ["llamacpp:<k>/<v>"]
        + [f"vllm:{d}" for d in VLLM_DTYPES]
        + ["vllm:fp8_e4m3+scales=tensor", "vllm:fp8_e4m3+scales=head", "sglang:fp4_e2m1", "sglang:fp8_e4m3",
           "exl3:k<b>v<b>", "kivi2", "kivi4", "qserve:kv4", "hf-quanto:int2", "hf-quanto:int4",
           "kvquant:4", "kvquant:3", "kvquant:2", "kvquant:4-1%", "kvquant:3-1%", "kvquant:2-1%", "K<b>V<b>", "KV<b>"]
    )
