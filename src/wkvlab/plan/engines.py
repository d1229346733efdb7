"""Engine support: which WeightSpec/KVSpec each engine runs, on which GPU, as which flags.

Single facts (weight kernels, cache dtypes, compute capabilities, versions) are data in
``data/engines.yaml``; the rules about pairs and layouts live here:

* vLLM, SGLang and TensorRT-LLM take one KV dtype for K and V; only vLLM keeps chosen layers at
  16 bit (``--kv-cache-dtype-skip-layers``, needs a 2026 version); none takes a per-layer map. A
  per-layer plan (``wkvlab search``) runs on vLLM as its closest line: the most precise dtype the
  plan uses for every quantized layer, its 16-bit layers skipped — flagged approximate.
* llama.cpp sets K and V separately (``-ctk``/``-ctv``) but has no per-layer types: a per-layer
  plan runs with the type most of its layers use per cache (int8/int4 as the 32-value q8_0/q4_0
  blocks). A quantized V cache needs flash attention (``-fa on``; llama.cpp #10378). Default CUDA
  builds compile flash-attention kernels only for K == V in {f16, bf16, q8_0, q4_0}: other pairs
  silently run attention on the CPU (#27109, #28455; fix: ``-DGGML_CUDA_FA_ALL_QUANTS=ON``).
  Since PR #21038 llama.cpp rotates Q/K/V of a quantized cache (wkvlab's ``+rot``); a spec
  without rotation runs with ``LLAMA_ATTN_ROT_DISABLE=1``.
* Options that only wkvlab simulates (sinks, residual windows, SmoothAttention, pre-RoPE keys,
  outliers, calibrated codebooks) have no engine flag: such a spec has no launch line.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

from wkvlab.engine_releases import engine_table, find_release
from wkvlab.errors import ConfigError
from wkvlab.kv.formats import get_kv_format
from wkvlab.kv.spec import SLIDING, KVSpec
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.gpus import GPU
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import ROW, linear_inventory
from wkvlab.plan.parallel import Parallel, parallel_problems
from wkvlab.plan.weights import shard_shape, as_weight_spec
from wkvlab.weights.spec import WeightSpec

ENGINES = ("vllm", "sglang", "llama.cpp", "trtllm")
COMMAND_ENGINES = ("vllm", "sglang", "llama.cpp")  # engines the planner writes launch lines for
_ENGINE_ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "llama_cpp": "llama.cpp",
                   "tensorrt-llm": "trtllm", "tensorrt_llm": "trtllm", "trt-llm": "trtllm"}
_LLAMACPP_FAST_FA = {"f16", "bf16", "q8_0", "q4_0"}
_SIM_ONLY = (("sinks", "sinks"), ("residual", "residual="), ("window", "window="), ("smooth", "smooth"),
             ("prerope", "prerope"), ("outliers", "outliers="), ("sink_ratio", "sinks=auto"))


@dataclass(frozen=True)
class EngineKV(JsonMixin):
    """A KV spec as an engine runs it."""

    args: tuple[str, ...]  # cache flags (dtype, skip layers, scales)
    env: tuple[str, ...]
    storage: str  # the KVSpec string of what the engine allocates (its own formats and scale sizes)
    exact: bool  # False: a per-layer plan approximated by the engine's closest line
    quantized_v: bool = False


@dataclass(frozen=True)
class Support(JsonMixin):
    engine: str
    version: str
    accepted: bool
    reasons: tuple[str, ...] = ()  # why the engine refuses the combination
    warnings: tuple[str, ...] = ()  # fallbacks and slow paths it takes silently
    notes: tuple[str, ...] = ()  # versions, checkpoints, sources
    slow_path: bool = False  # accepted, but a kernel falls back to something much slower
    kv: EngineKV | None = None
    weight_arg: str | None = None  # --quantization value
    weight_rule: str = ""  # which kernel family runs the weights
    checkpoint: str = ""  # what the model argument must hold ('' = the 16-bit checkpoint will do)
    weight_env: tuple[str, ...] = field(default=())


def matrix() -> dict[str, Any]:
    """The planner's engines of the engine table (data/engines.yaml, read once by :mod:`wkvlab.engine_releases`;
    its exllamav3 entry holds releases for presets only)."""
    table = engine_table()
    return {engine: table[engine] for engine in ENGINES}


def normalize_engine(name: str | None) -> str | None:
    if name is None:
        return None
    key = name.strip().lower()
    key = _ENGINE_ALIASES.get(key, key)
    if key not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; use one of: {', '.join(ENGINES)}")
    return key


def engine_version(engine: str, version: str | None = None) -> tuple[str, Mapping[str, Any]]:
    """(version key, its facts) of ``engine``: the newest modelled release unless ``version`` names another
    (its key or full version, :func:`wkvlab.engine_releases.find_release`)."""
    key = find_release(engine, version).key
    return key, matrix()[engine]["versions"][key]


def parse_engine_versions(items: list[str] | None) -> dict[str, str]:
    """``["vllm=0.11"]`` -> {"vllm": "0.11"} (checked against the known versions)."""
    out = {}
    for item in items or []:
        name, sep, version = item.partition("=")
        engine = normalize_engine(name)
        if not sep or not version or engine is None:
            raise ConfigError(f"--engine-version {item!r}: write <engine>=<version>, e.g. vllm=0.23")
        out[engine] = engine_version(engine, version)[0]
    return out


# ---- weights --------------------------------------------------------------------------------

def _matches(spec: WeightSpec, match: Mapping[str, Any]) -> bool:
    for key, wanted in match.items():
        value = getattr(spec, key)
        options = wanted if isinstance(wanted, list) else [wanted]
        if value not in options:
            return False
    return True


def weight_rule(engine: str, spec: WeightSpec) -> Mapping[str, Any] | None:
    return next((rule for rule in matrix()[engine]["weights"] if _matches(spec, rule["match"])), None)


def _fill(template: str, spec: WeightSpec) -> str:
    group = spec.group_size if spec.group_size else "-channel"
    return template.replace("{group_size}", str(group)).replace("{bits}", str(spec.bits)).replace("{format}", spec.format.upper())


def _check_entry(e: Mapping[str, Any], display: str, what: str, model: ModelDescription, gpu: GPU, features: list[str],
                 reasons: list[str], warnings: list[str], notes: list[str]) -> None:
    if e.get("min_sm") and gpu.sm < e["min_sm"]:
        reasons.append(f"{display} {what}: needs sm_{e['min_sm']}+, {gpu.name} is sm_{gpu.sm}"
                       + (f" — {e['reject_below']}" if e.get("reject_below") else ""))
    if e.get("needs") and e["needs"] not in features:
        reasons.append(f"{display} {what}: not in this version ({e.get('since', 'newer releases')}); target a newer one with --engine-version")
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


def _shape_problems(model: ModelDescription, spec: WeightSpec, par: Parallel, marlin: bool) -> list[str]:
    """Per-rank shape rules: group kernels store whole groups (input widths divisible by the group size);
    Marlin also wants input widths divisible by 128 and output widths by 64."""
    group = spec.group_size or (128 if marlin else 0)
    bad_in, bad_out = set(), set()
    for lin in linear_inventory(model):
        if spec.for_linear(lin.module_name, lin.layer, model.num_layers) is None:
            continue
        out, inp = shard_shape(lin, model, par.tp)
        if (group and inp % group) or (marlin and inp % 128):
            bad_in.add(inp)
        if marlin and out % 64:
            bad_out.add(out)
    problems = []
    if bad_in:
        need = "128 and the group size" if marlin else "the group size"
        problems.append(f"per-GPU input widths {sorted(bad_in)} are not multiples of {need} {group}; "
                        + ("its Marlin kernels refuse such shapes" if marlin else "its kernels store whole groups"))
    if bad_out:
        problems.append(f"per-GPU output widths {sorted(bad_out)} are not multiples of 64 (Marlin)")
    return problems


def _check_weights(engine: str, model: ModelDescription, spec: WeightSpec, gpu: GPU, par: Parallel, features: list[str],
                   reasons: list[str], warnings: list[str], notes: list[str]) -> Mapping[str, Any] | None:
    entry = matrix()[engine]
    display = entry["display"]
    rule = weight_rule(engine, spec)
    if rule is None:
        reasons.append(f"{display} has no kernel for {spec.label} weights (it runs: "
                       + ", ".join(r["name"] for r in entry["weights"]) + ")")
        return None
    _check_entry(rule, display, f"{spec.label} weights", model, gpu, features, reasons, warnings, notes)
    if rule.get("marlin") or (spec.format == "int" and spec.group_size and engine != "llama.cpp"):
        reasons.extend(f"{display} {spec.label}: {p}" for p in _shape_problems(model, spec, par, bool(rule.get("marlin"))))
    if spec.skip_layers or spec.skip_first or spec.skip_last or spec.skip_regex:
        notes.append("16-bit layers must be left out when the checkpoint is made (llm-compressor ignore=, "
                     "llama-quantize --tensor-type)")
    return rule


# ---- KV cache -------------------------------------------------------------------------------

def _layer_pairs(model: ModelDescription, spec: KVSpec) -> dict[int, tuple[str, str]]:
    """Each cache-holding layer's (K, V) format names."""
    out = {}
    for layer in model.kv_layers:
        k, v = spec.formats_for(layer, model.layer_types[layer] == "sliding_attention")
        out[layer] = (k.name, v.name)
    return out


def _unsupported_options(spec: KVSpec) -> list[str]:
    names = [label for attr, label in _SIM_ONLY if getattr(spec, attr)]
    names += [f.name for f in spec.all_formats() if f.calibrated or f.token_group or f.requantizes]
    return names


def translate_kv(engine: str, model: ModelDescription, spec: KVSpec, gpu: GPU, features: list[str],
                 reasons: list[str], warnings: list[str], notes: list[str]) -> EngineKV | None:
    """The flags ``engine`` needs for ``spec`` and what it then allocates (None, with reasons, when it cannot)."""
    entry = matrix()[engine]
    display, table = entry["display"], entry["kv"]
    start = len(reasons)
    sim_only = _unsupported_options(spec)
    if sim_only:
        reasons.append(f"{display} has no {', '.join(sim_only)} for its KV cache (wkvlab simulates them; no engine flag)")
    pairs = _layer_pairs(model, spec)
    used = sorted({f for pair in pairs.values() for f in pair})
    if engine == "llama.cpp":
        return _llamacpp_kv(model, spec, pairs, used, gpu, features, reasons, warnings, notes, start)
    if spec.rotate:
        reasons.append(f"{display} does not rotate the KV cache (a Hadamard rotation is llama.cpp's or exllamav3's)")
    if spec.q not in ("none", "fp8_e4m3") or (spec.q == "fp8_e4m3" and engine != "vllm"):
        reasons.append(f"{display} does not quantize queries as {spec.q}")
    per_layer = bool(spec.layers)
    for name in used:
        if name in table:
            _check_entry(table[name], display, f"{name} KV cache", model, gpu, features, reasons, warnings, notes)
        elif not per_layer:  # a per-layer plan may hold formats the engine lacks: a more precise dtype covers them
            reasons.append(f"{display} has no {name} KV cache (it takes: {', '.join(table)})")
    if len(reasons) > start:
        return None
    quantized = sorted({pair for pair in pairs.values() if pair != ("fp16", "fp16")})
    skips = [i for i, pair in pairs.items() if pair == ("fp16", "fp16")] if quantized else []
    exact = not per_layer
    if per_layer:
        # a per-layer plan: one dtype for every quantized layer, the most precise one the plan uses
        if engine != "vllm":
            reasons.append(f"{display} has no per-layer KV dtypes")
            return None
        head_dim = model.mla.cache_dim if model.mla is not None else model.head_dim
        size = lambda f: get_kv_format(f).bytes_per_vector(head_dim)  # noqa: E731
        formats = {f for pair in quantized for f in pair} - {"fp16"}
        runnable = [f for f in formats if f in table]
        if formats and not runnable:
            reasons.append(f"{display} has no KV dtype for {', '.join(sorted(formats))} (it takes: {', '.join(table)})")
            return None
        fmt = max(runnable, key=lambda f: size(table[f]["storage"])) if runnable else "fp16"
        finer = sorted(f for f in formats if value_bits(f) > value_bits(table[fmt]["storage"]))
        if finer:
            reasons.append(f"{display} has no KV dtype at least as precise as {', '.join(finer)}")
            return None
        exact = len(quantized) == 1 and quantized[0][0] == quantized[0][1] and quantized[0][0] in table
        if not exact:
            lacking = sorted(formats - set(table))
            notes.append(f"{display} cannot run this per-layer plan exactly (one KV dtype for K and V of every quantized layer"
                         + (f"; it has no {', '.join(lacking)}" if lacking else "") + f"): it uses {table[fmt]['arg']} for all of them, "
                         "at least as precise as the plan, with more memory")
    else:
        if spec.k != spec.v:
            reasons.append(f"{display} takes one KV dtype for both K and V")
            return None
        fmt = spec.k
        skips = [i for i in spec.skip if i != SLIDING]
    args: list[str] = []
    if table[fmt]["arg"] != "auto":
        args += ["--kv-cache-dtype", table[fmt]["arg"]]
    skip_words = [str(i) for i in sorted(skips)] + ([SLIDING] if SLIDING in spec.skip and not spec.layers else [])
    if skip_words and table[fmt]["arg"] != "auto":
        rule = entry.get("skip_layers")
        if rule is None:
            reasons.append(f"{display} cannot keep chosen layers' KV at 16 bit")
            return None
        if rule.get("needs") and rule["needs"] not in features:
            reasons.append(f"{display} {rule['flag']}: not in this version ({rule.get('since')}); target a newer one with --engine-version")
            return None
        args += [rule["flag"], *skip_words]
    if spec.scales != "static" and fmt.startswith("fp8"):
        if "calculate_kv_scales" in features:
            args.append("--calculate-kv-scales")
            notes.append(f"{display} --calculate-kv-scales computes its own FP8 scales on the first batch (not wkvlab's amax/448 calibration)")
        elif spec.scales == "calculate":
            reasons.append(f"{display} (this version) has no --calculate-kv-scales (vLLM 0.27.1 is the last release with it): "
                           "target --engine-version vllm=0.27, or give the checkpoint k_scale/v_scale (scales=amax448)")
            return None
        else:
            notes.append(f"{display}: scaled FP8 KV needs a checkpoint that carries k_scale/v_scale (llm-compressor kv_cache_scheme); "
                         "this version has no --calculate-kv-scales (vLLM 0.27.1 is the last release with it)")
    if spec.q == "fp8_e4m3":
        notes.append(f"{display}: FP8 queries are what the FlashAttention-3 / FlashInfer FP8 paths do; no separate flag")
    storage_fmt = table[fmt]["storage"]
    skip_tuple = tuple(int(w) for w in skip_words if w != SLIDING) + ((SLIDING,) if SLIDING in skip_words else ())
    storage = KVSpec(k=storage_fmt, v=storage_fmt, skip=skip_tuple) if table[fmt]["arg"] != "auto" else KVSpec()
    return EngineKV(tuple(args), (), storage.canonical(), exact, storage_fmt != "fp16")


def value_bits(fmt: str) -> int:
    """Bits a format keeps per value, as its name says (int8_pth 8, q4_0 4, fp8_e4m3 8, fp16 16)."""
    match = re.match(r"[a-z]*?(\d+)", get_kv_format(fmt).name)
    return int(match.group(1)) if match else 16


def _nearest_llamacpp(fmt: str, head_dim: int) -> str:
    """For a per-layer plan: the smallest llama.cpp cache type with at least ``fmt``'s bits per value (int8 -> q8_0,
    int4 and int2 -> q4_0), '' when none has."""
    table = matrix()["llama.cpp"]["kv"]
    finer = [t for t in table if t != "fp16" and head_dim % 32 == 0 and value_bits(t) >= value_bits(fmt)]
    return min(finer, key=lambda t: get_kv_format(t).bytes_per_vector(head_dim)) if finer else ""


def _llamacpp_kv(model: ModelDescription, spec: KVSpec, pairs: dict[int, tuple[str, str]], used: list[str], gpu: GPU,
                 features: list[str], reasons: list[str], warnings: list[str], notes: list[str], start: int) -> EngineKV | None:
    table = matrix()["llama.cpp"]["kv"]
    if spec.rotate not in (0, -2):
        reasons.append("llama.cpp rotates in its own blocks (wkvlab's +rot); other rotations have no flag")
    if spec.q not in ("none", "q8_0", "q8_0-x86", "fp16"):  # llama.cpp's own Q conversions (K's vec_dot_type)
        reasons.append(f"llama.cpp does not quantize queries as {spec.q}")
    if spec.skip and not spec.layers:
        reasons.append("llama.cpp has no per-layer KV types (-ctk/-ctv apply to every layer): it cannot skip layers")
    per_layer = bool(spec.layers)
    head_dim = model.mla.cache_dim if model.mla is not None else model.head_dim
    chosen = []
    for side in (0, 1):
        counts = Counter(pair[side] for pair in pairs.values())
        # q8_0-x86 is llama.cpp's q8_0 cache as its x86 writer fills it: the same -ctk/-ctv q8_0
        names = {f: (f if f in table else _nearest_llamacpp(f, head_dim)) if per_layer else ("q8_0" if f == "q8_0-x86" else f) for f in counts}
        missing = sorted(f for f, t in names.items() if t not in table)
        if missing:
            reasons.append(f"llama.cpp has no {'K' if side == 0 else 'V'} cache type for {', '.join(missing)} "
                           f"(it takes: {', '.join(table)})")
            continue
        if not per_layer:
            chosen.append(names[next(iter(counts))])
            continue
        quantized = {f: n for f, n in counts.items() if f != "fp16"} or counts
        fmt = max(quantized, key=lambda f: (quantized[f], get_kv_format(names[f]).bytes_per_vector(128)))
        chosen.append(names[fmt])
        if len(counts) > 1 or names[fmt] != fmt:
            notes.append(f"llama.cpp: {'K' if side == 0 else 'V'} cache of every layer as {table[names[fmt]]['arg']} "
                         f"(the plan's most common; it keeps {sum(n for f, n in counts.items() if f != fmt)} layers otherwise)")
    if len(reasons) > start:
        return None
    k, v = chosen
    exact = not per_layer or (len({p for p in pairs.values()}) == 1 and (k, v) == next(iter(pairs.values())))
    if per_layer and not exact:
        notes.insert(0, "per-layer cache types are not expressible in llama.cpp (-ctk/-ctv apply to every layer); "
                        "this line is the plan's most common type per cache")
    kt, vt = table[k]["arg"], table[v]["arg"]
    args = ("-ctk", kt, "-ctv", vt) if (kt, vt) != ("f16", "f16") else ()
    env: tuple[str, ...] = ()
    if args and spec.rotate == 0 and "attn_rotation" in features:
        env = ("LLAMA_ATTN_ROT_DISABLE=1",)
        notes.append("llama.cpp rotates quantized caches since PR #21038; this spec has no rotation, hence LLAMA_ATTN_ROT_DISABLE=1 "
                     "(add +rot to the spec to keep llama.cpp's default)")
    if args and (kt != vt or kt not in _LLAMACPP_FAST_FA):
        warnings.append(f"llama.cpp: default CUDA builds have no flash-attention kernel for K={kt}, V={vt}; attention silently "
                        "runs on the CPU (~30x slower prefill, llama.cpp #27109, #28455); build with -DGGML_CUDA_FA_ALL_QUANTS=ON")
    storage = KVSpec(k=table[k]["storage"], v=table[v]["storage"])
    return EngineKV(args, env, storage.canonical(), exact, vt != "f16")


def kv_flags(engine: str, model: ModelDescription, spec: KVSpec, gpu: GPU, version: str | None = None
             ) -> tuple[EngineKV | None, list[str], list[str], list[str]]:
    """The cache flags alone: (what the engine runs, reasons it cannot, notes, warnings) — for a KV plan
    whose weights are decided elsewhere (``wkvlab search`` exports)."""
    _, facts = engine_version(engine, version)
    reasons: list[str] = []
    warnings: list[str] = []
    notes: list[str] = []
    kv = translate_kv(engine, model, spec, gpu, list(facts.get("features", [])), reasons, warnings, notes)
    return kv, reasons, notes, warnings


# ---- the combination ------------------------------------------------------------------------

def check_support(engine: str, model: ModelDescription, weights: str | WeightSpec, kv: str | KVSpec, gpu: GPU,
                  par: Parallel = Parallel(), version: str | None = None) -> Support:
    """Does ``engine`` run ``weights`` x ``kv`` on ``gpu`` (x ``par.gpus``), and what does it do silently?"""
    wspec = as_weight_spec(weights, model)
    kspec = kv if isinstance(kv, KVSpec) else KVSpec.parse(str(kv))
    key, facts = engine_version(engine, version)
    features = list(facts.get("features", []))
    display = matrix()[engine]["display"]
    reasons: list[str] = [f"{display}: {p}" for p in parallel_problems(engine, model, par)]
    warnings: list[str] = []
    notes: list[str] = []
    rule = _check_weights(engine, model, wspec, gpu, par, features, reasons, warnings, notes)
    kv_out = translate_kv(engine, model, kspec, gpu, features, reasons, warnings, notes)
    slow = bool(rule and rule.get("slow")) or any("runs on the CPU" in w for w in warnings)
    checkpoint = _fill(rule["checkpoint"], wspec) if rule and rule.get("checkpoint") and not rule.get("online") else ""
    env = (rule["env_native"],) if rule and rule.get("env_native") and gpu.sm >= 89 else ()
    return Support(engine, key, not reasons, tuple(dict.fromkeys(reasons)), tuple(dict.fromkeys(warnings)),
                   tuple(dict.fromkeys(notes)), slow, kv_out if not reasons else None,
                   rule.get("arg") if rule else None, rule["name"] if rule else "", checkpoint, env)
