"""Run the reference and every (weights × KV) candidate on the same windows, chunk by chunk: one stream.

Each window is prefilled in chunks of queries through a cache (:mod:`wkvlab.eval.chunks`), and
every chunk's logits (float32, :mod:`wkvlab.eval.logits`) are reduced to per-token metrics at
once, so a window's ``[ctx, vocab]`` logits never exist. The run reads in one order:

1. **the reference, once** — per token, before any weight config is built (a stored reference,
   read from ``--reference FILE`` or written there, or kept in memory) in the ``one-model``
   plan; or as a live pass stepped beside every candidate in the ``copies`` plan;
2. **each weight config**, built in place on the one loaded model from its original weights
   (kept off the device by :class:`~wkvlab.weights.restore.WeightSnapshot`), or as its own copy
   in the ``copies`` plan;
3. **its KV configs**: their caches side by side when the memory estimate says they fit
   (``interleave``), otherwise a few at a time; then the original weights are written back and
   the next weight config follows.

The ``copies`` plan is the special case of the same loop where every weight config forms one
group with the live reference: exact KLD, (1 + weight configs) models in memory. Which plan runs
is chosen from the memory estimate (:mod:`wkvlab.eval.memory`) unless the options say. A device
out of memory ends the run with :class:`~wkvlab.errors.OutOfMemory`, which carries every result
that had finished.
"""
from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from wkvlab.data.windows import WindowSet
from wkvlab.errors import ConfigError, OutOfMemory
from wkvlab.eval.baseline import FLOAT_BASELINE, Baseline, float_baseline
from wkvlab.eval.chunks import WindowPass, auto_chunk, chunk_bounds, scored_rows, window_tokens
from wkvlab.eval.logits import model_logits
from wkvlab.eval.memory import PLANS, GridShape, PlanEstimate, announce, budget_and_reserve, estimate_memory
from wkvlab.eval.metrics import position_buckets
from wkvlab.eval.reference import DEFAULT_TOPK, StoredComparison
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.eval.sources import LiveReference, RecordedReference, placement, record_reference, recorded_reference  # noqa: F401 - record_reference re-exported
from wkvlab.kv.calibrate import stats_under_weights
from wkvlab.kv.chunked import check_chunk
from wkvlab.kv.hook import layer_stores
from wkvlab.kv.override import model_head_dim, sliding_layers
from wkvlab.kv.presets import fidelity_note, fidelity_of
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.tokens import token_group_multiple
from wkvlab.plan.models import ModelDescription
from wkvlab.runtime import available_memory, input_device, release_freed_heap
from wkvlab.weights.apply import QuantizedWeights, check_quantizable, quantize_with_progress
from wkvlab.weights.calibration import CalibrationSet
from wkvlab.weights.restore import WeightSnapshot
from wkvlab.weights.spec import WeightSpec

Progress = Callable[[str, float], None]  # (description of the step just done, steps advanced; fractions for layers)


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    sliding: tuple[bool, ...]

    @classmethod
    def of(cls, model: torch.nn.Module) -> "ModelShape":
        cfg = model.config.get_text_config()  # a multimodal model's language part
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return cls(cfg.num_hidden_layers, kv_heads, model_head_dim(model), sliding_layers(model))

    def kv_bytes_per_token(self, spec: KVSpec, context: int | None = None) -> float:
        return spec.bytes_per_token(layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim, sliding=self.sliding, context=context)


@dataclass(frozen=True)
class RunOptions:
    """How a grid runs (never what it measures: the numbers do not depend on these, beyond the
    plan's choice of exact or stored-reference KLD, and beyond float rounding — which a coarse
    cache can amplify: on Gemma-3-270M a q4_0 window's KLD moved 11% between chunks of 256 and 512,
    docs/engines.md; compare two runs at the same chunk).

    ``chunk``: queries per chunk (None: the largest power of two whose logits stay near 256 MiB).
    ``reference``: a stored-reference file (read when it exists and matches, written otherwise);
    it implies the one-model plan. ``topk``: k of a stored reference this run writes.
    ``plan``: ``copies``, ``one-model`` or ``auto`` (copies when its estimate fits, see
    :mod:`wkvlab.eval.memory`); ``interleave``: KV caches side by side in the one-model plan (None:
    as many as fit); ``max_memory``: bytes the run may use on its device (None: what is free).
    """

    chunk: int | None = None
    reference: Path | None = None
    topk: int = DEFAULT_TOPK
    plan: str = "auto"
    interleave: int | None = None
    max_memory: int | None = None

    def chunk_for(self, model: torch.nn.Module, ctx: int, kv_specs: list[KVSpec]) -> int:
        chunk = self.chunk or auto_chunk(model.config.get_text_config().vocab_size, ctx, kv_specs)
        check_chunk(chunk, kv_specs)
        return min(chunk, ctx)


@torch.no_grad()
def forward_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Float32 logits ``[ctx, vocab]`` of one window in one pass, without a cache (short windows only)."""
    return model_logits(model, tokens[None].to(input_device(model)), use_cache=False)


def check_kv_specs(model: torch.nn.Module, kv_specs: list[KVSpec]) -> None:
    """Fail before any work on a format the model's head_dim cannot hold."""
    head_dim = model_head_dim(model)
    for kv in kv_specs:
        kv.check_model(head_dim, model.config.get_text_config().num_hidden_layers)


def grid_steps(windows: WindowSet, n_weights: int, n_kv: int, kv_calibration: bool = False, chunk: int | None = None,
               reference_pass: bool = True) -> int:
    """Progress steps of :func:`run_grid`: weight builds, calibrations and one per pass and chunk
    (the reference's passes too, unless a stored reference is read back)."""
    chunks = len(chunk_bounds(windows.ctx, chunk or windows.ctx))
    reference = windows.n_windows * chunks if reference_pass else 0
    return n_weights * (2 if kv_calibration else 1) + reference + windows.n_windows * chunks * n_weights * n_kv


@dataclass
class _Cell:
    """One (weights × KV) candidate while it runs: its pass and what it has measured so far."""

    index: tuple[int, int]  # (weight config, KV config) in grid order
    built: QuantizedWeights
    kv: KVSpec
    pass_: WindowPass
    build_seconds: float = 0.0
    parts: list = field(default_factory=list)  # one host-side comparison per window
    seconds: float = 0.0
    forward_calls: int = 0

    @property
    def label(self) -> str:
        return f"{self.built.spec.label} × {self.kv.label}"


class _Grid:
    """What one run needs at every step: windows, chunking, progress, the configs' layer stores."""

    def __init__(self, model, windows: WindowSet, kv_specs: list[KVSpec], options: RunOptions, calibration, fingerprints, progress,
                 tokenizer=None, baseline: Baseline = FLOAT_BASELINE, notes: list[str] | None = None,
                 model_name: str = "", data_name: str = ""):
        self.model, self.windows, self.kv_specs, self.tokenizer = model, windows, kv_specs, tokenizer
        self.baseline, self.notes = baseline, list(notes or ())
        self.model_name, self.data_name = model_name, data_name
        self.chunk = options.chunk_for(model, windows.ctx, kv_specs)
        self.bounds = chunk_bounds(windows.ctx, self.chunk)
        self.calibration, self.fingerprints = calibration, dict(fingerprints or {})
        self.tick = progress or (lambda _desc, _n: None)
        self.lo, self.hi = windows.score_from, windows.ctx - 1

    def build(self, spec: WeightSpec, originals: WeightSnapshot | None) -> tuple[QuantizedWeights, float]:
        """``spec`` on the model itself (``originals``: the one-model plan) or as a copy of it."""
        start = time.perf_counter()
        in_place = originals is not None and not spec.is_identity and not spec.is_checkpoint
        built = quantize_with_progress(self.model, spec, self.calibration, self.fingerprints.get("model_sha256"), self.tick,
                                       in_place=in_place, originals=originals if in_place else None, tokenizer=self.tokenizer)
        return built, time.perf_counter() - start

    def cells(self, w_index: int, built: QuantizedWeights, build_seconds: float) -> list[_Cell]:
        stats = None
        if any(kv.needs_calibration for kv in self.kv_specs):
            if self.calibration is None:
                raise ConfigError("a KV config needs calibration but no calibration text was prepared; pass calibration= (wkvlab eval does)")
            label, done = f"calibrated KV statistics under {built.spec.label}", [0.0]

            def sample(finished: int, samples: int) -> None:  # a fraction of the step per sample (StepCosts times it as a build)
                done[0] += 1 / samples
                self.tick(f"{label}: sample {finished}/{samples}", 1 / samples)

            stats = stats_under_weights(built, self.calibration, self.fingerprints.get("model_sha256", self.model_name), sample)
            self.tick(label, max(0.0, 1.0 - done[0]))  # all of it when read from the cache
        return [_Cell((w_index, k), built, kv, WindowPass(built.model, kv, layer_stores(built.model, kv, stats if kv.needs_calibration else None),
                                                          self.baseline), build_seconds)
                for k, kv in enumerate(self.kv_specs)]

    def targets(self, tokens: torch.Tensor, start: int, end: int) -> tuple[slice, torch.Tensor]:
        rows = scored_rows(start, end, self.lo, self.hi)
        return rows, tokens[start + rows.start + 1 : start + rows.stop + 1]


def _run_cells(grid: _Grid, cells: list[_Cell], reference: LiveReference | RecordedReference) -> None:
    """The loop every plan runs: windows outside; per chunk the reference's chunk, then each cell's."""
    per_window = grid.windows.scored_per_window
    for w in range(grid.windows.n_windows):
        # one host-to-device copy per window: the chunks' ids are slices of it, and the targets
        # slices of its copy where the logits come from (lm_head's device), so no chunk copies
        tokens, labels = window_tokens(grid.model, grid.windows.tokens[w])
        reference.start_window(w)
        for cell in cells:
            cell.pass_.reset()
        window_parts: list[list[dict]] = [[] for _ in cells]
        for start, end in grid.bounds:
            rows, targets = grid.targets(labels, start, end)
            first = w * per_window + (start + rows.start - grid.lo)
            ref = reference.chunk(tokens, start, end, rows, targets, first)
            if isinstance(reference, LiveReference):
                grid.tick("reference", 1)
            for c, cell in enumerate(cells):
                began = time.perf_counter()
                window_parts[c].append(reference.compare(ref, cell.pass_.step(tokens[start:end], rows), targets))
                cell.forward_calls += 1
                cell.seconds += time.perf_counter() - began
                grid.tick(cell.label, 1)
            del ref
        for c, cell in enumerate(cells):
            cell.parts.append(reference.to_host(window_parts[c]))  # one read-back per window and cell
        release_freed_heap()  # a window's freed chunk tensors under 32 MiB would stay resident (wkvlab.runtime)


def _result(grid: _Grid, cell: _Cell, reference, run: dict) -> EvalResult:
    shape = ModelShape.of(grid.model)
    kv, built = cell.kv, cell.built
    metrics = [p.metrics if isinstance(p, StoredComparison) else p for p in cell.parts]
    run = {**run, "reference": reference.info(cell.parts), "forward_calls": cell.forward_calls,
           "reference_forward_calls": reference.forward_calls}
    return EvalResult(
        model=grid.model_name,
        data=grid.data_name,
        ctx=grid.windows.ctx,
        weights=built.spec.label,
        kv=kv.label,
        weights_spec=built.spec.to_dict(),
        kv_spec=kv.to_dict(),
        weight_bytes=built.weight_bytes,
        quantized_fraction=built.quantized_fraction,
        # sinks and residual windows held at 16 bits are amortized over the evaluated context
        kv_bytes_per_token=shape.kv_bytes_per_token(kv, context=grid.windows.ctx),
        seconds=cell.seconds + cell.build_seconds / len(grid.kv_specs),
        arrays=TokenArrays.concat(metrics, np.arange(grid.lo, grid.hi), grid.windows.documents),
        buckets=position_buckets(grid.windows.ctx),
        fingerprints=grid.fingerprints,
        notes=list(built.notes) + grid.notes + fidelity_note(kv),
        fidelity={**fidelity_of(kv), "baseline": grid.baseline.to_dict()},
        run=run,
        threads=torch.get_num_threads(),
        model_shape={"layers": shape.layers, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim},
    )


def memory_plan(model: torch.nn.Module, windows: WindowSet, weight_specs: list[WeightSpec], kv_specs: list[KVSpec], options: RunOptions,
                calibration: CalibrationSet | None = None) -> PlanEstimate:
    """The plan :func:`run_grid` runs: the one ``options`` names (with ``interleave``: decided
    already, by the preflight estimate), else the memory estimate's choice within what the model's
    device has (free memory plus the loaded model itself, less a reserve, or ``options.max_memory``)."""
    if options.plan not in PLANS:
        raise ConfigError(f"unknown memory plan {options.plan!r}; use one of {', '.join(PLANS)}")
    devices = {p.device for p in model.parameters()}
    device = input_device(model)
    where = "cuda" if device.type == "cuda" and len(devices) > 1 else str(device) if device.type == "cuda" else device.type
    samples = tuple(calibration.tokens.shape) if calibration is not None else (16, 512)
    grid = GridShape(tuple(weight_specs), tuple(kv_specs), ctx=windows.ctx, tokens=windows.n_scored, dtype=placement(model)["dtype"],
                     device=where, chunk=options.chunk_for(model, windows.ctx, kv_specs), calibration=samples, topk=options.topk)
    decided = options.plan != "auto" and options.interleave is not None
    budget, reserve = None, 0
    if not decided and where != "meta":
        resident = sum(p.numel() * p.element_size() for p in model.parameters())  # already loaded: part of what the run may use
        budget, reserve = budget_and_reserve(options.max_memory, available_memory(where) + resident if options.max_memory is None else None)
    try:
        desc = ModelDescription.from_config(model.config.to_dict(), name=type(model).__name__)
    except ConfigError:  # a config the planner cannot describe: no estimate, so the plan the options imply
        one = options.plan == "one-model" or options.reference is not None
        return PlanEstimate("one-model" if one else "copies", max(1, options.interleave or 1) if one else len(weight_specs) * len(kv_specs), ())
    estimate = estimate_memory(desc, grid, budget_bytes=budget, reserve_bytes=reserve, requested=options.plan,
                               stored_reference=options.reference is not None)
    if not decided:  # no preflight printed it: the command's header says it now
        announce(estimate)
    if options.interleave is not None and estimate.chosen.plan == "one-model":
        return estimate.plan("one-model", max(1, min(options.interleave, len(kv_specs))))
    return estimate.chosen


def _groups(weight_specs: list[WeightSpec], plan: PlanEstimate) -> list[list[int]]:
    """Weight configs built together: all of them with the live reference (copies), else one at a time."""
    indices = list(range(len(weight_specs)))
    return [indices] if plan.plan == "copies" else [[i] for i in indices]


def _batches(cells: list[_Cell], plan: PlanEstimate) -> list[list[_Cell]]:
    size = len(cells) if plan.plan == "copies" else max(1, plan.interleave)
    return [cells[i : i + size] for i in range(0, len(cells), size)]


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text or "not enough memory" in text)


def _out_of_memory(grid: _Grid, plan: PlanEstimate, running: list[_Cell], finished: list[EvalResult], total: int) -> OutOfMemory:
    where = str(input_device(grid.model))
    doing = ", ".join(c.label for c in running[:3]) + (" ..." if len(running) > 3 else "") if running else "building a weight config"
    multiple = math.lcm(*(token_group_multiple(kv) for kv in grid.kv_specs))
    smaller = (grid.chunk // 2) // multiple * multiple
    advice = [f"--chunk {smaller}"] if smaller >= 1 else []
    if plan.plan == "copies":
        advice.append("--memory-plan one-model (one model in memory)")
    elif plan.interleave > 1:
        advice.append("--max-memory with less than the device has, so fewer caches run side by side")
    kept = f"{len(finished)} of {total} result(s) had finished and are kept" if finished else "no result had finished"
    advice = " or ".join(advice) or "a device with more memory"
    return OutOfMemory(f"out of memory on {where} while running {doing}: {kept}; rerun with {advice}", finished)


@torch.no_grad()
def run_grid(
    model: torch.nn.Module,
    windows: WindowSet,
    weight_specs: list[WeightSpec],
    kv_specs: list[KVSpec],
    *,
    model_name: str,
    data_name: str,
    fingerprints: dict[str, str] | None = None,
    progress: Progress | None = None,
    calibration: CalibrationSet | None = None,
    options: RunOptions = RunOptions(),
    tokenizer=None,
    baseline: Baseline | None = None,
    notes: list[str] | None = None,
    plan: PlanEstimate | None = None,
) -> list[EvalResult]:
    """Evaluate every weights × KV combination on the same windows; results in grid order.

    ``calibration`` feeds the weight configs that need it (GPTQ, AWQ, SmoothQuant, static
    activation scales) and calibrated KV configs; each is calibrated once per weight config.
    ``tokenizer`` (the reference's) is checked against a ``checkpoint:`` candidate's.
    ``baseline`` (:mod:`wkvlab.eval.baseline`) is attached around the reference pass and every
    candidate pass alike (default: the float reference in the model's dtype); ``notes`` are added to every result (the baseline's choice). ``plan``:
    the memory plan (default :func:`memory_plan`). ``model`` is left as it came (in-place builds
    are undone, on error too).
    """
    baseline = baseline or float_baseline(model)
    check_kv_specs(model, kv_specs)
    check_quantizable(model, weight_specs)  # offloaded layers, MoE experts a method cannot take: before the reference pass
    grid = _Grid(model, windows, kv_specs, options, calibration, fingerprints, progress, tokenizer, baseline, notes, model_name, data_name)
    plan = plan or memory_plan(model, windows, weight_specs, kv_specs, options, calibration)
    run = {"chunk": grid.chunk, **placement(model), "device": str(next(model.parameters()).device),
           "plan": plan.plan, "interleave": plan.interleave}
    total = len(weight_specs) * len(kv_specs)
    finished: dict[tuple[int, int], EvalResult] = {}
    running: list[_Cell] = []
    snapshot: WeightSnapshot | None = None
    active: QuantizedWeights | None = None  # the in-place build the model holds now
    try:
        if plan.plan == "copies":
            reference = LiveReference(model, baseline)
        else:
            path = Path(options.reference) if options.reference is not None else None
            reference = recorded_reference(model, windows, chunk=grid.chunk, k=options.topk, path=path, fingerprints=grid.fingerprints,
                                           model_name=model_name, data_name=data_name, baseline=baseline, progress=grid.tick)
            if any(not (w.is_identity or w.is_checkpoint) for w in weight_specs):
                snapshot = WeightSnapshot(model, weight_specs)
        for group in _groups(weight_specs, plan):
            cells = []
            for w_index in group:
                built, seconds = grid.build(weight_specs[w_index], snapshot)
                active = built if built.model is model and not built.spec.is_identity else active
                cells += grid.cells(w_index, built, seconds)
            batch: list[_Cell] = []
            for batch in _batches(cells, plan):
                running = batch
                _run_cells(grid, batch, reference)
                finished.update({cell.index: _result(grid, cell, reference, run) for cell in batch})
                for cell in batch:
                    cell.pass_.cache = None  # measured: its KV cache must not sit beside the next batch's or build
                running = []
            if active is not None:
                snapshot.restore(model, active.hooks)  # the next weight config starts from the original weights
                active = None
            del cells, built, batch  # the loop variable would keep the last batch (a copy's weights too) through the next build
            gc.collect()
    except Exception as exc:
        if active is not None:
            snapshot.restore(model, active.hooks)
        if _is_out_of_memory(exc):
            raise _out_of_memory(grid, plan, running, [finished[k] for k in sorted(finished)], total) from None
        raise
    finally:
        if snapshot is not None:
            snapshot.close()
    return [finished[(w, k)] for w in range(len(weight_specs)) for k in range(len(kv_specs))]
