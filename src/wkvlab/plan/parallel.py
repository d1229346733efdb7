"""Several GPUs: which part of the model and of its KV cache each one holds, as each engine splits it.

* vLLM and SGLang, tensor parallelism (``--tensor-parallel-size``, SGLang ``--tp-size``): attention
  heads, MLP/expert intermediate features and the (64-padded) vocabulary are split across the tp
  ranks; KV heads too, and when tp exceeds the KV heads every rank keeps one replicated KV head —
  vLLM ``QKVParallelLinear`` (vllm/model_executor/layers/linear.py @ 9e109c9: ``num_kv_heads = 1``,
  ``num_kv_head_replicas = tp / total_num_kv_heads`` when ``tp >= total_num_kv_heads``, both via
  ``divide`` which asserts divisibility) and ``ModelConfig.get_num_kv_heads`` (vllm/config/model.py
  @ 18ec662: ``max(1, total_num_kv_heads // tp)``, 1 for MLA: the latent is whole on every rank);
  SGLang ``ModelConfig.get_num_kv_heads`` (python/sglang/srt/configs/model_config.py @ 8b5e1bb) is
  the same rule. Norms and routers are replicated.
* vLLM pipeline parallelism (``--pipeline-parallel-size``): layers split evenly, a remainder going to
  the partitions before the last (``get_pp_indices``, vllm/distributed/utils.py); the first stage
  holds the embedding, the last the lm_head. SGLang gives the remainder to the last partitions.
* llama.cpp ``-sm layer`` (default): layer ``il`` of ``n_layer + 1`` (the output layer counts) goes to
  the device ``upper_bound(splits, il / (n_layer + 1))`` of the cumulative ``-ts`` proportions, with
  its KV cache; the token embedding stays on the CPU ("very little benefit to offloading the input
  layer") — src/llama-model.cpp ``load_tensors`` @ a5410f0. ``-sm row``: every matrix's rows are
  split by ``-ts``; the KV cache and intermediate results live on the main GPU (``-mg``, common/arg.cpp
  @ 145b628: "the GPU to use ... for intermediate results and KV (with split-mode = row)").
"""
from __future__ import annotations

from dataclasses import dataclass

from wkvlab.errors import ConfigError
from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.weights import Shard

SPLITS = ("layer", "row")


@dataclass(frozen=True)
class Parallel(JsonMixin):
    """How one engine spreads a model over ``gpus`` identical GPUs."""

    gpus: int = 1
    tp: int = 1  # vLLM/SGLang tensor parallelism
    pp: int = 1  # vLLM/SGLang pipeline parallelism
    split: str = "layer"  # llama.cpp -sm

    @property
    def how(self) -> str:
        """The split alone: 'tp 2', 'tp 2 x pp 2', '-sm layer', '-' for one GPU."""
        if self.gpus == 1:
            return "-"
        if self.tp == self.pp == 1:
            return f"-sm {self.split}"
        return f"tp {self.tp}" + (f" x pp {self.pp}" if self.pp > 1 else "")

    @property
    def label(self) -> str:
        if self.gpus == 1:
            return "1 GPU"
        if self.tp == self.pp == 1:  # llama.cpp: one process drives every GPU
            return f"{self.gpus} GPUs, -sm {self.split}"
        return f"{self.gpus} GPUs, tp {self.tp}" + (f" x pp {self.pp}" if self.pp > 1 else "")


def parallel_for(engine: str | None, gpus: int, tp: int | None = None, pp: int | None = None, split: str | None = None) -> Parallel:
    """The layout ``engine`` uses for ``gpus`` GPUs (tensor parallel over all of them unless told otherwise)."""
    if gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {gpus}")
    if split is not None and split not in SPLITS:
        raise ConfigError(f"unknown --split {split!r}; llama.cpp splits by {' or '.join(SPLITS)}")
    if engine == "llama.cpp":
        return Parallel(gpus, 1, 1, split or "layer")
    if tp is not None and pp is None and (tp < 1 or gpus % tp):
        raise ConfigError(f"--tp {tp} does not divide --gpus {gpus} (--pp is --gpus / --tp when not given); "
                          f"use --gpus {max(tp, 1)} for tensor parallel over {max(tp, 1)} GPUs, or a --tp that divides {gpus}")
    if pp is not None and tp is None and (pp < 1 or gpus % pp):
        raise ConfigError(f"--pp {pp} does not divide --gpus {gpus} (--tp is --gpus / --pp when not given); "
                          f"use --gpus {max(pp, 1)}, or a --pp that divides {gpus}")
    pp = pp or (gpus // tp if tp else 1)
    tp = tp or gpus // pp
    if tp < 1 or pp < 1 or tp * pp != gpus:
        raise ConfigError(f"--tp {tp} x --pp {pp} must equal --gpus {gpus}; choose sizes whose product is the GPU count")
    return Parallel(gpus, tp, pp, split or "layer")


def parallel_problems(engine: str, model: ModelDescription, par: Parallel) -> list[str]:
    """Why ``engine`` cannot run ``model`` with this layout (its own divisibility asserts)."""
    if engine == "llama.cpp" or par.tp == par.pp == 1:
        return []
    out = []
    tp = par.tp
    if model.num_heads % tp:
        out.append(f"{model.num_heads} attention heads are not divisible by tp {tp}")
    kv = model.num_kv_heads
    if model.mla is None and kv % tp and tp % kv:
        out.append(f"{kv} KV heads and tp {tp}: one must divide the other (KV heads are split, or replicated when tp > KV heads)")
    widths = [model.intermediate_size] if model.moe is None else [model.moe.expert_intermediate_size]
    if any(w % tp for w in widths):
        out.append(f"intermediate size {widths[0]} is not divisible by tp {tp}")
    if par.pp > model.num_layers:
        out.append(f"pp {par.pp} exceeds the {model.num_layers} layers")
    return out


def layouts_that_run(engine: str, model: ModelDescription, gpus: int) -> list[Parallel]:
    """The tp x pp splits of ``gpus`` GPUs that ``engine``'s divisibility rules allow for ``model`` (tp largest first)."""
    out = []
    for tp in sorted((t for t in range(1, gpus + 1) if gpus % t == 0), reverse=True):
        par = Parallel(gpus, tp, gpus // tp, "layer")
        if not parallel_problems(engine, model, par):
            out.append(par)
    return out


def kv_heads_per_gpu(model: ModelDescription, par: Parallel) -> int:
    """KV heads one GPU keeps per layer: split across tp ranks, one replicated head when tp > heads."""
    if model.mla is not None:
        return 1
    return max(1, model.num_kv_heads // par.tp)


def pp_layers(engine: str, layers: int, pp: int) -> list[tuple[int, ...]]:
    """Decoder layers of each pipeline stage."""
    base, rest = divmod(layers, pp)
    counts = [base] * pp
    if engine == "sglang":
        for i in range(rest):  # the last partitions get one more (SGLang get_pp_indices)
            counts[-1 - i] += 1
    else:
        for i in range(2, rest + 2):  # vLLM get_pp_indices: from the second-to-last backwards
            counts[-i] += 1
    out, start = [], 0
    for count in counts:
        out.append(tuple(range(start, start + count)))
        start += count
    return out


def llamacpp_layer_devices(layers: int, gpus: int) -> list[int]:
    """Device of layers 0..n_layer (the last entry is the output layer) under ``-sm layer`` with equal ``-ts``."""
    splits = [(i + 1) / gpus for i in range(gpus)]  # cumulative normalized -ts 1,1,...
    out = []
    for il in range(layers + 1):
        x = il / (layers + 1)
        out.append(next(i for i, s in enumerate(splits) if s > x))  # std::upper_bound
    return out


@dataclass(frozen=True)
class GPUShare(JsonMixin):
    """What one group of identical GPUs holds (a pipeline stage, a llama.cpp device)."""

    name: str
    count: int  # GPUs holding this same share (the tp ranks of a stage)
    shard: Shard
    kv_layers: tuple[int, ...]  # layers whose KV cache lives on these GPUs
    kv_heads: int  # KV heads per layer on one of them


def gpu_shares(engine: str | None, model: ModelDescription, par: Parallel) -> list[GPUShare]:
    """The distinct per-GPU shares of ``model`` under ``par`` (one entry per stage / device)."""
    all_layers = tuple(range(model.num_layers))
    if par.gpus == 1:
        embedding = engine != "llama.cpp"  # llama.cpp keeps the token embedding on the CPU
        return [GPUShare("GPU 0", 1, Shard(embedding=embedding), all_layers, model.num_kv_heads)]
    if engine == "llama.cpp":
        if par.split == "row":
            frac = 1 / par.gpus
            main = GPUShare("GPU 0 (main: KV, output, norms)", 1, Shard(embedding=False, row_fraction=frac), all_layers, model.num_kv_heads)
            rest = GPUShare(f"GPU 1..{par.gpus - 1}", par.gpus - 1, Shard(embedding=False, lm_head=False, row_fraction=frac), (), 0)
            return [main, rest]
        devices = llamacpp_layer_devices(model.num_layers, par.gpus)
        out = []
        for d in range(par.gpus):
            layers = tuple(i for i in all_layers if devices[i] == d)
            out.append(GPUShare(f"GPU {d} (layers {_span(layers)})", 1, Shard(layers=layers, embedding=False, lm_head=devices[-1] == d),
                                layers, model.num_kv_heads))
        return out
    heads = kv_heads_per_gpu(model, par)
    stages = pp_layers(engine or "vllm", model.num_layers, par.pp)
    out = []
    for s, layers in enumerate(stages):
        name = f"stage {s} (layers {_span(layers)}), {par.tp} GPU{'s' if par.tp > 1 else ''}" if par.pp > 1 else f"each of {par.tp} GPUs"
        out.append(GPUShare(name, par.tp, Shard(tp=par.tp, layers=layers, embedding=s == 0, lm_head=s == par.pp - 1), layers, heads))
    return out


def _span(layers: tuple[int, ...]) -> str:
    return f"{layers[0]}-{layers[-1]}" if layers else "none"
