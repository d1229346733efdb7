"""Named KV configurations that reproduce how an engine or paper stores its cache.

Each preset is a :class:`KVSpec`, its source (repository, file and commit where it was read) and a
fidelity label saying how sure the simulation is; ``wkvlab eval --kv <preset>`` refuses names it
does not know, and ``wkvlab presets`` lists them with their labels.

Presets of vLLM, SGLang and llama.cpp follow a release of the engine table
(:mod:`wkvlab.engine_releases`): ``vllm:int8_per_token_head`` is the newest modelled release,
``vllm@0.23:int8_per_token_head`` an older one, whose formats the table's ``kv_formats`` map.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from wkvlab.engine_releases import PRESET_ENGINES, Release, engine_table, preset_release, releases
from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.formats import HQQ_BITS

LLAMACPP_TYPES = ("f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
VLLM_DTYPES = {
    "fp8": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    "int8_per_token_head": "int8_pth",
    "fp8_per_token_head": "fp8_pth",
    "int4_per_token_head": "int4_pth",
    "nvfp4": "nvfp4",
    "nvfp4_4over6": "nvfp4_4over6",
}


FIDELITY = ("bit-exact", "engine-checked", "source-faithful", "approximate", "identity")
# The measured checks (wkvlab eval's KLD over the engine's own, same windows) behind every
# engine-checked label: a preset is engine-checked only for the exact name and spec a ratio within
# the band was recorded for (fidelity_checks.json says by which command, on which model).
CHECKS_FILE = Path(__file__).with_name("fidelity_checks.json")


@functools.lru_cache(maxsize=1)
def recorded_checks() -> tuple[float, tuple[dict, ...]]:
    """(band, checks) from :data:`CHECKS_FILE`."""
    data = json.loads(CHECKS_FILE.read_text(encoding="utf-8"))
    return float(data["band"]), tuple(data["checks"])


def measured_checks(name: str, spec: KVSpec) -> list[dict]:
    """Every recorded check of ``name`` for the spec that was measured (a preset whose spec changed
    since has none)."""
    return [c for c in recorded_checks()[1] if c["preset"] == name and c["spec"] == spec.canonical()]


def supports_label(check: dict) -> bool:
    """Whether a check backs ``engine-checked``: the one rule's verdict on its ratio − 1 against the band
    (``wkvlab engine compare``'s verdict column: Holm over the cache types of its run, the analytic interval
    over windows) is *equivalent within ±band*, so its whole adjusted interval lies inside 1 ± band. A point
    ratio does not back it (the ratio moves with the text), and neither does a 95% interval recorded
    without the rule's verdict."""
    return check.get("outcome") == "within"


def engine_checks(name: str, spec: KVSpec) -> list[dict]:
    """The recorded checks that make ``name`` engine-checked: same preset name, the spec that was
    measured, and the rule's verdict equivalent within ±band (:func:`supports_label`)."""
    return [c for c in measured_checks(name, spec) if supports_label(c)]


def _check_text(c: dict) -> str:
    interval, adjusted = c.get("interval"), c.get("adjusted")
    if not interval:
        shown = " (a point ratio, no interval recorded)"
    elif c.get("outcome") is None:
        shown = f" [{interval[0]}, {interval[1]}] (95%, no verdict of the rule recorded)"
    else:
        shown = f" [{interval[0]}, {interval[1]}] (95%), Holm-adjusted " + (f"[{adjusted[0]}, {adjusted[1]}]" if adjusted else "none") + f" → {c['verdict']}"
    return f"{c['ratio']:.2f}{shown} on {c['model'].split(' (')[0]}"


# llama.cpp cache types with a recorded check on the default model (tests/engines/test_fidelity_ratios.py re-measures
# those the rule decided, scripts/fidelity_table.py --record)
ENGINE_CHECKED_LLAMACPP = tuple(dict.fromkeys(
    c["preset"].split(":", 1)[1] for c in recorded_checks()[1] if c["preset"].startswith("llamacpp:") and c["model"].startswith("SmolLM2")))
VLLM_PTH_SOURCE = ("vllm-project/vllm vllm/v1/attention/ops/triton_reshape_and_cache_flash.py _reshape_cache_per_token_head, "
                   "as released: 0.24.0 (@ee0da84ab) to 0.34.0 (@62d4bc3c7, lines 231-234 and 263-266) add "
                   "tl.where(q >= 0, q + 0.5, q - 0.5) before the truncating int8 store (\"INT8 rounds explicitly\", "
                   "tests/quantization/test_per_token_kv_cache.py); 0.20.0 to 0.23.0 (@91df0fad4, line 207) store the clamp: "
                   "truncation (\"INT8 Triton stores truncate\"); FP8 casts round to nearest even in all")
SGLANG_FP4_SOURCE = ("FP4MXBlock16KVQuantizeUtil.batched_quantize: sglang-0.5.23 python/sglang/srt/layers/quantization/kvfp4_tensor.py "
                     "(the lines of sgl-project/sglang@0dae407b), FP4MXBlock16KVCacheMethod in fp4_kv_cache_quant_method.py "
                     "(--kv-cache-dtype fp4_mx_block16; fp4_e2m1 its deprecated name in 0.5.20, gone in 0.5.23)")
VLLM_NVFP4_SOURCE = ("vllm-project/vllm csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu @0cd789b3 reshape_and_cache_nvfp4_kernel "
                     "(cvt_warp_fp16_to_fp4 of quantization/fp4/nvfp4_utils.cuh @20b4ad8e; 4over6: cvt_warp_fp16_to_fp4_4over6), "
                     "global scale 1/k_scale; CacheDType in vllm/config/cache.py @002f10e0; read (SM120): FlashInfer FA2 "
                     "code*scale in the query dtype, exact, k_scale on the softmax scale (flashinfer-ai/flashinfer@fb28d724 "
                     "include/flashinfer/attention/prefill.cuh compute_qk/compute_sfm_v); SM100 trtllm-gen cubins not read")
# The block scale of every NVFP4 store wkvlab models multiplies by rcp.approx.ftz.f32(6.0f), computed on the GPU at run time.
NVFP4_RCP6_ASSUMED = ("1/6 is taken as float32 0x3E2AAAAB, the correctly rounded value: the kernels compute it on the GPU "
                      "(nvfp4_utils.cuh cvt_warp_fp16_to_fp4: SFValue = SFScaleVal * (vecMax * reciprocal_approximate_ftz(6.0f)), "
                      "an asm volatile rcp.approx.ftz.f32 the compiler cannot fold), no source read states what it returns for 6.0 "
                      "and no GPU was at hand to measure it; if it is one bit low (0x3E2AAAAA) block maxima at E4M3 ties of max/6 "
                      "round down: 3.12% of bf16 N(0,1) values change (wkvlab.formats.nvfp4_kv rcp6=, tests/formats/test_nvfp4_kv.py)")
SGLANG_NVFP4_SOURCE = ("scale rule: sglang-0.5.23 python/sglang/srt/layers/quantization/fp4_kv_cache_quant_method.py "
                       "NVFP4KVCacheMethod.load_scales_from_model (k_scale x6 on SM100 only when the checkpoint gives k_scale != 1.0; "
                       "sglang-0.5.20: x6 on SM100 always); store: sglang-0.5.23 NVFP4KVCacheMethod.quantize_and_store -> "
                       "kvfp4_tensor.py NVFP4KVQuantizeUtil.quantize(cache_k, k_scale) -> on SM100/SM120 flashinfer "
                       "nvfp4_kv_quantize(tensor_2d, global_scale) of flashinfer-python 0.7.2 (sglang 0.5.23 pins "
                       "flashinfer_python[cu13]==0.7.2; read in that wheel: flashinfer/quantization/fp4_quantization.py -> "
                       "csrc/fp4_kv_quantization.cu quantize_fp16_to_e2m1_with_scaling: sf = e4m3(rcp(global_scale) * (vecMax * "
                       "rcp(6))), outputScale = vecMax != 0 ? rcp(sf * global_scale) : 0, cvt.rn.satfinite.e2m1x2.f32 — with "
                       "k_scale 1.0 the arithmetic of vLLM's cvt_warp_fp16_to_fp4); SM90, and older main's --fp4-kv-cache-recipe nvfp4 "
                       "(+recipe=nvfp4; sgl-project/sglang@1c5f9e23 kv_cache_quant_method.py NVFP4Method.quantize_and_store -> "
                       "kvfp4_tensor.py NVFP4QuantizeUtil.fi_nvfp4_quantize): flashinfer fp4_quantize(x, 1/global_scale, "
                       "sf_vec_size=16) (flashinfer-ai/flashinfer@014327ab csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh "
                       "cvt_warp_fp16_to_fp4, the same arithmetic); decode read as read at sgl-project/sglang@1c5f9e23: "
                       "python/sglang/srt/layers/attention/flashinfer_backend.py FlashInferAttnBackend.forward_decode "
                       "(raw uint8 codes + E4M3 block scales to BatchDecodeWithPagedKVCacheWrapper(backend='fa2', "
                       "use_tensor_cores=True).run(k_scale=k_scales_gpu[layer], v_scale=..., kv_block_scales=...)) -> "
                       "FlashInfer FA2 NVFP4 read, code*scale in the query dtype, exact, k_scale on the softmax scale "
                       "(flashinfer-ai/flashinfer@fb28d724 include/flashinfer/attention/prefill.cuh compute_qk/compute_sfm_v, "
                       "flashinfer/decode.py run)")
SGLANG_NVFP4_DIFFERS = ("the store without checkpoint scales (k_scale = v_scale = 1.0; 6 for nvfp4-sm100, where flashinfer's "
                        "rcp.approx(6) of the global scale is taken as fl32(1/6) too and rcp(sf * 6) equals the modelled "
                        "rcp(sf * rcp(fl32(1/6))) since rcp(fl32(1/6)) = 6.0); SGLang 0.5.20 to 0.5.23 store through flashinfer "
                        "nvfp4_kv_quantize on SM100/SM120 (read in 0.7.2, 0.5.23's pin), which "
                        "tests vecMax != 0 where vLLM tests sf != 0, so a block whose scale rounds to E4M3 zero (max < 6 * 2^-10) "
                        "stores rcp(0) = inf times x as its codes instead of zeros: the bytes differ, every read (code * 0 * k_scale) "
                        "is 0 as modelled; with a checkpoint k_scale != 1 it takes rcp.approx(k_scale) where vLLM takes 1.0f/k_scale "
                        "(not modelled: the preset has no checkpoint scales); "
                        f"{NVFP4_RCP6_ASSUMED}; "
                        "the decode read; an extend over a cached prefix reads the prefix through bf16 into the FP8 workspace "
                        "instead (dequantize_prev_kv: formats nvfp4-fp8read[-sm100]), and a prompt attends its own tokens unquantized "
                        "(ragged wrapper on the raw K/V) or cast straight to FP8 (paged path: k.to(float8_e4m3fn)); SGLang@1c5f9e23 passes kv_block_scales=, a keyword FlashInfer renamed "
                        "kv_cache_sf (flashinfer-ai/flashinfer@c6cf5e43, #2954) before its FA2 kernels read NVFP4 (@4e642191, #3097), "
                        "so the FlashInfer build SGLang ran there was not pinned; decode's run() passes no sm_scale or soft cap "
                        "(the plan's 1/sqrt(head_dim) applies) and scales the output by v_scale in its dtype (6 on SM100), "
                        "neither modelled; on SM100 the trtllm_mha backend's trtllm-gen cubins were not read")
# SGLang --kv-cache-dtype fp8_e4m3 / fp8_e5m2, store and read (each read at the commit named)
SGLANG_FP8_SOURCE = ("store: sgl-project/sglang@000ccdba python/sglang/srt/mem_cache/memory_pool.py MHATokenToKVPool.set_kv_buffer "
                     "(cache_k.div_(k_scale) only when the layer has checkpoint scales, then cache_k.to(float8); the same lines in the "
                     "sglang-0.5.23 wheel); the cast: torch 2.13 "
                     "torch/headeronly/util/Float8_e4m3fn.h fp8e4m3fn_from_fp32_value (nearest even, saturating), Float8_e5m2.h "
                     "fp8e5m2_from_fp32_value (nearest even, +-inf from +-61440); read: @1c5f9e23 "
                     "python/sglang/srt/layers/attention/flashinfer_backend.py forward_decode -> flashinfer "
                     "BatchDecodeWithPagedKVCacheWrapper.forward(k_scale=layer.k_scale_float, v_scale=...) "
                     "(flashinfer-ai/flashinfer@fb28d724 include/flashinfer/attention/decode.cuh compute_qk: cast_load to float32, "
                     "exact; flashinfer/decode.py: sm_scale *= k_scale, out *= v_scale)")
SGLANG_FP8_DIFFERS = {
    "fp8_e4m3": ("saturation at +-448 is torch 2.13's cast; SGLang's own note (kv_cache_quant_method.py @1c5f9e23 "
                 "dequantize_prev_kv) says its e4m3fn cast gives NaN beyond +-448, as torch releases whose cast has no "
                 "saturating branch do (NaN above 464); the torch version SGLang runs was not pinned"),
    "fp8_e5m2": "",
}
LLAMACPP_SOURCE = "llama.cpp -ctk/-ctv, ggml-org/llama.cpp@0c1e57098 (vendored by llama-cpp-python 0.3.36)"
LLAMACPP_X86_SOURCE = (LLAMACPP_SOURCE + "; x86 AVX/AVX2 q8_0/q8_1 writer: ggml/src/ggml-cpu/arch/x86/quants.c quantize_row_q8_0 "
                       "@04e1dd75 (id = 127/max, _mm256_round_ps to nearest even)")


@dataclass(frozen=True)
class Preset:
    """A named configuration, where it comes from and how sure the simulation is.

    ``fidelity``: ``bit-exact`` (tested against the engine's own quantizer), ``engine-checked``
    (a KLD ratio against the real engine was recorded for exactly this spec, :data:`CHECKS_FILE`),
    ``source-faithful`` (read from the engine's or paper's source at a cited commit, tested
    against hand-computed values, not run), ``approximate`` (``differs`` says what differs),
    ``identity`` (nothing is quantized).
    """

    spec: KVSpec
    source: str
    fidelity: str = "approximate"
    differs: str = ""
    release: Release | None = None  # the engine release modelled (engine_releases), None for presets of no engine table

    def describe(self) -> str:
        """The fidelity label with its qualification, for notes and tables."""
        return f"{self.fidelity}: {self.differs}" if self.differs else self.fidelity


def _llamacpp(k: str, v: str, x86: bool = False, engine: str = "") -> Preset:
    """llama.cpp ``-ctk k -ctv v`` (see :data:`LLAMACPP_SOURCE`).

    * The cache stores blocks of 32 along head_dim (ggml types, bit-exact with ``gguf.quants``, the
      reference quantizers ``ggml-quants.c``).
    * PR #21038 rotates Q/K by a Hadamard transform when K is quantized and V (with the inverse on
      the output) when V is, only when head_dim is a multiple of 64: K's block is the largest power
      of two ≥ 64 dividing head_dim, V's is 64 (:meth:`KVSpec.rotation_blocks`);
      ``LLAMA_ATTN_ROT_DISABLE=1`` turns it off: append ``+norot``.
    * A quantized V needs flash attention; ggml's CPU flash attention converts Q to K's dot
      type — q8_0 (or q8_1, the same values) for every quantized K here, fp16 for an f16 K
      (``q=fp16``, applied beside a quantized V) — before the Q·K products.
    * ``x86`` (the ``llamacpp-x86:`` presets): the q8_0 cache and the Q conversion go through
      ``arch/x86/quants.c``'s AVX/AVX2 writer instead (:mod:`wkvlab.formats.ggml_x86`).
    """
    quantized_k = k != "f16"
    engine = engine or ("llamacpp-x86" if x86 else "llamacpp")
    name = f"{engine}:{k}" if k == v else f"{engine}:{k}/{v}"
    q8 = "q8_0-x86" if x86 else "q8_0"
    q = q8 if quantized_k else ("fp16" if v != "f16" else "none")
    cache = (lambda t: "q8_0-x86" if t == "q8_0" else t) if x86 else (lambda t: t)
    spec = KVSpec(k=cache(k), v=cache(v), rotate=-2 if (quantized_k or v != "f16") else 0, q=q, name=name)
    return Preset(spec, LLAMACPP_X86_SOURCE if x86 else LLAMACPP_SOURCE, "source-faithful")


def _labelled(preset: Preset) -> Preset:
    """The label the recorded evidence supports: ``identity`` when nothing is quantized,
    ``engine-checked`` only with a recorded check (:func:`engine_checks`), else as built."""
    if preset.spec.is_identity:
        return replace(preset, fidelity="identity", differs="nothing is quantized: K/V stay at model precision"
                       + (" (llama.cpp stores them as f16; the engine baseline of docs/engines.md is this very cache)"
                          if preset.spec.name.startswith("llamacpp:") else ""))
    measured = measured_checks(preset.spec.name, preset.spec)
    backing = [c for c in measured if supports_label(c)]
    others = [c for c in measured if not supports_label(c)]
    band = f"±{recorded_checks()[0]:.0%}"
    outside = (f"measured against the engine, KLD ratio {', '.join(map(_check_text, others))}: "
               f"not shown equivalent within {band}, so not engine-checked there") if others else ""
    if backing:
        text = (f"KLD ratio to the engine's own {', '.join(map(_check_text, backing))}"
                + (f"; {outside}" if outside else "") + " (src/wkvlab/kv/fidelity_checks.json)")
        return replace(preset, fidelity="engine-checked", differs=text)
    if outside:
        text = f"{outside} (src/wkvlab/kv/fidelity_checks.json)"
        return replace(preset, differs=f"{preset.differs}; {text}" if preset.differs else text)
    return preset


def _release_format(release: Release, fmt: str, dtype: str, name: str) -> str:
    """``fmt`` as ``release`` stores it (its ``kv_formats``), or a one-line ConfigError when the release has no
    such cache dtype (the table's KV entry needs a feature the release lacks)."""
    fmt = release.kv_format(fmt)
    entry = engine_table()[release.engine]["kv"].get(fmt, {})
    if entry.get("needs") and entry["needs"] not in release.features:
        newest = engine_table()[release.engine]["default_version"]
        raise ConfigError(f"{release.label} has no {dtype} KV cache ({entry.get('since', 'a newer release')}); "
                          f"write {name.split('@')[0].split(':')[0]}:{name.partition(':')[2]} for the newest modelled release ({newest})")
    return fmt


def _vllm(rest: str, release: Release, engine: str) -> Preset:
    name = f"{engine}:{rest}"
    fmt = _release_format(release, VLLM_DTYPES[rest], f"--kv-cache-dtype {rest}", name)
    spec = KVSpec(k=fmt, v=fmt, name=name)
    if rest.endswith("_per_token_head") and rest != "int4_per_token_head":  # the dtype decides the source, whatever format the release stores
        return Preset(spec, f"vLLM --kv-cache-dtype {rest}: {VLLM_PTH_SOURCE}", "source-faithful")
    if fmt == "int4_pth":
        return Preset(spec, "vLLM int4_per_token_head: vllm-project/vllm@055e47c2 (re-read; write path as at @a7f284a2) vllm/v1/attention/ops/int4_per_token_head.py: "
                      "single_rht, then asymmetric INT4; re-read unchanged at @18829594 vllm/v1/attention/ops/triton_quant_kv/int4_per_token_head.py", "source-faithful")
    if fmt.startswith("nvfp4"):
        return Preset(spec, f"vLLM --kv-cache-dtype {rest}: {VLLM_NVFP4_SOURCE}", "source-faithful",
                      "the store as vLLM's kernel writes it with k_scale = v_scale = 1.0 (no checkpoint scales); the attention "
                      "readers (trtllm-gen on SM100, FlashInfer FA2 on SM120) were not read and are taken as exact code x scale x k_scale; "
                      f"{NVFP4_RCP6_ASSUMED}")
    return Preset(spec, f"vLLM --kv-cache-dtype {rest}: scale 1.0 unless set (vllm-project/vllm@5d4420da vllm/attention/layer.py)",
                  "approximate", "FP8 rounding to nearest even with saturation; vLLM's cast kernels were not read, only the scale rule")


def _vllm_fa3(rest: str, engine: str) -> Preset:
    fmt = VLLM_DTYPES[rest]
    spec = KVSpec(k=fmt, v=fmt, q="fp8_e4m3", name=f"{engine}:{rest}")
    return Preset(spec, "vLLM FP8 KV with Q in FP8 (FlashAttention-3, Triton: supports_quant_query_input), static q_scale "
                  "(vllm-project/vllm@5d4420da vllm/attention/layer.py)", "approximate",
                  "FP8 casts as for vllm:fp8 (cast kernels not read)")


# 16-bit arithmetic a preset does not model (measured by benchmarks/sixteen_bit.py, docs/kv.md "16-bit arithmetic")
KIVI_DIFFERS = ("KIVI quantizes in the model's dtype (fp16: min, max, (max-min)/(2^b-1), (x-min)/scale, round, q*scale+min "
                "in quant/new_pack.py); here in float32 and rounded once: on random fp16 K-like tensors 0.06-0.3% of codes "
                "and 62-74% of dequantized values differ by a 16-bit rounding (bf16: 0.5-2.4% of codes)")


def _kivi(bits: str) -> Preset:
    # KIVI (jy-yuan/KIVI @876b4d2d, models/llama_kivi.py + quant/new_pack.py): keys per channel in
    # groups of G tokens, flushed when the full-precision part reaches R; values per token in groups
    # of G along head_dim, the R most recent kept at full precision before the new one is appended
    # (a window of R + 1 as a query sees it); both asymmetric, scale (max-min)/(2^b-1), float minimum.
    # G = 32, R = 128 as in the paper's main configuration (the repo takes both as arguments).
    spec = KVSpec(k=f"int{bits}-c32", v=f"int{bits}-g32-asym", k_residual=128, v_window=129, name=f"kivi{bits}")
    return Preset(spec, "KIVI: jy-yuan/KIVI@876b4d2d models/llama_kivi.py, quant/new_pack.py", "source-faithful", KIVI_DIFFERS)


def _sglang_fp8(dtype: str, engine: str) -> Preset:
    """``sglang:fp8_e4m3`` / ``sglang:fp8_e5m2`` (see :data:`SGLANG_FP8_SOURCE`).

    Without checkpoint scales the layer's k_scale is None, so ``set_kv_buffer`` divides by nothing and
    the cache holds ``x.to(float8)``: torch's cast, which saturates E4M3 but sends E5M2 past ±61440 to
    ±inf (``fp8_e5m2-nosat``). The FlashInfer read converts each FP8 value exactly and applies the
    (absent) scales to the softmax scale and the output, so the attention sees exactly the stored value.
    """
    fmt = "fp8_e5m2-nosat" if dtype == "fp8_e5m2" else dtype
    spec = KVSpec(k=fmt, v=fmt, name=f"{engine}:{dtype}")
    return Preset(spec, f"SGLang --kv-cache-dtype {dtype} without checkpoint scales: {SGLANG_FP8_SOURCE}", "source-faithful",
                  SGLANG_FP8_DIFFERS[dtype])


EXL3_SOURCE = "ExLlamaV3 cache: turboderp-org/exllamav3@4f8ad012 exllamav3_ext/cache/q_cache_kernels.cuh"
EXL3_QUANT_DIRECT = ("attention (ExLlamaV3 1.6.5 wheel): modules/attention_fn/dispatch.py attn_dispatch quantizes the chunk's own K/V "
                     "into the cache first (update_kv_direct) and reads the packed cache with k=None, v=None "
                     "(triton_paged.py fn_triton_paged_attn_{decode,prefill}_qc, _qc_load_kt/_qc_load_v)")
EXL3_QUANT_DIRECT_DIFFERS = ("1.6.5 takes this path for fp16 queries, head_dim a multiple of 32 up to 512, no compander and no varlen "
                             "batch; otherwise it dequantizes with get_kv and attends the chunk's own K/V at fp16 (the read of "
                             "exl3-fa@0.0.28, with 1.6.5's midpoint grid). Its kernels rotate q and the output by H32/sqrt(32) in fp16 "
                             "instead of dequantizing K/V back (equal in exact arithmetic), and prefill stages the window through an "
                             "fp16 scratch: fp16 rounding not modelled")
EXL3_OLD_READ = ("ExLlamaV3 0.0.28 (turboderp-org/exllamav3@ea87af6e): exllamav3/modules/attn.py get_layer dequantizes the old cache "
                 "to fp16, flash_attn_with_kvcache(k=, v=) attends the chunk's own K/V unquantized, update_layer quantizes it after "
                 "(read at @00ad26e8, unchanged to v0.0.28); cache: exllamav3_ext/cache/q_cache_kernels.cuh quant_block, lrintf "
                 "onto the integer grid (exl3rn_<b>)")


def _exl3(rest: str, release: Release | None = None, typed: str = "exl3-fa") -> Preset | None:
    """``exl3:k<b>v<b>``: every token, the current one included, attends to quantized K/V.

    ``exl3-fa:`` follows ExLlamaV3's releases (the ``exllamav3`` entry of engines.yaml): 1.6.5 (the default)
    quantizes a chunk's own K/V into the cache before the attention reads it (feature
    ``exl3_quant_direct_attention``), the spec of ``exl3:``; ``exl3-fa@0.0.28:`` is the older read — the old cache
    dequantized to fp16, the chunk's own K/V attended unquantized and quantized only afterwards (in
    decoding, ``+pastonly``) — with that release's rounding grid (its ``kv_formats``)."""
    match = re.fullmatch(r"k([2-8])v([2-8])", rest)
    if not match:
        return None
    kb, vb = match.groups()
    if release is None:
        spec = KVSpec(k=f"exl3_{kb}", v=f"exl3_{vb}", name=f"exl3:{rest}")
        return Preset(spec, EXL3_SOURCE, "source-faithful")
    direct = "exl3_quant_direct_attention" in release.features
    spec = KVSpec(k=release.kv_format(f"exl3_{kb}"), v=release.kv_format(f"exl3_{vb}"), pastonly=not direct, name=f"{typed}:{rest}")
    if direct:
        return Preset(spec, f"{EXL3_SOURCE}; {EXL3_QUANT_DIRECT}", "source-faithful", EXL3_QUANT_DIRECT_DIFFERS)
    return Preset(spec, EXL3_OLD_READ, "source-faithful")


def lookup_preset(text: str) -> KVSpec | None:
    """The spec of a preset name, or None when ``text`` is not a preset (a plain format)."""
    preset = describe_preset(text)
    return preset.spec if preset else None


def describe_preset(text: str) -> Preset | None:
    """The preset named ``text`` with the label its evidence supports, or None for a plain format."""
    preset = _build_preset(text)
    return _labelled(preset) if preset is not None else None


def _build_preset(text: str) -> Preset | None:
    """The preset with the engine release it models (:func:`wkvlab.engine_releases.preset_release`)."""
    key = text.strip().lower()
    engine = key.partition(":")[0]
    release = preset_release(engine) if ":" in key else None
    preset = _preset_of(key, engine.partition("@")[0], engine, release)
    return replace(preset, release=release) if preset is not None else None


def _preset_of(key: str, engine: str, typed: str, release: Release | None) -> Preset | None:
    """``engine``: the engine part without ``@``; ``typed``: as written (it names the spec)."""
    if key in ("kivi2", "kivi4"):
        return _kivi(key[-1])
    shorthand = re.fullmatch(r"k(16|8|4|2)v(16|8|4|2)|kv(16|8|4|2)", key)
    if shorthand:
        # KVTuner's bit-pair names (Li et al., ICML 2025: KV8, K8V4, KV4, K4V2, KV2) as wkvlab's own
        # per-(token, head) integer formats; 16 = the cache at model precision. A shorthand, not KVTuner's quantizer.
        kb, vb = (shorthand.group(3),) * 2 if shorthand.group(3) else shorthand.group(1, 2)
        k, v = ("fp16" if b == "16" else f"int{b}" for b in (kb, vb))
        return Preset(KVSpec(k=k, v=v), f"bit pair K{kb}V{vb}: wkvlab {k} keys, {v} values (per token and head)",
                      "approximate", "KVTuner's names for wkvlab's own per-(token, head) integer formats, not KVTuner's quantizer")
    _, sep, rest = key.partition(":")
    if engine == "kvquant":
        match = re.fullmatch(r"([2-4])(-1%)?", rest)
        if match:
            bits, sparse = int(match.group(1)), bool(match.group(2))
            spec = KVSpec(k=f"nuq{bits}-c", v=f"nuq{bits}", prerope=True, sinks=1, outliers=0.01 if sparse else 0.0, name=f"kvquant:{rest}")
            return Preset(spec, "KVQuant: pre-RoPE per-channel keys, per-token values, non-uniform codebooks, first token fp16, optional 1% outliers",
                          "approximate", "codebooks by unweighted k-means (KVQuant weights by Fisher information, which needs gradients)")
    if not sep:
        return None
    if engine in ("llamacpp", "llamacpp-x86"):
        k, _, v = rest.partition("/")
        v = v or k
        if k in LLAMACPP_TYPES and v in LLAMACPP_TYPES:
            return _llamacpp(k, v, x86=engine == "llamacpp-x86", engine=typed)
    elif engine == "vllm" and rest in VLLM_DTYPES:
        return _vllm(rest, release, typed)
    elif engine == "vllm-fa3" and rest in ("fp8", "fp8_e4m3"):
        return _vllm_fa3(rest, typed)
    elif engine == "sglang" and rest in ("fp4_e2m1", "fp4_mx_block16"):
        # one kernel: fp4_mx_block16 is SGLang's current name, fp4_e2m1 the name wkvlab's format and older SGLang use
        spec = KVSpec(k="fp4_e2m1", v="fp4_e2m1", name=f"{typed}:{rest}")
        return Preset(spec, f"SGLang --kv-cache-dtype fp4_mx_block16 (formerly fp4_e2m1; older main's --fp4-kv-cache-recipe mxfp4/blockfp4): "
                      f"{SGLANG_FP4_SOURCE}", "source-faithful")
    elif engine == "sglang" and rest == "nvfp4":
        fmt = _release_format(release, "nvfp4", "--kv-cache-dtype nvfp4", f"{typed}:{rest}")
        return Preset(KVSpec(k=fmt, v=fmt, name=f"{typed}:{rest}"), f"SGLang --kv-cache-dtype nvfp4 without checkpoint scales (k_scale 1.0; "
                      f"the decode read): {SGLANG_NVFP4_SOURCE}", "source-faithful", SGLANG_NVFP4_DIFFERS)
    elif engine == "sglang" and rest in ("fp8_e4m3", "fp8_e5m2"):
        return _sglang_fp8(rest, typed)
    elif engine == "hf-quanto" and rest in ("int2", "int4"):
        # transformers 5.24 QuantizedCache(backend="quanto") (cache_utils.py QuantizedLayer.update,
        # QuantoQuantizedLayer): optimum-quanto 0.2.7 MaxOptimizer + quantize_affine with axis=0 and
        # q_group_size 64 — groups of 64 consecutive values of a token (along head_dim), scale
        # (max - min)/(2^b - 1), float shift -min, codes round((x + shift)/scale) half to even,
        # dequantized scale*q - shift, in the cache's dtype (quanto<b>; in float32 int<b>-g64-asym). The first update quantizes the
        # prompt but returns it unquantized; decoded tokens pile up to residual_length 128, then the
        # whole cache is re-quantized (near-idempotent: the replay test matches to 1e-6). prefill=1:
        # decoding from a one-token prompt, as every preset here measures; +prefill=L for a prompt of L.
        bits = rest[-1]
        spec = KVSpec(k=f"quanto{bits}", v=f"quanto{bits}", residual=128, prefill=1, name=f"hf-quanto:{rest}")
        return Preset(spec, "transformers 5.24 src/transformers/cache_utils.py QuantizedLayer.update + QuantoQuantizedLayer; "
                      "optimum-quanto 0.2.7 MaxOptimizer, quantize_affine (tests/kv/test_quantized_cache_replay.py replays it)",
                      "source-faithful")
    elif engine == "hf-hqq" and rest in tuple(f"int{b}" for b in HQQ_BITS):
        # transformers 5.24 QuantizedCache(backend="hqq") with its defaults (cache_utils.py HQQQuantizedLayer:
        # nbits, axis_key = axis_value = 0, q_group_size 64, residual_length 128): hqq 0.2.8.post1's
        # Quantizer.quantize on the whole cache (mobiusml/hqq@e0b1d00e hqq/core/quantize.py, optimize.py's
        # proximal zero-point solver; wkvlab/formats/hqq.py), re-quantized whole at every flush (wkvlab/kv/requant.py).
        # prefill=1: decoding from a one-token prompt, as every preset here measures; +prefill=L for a prompt of L.
        bits = rest[3:]
        spec = KVSpec(k=f"hqq{bits}-g64", v=f"hqq{bits}-g64", residual=128, prefill=1, name=f"hf-hqq:{rest}")
        return Preset(spec, "transformers 5.24 src/transformers/cache_utils.py QuantizedLayer.update + HQQQuantizedLayer; "
                      "hqq 0.2.8.post1 (mobiusml/hqq@e0b1d00e) Quantizer.quantize, optimize_weights_proximal_legacy "
                      "(tests/kv/test_hqq_cache_replay.py replays it)",
                      "source-faithful", "each sequence is quantized as its own tensor (generate with batch 1; a batch of B "
                      "shares hqq's groups and early stop across sequences)")
    elif engine == "qserve" and rest == "kv4":
        # QServe/QoQ (Lin et al. 2024): SmoothAttention with α = 0.5, then per-head asymmetric 4-bit.
        spec = KVSpec(k="int4", v="int4", smooth=0.5, name="qserve:kv4")
        return Preset(spec, "QServe KV4: SmoothAttention (λ = max|K|^0.5, RoPE pairs shared) + per-head asymmetric INT4", "approximate",
                      "from the QServe paper; its kernels (scale/zero layout, rounding) were not read")
    elif engine in ("exl3", "exl3-fa"):
        preset = _exl3(rest, release, typed)
        if preset is not None:
            return preset
    raise ConfigError(f"unknown KV preset {key!r}; known: {', '.join(preset_names())}")


def preset_names() -> list[str]:
    return (
        [f"llamacpp:{t}" for t in LLAMACPP_TYPES]
        + ["llamacpp:q8_0/q4_0", "llamacpp:<k>/<v>", "llamacpp:q4_0+norot", "llamacpp:f16/q4_0", "llamacpp-x86:q8_0", "llamacpp-x86:q8_0/q4_0",
           "llamacpp-x86:<k>/<v>"]
        + [f"vllm:{d}" for d in VLLM_DTYPES] + ["vllm@0.23:int8_per_token_head"]
        + ["vllm-fa3:fp8_e4m3", "vllm@0.27:fp8_e4m3+scales=calculate", "vllm:fp8_e4m3+scales=amax448", "vllm:fp8_e4m3+scales=amax448-head",
           "sglang:fp4_mx_block16", "sglang:fp4_e2m1", "sglang:nvfp4", "sglang:fp4_e2m1+recipe=nvfp4", "sglang@0.5.20:fp4_e2m1+recipe=nvfp4-sm100",
           "sglang:fp8_e4m3", "sglang:fp8_e5m2",
           "exl3:k<b>v<b>", "exl3-fa:k<b>v<b>", "exl3-fa@0.0.28:k<b>v<b>", "kivi2", "kivi4", "qserve:kv4", "hf-quanto:int2", "hf-quanto:int4",
           *(f"hf-hqq:int{b}" for b in HQQ_BITS),
           "kvquant:4", "kvquant:3", "kvquant:2", "kvquant:4-1%", "kvquant:3-1%", "kvquant:2-1%", "K<b>V<b>", "KV<b>"]
    )


# Options that are the engine's own settings (llama.cpp's LLAMA_ATTN_ROT_DISABLE, vLLM's FP8 scale
# rules, QuantizedCache's residual_length and prompt length): source-faithful with them appended.
ENGINE_OPTIONS = {"llamacpp": ("norot",), "llamacpp-x86": ("norot",), "vllm": ("scales=",), "vllm-fa3": ("scales=",),
                  "hf-quanto": ("residual=", "prefill="), "hf-hqq": ("residual=", "prefill="), "sglang": ("recipe=",)}


def _spec_release(name: str) -> Release | None:
    """The release a spec named after a versioned preset (``vllm@0.23:...``) models; None otherwise."""
    engine, sep, _ = name.strip().lower().partition(":")
    if not sep or engine.partition("@")[0] not in PRESET_ENGINES:
        return None
    return preset_release(engine)


def release_format(name: str, fmt: str) -> str:
    """``fmt`` (an option's target, e.g. ``recipe=nvfp4-sm100``) as the release of preset ``name`` stores it."""
    release = _spec_release(name)
    return release.kv_format(fmt) if release is not None else fmt


def check_release_scales(name: str, mode: str) -> None:
    """``scales=calculate`` is vLLM's ``--calculate-kv-scales``: refused, in one line, for a release without it."""
    release = _spec_release(name)
    if mode != "calculate" or release is None or release.engine != "vllm" or "calculate_kv_scales" in release.features:
        return
    last = next(r for r in releases("vllm") if "calculate_kv_scales" in r.features)
    engine, _, dtype = name.strip().lower().partition(":")
    raise ConfigError(f"{release.label} has no --calculate-kv-scales ({last.label} is the last release with it): write "
                      f"{engine.partition('@')[0]}@{last.key}:{dtype.split('+')[0]}+scales=calculate, or +scales=amax448 for "
                      f"checkpoint scales (what {release.label} loads)")


# Why +scales=calculate can measure far worse than scale 1.0 (issue 41: Qwen2.5-1.5B, KLD 2.00 vs 0.17): a real effect
# of vLLM's rule, not a defect of its simulation (kv/store.py _fp8_scale, as vllm/attention/layer.py calc_kv_scales).
CALCULATE_DIFFERS = (
    "scales=calculate: vLLM sets one k_scale per layer = max|K| over the whole first batch (every token, head and channel) / 200 "
    "(v_scale: max|V| / 100; vllm/attention/layer.py calc_kv_scales @5d4420da, K/V_SCALE_CONSTANT in vllm/envs.py); a key "
    "outlier channel sets it for every channel, and ordinary keys divided by it fall below E4M3's smallest normal (2^-6), where "
    "the step is k_scale x 2^-9 instead of 3 mantissa bits — while scale 1.0 only clips the outlier channel at 448 (a "
    "QKV-bias outlier is nearly constant over tokens, so clipping it barely moves softmax). Measured on a tiny Qwen2 with a "
    "key bias B planted on one RoPE pair (tests/plan/conftest.py build_planted; 512 tokens, ctx 64): KLD 0.00061 at scale "
    "1.0 for B = 60, 3000 and 30000; with calculated scales 0.00065, 0.00065 and 0.00339 (top-1 93.7% -> 86.5% at B 30000)")


def fidelity_of(spec: KVSpec) -> dict:
    """How sure a result computed with ``spec`` is about the engine or paper it is named after.

    ``{"label": ..., "differs": ..., "source": ...}`` for presets (options appended to a preset
    are noted: the label covers the preset as listed); plain formats name no engine.
    """
    base, *options = re.split(r"[+;]", spec.name) if spec.name else [""]
    try:
        preset = describe_preset(base) if base else None
    except Exception:  # a renamed spec file entry: not a preset
        preset = None
    if preset is None:
        return {"label": "no preset", "differs": "plain formats and options: named after no engine or paper", "source": ""}
    label, differs, source = preset.fidelity, preset.differs, preset.source
    if any(o.strip().lower().startswith("recipe=nvfp4") for o in options):
        differs, source = SGLANG_NVFP4_DIFFERS, SGLANG_NVFP4_SOURCE  # the recipe is another kernel than the preset's
    if preset.release is not None:  # the release the preset stands for; the source names where each line was read
        source = f"release modelled: {preset.release.describe()}; {source}"
    engine_name = base.strip().lower().partition(":")[0].partition("@")[0]
    covered = ENGINE_OPTIONS.get(engine_name, ())
    engine = [o for o in options if o.strip().lower().startswith(covered)] if covered else []
    extra = [o for o in options if o not in engine]
    if options and label not in ("identity", "approximate"):
        # the label covers the preset as listed: with options it is another spec, and no check names it
        if label == "engine-checked":
            differs = f"no ratio was measured for this spec ({base} without {'+'.join(options)} was)"
        label = "approximate" if extra else "source-faithful"
        if extra:
            differs = (differs + "; " if differs else "") + f"options {'+'.join(extra)} added to the preset are not part of it"
    elif extra and label == "approximate":
        differs = (differs + "; " if differs else "") + f"options {'+'.join(extra)} added to the preset are not covered by the label"
    if any(o.strip().lower() in ("scales=calculate", "scales=calc") for o in options):
        differs = (differs + "; " if differs else "") + CALCULATE_DIFFERS
    return {"label": label, "differs": differs, "source": source,
            "release": preset.release.describe() if preset.release is not None else ""}


def fidelity_note(spec: KVSpec) -> list[str]:
    """The one-line note a result table prints for a preset (none for plain formats)."""
    info = fidelity_of(spec)
    if info["label"] == "no preset":
        return []
    return [f"{spec.label}: {info['label']}" + (f" ({info['differs']})" if info["differs"] else "")]
