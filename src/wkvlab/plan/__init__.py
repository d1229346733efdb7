"""Planner: will it fit, how fast will it run, and which weight x KV combination to choose.

Exact byte arithmetic for weights (scales, zero points, 16-bit leftovers) and KV caches (per
layer, sliding windows, MLA latents, scale overheads), engine allocation rules, a roofline speed
estimate, quality priors from the literature (or wkvlab's measurements), an engine support
matrix, and launch lines for vLLM, SGLang and llama.cpp. See docs/planner.md.
"""
from __future__ import annotations

from wkvlab.plan.engines import ENGINES, LaunchCommand, Support, check_support, launch_command
from wkvlab.plan.gpus import GPU, find_gpu, load_gpu_catalog
from wkvlab.plan.kv import (KV_FORMATS, KVBytes, KVCacheSize, KVLayout, KVPair, kv_bytes_per_token,
                            kv_cache_bytes, parse_kv, sequence_bytes)
from wkvlab.plan.memory import EngineSettings, FitResult, MemoryBudget, fit, memory_budget
from wkvlab.plan.models import ModelDescription, builtin_model_names, resolve_model
from wkvlab.plan.params import parameter_count
from wkvlab.plan.planner import Combination, PlanResult, Recommendation, plan
from wkvlab.plan.quality import QualityEstimate, estimate_quality
from wkvlab.plan.throughput import RooflineAssumptions, ThroughputEstimate, estimate_throughput
from wkvlab.plan.weights import FORMATS, WeightBytes, WeightSpec, parse_weight_spec, weight_bytes

__all__ = [
    "ENGINES", "FORMATS", "GPU", "KV_FORMATS", "Combination", "EngineSettings", "FitResult",
    "KVBytes", "KVCacheSize", "KVLayout", "KVPair", "LaunchCommand", "MemoryBudget",
    "ModelDescription", "PlanResult", "QualityEstimate", "Recommendation", "RooflineAssumptions",
    "Support", "ThroughputEstimate", "WeightBytes", "WeightSpec", "builtin_model_names",
    "check_support", "estimate_quality", "estimate_throughput", "find_gpu", "fit",
    "kv_bytes_per_token", "kv_cache_bytes", "launch_command", "load_gpu_catalog",
    "memory_budget", "parameter_count", "parse_kv", "parse_weight_spec", "plan", "resolve_model",
    "sequence_bytes", "weight_bytes",
]
