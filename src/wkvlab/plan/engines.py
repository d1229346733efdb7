"""Engine support matrix and launch lines: never print a command the engine would refuse.

Single-format facts (which weight formats and KV dtypes an engine accepts, from which compute
capability, since which version) are data in ``data/engines.yaml``. The rules about pairs and
layouts live here:

* vLLM, SGLang and TensorRT-LLM take one KV dtype for K and V; only vLLM keeps chosen layers at
  16 bit (``--kv-cache-dtype-skip-layers``); none takes a per-layer map.
* llama.cpp sets K and V separately (``-ctk``/``-ctv``) but has no per-layer types; a quantized V
  cache needs flash attention — without ``-fa on`` it refuses to create the context
  (llama.cpp #10378, #28524). Default CUDA builds compile flash-attention kernels only for
  K == V in {f16, bf16, q8_0, q4_0}: other pairs silently run attention on the CPU
  (llama.cpp #27109, #28455, #28633; fixed by building with ``-DGGML_CUDA_FA_ALL_QUANTS=ON``).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

import yaml

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.gpus import GPU
from wkvlab.plan.kv import KVLayout
from wkvlab.plan.memory import EngineSettings
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import linear_inventory
from wkvlab.plan.weights import WeightSpec, weight_format

ENGINES = ("vllm", "sglang", "llama.cpp", "trtllm")
COMMAND_ENGINES = ("vllm", "sglang", "llama.cpp")  # engines the planner writes launch lines for
_ENGINE_ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "llama_cpp": "llama.cpp",
                   "tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm", "trt-llm": "trtllm"}
_LLAMACPP_FAST_FA = {"fp16", "bf16", "q8_0", "q4_0"}


@dataclass(frozen=True)
class Support(JsonMixin):
    engine: str
    accepted: bool
    reasons: tuple[str, ...] = ()  # why the engine refuses the combination
    warnings: tuple[str, ...] = ()  # fallbacks and slow paths it takes silently
    notes: tuple[str, ...] = ()  # versions, checkpoints, sources
    row_scale_bytes: int | None = None  # the engine's per-row KV scale size, if it differs
    slow_path: bool = False  # accepted, but a kernel falls back to something much slower


@dataclass(frozen=True)
class LaunchCommand(JsonMixin):
    engine: str
    argv: tuple[str, ...]
    env: tuple[str, ...] = ()
    checkpoint: str = ""  # what the model argument must point at
    notes: tuple[str, ...] = ()

    def text(self) -> str:
        return " ".join([*self.env, shlex.join(self.argv)])


_MATRIX: dict[str, Any] | None = None


def matrix() -> dict[str, Any]:
    global _MATRIX
    if _MATRIX is None:
        text = resources.files("wkvlab.plan").joinpath("data/engines.yaml").read_text()
        _MATRIX = yaml.safe_load(text)["engines"]
    return _MATRIX


def normalize_engine(name: str | None) -> str | None:
    if name is None:
        return None
    key = name.strip().lower()
    key = _ENGINE_ALIASES.get(key, key)
    if key not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; use one of: {', '.join(ENGINES)}")
    return key


def check_support(engine: str, model: ModelDescription, weights: WeightSpec, kv: KVLayout,
                  gpu: GPU) -> Support:
    """Does ``engine`` accept this combination on ``gpu``, and what does it do silently?"""
    entry = matrix()[engine]
    display = entry["display"]
    reasons: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    w = entry["weights"].get(weights.format)
    if w is None:
        known = ", ".join(entry["weights"])
        reasons.append(f"{display} does not load {weights.format} weights (it takes: {known})")
    else:
        _check_format(w, display, weights.format, model, gpu, reasons, warnings, notes)
        group = weight_format(weights.format).group_size
        if group and engine != "llama.cpp":
            ragged = sorted({lin.in_features for lin in linear_inventory(model)
                             if lin.in_features % group and lin.layer not in weights.skip_layers})
            if ragged:
                reasons.append(f"{display} {weights.format}: input widths {ragged} are not multiples "
                               f"of the group size {group}; its kernels (Marlin) refuse such shapes")
        if weights.skip_layers:
            notes.append("16-bit layers must be excluded when the checkpoint is made (e.g. "
                         "llm-compressor `ignore=`, llama-quantize per-tensor types)")
    row_scale: int | None = None
    for name in sorted(kv.formats() | ({model.dtype} if kv.skip_layers or kv.skip_sliding else set())):
        k = entry["kv"].get(name)
        if k is None:
            reasons.append(f"{display} has no {name} KV cache (it takes: {', '.join(entry['kv'])})")
            continue
        _check_format(k, display, f"{name} KV cache", model, gpu, reasons, warnings, notes)
        if k.get("row_scale_bytes") is not None:
            row_scale = int(k["row_scale_bytes"])
    slow = _check_layout(engine, display, kv, reasons, warnings, notes)
    slow = slow or bool(w and w.get("slow"))
    return Support(engine, not reasons, tuple(reasons), tuple(dict.fromkeys(warnings)),
                   tuple(dict.fromkeys(notes)), row_scale, slow)


def _check_format(e: Mapping[str, Any], display: str, what: str, model: ModelDescription, gpu: GPU,
                  reasons: list[str], warnings: list[str], notes: list[str]) -> None:
    if e.get("min_sm") and gpu.sm < e["min_sm"]:
        reasons.append(f"{display} {what}: needs sm_{e['min_sm']}+, {gpu.name} is sm_{gpu.sm}"
                       + (f" — {e['reject_below']}" if e.get("reject_below") else ""))
    if e.get("moe_only") and not model.is_moe:
        reasons.append(f"{display} {what}: only for MoE models")
    if e.get("no_mla") and model.mla is not None:
        reasons.append(f"{display} {what}: not for MLA models")
    if e.get("moe_min_sm") and model.is_moe and gpu.sm < e["moe_min_sm"]:
        reasons.append(f"{display} {what}: MoE models need sm_{e['moe_min_sm']}+ for this format")
    if e.get("native_min_sm") and gpu.sm < e["native_min_sm"] and e.get("fallback"):
        warnings.append(f"{display} {what} on {gpu.name}: {e['fallback']}")
    if e.get("warn"):
        warnings.append(f"{display} {what}: {e['warn']}")
    if e.get("since"):
        notes.append(f"{display} {what}: since {e['since']}")
    if e.get("checkpoint"):
        notes.append(f"{display} {what}: checkpoint format {e['checkpoint']}")


def _check_layout(engine: str, display: str, kv: KVLayout, reasons: list[str], warnings: list[str],
                  notes: list[str]) -> bool:
    """Pair/layout rules; returns True when the engine takes a silent slow path."""
    if engine == "llama.cpp":
        if kv.overrides or kv.skip_layers or kv.skip_sliding:
            reasons.append("llama.cpp has no per-layer KV types (only -ctk/-ctv for all layers)")
        k, v = kv.default.k, kv.default.v
        if v not in ("fp16", "bf16"):
            notes.append("llama.cpp: a quantized V cache requires flash attention (-fa on); "
                         "without it the context is refused (llama.cpp #10378)")
        if k != v or k not in _LLAMACPP_FAST_FA:
            warnings.append(f"llama.cpp: default CUDA builds have no flash-attention kernel for "
                            f"K={k}, V={v}; attention silently runs on the CPU (~30x slower prefill, "
                            "llama.cpp #27109, #28455); build with -DGGML_CUDA_FA_ALL_QUANTS=ON")
            return True
        return False
    if kv.is_mixed:
        reasons.append(f"{display} takes one KV dtype for both K and V")
    if kv.overrides:
        reasons.append(f"{display} has no per-layer KV dtype map")
    if (kv.skip_layers or kv.skip_sliding) and engine != "vllm":
        reasons.append(f"{display} cannot keep chosen layers' KV at 16 bit")
    if (kv.skip_layers or kv.skip_sliding) and engine == "vllm":
        notes.append("vLLM: --kv-cache-dtype-skip-layers keeps the listed layers at the model dtype "
                     "(2026 main, vllm/config/cache.py)")
    return False


def checkpoint_name(model: ModelDescription, weights: WeightSpec, engine: str) -> str:
    base = (model.hf_id or model.name).rsplit("/", 1)[-1]
    if engine == "llama.cpp":
        arg = matrix()["llama.cpp"]["weights"][weights.format]["arg"]
        return f"./{base}-{arg}.gguf"
    if weights.format in ("bf16", "fp16", "fp8", "fp8-wo") and not weights.skip_layers:
        return model.hf_id or model.name  # the original checkpoint, quantized at load time
    return f"./{base}-{weights}".replace(";", "_").replace("=", "").replace(",", "_")


def launch_command(engine: str, model: ModelDescription, weights: WeightSpec, kv: KVLayout,
                   gpu: GPU, batch: int, ctx: int,
                   settings: EngineSettings = EngineSettings()) -> LaunchCommand:
    """The launch line; raises ConfigError rather than print one the engine rejects."""
    support = check_support(engine, model, weights, kv, gpu)
    if not support.accepted:
        raise ConfigError(f"{engine} rejects {weights} x {kv} on {gpu.name}: {support.reasons[0]}")
    if engine not in COMMAND_ENGINES:
        raise ConfigError(f"no launch line for {engine}; the planner writes them for "
                          + ", ".join(COMMAND_ENGINES))
    entry = matrix()[engine]
    ckpt = checkpoint_name(model, weights, engine)
    w_arg = entry["weights"][weights.format]["arg"]
    notes = [n for n in support.notes if "checkpoint" in n]
    if ckpt != (model.hf_id or model.name):
        notes.append(f"{ckpt}: {model.hf_id or model.name} quantized to {weights}")
    env: tuple[str, ...] = ()
    if engine == "llama.cpp":
        k, v = (entry["kv"][x]["arg"] for x in (kv.default.k, kv.default.v))
        argv = ["llama-server", "-m", ckpt, "-ngl", "999", "-c", str(batch * ctx), "-np", str(batch)]
        if (k, v) != ("f16", "f16"):
            argv += ["-fa", "on", "-ctk", k, "-ctv", v]
        notes.append(f"-c is the total context of the {batch} slots (-np): each gets {ctx} tokens; "
                     "builds before the 2025 '-fa on|off|auto' change take a bare -fa")
        return LaunchCommand(engine, tuple(argv), env, ckpt, tuple(notes))
    kv_arg = entry["kv"][kv.default.k]["arg"]
    if kv_arg == "auto" and kv.default.k != model.dtype:
        kv_arg = {"fp16": "float16", "bf16": "bfloat16"}[kv.default.k]
    if engine == "vllm":
        w_entry = entry["weights"][weights.format]
        if w_entry.get("env_native") and gpu.sm >= 89:
            env = (w_entry["env_native"],)  # keep FP8 weights weight-only where W8A8 would run
        argv = ["vllm", "serve", ckpt]
        argv += ["--quantization", w_arg] if w_arg else []
        argv += ["--kv-cache-dtype", kv_arg] if kv_arg != "auto" else []
        skips = [str(i) for i in kv.skip_layers] + (["sliding_window"] if kv.skip_sliding else [])
        argv += ["--kv-cache-dtype-skip-layers", *skips] if skips else []
        argv += ["--max-model-len", str(ctx), "--max-num-seqs", str(batch),
                 "--gpu-memory-utilization", f"{settings.vllm_gpu_memory_utilization:.2f}"]
        return LaunchCommand(engine, tuple(argv), env, ckpt, tuple(notes))
    argv = ["python", "-m", "sglang.launch_server", "--model-path", ckpt]
    argv += ["--quantization", w_arg] if w_arg else []
    argv += ["--kv-cache-dtype", kv_arg] if kv_arg != "auto" else []
    argv += ["--context-length", str(ctx), "--max-running-requests", str(batch),
             "--mem-fraction-static", f"{settings.sglang_mem_fraction_static:.2f}"]
    return LaunchCommand(engine, tuple(argv), env, ckpt, tuple(notes))
