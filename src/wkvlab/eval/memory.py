"""How much memory an evaluation grid needs, before anything loads, and which plan fits.

An evaluation holds, on the model's device: the weights, the KV caches of the passes that run
side by side, one chunk's float32 logits (and what the metrics derive from them), the activations
of one chunk's forward, and — while a calibrated weight config is built — what its calibration
captures. Two plans (docs/architecture.md, "Loop order"):

* ``copies``: the reference model stays and every weight config gets its own copy, built before
  the first window; every (weights × KV) pass runs chunk by chunk beside the reference's, which
  is the exact KLD. Memory: (1 + weight configs) models and 1 + configs caches.
* ``one-model``: the reference is recorded once per token (a stored reference, on disk or in
  memory: NLL, top-1 and Δp exact, KLD as top-k head + sampled tail); then each weight config is
  built in place on the one model (its original weights kept off the device and restored
  exactly), its KV configs run — ``interleave`` caches side by side when they fit, else one at a
  time — and the next config follows. Memory: one model, the caches running at once.

Byte counts come from the planner's description of the model (:mod:`wkvlab.plan.models`,
``parameter_count``, the per-layer cache layout of :mod:`wkvlab.plan.kv`), so a model is costed from
its config.json or GGUF header — or by name (``llama-3-8b``) — without loading it. The formulas
count what this code allocates; kernels' own workspaces and allocator fragmentation are in the
fixed ``runtime`` part. ``benchmarks/gpu_check.py`` compares the estimate with the measured peak.
This module imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from wkvlab.errors import ConfigError
from wkvlab.eval.constants import DEFAULT_SAMPLES, DEFAULT_TOPK
from wkvlab.kv.attention_sizes import mixed_attention_bytes
from wkvlab.kv.readprec import READ_BYTES, engine_read
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.tokens import token_group_multiple
from wkvlab.plan.kv import kv_bytes_per_token, per_layer_tokens
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.params import linear_inventory, parameter_count
from wkvlab.units import GIB
from wkvlab.weights.gptq_batch import experts_per_batch, gptq_working_bytes
from wkvlab.weights.spec import WeightSpec

# The chunk's float32 logits (and the log-probabilities derived from them) should stay around this
# size: 256 MiB is 1,365 queries of SmolLM2's 49k vocabulary and 256 of Gemma 3's 262k.
LOGITS_BUDGET_BYTES = 256 << 20
MIN_CHUNK = 64
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PLANS = ("auto", "copies", "one-model")
RUNTIME_BYTES = 512 << 20  # CUDA context, kernel workspaces, allocator slack (a fixed allowance)
# On the CPU the device is the process itself, and its peak RSS holds, before any tensor of the run:
# the interpreter with torch 2.13, transformers 5.24 and wkvlab imported (423 MiB RSS, measured
# the same for both packaged models), and the tokenizer, about 1.2 KB per vocabulary entry (+46 MiB
# for SmolLM2's 49,152, +321 MiB for Gemma 3's 262,144: tokens, merges and the Rust maps).
# Measured by `benchmarks/estimate_vs_peak.py --components` (docs/scale.md).
CPU_PROCESS_BYTES = 424 << 20
TOKENIZER_BYTES_PER_ENTRY = 1200
HEAD_BLOCK_BYTES = 64 << 20  # float32 head rows upcast at a time (wkvlab.eval.logits)
# [T, V] float32 tensors alive at the peak of one chunk's comparison (see the formulas in _logits)
LIVE_LOGITS = {"copies": 5, "one-model": 3}
STORED_BYTES_PER_TOKEN = 12  # nll, argmax, log-sum-exp (float32/int32) per scored token, besides top-k and samples
FULL_EVERY = 256  # a stored reference keeps every 256th token's full distribution (wkvlab.eval.reference)
# Kept back when the budget is the memory the machine measured free (not a --max-memory, which is the
# user's own number): the printed estimates came within 0.996–1.108× of the measured peak RSS
# (docs/runs/estimate-vs-peak.json, 11 commands), and other processes' memory moves while a run
# is in flight (a 1.5B dry run once chose a plan needing 7.7 of 8.0 GiB free). A plan is chosen at
# most at 85% of the free memory, so an estimate 1.11× short still peaks at 94% of it, with 6%
# left for the rest of the machine; at least 0.5 GiB on a small budget.
RESERVE_FRACTION = 0.15
MIN_RESERVE_BYTES = 512 << 20


def measured_reserve(measured_bytes: int) -> int:
    """Bytes of a measured free-memory budget a plan may not use (see ``RESERVE_FRACTION``)."""
    return max(MIN_RESERVE_BYTES, int(measured_bytes * RESERVE_FRACTION))


def budget_and_reserve(max_memory: int | None, measured: int | None) -> tuple[int | None, int]:
    """(budget, reserve) a plan is chosen within: the user's ``--max-memory`` whole (their number), else the
    measured free memory less :func:`measured_reserve`, else no budget (a device whose memory is unknown)."""
    if max_memory is not None:
        return max_memory, 0
    return (measured, measured_reserve(measured)) if measured is not None else (None, 0)


def auto_chunk(vocab_size: int, ctx: int, specs: list[KVSpec] = ()) -> int:
    """The largest power of two (≥ 64) whose float32 logits fit the budget, a multiple of every
    per-channel token group, and no longer than the window."""
    chunk = MIN_CHUNK
    while chunk * 2 * vocab_size * 4 <= LOGITS_BUDGET_BYTES:
        chunk *= 2
    for spec in specs:
        multiple = token_group_multiple(spec)
        chunk = -(-chunk // multiple) * multiple
    return min(chunk, ctx)


@dataclass(frozen=True)
class GridShape:
    """What an estimate needs to know about a run besides the model."""

    weights: tuple[WeightSpec, ...]
    kv: tuple[KVSpec, ...]
    ctx: int
    tokens: int  # scored tokens of the whole run (the per-token reference's size)
    dtype: str = "float32"
    device: str = "cpu"
    chunk: int | None = None  # None: auto_chunk
    calibration: tuple[int, int] = (16, 512)  # samples × tokens per sample, for calibrated configs
    topk: int = DEFAULT_TOPK
    samples: int = DEFAULT_SAMPLES

    def chunk_for(self, vocab: int) -> int:
        return self.chunk or auto_chunk(vocab, self.ctx, list(self.kv))


@dataclass(frozen=True)
class Part:
    name: str
    bytes: int
    where: str = "device"  # device | host | disk

    def to_dict(self) -> dict:
        return {"name": self.name, "bytes": self.bytes, "gib": round(self.bytes / GIB, 3), "where": self.where}


@dataclass(frozen=True)
class PlanEstimate:
    """One plan's peak on the device: the larger of the build phase and the evaluation phase."""

    plan: str
    interleave: int  # candidate caches alive at once
    parts: tuple[Part, ...]  # evaluation phase
    build_parts: tuple[Part, ...] = ()  # while a calibrated weight config is built (AWQ/GPTQ capture)

    @property
    def device_bytes(self) -> int:
        phase = lambda parts: sum(p.bytes for p in parts if p.where == "device")  # noqa: E731
        return max(phase(self.parts), phase(self.build_parts))

    @property
    def host_bytes(self) -> int:
        return sum(p.bytes for p in self.parts if p.where == "host")

    def label(self) -> str:
        if self.plan != "one-model":  # copies, or a command's own layout (wkvlab.search.memory: profile, search)
            return self.plan
        return f"one-model ({self.interleave} cache{'s' if self.interleave > 1 else ''} at once)"

    def to_dict(self) -> dict:
        return {"plan": self.plan, "interleave": self.interleave, "device_bytes": self.device_bytes,
                "device_gib": round(self.device_bytes / GIB, 3), "host_bytes": self.host_bytes,
                "parts": [p.to_dict() for p in self.parts], "build_parts": [p.to_dict() for p in self.build_parts]}


@dataclass(frozen=True)
class MemoryEstimate:
    model: str
    grid: GridShape
    chunk: int
    plans: tuple[PlanEstimate, ...]  # copies, then one-model with 1..len(kv) caches at once
    budget_bytes: int | None = None
    chosen: PlanEstimate | None = None
    notes: tuple[str, ...] = field(default=())
    reserve_bytes: int = 0  # of budget_bytes, kept back: the budget was measured, not given (measured_reserve)

    @property
    def usable_bytes(self) -> int | None:
        """What a plan may use: the budget less the reserve (None: no budget, any plan)."""
        return None if self.budget_bytes is None else max(0, self.budget_bytes - self.reserve_bytes)

    def available(self) -> str:
        """``8.0 GiB available on cuda, 1.2 kept in reserve``: the budget as the header and refusals say it."""
        kept = f", {self.reserve_bytes / GIB:.1f} kept in reserve" if self.reserve_bytes else ""
        return f"{self.budget_bytes / GIB:.1f} GiB available on {self.grid.device}{kept}"

    def plan(self, name: str, interleave: int | None = None) -> PlanEstimate:
        found = [p for p in self.plans if p.plan == name and (interleave is None or p.interleave == interleave)]
        return found[0] if name == "copies" or interleave is not None else found[-1]

    def one_line(self) -> str:
        """The run header's line: the chosen plan, its peak and the budget."""
        plan = self.chosen or self.plan("copies")
        top = sorted((p for p in plan.parts if p.where == "device"), key=lambda p: -p.bytes)[:3]
        budget = (f" of {self.available()}" if self.budget_bytes
                  else f"; {self.grid.device}'s free memory is unknown here, --max-memory GiB chooses the plan for it")
        return (f"memory: {plan.label()} plan, about {plan.device_bytes / GIB:.1f} GiB{budget} "
                f"({', '.join(f'{p.name} {p.bytes / GIB:.1f}' for p in top)})")

    def lines(self) -> list[str]:
        """The ``--dry-run`` table: every plan's parts."""
        g = self.grid
        out = [f"memory estimate for {self.model} ({g.dtype} on {g.device}): {len(g.weights)} weight × {len(g.kv)} KV config(s), "
               f"ctx {g.ctx}, chunks of {self.chunk}, {g.tokens:,} scored tokens"]
        one = [p for p in self.plans if p.plan == "one-model"]
        shown = [self.plan("copies"), one[0]] + ([self.chosen] if self.chosen not in (None, one[0], self.plan("copies")) else [])
        for plan in shown:
            mark = "  <- chosen" if plan is self.chosen else ""
            out.append(f"  {plan.label()}: {plan.device_bytes / GIB:.2f} GiB on the device{mark}")
            for part in plan.parts:
                out.append(f"      {part.name:<40} {part.bytes / GIB:8.3f} GiB  ({part.where})")
            for part in plan.build_parts:
                if part.name.startswith("calibration") and part.bytes:
                    out.append(f"      {part.name:<40} {part.bytes / GIB:8.3f} GiB  (while a weight config is built)")
        if self.budget_bytes:
            kept = (f", {self.reserve_bytes / GIB:.2f} kept in reserve (a plan may use {self.usable_bytes / GIB:.2f})"
                    if self.reserve_bytes else "")
            out.append(f"  available: {self.budget_bytes / GIB:.2f} GiB on {g.device}{kept}")
        out += [f"  note: {n}" for n in self.notes]
        return out

    def to_dict(self) -> dict:
        return {"model": self.model, "chunk": self.chunk, "budget_bytes": self.budget_bytes, "reserve_bytes": self.reserve_bytes,
                "chosen": self.chosen.to_dict() if self.chosen else None, "plans": [p.to_dict() for p in self.plans],
                "notes": list(self.notes)}


def _cache_bytes(desc: ModelDescription, spec: KVSpec, ctx: int, chunk: int, dtype_bytes: int) -> int:
    """One pass's cache: K and V of every layer at the model's dtype (the simulation keeps the dequantized
    values) — a quantized layer of an engine that reads K/V wider holds them in that dtype in a 16-bit
    run (wkvlab.kv.readprec) —, the full-precision copies where a query sees some keys unquantized,
    sliding layers capped."""
    per_token = kv_bytes_per_token(desc, "fp16")  # 16-bit bytes per layer; rescaled to the run's dtype
    read = engine_read(spec.name)
    total = 0
    for layer, kept in per_layer_tokens(per_token, ctx):
        if layer.window is not None:
            kept = min(ctx, layer.window + chunk)  # the window plus the chunk being written
        k_fmt, v_fmt = spec.formats_for(layer.layer, layer.window is not None)
        quantized = not (k_fmt.is_identity and v_fmt.is_identity)
        raw = quantized and any(p.depends_on_query for p in spec.token_policies(k_fmt, v_fmt))
        held = READ_BYTES[read] if (quantized and read and dtype_bytes < 4) else dtype_bytes
        total += layer.bytes * kept * held // 2 * (2 if raw else 1)
    return total


def _attention(desc: ModelDescription, ctx: int, dtype_bytes: int, mixed: bool, chunk: int = 1) -> int:
    """One layer's attention beyond its inputs and output. transformers' sdpa path passes a mask
    with a chunk of queries against a longer cache, so torch's fused kernels (flash on the CPU,
    memory-efficient on CUDA) run without a score matrix, but ``repeat_kv`` first expands K and V
    of a grouped-query model to every query head: 2 × heads × keys × head_dim in the model's dtype.
    A grid with a query-dependent spec (``mixed``) also runs :func:`wkvlab.kv.attention.mixed_attention`
    (its float32 K/V and one query group's scores, as ``mixed_attention_bytes`` states); the larger counts."""
    expanded = 2 * desc.num_heads * ctx * desc.head_dim * dtype_bytes if desc.num_heads > desc.num_kv_heads else 0
    if not mixed:
        return expanded
    return max(expanded, mixed_attention_bytes(1, desc.num_heads, desc.num_kv_heads, chunk, ctx, desc.head_dim, dtype_bytes))


def _activations(desc: ModelDescription, chunk: int, ctx: int, dtype_bytes: int, mixed: bool = False) -> int:
    """One chunk's forward: hidden-size tensors, the MLP's gate/up/product, and :func:`_attention`."""
    inter = desc.moe.expert_intermediate_size * desc.moe.experts_per_token if desc.moe else desc.intermediate_size
    return chunk * (6 * desc.hidden_size + 3 * inter) * dtype_bytes + _attention(desc, ctx, dtype_bytes, mixed, chunk)


def _query_dependent(spec: KVSpec) -> bool:
    """Whether ``spec`` runs the blocked mixed-precision attention (some keys seen unquantized by some queries)."""
    for sliding in (False, True):
        k_fmt, v_fmt = spec.formats_for(0, sliding)
        if not (k_fmt.is_identity and v_fmt.is_identity) and any(p.depends_on_query for p in spec.token_policies(k_fmt, v_fmt)):
            return True
    return False


CAPTURE_CHUNK = 4  # calibration samples per forward (wkvlab.weights.capture.capture_layer_inputs)
AWQ_CLIP_TOKENS = 512  # input rows AWQ keeps per linear for its clipping search (wkvlab.weights.awq.CLIP_TOKENS)


def _gptq_groups(desc: ModelDescription, dtype_bytes: int) -> list[tuple[int, int, bool, int]]:
    """``(in, out, stacked, matrices)`` of each quantization GPTQ runs at once: q/k/v (every
    attention linear reading the hidden size) stacked, gate and up stacked, and routed experts of
    one shape in batches through one column loop (wkvlab.weights.gptq_batch.experts_per_batch:
    ``matrices`` of them, stacked when more than one; gate and up of one expert are one matrix)."""
    groups = set()
    inventory = linear_inventory(desc)
    for layer in sorted({lin.layer for lin in inventory}):
        linears = [lin for lin in inventory if lin.layer == layer]
        attention_in = [lin for lin in linears if lin.name.startswith("attn.") and lin.in_features == desc.hidden_size]
        if attention_in:
            groups.add((desc.hidden_size, sum(lin.out_features for lin in attention_in), len(attention_in) > 1, 1))
        for lin in linears:
            if lin in attention_in:
                continue
            if lin.routed_expert:
                gate_up = lin.name.endswith("gate_up_proj")
                n_out, experts = lin.out_features * (2 if gate_up else 1), lin.count // (2 if gate_up else 1)
                batch = experts_per_batch(lin.in_features, n_out, experts, dtype_bytes)
                groups.add((lin.in_features, n_out, batch > 1, batch))
            else:
                groups.add((lin.in_features, lin.out_features * lin.count, lin.count > 1, 1))
    return sorted(groups)


def _gptq_build(desc: ModelDescription, tokens: int, dtype_bytes: int) -> int:
    """GPTQ (wkvlab.weights.gptq) beside the weights: the layer's input hidden states, an MoE
    layer's recorded expert inputs (as large), and the largest group's quantization
    (wkvlab.weights.gptq_batch.gptq_working_bytes, times the experts batched together)."""
    hidden = tokens * desc.hidden_size * dtype_bytes
    experts = hidden if desc.moe else 0
    worst = max((matrices * gptq_working_bytes(n_in, n_out, dtype_bytes, stacked=stacked)
                 for n_in, n_out, stacked, matrices in _gptq_groups(desc, dtype_bytes)), default=0)
    return hidden + experts + worst


def _awq_build(desc: ModelDescription, tokens: int, dtype_bytes: int) -> int:
    """AWQ (wkvlab.weights.awq, AutoAWQ's search) beside the weights, one layer at a time: the
    layer's outputs (the next layer's inputs), the recorded inputs and outputs of each inspected
    module — attention, o_proj where K/V heads equal query heads, the MLP, down_proj — each freed
    once its balance is searched, and per scale candidate one balanced linear's float32
    temporaries (the scaled weights, their grid and dequantized copy: four of its size, measured)
    beside the group's other candidate weights (16-bit)."""
    h, i = desc.hidden_size, desc.intermediate_size
    q_out, kv_out = desc.num_heads * desc.head_dim, desc.num_kv_heads * desc.head_dim
    # (features recorded for this balance's inspected module, each balanced linear's out x in), in search order
    balances = [(h + h, [q_out * h, kv_out * h, kv_out * h])]
    if kv_out == q_out:
        balances.append((q_out + h, [h * q_out]))
    balances += [(h + h, [i * h, i * h]), (i + h, [h * i])]
    worst = 0
    for index, (_, linears) in enumerate(balances):
        recorded = sum(features for features, _ in balances[index:]) * tokens * dtype_bytes
        worst = max(worst, recorded + 4 * max(linears) * 4 + (sum(linears) - max(linears)) * dtype_bytes)
    return tokens * h * dtype_bytes + worst


def _calibration(desc: ModelDescription, weights: tuple[WeightSpec, ...], samples: int, length: int, dtype_bytes: int) -> int:
    """What a calibrated build holds besides the weights (measured against a counting ``meta``
    emulation of the build: benchmarks/build_memory.py, docs/weights.md): one layer's hidden
    states and one chunk's forward for every calibrated method, plus GPTQ's or AWQ's own part."""
    methods = {w.method for w in weights}
    if not methods & {"gptq", "awq", "smoothquant"} and not any(w.activations != "none" for w in weights):
        return 0
    tokens = samples * length
    forward = _activations(desc, CAPTURE_CHUNK * length, CAPTURE_CHUNK * length, dtype_bytes)  # repeat_kv expands every sample's keys
    base = tokens * desc.hidden_size * dtype_bytes + forward
    gptq = _gptq_build(desc, tokens, dtype_bytes) if "gptq" in methods else 0
    awq = _awq_build(desc, tokens, dtype_bytes) if "awq" in methods else 0
    return max(base, gptq, awq)


def _reference_record(desc: ModelDescription, grid: GridShape, tokens: int | None = None) -> int:
    """The per-token reference of ``tokens`` scored tokens (default: the whole run's)."""
    tokens = grid.tokens if tokens is None else tokens
    per_token = 8 * (grid.topk + grid.samples) + STORED_BYTES_PER_TOKEN
    return tokens * per_token + -(-tokens // FULL_EVERY) * desc.vocab_size * 4


def _fixed_parts(desc: ModelDescription, device: str) -> list[Part]:
    """What a run holds on its device whatever the grid: on a GPU the CUDA context, kernels'
    workspaces and allocator slack (a fixed allowance); on the CPU, where the estimate is the
    process's peak RSS, the interpreter with its libraries and the tokenizer (measured)."""
    if device == "cpu":
        return [Part("process (python, torch, transformers)", CPU_PROCESS_BYTES),
                Part("tokenizer", desc.vocab_size * TOKENIZER_BYTES_PER_ENTRY)]
    return [Part("runtime (context, workspaces)", RUNTIME_BYTES)]


def estimate_memory(desc: ModelDescription, grid: GridShape, *, budget_bytes: int | None = None, reserve_bytes: int = 0,
                    requested: str = "auto", stored_reference: bool = False, choose: bool = True) -> MemoryEstimate:
    """Every plan's device peak for ``grid`` on ``desc``, and the plan chosen within ``budget_bytes``
    less ``reserve_bytes`` (see :func:`choose_plan`; without a budget: the copies plan unless one-model
    is asked for or a stored reference is used). ``choose=False`` chooses nothing and so refuses nothing."""
    if grid.dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {grid.dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
    d = DTYPE_BYTES[grid.dtype]
    chunk = grid.chunk_for(desc.vocab_size)
    weights = parameter_count(desc) * d
    built = [w for w in grid.weights if not w.is_identity]
    caches = sorted((_cache_bytes(desc, k, grid.ctx, chunk, d) for k in grid.kv), reverse=True)
    identity_cache = _cache_bytes(desc, KVSpec.parse("fp16"), grid.ctx, chunk, d)
    logits_row = chunk * desc.vocab_size * 4
    mixed = any(_query_dependent(k) for k in grid.kv)
    fixed = _fixed_parts(desc, grid.device)
    common = [Part("activations (one chunk)", _activations(desc, chunk, grid.ctx, d, mixed)),
              Part("float32 head block", min(HEAD_BLOCK_BYTES, desc.vocab_size * desc.hidden_size * 4) if d != 4 else 0), *fixed]
    calibration = _calibration(desc, grid.weights, *grid.calibration, d)
    cells = len(grid.weights) * len(grid.kv)
    copies_parts = (Part("weights", weights), Part(f"weight copies ({len(built)})", len(built) * weights),
                    Part(f"KV caches (reference + {cells})", identity_cache + len(grid.weights) * sum(caches)),
                    Part("logits (one chunk, float32)", LIVE_LOGITS["copies"] * logits_row), *common)
    copies_build = (Part("weights", weights), Part(f"weight copies ({len(built)})", len(built) * weights),
                    Part("calibration capture", calibration), *fixed)
    plans = [PlanEstimate("copies", cells, copies_parts, copies_build)]
    off_device = "host" if grid.device.startswith("cuda") else "disk"
    for interleave in range(1, len(grid.kv) + 1):
        alive = max(identity_cache, sum(caches[:interleave]))  # the recording pass, then the candidates
        parts = [Part("weights", weights),
                 Part(f"KV caches ({interleave} at once)", alive),
                 Part("logits (one chunk, float32)", LIVE_LOGITS["one-model"] * logits_row), *common]
        if built:
            parts.append(Part("original weights (restored per config)", weights, off_device))
        # one window of it on the device: the recorder reads a window back at once, and the
        # comparison takes a window's record to the device at once (wkvlab.eval.sources)
        parts.append(Part("per-token reference (one window)", _reference_record(desc, grid, min(grid.ctx, grid.tokens))))
        parts.append(Part("per-token reference", _reference_record(desc, grid), "disk" if stored_reference else "host"))
        build = (Part("weights", weights), Part("calibration capture", calibration), *fixed)
        plans.append(PlanEstimate("one-model", interleave, tuple(parts), build))
    estimate = MemoryEstimate(desc.name, grid, chunk, tuple(plans), budget_bytes, reserve_bytes=reserve_bytes)
    if not choose:
        return estimate
    return replace(estimate, chosen=choose_plan(desc, estimate, requested, stored_reference))


# Who is told each estimate a run makes for itself (a grid whose plan no preflight decided: the ones
# explain, plan --probe, sweep, tasks and findings run): the CLI prints it in the run's header.
_LISTENERS: list[Callable[[MemoryEstimate], None]] = []


def listen(callback: Callable[[MemoryEstimate], None]) -> None:
    """Call ``callback`` with every estimate :func:`announce` is given (once per callback)."""
    if callback not in _LISTENERS:
        _LISTENERS.append(callback)


def announce(estimate: MemoryEstimate) -> None:
    for callback in _LISTENERS:
        callback(estimate)


def grid_estimate(model: str, weights, kv, *, ctx: int, tokens: int, score: str, dtype: str, device: str, chunk: int | None,
                  stored_reference: bool, plan: str, budget: int | None, calibration: tuple[int, int], topk: int,
                  choose: bool = True, reserve: int = 0) -> MemoryEstimate:
    """:func:`estimate_memory` for a grid as the CLI states it (``tokens`` asked, whole windows of
    ``ctx`` scored as ``score`` says), with ``dtype`` and ``device`` already resolved — the one
    computation behind :func:`wkvlab.api.memory_estimate` and the torch-free preflight."""
    from wkvlab.plan.source import resolve_source

    desc = resolve_source(model)[0]
    scored = (tokens // ctx) * (ctx - 1 - (0 if score == "all" else ctx // 2))
    grid = GridShape(tuple(weights), tuple(kv), ctx=ctx, tokens=scored, dtype=dtype, device=device, chunk=chunk,
                     calibration=calibration, topk=topk)
    return estimate_memory(desc, grid, budget_bytes=budget, reserve_bytes=reserve, requested=plan, stored_reference=stored_reference,
                           choose=choose)


def choose_plan(desc: ModelDescription, estimate: MemoryEstimate, requested: str = "auto", stored_reference: bool = False) -> PlanEstimate:
    """The plan to run: ``copies`` (exact KLD) when asked or, under ``auto``, when it fits; else
    ``one-model`` with as many caches side by side as fit. A plan fits when its peak is within the
    budget less its reserve (a measured budget's; none for ``--max-memory``). Refuses in one line,
    naming what fits."""
    if requested not in PLANS:
        raise ConfigError(f"unknown --memory-plan {requested!r}; use one of {', '.join(PLANS)}")
    if stored_reference and requested == "copies":
        raise ConfigError("--memory-plan copies keeps the reference model beside every copy; a stored --reference is the one-model plan: drop one of them")
    budget = estimate.usable_bytes
    fits = lambda plan: budget is None or plan.device_bytes <= budget  # noqa: E731
    copies = estimate.plan("copies")
    singles = [p for p in estimate.plans if p.plan == "one-model"]
    if requested == "copies" or (requested == "auto" and not stored_reference and fits(copies)):
        if fits(copies):
            return copies
        raise ConfigError(f"the copies plan needs about {copies.device_bytes / GIB:.1f} GiB, {estimate.available()}; {_advice(desc, estimate)}")
    fitting = [p for p in singles if fits(p)]
    if fitting:
        return fitting[-1]
    raise ConfigError(f"even one model with one cache needs about {singles[0].device_bytes / GIB:.1f} GiB, {estimate.available()}; "
                      f"{_advice(desc, estimate)}")


def _advice(desc: ModelDescription, estimate: MemoryEstimate) -> str:
    """The first change that fits, tried in order: the one-model plan, a smaller chunk, bfloat16, a shorter ctx."""
    budget, grid = estimate.usable_bytes or 0, estimate.grid
    one = [p for p in estimate.plans if p.plan == "one-model"][0]
    if one.device_bytes <= budget:
        return f"--memory-plan one-model fits ({one.device_bytes / GIB:.1f} GiB)"
    trials = [("--chunk 64", replace(grid, chunk=MIN_CHUNK))]
    if grid.dtype == "float32":
        trials.append(("--dtype bfloat16", replace(grid, dtype="bfloat16")))
    trials += [(f"--ctx {ctx}", replace(grid, ctx=ctx)) for ctx in (grid.ctx // 2, grid.ctx // 4) if ctx >= MIN_CHUNK]
    for option, trial in trials:
        need = estimate_memory(desc, trial, requested="one-model").plan("one-model", 1).device_bytes
        if need <= budget:
            return f"{option} with --memory-plan one-model fits ({need / GIB:.1f} GiB)"
    return "no smaller chunk, dtype or ctx fits: use a device with more memory"

