"""A per-layer plan in the forms engines and tools accept.

* wkvlab's own :class:`~wkvlab.kv.spec.KVSpec` file (``wkvlab eval --kv @plan.yaml``, and
  ``wkvlab plan --kv @plan.yaml``): the most common pair as the default, the other layers in
  ``layers``.
* vLLM and llama.cpp lines: written by the planner's engine translation
  (:func:`wkvlab.plan.engines.kv_flags`, :func:`wkvlab.plan.launch.launch_command`), so that
  ``wkvlab plan --kv @plan.yaml`` prints the same flags. vLLM takes one dtype for K and V of every
  quantized layer plus ``--kv-cache-dtype-skip-layers``; llama.cpp one type per cache for all
  layers: a plan mixing more is run as the engine's closest line, flagged as an approximation.
* a layer-wise recipe JSON: per-layer K/V formats and bits (KVTuner's layer-wise K/V bit pairs) and
  the same map as ModelOpt ``quant_cfg`` globs over its ``k_bmm_quantizer``/``v_bmm_quantizer``.
"""
from __future__ import annotations

import re
from collections import Counter

from wkvlab.kv.spec import KVSpec
from wkvlab.search.choices import Choice

EXPORT_ENGINES = ("vllm", "llama.cpp")
DEFAULT_EXPORT_GPU = "H100-80GB"  # the device engine support is checked for when no --gpu was given


def plan_kvspec(plan: tuple[Choice, ...], name: str = "") -> KVSpec:
    default = Counter(plan).most_common(1)[0][0]
    layers = tuple((i, k, v) for i, (k, v) in enumerate(plan) if (k, v) != default)
    return KVSpec(k=default[0], v=default[1], layers=layers, name=name)


def engine_exports(desc, source, weights, spec: KVSpec, *, gpu: str | None, batch: int, context: int,
                   model_id: str | None = None) -> dict[str, dict]:
    """Per engine: the cache flags for ``spec`` and, where the engine also runs ``weights``, the whole line."""
    from wkvlab.plan.engines import check_support, kv_flags
    from wkvlab.plan.gpus import find_gpu
    from wkvlab.plan.launch import launch_command

    device = find_gpu(gpu or DEFAULT_EXPORT_GPU)
    out = {}
    for engine in EXPORT_ENGINES:
        kv, reasons, notes, warnings = kv_flags(engine, desc, spec, device)
        entry: dict = {"engine": engine, "gpu": device.name, "kv_args": list(kv.args) if kv else [], "env": list(kv.env) if kv else [],
                       "exact": bool(kv and kv.exact), "command": None, "argv": [], "prepare": [], "notes": reasons + notes + warnings}
        if gpu is None:
            entry["notes"].append(f"support checked for an {device.name} (no --gpu given)")
        if kv is not None:
            support = check_support(engine, desc, weights, spec, device)
            if support.accepted:
                cmd = launch_command(engine, source, weights, support, batch, context, model_id=model_id)
                entry.update(command=cmd.text(), argv=list(cmd.argv), prepare=list(cmd.prepare), version=cmd.version,
                             checked=cmd.checked, ready=cmd.ready)
                entry["notes"] += [n for n in cmd.notes if n not in entry["notes"]]
            else:
                entry["notes"].append(f"no launch line for {weights.label} weights: {support.reasons[0]}")
        out[engine] = entry
    return out


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
