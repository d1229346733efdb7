"""Planner: will it fit, how fast will it run, and which weight x KV combination to choose.

Weights and KV are wkvlab's one spec language (:class:`~wkvlab.weights.spec.WeightSpec`,
:class:`~wkvlab.kv.spec.KVSpec`, parsed where ``wkvlab eval`` parses them); the planner adds the
deployment facts: exact bytes for a model it has not loaded (per GPU under each engine's
sharding), engine allocation rules, a roofline speed estimate, quality from the user's own
measurements (or cited priors), an engine support matrix, and launch lines for vLLM, SGLang and
llama.cpp. Importing it does not import torch. See docs/planner.md.
"""
from __future__ import annotations

from wkvlab.plan.engines import ENGINES, EngineKV, Support, check_support
from wkvlab.plan.gpus import GPU, find_gpu, load_gpu_catalog
from wkvlab.plan.kv import KVBytes, KVCacheSize, kv_bytes_per_token, kv_cache_bytes, sequence_bytes
from wkvlab.plan.launch import LaunchCommand, launch_command
from wkvlab.plan.measured import Measurement, load_measurements
from wkvlab.plan.memory import EngineSettings, FitResult, MemoryBudget, fit, memory_budget
from wkvlab.plan.models import ModelDescription, builtin_model_names, resolve_model
from wkvlab.plan.parallel import Parallel, gpu_shares, parallel_for
from wkvlab.plan.params import parameter_count
from wkvlab.plan.planner import Combination, PlanResult, Recommendation, plan
from wkvlab.plan.quality import QualityEstimate, estimate_quality
from wkvlab.plan.source import ModelSource, resolve_source
from wkvlab.plan.throughput import RooflineAssumptions, ThroughputEstimate, estimate_throughput
from wkvlab.plan.weights import Shard, WeightBytes, weight_bytes

__all__ = [
    "ENGINES", "GPU", "Combination", "EngineKV", "EngineSettings", "FitResult", "KVBytes", "KVCacheSize", "LaunchCommand",
    "Measurement", "MemoryBudget", "ModelDescription", "ModelSource", "Parallel", "PlanResult", "QualityEstimate",
    "Recommendation", "RooflineAssumptions", "Shard", "Support", "ThroughputEstimate", "WeightBytes", "builtin_model_names",
    "check_support", "estimate_quality", "estimate_throughput", "find_gpu", "fit", "gpu_shares", "kv_bytes_per_token",
    "kv_cache_bytes", "launch_command", "load_gpu_catalog", "load_measurements", "memory_budget", "parallel_for",
    "parameter_count", "plan", "resolve_model", "resolve_source", "sequence_bytes", "weight_bytes",
]
