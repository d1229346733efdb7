"""One weight x KV combination on one engine: support, per-GPU bytes and fit, speed, launch line."""
from __future__ import annotations

from dataclasses import dataclass, replace

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.engines import COMMAND_ENGINES, Support, check_support, engine_version
from wkvlab.plan.gpus import GPU
from wkvlab.plan.kv import KVBytes, kv_bytes_per_token
from wkvlab.plan.launch import LaunchCommand, launch_command
from wkvlab.plan.memory import EngineSettings, FitResult, MemoryBudget, fit, memory_budget, tightest
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import linear_inventory
from wkvlab.plan.parallel import GPUShare, Parallel, gpu_shares, parallel_for
from wkvlab.plan.source import ModelSource
from wkvlab.plan.throughput import RooflineAssumptions, StageLoad, ThroughputEstimate, estimate_throughput
from wkvlab.plan.weights import WeightBytes, shard_shape, execution, weight_bytes
from wkvlab.weights.spec import WeightSpec


@dataclass(frozen=True)
class Layout(JsonMixin):
    """What was asked for: a GPU count and, optionally, how vLLM/SGLang or llama.cpp split it."""

    gpus: int = 1
    tp: int | None = None
    pp: int | None = None
    split: str | None = None


@dataclass(frozen=True)
class GPUEvaluation(JsonMixin):
    """One group of identical GPUs (a pipeline stage, a llama.cpp device)."""

    name: str
    count: int
    weights_bytes: int
    kv_bytes_per_token: int  # what the engine allocates per token on one of these GPUs
    budget: MemoryBudget
    fit: FitResult


@dataclass(frozen=True)
class EngineEvaluation(JsonMixin):
    """One engine's view of a combination: support, its memory rule per GPU, fit and launch line."""

    engine: str
    parallel: Parallel
    support: Support
    gpus: tuple[GPUEvaluation, ...]
    fit: FitResult  # the tightest GPU's
    kv_per_token_bytes: int  # the engine's allocation per token, summed over every GPU
    command: LaunchCommand | None = None


@dataclass(frozen=True)
class Context(JsonMixin):
    """Everything a plan evaluates against."""

    model: ModelDescription
    source: ModelSource
    gpu: GPU
    batch: int
    ctx: int
    layout: Layout
    settings: EngineSettings
    assumptions: RooflineAssumptions
    model_id: str | None = None
    versions: dict[str, str] | None = None
    file_bytes: int | None = None  # a GGUF served as it is: its tensor bytes stand for the spec's


def _refused(engine: str, par: Parallel, reason: str, version: str) -> Support:
    return Support(engine, version, False, (reason,))


def evaluate_engine(engine: str, c: Context, w: WeightSpec, kv: KVSpec) -> tuple[EngineEvaluation, list[GPUShare], list[KVBytes], list[WeightBytes]]:
    version = (c.versions or {}).get(engine)
    try:
        par = parallel_for(engine, c.layout.gpus, c.layout.tp, c.layout.pp, c.layout.split)
        support = check_support(engine, c.model, w, kv, c.gpu, par, version)
    except ConfigError as exc:
        par = Parallel(c.layout.gpus, c.layout.gpus if engine != "llama.cpp" else 1)
        support = _refused(engine, par, str(exc), engine_version(engine, version)[0])
    storage = KVSpec.parse(support.kv.storage) if support.kv else kv  # what the engine allocates
    shares = gpu_shares(engine, c.model, par)
    evaluations, per_tokens, weights = [], [], []
    for share in shares:
        wb = weight_bytes(c.model, w, share.shard)
        if c.file_bytes:  # the file's own bytes, split across GPUs as the spec's would be
            wb = replace(wb, total_bytes=round(c.file_bytes * wb.total_bytes / weight_bytes(c.model, w).total_bytes))
        per_token = kv_bytes_per_token(c.model, storage, layers=share.kv_layers, kv_heads=share.kv_heads,
                                       linear_state_share=1 / par.tp, context=c.ctx)
        budget = memory_budget(engine, c.model, c.gpu, wb.total_bytes, c.settings, tp=par.tp, gpus=par.gpus)
        evaluations.append(GPUEvaluation(share.name, share.count, wb.total_bytes, per_token.total_bytes, budget,
                                         fit(budget, per_token, c.model, c.batch, c.ctx, c.settings, share.name)))
        per_tokens.append(per_token)
        weights.append(wb)
    total = tightest([e.fit for e in evaluations])
    command = None
    if support.accepted and total.fits and engine in COMMAND_ENGINES:
        command = launch_command(engine, c.source, w, support, c.batch, c.ctx, par, c.settings, c.model_id)
    kv_total = sum(e.kv_bytes_per_token * e.count for e in evaluations)
    return EngineEvaluation(engine, par, support, tuple(evaluations), total, kv_total, command), shares, per_tokens, weights


def stage_loads(model: ModelDescription, shares: list[GPUShare], per_tokens: list[KVBytes], weights: list[WeightBytes],
                par: Parallel) -> list[StageLoad]:
    """The roofline's view of each group of GPUs: bytes held and GEMM parameters multiplied."""
    loads = []
    for share, per_token, wb in zip(shares, per_tokens, weights):
        held = set(range(model.num_layers) if share.shard.layers is None else share.shard.layers)
        linear = routed = 0
        for lin in linear_inventory(model):
            if lin.layer in held:
                out, inp = shard_shape(lin, model, share.shard.tp)
                n = int(out * inp * lin.count * share.shard.row_fraction)
                linear += n
                routed += n if lin.routed_expert else 0
        lm_head = model.vocab_size * model.hidden_size // share.shard.tp if share.shard.lm_head else 0
        heads = model.num_heads // share.shard.tp
        layers = len(held)
        tp = par.gpus if par.split == "row" and par.tp == 1 and par.gpus > 1 else share.shard.tp
        loads.append(StageLoad(wb, per_token, linear, routed, lm_head, heads, layers, tp))
        if par.split == "row" and par.gpus > 1:
            break  # -sm row: the main GPU's share stands for all (each multiplies its rows; KV and attention there)
    return loads


def evaluate_speed(c: Context, w: WeightSpec, primary: EngineEvaluation, shares: list[GPUShare], per_tokens: list[KVBytes],
                   weights: list[WeightBytes]) -> ThroughputEstimate:
    par = primary.parallel
    loads = stage_loads(c.model, shares, per_tokens, weights, par)
    sequential = primary.engine == "llama.cpp" and par.split == "layer" and par.gpus > 1
    return estimate_throughput(c.model, c.gpu, execution(w), loads, c.batch, c.ctx, c.assumptions, sequential=sequential)
