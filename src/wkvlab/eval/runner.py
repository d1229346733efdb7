"""Run the reference and every (weights × KV) candidate on the same windows, chunk by chunk.

Each window is prefilled in chunks of queries through a cache (:mod:`wkvlab.eval.chunks`), and
every chunk's logits are reduced to per-token metrics at once, so a window's ``[ctx, vocab]``
logits never exist. Two ways to hold the reference:

* **in memory** (default, exact KLD): per chunk, the reference runs first and every candidate is
  compared with it before the next chunk; each weight-quantized copy is built once, kept for the
  run and shared by its KV configs. The full-vocabulary reference is never stored.
* **stored** (:mod:`wkvlab.eval.reference`, ``reference=<file>``): the reference runs once (or is
  read back), keeping per token its NLL, argmax, log-sum-exp and top-k log-probabilities; then the
  weight configs are built and evaluated one at a time and released, so the reference and a
  quantized copy never need memory together. NLL, top-1 and Δp are exact; KLD is the top-k lower
  bound, whose error each run measures on the tokens whose full distribution the file keeps.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from wkvlab.data.windows import WindowSet
from wkvlab.eval.baseline import FLOAT_BASELINE, Baseline
from wkvlab.errors import ConfigError
from wkvlab.eval.chunks import WindowPass, auto_chunk, chunk_bounds
from wkvlab.eval.metrics import ReferenceTokens, TokenMetrics, compare_tokens, concat_metrics, position_buckets
from wkvlab.eval.reference import DEFAULT_TOPK, ReferenceRecorder, StoredComparison, StoredReference, compare_stored, windows_fingerprint
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.kv.calibrate import KVStats, stats_under_weights
from wkvlab.kv.chunked import check_chunk
from wkvlab.kv.hook import layer_stores
from wkvlab.kv.override import model_head_dim, sliding_layers
from wkvlab.kv.presets import fidelity_note, fidelity_of
from wkvlab.kv.spec import KVSpec
from wkvlab.runtime import input_device, keep_freed_memory
from wkvlab.weights.apply import QuantizedWeights, quantize_with_progress
from wkvlab.weights.calibration import CalibrationSet
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
        cfg = model.config
        kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        return cls(cfg.num_hidden_layers, kv_heads, model_head_dim(model), sliding_layers(model))

    def kv_bytes_per_token(self, spec: KVSpec, context: int | None = None) -> float:
        return spec.bytes_per_token(layers=self.layers, kv_heads=self.kv_heads, head_dim=self.head_dim, sliding=self.sliding, context=context)


@dataclass(frozen=True)
class RunOptions:
    """How a grid runs (never what it measures: the numbers do not depend on these).

    ``chunk``: queries per chunk (None: the largest power of two whose logits stay near 256 MiB).
    ``reference``: a stored-reference file (read when it exists and matches, written otherwise);
    None keeps the reference in memory. ``topk``: k of a stored reference this run writes.
    ``in_place``: with a stored reference, quantize the loaded model itself and reload it before
    the next weight config (for a model that does not fit in memory twice; needs ``reload``).
    """

    chunk: int | None = None
    reference: Path | None = None
    topk: int = DEFAULT_TOPK
    in_place: bool = False

    def chunk_for(self, model: torch.nn.Module, ctx: int, kv_specs: list[KVSpec]) -> int:
        chunk = self.chunk or auto_chunk(model.config.get_text_config().vocab_size, ctx, kv_specs)
        check_chunk(chunk, kv_specs)
        return min(chunk, ctx)


@torch.no_grad()
def forward_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[ctx, vocab]`` of one window in one pass, without a cache (short windows only)."""
    return model(input_ids=tokens[None].to(input_device(model)), use_cache=False).logits[0]


def check_kv_specs(model: torch.nn.Module, kv_specs: list[KVSpec]) -> None:
    """Fail before any work on a format the model's head_dim cannot hold."""
    head_dim = model_head_dim(model)
    for kv in kv_specs:
        kv.check_model(head_dim, model.config.num_hidden_layers)


def grid_steps(windows: WindowSet, n_weights: int, n_kv: int, kv_calibration: bool = False, chunk: int | None = None,
               reference_pass: bool = True) -> int:
    """Progress steps of :func:`run_grid`: weight builds, calibrations and one per pass and chunk
    (the reference's passes too, unless a stored reference is read back)."""
    chunks = len(chunk_bounds(windows.ctx, chunk or windows.ctx))
    reference = windows.n_windows * chunks if reference_pass else 0
    return n_weights * (2 if kv_calibration else 1) + reference + windows.n_windows * chunks * n_weights * n_kv


def _scored_rows(start: int, end: int, lo: int, hi: int) -> slice:
    """Rows of a chunk ``[start, end)`` whose query position is scored (``lo <= p < hi``)."""
    return slice(max(lo, start) - start, max(min(hi, end), max(lo, start)) - start)


class _Grid:
    """What one run needs at every step: windows, chunking, progress, the configs' layer stores."""

    def __init__(self, model, windows: WindowSet, kv_specs: list[KVSpec], options: RunOptions, calibration, fingerprints, progress,
                 tokenizer=None, baseline: Baseline = FLOAT_BASELINE, notes: list[str] | None = None):
        self.model, self.windows, self.kv_specs, self.tokenizer = model, windows, kv_specs, tokenizer
        self.baseline, self.notes = baseline, list(notes or ())
        self.chunk = options.chunk_for(model, windows.ctx, kv_specs)
        self.bounds = chunk_bounds(windows.ctx, self.chunk)
        self.calibration, self.fingerprints = calibration, dict(fingerprints or {})
        self.tick = progress or (lambda _desc, _n: None)
        self.lo, self.hi = windows.score_from, windows.ctx - 1

    def build(self, spec: WeightSpec, in_place: bool = False) -> tuple[QuantizedWeights, float]:
        start = time.perf_counter()
        built = quantize_with_progress(self.model, spec, self.calibration, self.fingerprints.get("model_sha256"), self.tick,
                                       in_place=in_place, tokenizer=self.tokenizer)
        return built, time.perf_counter() - start

    def kv_stats(self, built: QuantizedWeights, model_name: str) -> KVStats | None:
        if not any(kv.needs_calibration for kv in self.kv_specs):
            return None
        if self.calibration is None:
            raise ConfigError("a KV config needs calibration but no calibration text was prepared; pass calibration= (wkvlab eval does)")
        stats = stats_under_weights(built, self.calibration, self.fingerprints.get("model_sha256", model_name))
        self.tick(f"calibrated KV statistics under {built.spec.label}", 1)
        return stats

    def passes(self, built: QuantizedWeights, stats: KVStats | None) -> list[WindowPass]:
        return [WindowPass(built.model, kv, layer_stores(built.model, kv, stats if kv.needs_calibration else None), self.baseline)
                for kv in self.kv_specs]

    def targets(self, tokens: torch.Tensor, start: int, end: int) -> tuple[slice, torch.Tensor]:
        rows = _scored_rows(start, end, self.lo, self.hi)
        return rows, tokens[start + rows.start + 1 : start + rows.stop + 1]


def _result(grid: _Grid, built: QuantizedWeights, kv: KVSpec, parts: list[TokenMetrics], seconds: float, build_seconds: float,
            model_name: str, data_name: str, run: dict) -> EvalResult:
    shape = ModelShape.of(grid.model)
    return EvalResult(
        model=model_name,
        data=data_name,
        ctx=grid.windows.ctx,
        weights=built.spec.label,
        kv=kv.label,
        weights_spec=built.spec.to_dict(),
        kv_spec=kv.to_dict(),
        weight_bytes=built.weight_bytes,
        # sinks and residual windows held at 16 bits are amortized over the evaluated context
        kv_bytes_per_token=shape.kv_bytes_per_token(kv, context=grid.windows.ctx),
        seconds=seconds + build_seconds / len(grid.kv_specs),
        arrays=TokenArrays.concat(parts, np.arange(grid.lo, grid.hi)),
        buckets=position_buckets(grid.windows.ctx),
        fingerprints=grid.fingerprints,
        notes=list(built.notes) + grid.notes + fidelity_note(kv),
        fidelity={**fidelity_of(kv), "baseline": grid.baseline.to_dict()},
        run=dict(run),
        threads=torch.get_num_threads(),
        model_shape={"layers": shape.layers, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim},
    )


def _run_in_memory(grid: _Grid, weight_specs: list[WeightSpec], model_name: str, data_name: str, run: dict) -> list[EvalResult]:
    built, build_seconds = zip(*(grid.build(spec) for spec in weight_specs))
    stats = [grid.kv_stats(b, model_name) for b in built]
    cells = [(wi, ki) for wi in range(len(built)) for ki in range(len(grid.kv_specs))]
    passes = [p for wi, b in enumerate(built) for p in grid.passes(b, stats[wi])]
    reference = WindowPass(grid.model, baseline=grid.baseline)
    parts: list[list[TokenMetrics]] = [[] for _ in cells]
    seconds = [0.0] * len(cells)
    for w in range(grid.windows.n_windows):
        tokens = grid.windows.tokens[w]
        reference.reset()
        for p in passes:
            p.reset()
        window_parts: list[list[TokenMetrics]] = [[] for _ in cells]
        for start, end in grid.bounds:
            rows, targets = grid.targets(tokens, start, end)
            ref = ReferenceTokens.from_logits(reference.step(tokens[start:end])[rows], targets)
            grid.tick("reference", 1)
            for c, p in enumerate(passes):
                began = time.perf_counter()
                window_parts[c].append(compare_tokens(ref, p.step(tokens[start:end])[rows]))
                seconds[c] += time.perf_counter() - began
                grid.tick(f"{built[cells[c][0]].spec.label} × {grid.kv_specs[cells[c][1]].label}", 1)
            del ref
        for c in range(len(cells)):
            parts[c].append(concat_metrics(window_parts[c]))
    return [_result(grid, built[wi], grid.kv_specs[ki], parts[c], seconds[c], build_seconds[wi], model_name, data_name, run)
            for c, (wi, ki) in enumerate(cells)]


def record_reference(model: torch.nn.Module, windows: WindowSet, *, chunk: int, k: int = DEFAULT_TOPK, meta: dict | None = None,
                     progress: Progress | None = None, baseline: Baseline = FLOAT_BASELINE) -> StoredReference:
    """Run the reference over every window chunk by chunk and keep what :func:`compare_stored` needs."""
    tick = progress or (lambda _desc, _n: None)
    recorder = ReferenceRecorder(k)
    reference = WindowPass(model, baseline=baseline)
    lo, hi = windows.score_from, windows.ctx - 1
    for w in range(windows.n_windows):
        tokens = windows.tokens[w]
        reference.reset()
        for start, end in chunk_bounds(windows.ctx, chunk):
            rows = _scored_rows(start, end, lo, hi)
            logits = reference.step(tokens[start:end])[rows]
            recorder.add(logits, tokens[start + rows.start + 1 : start + rows.stop + 1], seed=w * windows.ctx + start)
            tick("reference", 1)
    info = dict(meta or {}, baseline=baseline.label, windows_sha256=windows_fingerprint(windows.tokens, windows.score_from), ctx=windows.ctx,
                n_windows=windows.n_windows, score_from=windows.score_from, dtype=str(next(model.parameters()).dtype).replace("torch.", ""))
    return recorder.finish(info)


def _stored_reference(grid: _Grid, path: Path, k: int, model_name: str, data_name: str) -> tuple[StoredReference, bool]:
    """The stored reference at ``path``: read back and checked, or computed and written there."""
    expected = {**{key: grid.fingerprints[key] for key in ("model_sha256", "data_sha256") if key in grid.fingerprints},
                "windows_sha256": windows_fingerprint(grid.windows.tokens, grid.windows.score_from), "ctx": grid.windows.ctx,
                "baseline": grid.baseline.label}
    if path.exists():
        stored = StoredReference.load(path)
        stored.check_matches(expected)
        return stored, False
    if not path.parent.exists():
        raise ConfigError(f"folder {path.parent} does not exist; create it or choose another --reference path")
    stored = record_reference(grid.model, grid.windows, chunk=grid.chunk, k=k, progress=grid.tick, baseline=grid.baseline,
                              meta={**grid.fingerprints, "model": model_name, "data": data_name})
    stored.save(path)
    return stored, True


def _reference_info(stored: StoredReference, path: Path, created: bool, comparisons: list[StoredComparison]) -> dict:
    """What a stored-reference KLD is, and its error measured where the file keeps the full reference."""
    exact = np.concatenate([c.exact for c in comparisons])
    estimate = np.concatenate([c.estimate_at_exact for c in comparisons])
    bound_at = np.concatenate([c.bound_at_exact for c in comparisons])
    err = exact - estimate
    tail = 1.0 - stored.topk_logprobs.double().exp().sum(-1)
    n = int(err.size)
    variance = np.concatenate([c.tail_variance for c in comparisons])
    return {
        "kind": "stored", "path": str(path), "k": stored.k, "samples": stored.meta.get("samples"), "created": created,
        "reference_tail_mass_mean": float(tail.mean()),
        # standard error of the mean KLD from tail sampling alone, estimated from the samples themselves
        "sampling_se": float(np.sqrt(variance.sum()) / variance.size) if variance.size else float("nan"),
        # the top-k lower bound over all tokens (never above the true KLD), for comparison with the estimate
        "kld_lower_bound_mean": float(np.concatenate([c.bound for c in comparisons]).mean()),
        # exact KLD minus the estimate (and minus the bound) on the tokens whose full reference the file keeps
        "error": {"tokens": n, "mean": float(err.mean()) if n else float("nan"),
                  "se": float(err.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
                  "bound_gap_mean": float((exact - bound_at).mean()) if n else float("nan")},
    }


def _run_stored(grid: _Grid, weight_specs: list[WeightSpec], model_name: str, data_name: str, run: dict, path: Path, k: int,
                reload: Callable[[], torch.nn.Module] | None) -> list[EvalResult]:
    stored, created = _stored_reference(grid, path, k, model_name, data_name)
    device = input_device(grid.model)
    per_window = grid.windows.scored_per_window
    results = []
    modified = False  # the loaded model was quantized in place by the previous weight config
    for spec in weight_specs:
        if modified:
            grid.model = reload()
        built, build_seconds = grid.build(spec, in_place=reload is not None)
        modified = reload is not None and not spec.is_identity
        stats = grid.kv_stats(built, model_name)
        for kv, window_pass in zip(grid.kv_specs, grid.passes(built, stats)):
            parts, comparisons = [], []
            began = time.perf_counter()
            for w in range(grid.windows.n_windows):
                tokens = grid.windows.tokens[w]
                window_pass.reset()
                chunk_parts = []
                for start, end in grid.bounds:
                    rows, targets = grid.targets(tokens, start, end)
                    first = w * per_window + (start + rows.start - grid.lo)
                    ref = stored.chunk(first, first + (rows.stop - rows.start), device)
                    comparison = compare_stored(ref, window_pass.step(tokens[start:end])[rows], targets)
                    chunk_parts.append(comparison.metrics)
                    comparisons.append(comparison)
                    grid.tick(f"{built.spec.label} × {kv.label}", 1)
                parts.append(concat_metrics(chunk_parts))
            seconds = time.perf_counter() - began
            info = _reference_info(stored, path, created, comparisons)
            results.append(_result(grid, built, kv, parts, seconds, build_seconds, model_name, data_name, {**run, "reference": info}))
        del built, stats  # release the quantized copy before the next weight config is built
        gc.collect()
    return results


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
    reload: Callable[[], torch.nn.Module] | None = None,
    tokenizer=None,
    baseline: Baseline = FLOAT_BASELINE,
    notes: list[str] | None = None,
) -> list[EvalResult]:
    """Evaluate every weights × KV combination on the same windows; results in grid order.

    ``calibration`` feeds the weight configs that need it (GPTQ, AWQ, SmoothQuant, static
    activation scales) and calibrated KV configs; each is calibrated once per weight config.
    ``reload`` (a fresh copy of the reference model) is used with ``options.in_place``;
    ``tokenizer`` (the reference's) is checked against a ``checkpoint:`` candidate's.
    ``baseline`` (:mod:`wkvlab.eval.baseline`) is attached around the reference pass and every
    candidate pass alike; ``notes`` are added to every result (the baseline's choice).
    """
    if options.in_place and (options.reference is None or reload is None):
        raise ConfigError("building weight configs in place needs a stored reference (--reference FILE) and a model that can be reloaded")
    keep_freed_memory()
    check_kv_specs(model, kv_specs)
    grid = _Grid(model, windows, kv_specs, options, calibration, fingerprints, progress, tokenizer, baseline, notes)
    param = next(model.parameters())
    run = {"chunk": grid.chunk, "device": str(param.device), "dtype": str(param.dtype).replace("torch.", ""),
           "reference": {"kind": "memory"}}
    if options.reference is None:
        return _run_in_memory(grid, weight_specs, model_name, data_name, run)
    return _run_stored(grid, weight_specs, model_name, data_name, run, Path(options.reference), options.topk,
                       reload if options.in_place else None)
