"""A per-layer plan in the forms engines and tools accept.

* wkvlab's own :class:`~wkvlab.kv.spec.KVSpec` file (``wkvlab eval --kv @plan.yaml``): the most
  common pair as the default, the other layers in ``layers``.
* vLLM: one ``--kv-cache-dtype`` for K and V of every layer, plus ``--kv-cache-dtype-skip-layers``
  (layer indices kept at the model dtype; ``vllm/config/cache.py kv_cache_dtype_skip_layers``). A
  plan is expressible when its quantized layers all use the same pair, K == V, of a dtype vLLM has.
* llama.cpp: ``-ctk``/``-ctv`` set one type per cache for *all* layers; per-layer types are not
  expressible. The line given uses, per cache, the type most of the plan's layers use, and its notes
  list the layers that differ. A quantized V cache needs ``-fa on`` (llama.cpp #10378).
* a layer-wise recipe JSON: per-layer K/V formats and bits (KVTuner's layer-wise K/V bit pairs) and
  the same map as ModelOpt ``quant_cfg`` globs over its ``k_bmm_quantizer``/``v_bmm_quantizer``.
"""
from __future__ import annotations

import re
import shlex
from collections import Counter
from dataclasses import dataclass

from wkvlab.kv.formats import get_kv_format
from wkvlab.kv.spec import KVSpec
from wkvlab.search.choices import FP16, Choice

# wkvlab element format -> vLLM --kv-cache-dtype value. wkvlab's int8/int4 are the same per-(token,
# head) symmetric/asymmetric grids as vLLM's *_per_token_head dtypes; vLLM stores the scale in fp32.
VLLM_DTYPES = {"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "int8": "int8_per_token_head", "int8_pth": "int8_per_token_head",
               "int4": "int4_per_token_head", "int4_pth": "int4_per_token_head", "fp8_pth": "fp8_per_token_head"}
# wkvlab element format -> llama.cpp cache type; int8/int4 have no per-vector llama.cpp type, the
# nearest block types (32 values per scale) stand in, and there is no 2-bit cache type at all.
LLAMACPP_TYPES = {"fp16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1", "q5_0": "q5_0",
                  "q5_1": "q5_1", "iq4_nl": "iq4_nl", "int8": "q8_0", "int8_pth": "q8_0", "int4": "q4_0", "int4_pth": "q4_0"}


@dataclass(frozen=True)
class EngineLine:
    engine: str
    argv: tuple[str, ...]
    exact: bool  # True: the engine runs exactly this plan's per-layer formats
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict:
        return {"engine": self.engine, "command": self.text(), "argv": list(self.argv), "exact": self.exact, "notes": list(self.notes)}


def plan_kvspec(plan: tuple[Choice, ...], name: str = "") -> KVSpec:
    default = Counter(plan).most_common(1)[0][0]
    layers = tuple((i, k, v) for i, (k, v) in enumerate(plan) if (k, v) != default)
    return KVSpec(k=default[0], v=default[1], layers=layers, name=name)


def _bits(fmt: str) -> float:
    return 16.0 if fmt in ("fp16", "bf16") else get_kv_format(fmt).bytes_per_vector(128) * 8 / 128


def vllm_line(plan: tuple[Choice, ...], model: str, extra: tuple[str, ...] = ()) -> EngineLine:
    quantized = sorted({c for c in plan if c != FP16})
    skips = [str(i) for i, c in enumerate(plan) if c == FP16]
    argv = ["vllm", "serve", model, *extra]
    if not quantized:
        return EngineLine("vllm", tuple(argv), True, ("every layer at the model dtype: no KV flag needed",))
    notes = []
    exact = len(quantized) == 1 and quantized[0][0] == quantized[0][1] and quantized[0][0] in VLLM_DTYPES
    if exact:
        dtype = VLLM_DTYPES[quantized[0][0]]
    else:
        # One dtype for every quantized layer: the most precise one the plan uses that vLLM has.
        formats = [f for pair in quantized for f in pair if f in VLLM_DTYPES]
        if not formats:
            return EngineLine("vllm", tuple(argv), False, (f"vLLM has no KV dtype for {', '.join(sorted({f for p in quantized for f in p}))}; "
                                                        "not expressible, served at the model dtype",))
        fmt = max(formats, key=_bits)
        dtype = VLLM_DTYPES[fmt]
        notes.append(f"not expressible in vLLM: it takes one dtype for K and V of all quantized layers, the plan mixes "
                     f"{', '.join(f'{k}/{v}' for k, v in quantized)}; this line uses {dtype} for all of them (more memory, at least as precise)")
    argv += ["--kv-cache-dtype", dtype]
    if skips:
        argv += ["--kv-cache-dtype-skip-layers", *skips]
    if dtype.endswith("per_token_head"):
        notes.append(f"{dtype}: recent vLLM (2026) with the Triton attention backend; scales are fp32 per token and head")
    return EngineLine("vllm", tuple(argv), exact, tuple(notes))


def llamacpp_line(plan: tuple[Choice, ...], model_gguf: str) -> EngineLine:
    """``-ctk``/``-ctv`` for all layers: per cache, the type most layers of the plan use."""
    notes = []
    chosen = []
    for side, used in (("K", [k for k, _ in plan]), ("V", [v for _, v in plan])):
        counts = Counter(used)
        missing = sorted(f for f in counts if f not in LLAMACPP_TYPES)
        if missing:
            notes.append(f"llama.cpp has no {side} cache type for {', '.join(missing)}")
        usable = [f for f in counts if f in LLAMACPP_TYPES] or ["fp16"]
        fmt = max(usable, key=lambda f: (counts[f], _bits(f)))  # most layers; ties to the more precise
        chosen.append(LLAMACPP_TYPES[fmt])
        if len(counts) > 1:
            others = sorted(f for f in counts if f != fmt)
            notes.append(f"{side}: the plan keeps {sum(counts[f] for f in others)} layers in {', '.join(others)}; "
                         f"llama.cpp runs every layer's {side} as {LLAMACPP_TYPES[fmt]}")
        if fmt.startswith("int"):
            notes.append(f"{side}: wkvlab's per-vector {fmt} is approximated by llama.cpp's {LLAMACPP_TYPES[fmt]} (32-value blocks, not the same grid)")
    k, v = chosen
    mixed = len(set(plan)) > 1 and (len({k for k, _ in plan}) > 1 or len({v for _, v in plan}) > 1)
    if mixed:
        notes.insert(0, "per-layer cache types are not expressible in llama.cpp (-ctk/-ctv apply to every layer); "
                        "this line is the plan's majority type per cache")
    exact = not mixed and not notes
    argv = ["llama-server", "-m", model_gguf]
    if (k, v) != ("f16", "f16"):
        argv += ["-fa", "on", "-ctk", k, "-ctv", v]
    return EngineLine("llama.cpp", tuple(argv), exact, tuple(notes))


def _nominal_bits(fmt: str) -> int:
    """Bits per value as the format is named (int4 → 4, q8_0 → 8, fp8_e4m3 → 8, fp16 → 16)."""
    match = re.match(r"(?:int|iq|q|fp)(\d+)", fmt)
    return int(match.group(1)) if match else 16


def _modelopt_bits(fmt: str):
    if fmt.startswith("fp8"):
        return [4, 3] if "e4m3" in fmt or fmt == "fp8_pth" else [5, 2]
    return _nominal_bits(fmt)


def layer_recipe(plan: tuple[Choice, ...], *, model: str, weights: str, keep_16bit: tuple[int, ...] = ()) -> dict:
    layers = [{"layer": i, "k": k, "v": v, "k_bits": _nominal_bits(k), "v_bits": _nominal_bits(v), "weights_16bit": i in keep_16bit}
              for i, (k, v) in enumerate(plan)]
    quant_cfg: dict = {}
    for i, (k, v) in enumerate(plan):
        for side, fmt in (("k", k), ("v", v)):
            key = f"*layers.{i}.*{side}_bmm_quantizer"
            quant_cfg[key] = {"enable": False} if fmt in ("fp16", "bf16") else {"num_bits": _modelopt_bits(fmt), "axis": None, "enable": True}
    return {
        "format": "wkvlab-layerwise-kv/1",
        "model": model,
        "weights": weights,
        "weights_16bit_layers": list(keep_16bit),
        "layers": layers,
        "kvtuner": {"k_bits": [x["k_bits"] for x in layers], "v_bits": [x["v_bits"] for x in layers]},
        "modelopt": {"quant_cfg": quant_cfg, "algorithm": "max",
                     "note": "ModelOpt glob form of the same map; ModelOpt's KV quantizers default to per-tensor scales, not wkvlab's per-(token, head) grid"},
    }
