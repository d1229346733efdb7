"""The Python API; the CLI only parses arguments and calls these functions.

    >>> from wkvlab import api
    >>> results = api.evaluate(model="default", data="default", ctx=512, tokens=2048,
    ...                        weights=["int4-g128"], kv=["fp16", "q4_0"])
    >>> results[1].kld["mean"], results[1].top1_agreement
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from wkvlab.data import Corpus, WindowSet, cut_windows, load_corpus, tokenize, tokenizer_wants_bos, window_layout
from wkvlab.data.selfgen import parse_selfgen, selfgen_corpus
from wkvlab.data.windows import unused_remainders
from wkvlab.errors import ConfigError
from wkvlab.eval.baseline import Baseline, choose_baseline
from wkvlab.eval.constants import DEFAULT_TOPK
from wkvlab.eval.result import EvalResult
from wkvlab.eval.runner import Progress, RunOptions, check_kv_specs, grid_steps, run_grid
from wkvlab.kv.spec import KVSpec
from wkvlab.models.loading import LoadedModel, load_model
from wkvlab.preflight import check_context_fits
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec, calibration_corpus, calibration_set
from wkvlab.weights.spec import WeightSpec


@dataclass
class Workload:
    """A loaded model and the token windows it will be evaluated on."""

    loaded: LoadedModel
    corpus: Corpus
    windows: WindowSet
    tokens: int = 0  # the tokens asked for (the windows hold them rounded down to whole windows)
    stride: int | None = None


def prepare(
    model: str | LoadedModel = "default",
    data: str = "default",
    *,
    ctx: int = 1024,
    tokens: int = 8192,
    score: str = "all",
    stride: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    device_map: str = "auto",
    attn: str = "auto",
) -> Workload:
    """Load the model (on ``device``, in ``dtype``, placed by ``device_map``, attention ``attn``; see
    :func:`wkvlab.models.loading.load_model`; ``auto``: a GPU when one is visible, as the CLI) and cut the text into windows."""
    from wkvlab.models.attn import check_attn

    implementation = check_attn(attn, device=device, dtype=dtype)
    selfgen = parse_selfgen(data, default_tokens=tokens)  # text the model writes itself: needs the model first
    corpus = None if selfgen else load_corpus(data)  # first: a typo in --data should not cost a model load
    loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device, dtype=dtype, device_map=device_map, attn=implementation)
    corpus = corpus or selfgen_corpus(loaded, selfgen)
    check_context_fits(ctx, tokens, loaded.max_context, loaded.name)
    bos = loaded.tokenizer.bos_token_id if tokenizer_wants_bos(loaded.tokenizer) else None
    # documents: windows spread across them, each inside one (wkvlab.data.windows.cut_windows)
    windows = cut_windows(corpus, loaded.tokenizer, ctx=ctx, n_tokens=tokens, bos_id=bos, stride=stride, score=score)  # type: ignore[arg-type]
    return Workload(loaded, corpus, windows, tokens, stride)


def parse_weights(values: Iterable[str]) -> list[WeightSpec]:
    specs = [WeightSpec.parse(v) for v in values]
    if not specs:
        raise ConfigError("give at least one weight config, e.g. --weights int4-g128")
    return specs


def parse_kv(values: Iterable[str]) -> list[KVSpec]:
    specs = [KVSpec.parse(v) for v in values]
    if not specs:
        raise ConfigError("give at least one KV config, e.g. --kv q4_0")
    return specs


def prepare_calibration(work: Workload, weights: list[WeightSpec], calibration: CalibrationSpec | None = None,
                        kv: Iterable[KVSpec] = (), replicate: int = 0) -> CalibrationSet | None:
    """Calibration tokens for the weight and KV configs that need them (None when none does).

    Samples come from the end of the calibration text; when it is the evaluation text, the tokens
    evaluation uses at its start are reserved, so the two never overlap. ``replicate`` r: the r-th
    disjoint sample of the same size before that (another build of the same method, for replicates).
    """
    if not any(w.needs_calibration for w in weights) and not any(k.needs_calibration for k in kv):
        return None
    spec = calibration or CalibrationSpec()
    corpus = calibration_corpus(spec.data)
    reserved, spare = 0, None
    if corpus.sha256 == work.corpus.sha256:  # the tokens of the text up to where the windows end
        end = work.windows.text_end
        reserved = work.windows.n_windows * work.windows.ctx if end is None else tokenize(work.loaded.tokenizer, work.corpus.text[:end]).numel()
        # windows spread over the documents can reach the text's end (SmolLM2's 32 default findings windows
        # reach the 78th of the 79 prose topics): then what follows each document's windows is drawn on too
        spare = unused_remainders(work.corpus, work.loaded.tokenizer, work.windows)
    return calibration_set(spec, work.loaded.tokenizer, corpus=corpus, reserved_tokens=reserved, spare=spare, replicate=replicate)


def run_options(work: Workload | None, weights: list[WeightSpec], *, chunk: int | None = None, reference: str | Path | None = None,
                topk: int = DEFAULT_TOPK, plan: str = "auto", interleave: int | None = None, max_memory: int | None = None) -> RunOptions:
    """How to run a grid: chunk size, stored reference, and the memory plan (``auto``: the copies
    plan when its estimate fits the device, else one model quantized in place; see
    :mod:`wkvlab.eval.memory`). ``max_memory``: bytes the run may use (default: what the device has free)."""
    if chunk is not None and chunk < 1:
        raise ConfigError(f"--chunk {chunk} must be a positive number of tokens")
    if topk < 1:
        raise ConfigError(f"--topk {topk} must be at least 1")
    return RunOptions(chunk=chunk, reference=Path(reference) if reference is not None else None, topk=topk, plan=plan,
                      interleave=interleave, max_memory=max_memory)


def describe_model(model: str):
    """The planner's description of ``model`` (its shapes, from config.json, a GGUF header or the
    table of published models) without loading it; ConfigError when its files do not say enough."""
    from wkvlab.plan.source import resolve_source

    return resolve_source(model)[0]


def memory_estimate(model: str, weights: list[WeightSpec], kv: list[KVSpec], *, ctx: int, tokens: int, score: str = "all",
                    dtype: str = "auto", device: str = "auto", chunk: int | None = None, reference: str | Path | None = None,
                    plan: str = "auto", max_memory: int | None = None, calibration: CalibrationSpec | None = None,
                    topk: int = DEFAULT_TOPK, choose: bool = True):
    """The memory a grid needs on its device under every plan, and the plan that fits — before the
    model loads (its shapes from config.json, a GGUF header, or the planner's table of published
    models: ``llama-3-8b`` needs no files). ``choose=False``: no plan chosen, nothing refused (a dry run
    prints the table first). See :mod:`wkvlab.eval.memory`."""
    import torch

    from wkvlab.eval.memory import budget_and_reserve, grid_estimate
    from wkvlab.models.loading import resolve_dtype
    from wkvlab.runtime import available_memory

    key = device.strip().lower()
    if key == "auto":
        key = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = resolve_dtype(dtype, key)
    calib = calibration or CalibrationSpec()
    visible = key == "cpu" or torch.cuda.is_available()
    budget, reserve = budget_and_reserve(max_memory, available_memory(key) if max_memory is None and visible else None)
    return grid_estimate(model, weights, kv, ctx=ctx, tokens=tokens, score=score, dtype=dtype, device=key, chunk=chunk,
                         stored_reference=reference is not None, plan=plan, budget=budget, calibration=(calib.samples, calib.length),
                         topk=topk, choose=choose, reserve=reserve)


def total_steps(work: Workload, weights: list[WeightSpec], kv: list[KVSpec], options: RunOptions) -> int:
    """Progress steps :func:`evaluate_workload` will report (for a progress bar's total)."""
    chunk = options.chunk_for(work.loaded.model, work.windows.ctx, kv)
    reference_runs = options.reference is None or not Path(options.reference).exists()  # an existing file is read back
    return grid_steps(work.windows, len(weights), len(kv), any(k.needs_calibration for k in kv), chunk, reference_pass=reference_runs)


def evaluate_workload(work: Workload, weights: list[WeightSpec], kv: list[KVSpec], progress: Progress | None = None,
                      calibration: CalibrationSpec | None = None, options: RunOptions | None = None,
                      baseline: str | Baseline = "auto", calibration_replicate: int = 0) -> list[EvalResult]:
    """``calibration_replicate`` r: calibrated configs read the r-th disjoint calibration sample (a sweep's
    replicate, :func:`prepare_calibration`). ``baseline``: ``auto``, ``float`` or ``engine`` — what every pass runs with (see
    :mod:`wkvlab.eval.baseline`; ``auto`` measures ``llamacpp:`` presets on a GGUF as llama.cpp does) — or
    a :class:`~wkvlab.eval.baseline.Baseline` already built (``engine compare``'s simulated side runs
    through here with llama.cpp's, so its numbers are ``wkvlab eval``'s)."""
    if isinstance(baseline, Baseline):
        chosen, notes = baseline, []
    else:
        chosen, notes = choose_baseline(baseline, model=work.loaded.model, source=work.loaded.source, weights=weights, kv=kv)
    return run_grid(
        work.loaded.model,
        work.windows,
        weights,
        kv,
        model_name=work.loaded.name,
        data_name=work.corpus.name,
        fingerprints={"model_sha256": work.loaded.fingerprint, "data_sha256": work.corpus.sha256},
        progress=progress,
        calibration=prepare_calibration(work, weights, calibration, kv, replicate=calibration_replicate),
        options=options or RunOptions(),
        tokenizer=work.loaded.tokenizer,
        baseline=chosen,
        notes=notes,
    )


def evaluate(
    model: str | LoadedModel = "default",
    data: str = "default",
    *,
    ctx: int = 1024,
    tokens: int = 8192,
    weights: Iterable[str] = ("none",),
    kv: Iterable[str] = ("fp16",),
    score: str = "all",
    stride: int | None = None,
    progress: Progress | None = None,
    calibration: CalibrationSpec | None = None,
    device: str = "auto",
    dtype: str = "auto",
    chunk: int | None = None,
    reference: str | Path | None = None,
    topk: int = DEFAULT_TOPK,
    baseline: str = "auto",
    device_map: str = "auto",
    attn: str = "auto",
) -> list[EvalResult]:
    """Evaluate every weights × KV combination against the unquantized reference.

    ``calibration`` (default: 16 × 512 tokens of prose) is used by GPTQ, AWQ, SmoothQuant and
    static activation scales only. ``baseline``: see :func:`evaluate_workload`. ``device``/``dtype``: where and in which precision the reference
    runs (``auto``: a GPU when one is visible, as the CLI; bfloat16 there, float32 on the CPU); ``device_map``: how ``cuda``
    uses the GPUs (:mod:`wkvlab.models.placement`); ``attn``: ``auto``, ``sdpa``, ``eager`` or ``flash_attention_2``
    (:mod:`wkvlab.models.attn`). ``chunk``: queries per prefill chunk
    (default: from the vocabulary size). ``reference``: a stored-reference file (read if it exists
    and matches this model, text, windows and dtype; written otherwise) — the one-model plan: KLD
    becomes the top-``topk`` head plus a sampled tail, and each weight config is built in place
    on the one model (docs/scale.md).
    """
    from wkvlab.models.attn import check_attn

    weight_specs, kv_specs = parse_weights(weights), parse_kv(kv)
    check_attn(attn, device=device, dtype=dtype, kv_specs=kv_specs)  # a preset flash cannot run: refused before loading
    work = prepare(model, data, ctx=ctx, tokens=tokens, score=score, stride=stride, device=device, dtype=dtype, device_map=device_map,
                   attn=attn)
    options = run_options(work, weight_specs, chunk=chunk, reference=reference, topk=topk)
    return evaluate_workload(work, weight_specs, kv_specs, progress, calibration, options, baseline)


def check_reference_path(out: str | Path) -> Path:
    """A new stored-reference file name, refused before any work when it cannot be written."""
    out = Path(out)
    if out.exists():
        raise ConfigError(f"{out} exists; choose a new file name (a stored reference is never overwritten)")
    if not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise ConfigError(f"cannot write {out}: folder {out.parent} does not exist; create it or choose another --out")
    return out


def reference_steps(work: Workload, chunk: int | None = None) -> int:
    """Progress steps of :func:`save_reference` (one per window and chunk)."""
    chunk = RunOptions(chunk=chunk).chunk_for(work.loaded.model, work.windows.ctx, [])
    return grid_steps(work.windows, 0, 0, chunk=chunk)


def save_reference(work: Workload, out: str | Path, *, chunk: int | None = None, topk: int = DEFAULT_TOPK,
                   progress: Progress | None = None):
    """Run the reference over the workload's windows and write a stored reference to ``out``.

    Returns the :class:`~wkvlab.eval.reference.StoredReference`; ``wkvlab eval --reference out``
    (same model, text, ctx, tokens and score mode) then compares every candidate with it.
    """
    from wkvlab.eval.sources import record_reference

    out = check_reference_path(out)
    if topk < 1:
        raise ConfigError(f"--topk {topk} must be at least 1")
    chunk = RunOptions(chunk=chunk).chunk_for(work.loaded.model, work.windows.ctx, [])
    stored = record_reference(work.loaded.model, work.windows, chunk=chunk, k=topk, progress=progress,
                              meta={"model_sha256": work.loaded.fingerprint, "data_sha256": work.corpus.sha256,
                                    "model": work.loaded.name, "data": work.corpus.name})
    stored.save(out)
    return stored


def store_results(results: list[EvalResult], store: str | Path, *, work: Workload, weights: list[WeightSpec], kv: list[KVSpec],
                  calibration: CalibrationSpec | None = None, score: str = "all", chunk: int | None = None) -> int:
    """Write an evaluation's results into a results store under the ids a sweep of the same
    configs would give them (:mod:`wkvlab.sweep.plan`), so a later sweep or finding skips them.

    Returns how many were new. A stored-reference run is not written (its id depends on the
    sweep's reference folder): run such grids as a sweep with ``reference:``.
    """
    from wkvlab.store import open_store
    from wkvlab.sweep.plan import SweepConfig, canonical_json

    if any((r.run or {}).get("reference", {}).get("kind") == "stored" for r in results):
        raise ConfigError("--store keeps in-memory-reference results only; for a stored reference run a sweep with reference: <folder>")
    run = results[0].run or {}
    calib = (calibration or CalibrationSpec()).to_dict()
    written = 0
    with open_store(store) as db:
        for w in weights:
            for k in kv:
                result = next(r for r in results if canonical_json(r.weights_spec) == canonical_json(w.to_dict())
                              and canonical_json(r.kv_spec) == canonical_json(k.to_dict()))
                config = SweepConfig(work.loaded.spec or work.loaded.source, work.loaded.fingerprint, work.corpus.name, work.corpus.sha256,
                                     work.windows.ctx, work.tokens, score, None, w.to_dict(), k.to_dict(),
                                     calib if (w.needs_calibration or k.needs_calibration) else None,
                                     dtype=run.get("dtype", "float32"), device=run.get("device", "cpu"), chunk=chunk or 0,
                                     windows=window_layout(work.corpus, work.stride))
                written += db.put(config.config_id, config.to_dict(), result)
    return written


def sweep(spec, store="results.db", *, dry_run: bool = False, executor=None, progress: Progress | None = None):
    """Run a sweep spec (a YAML path or a :class:`wkvlab.sweep.SweepSpec`) into a results store.

    Returns a :class:`wkvlab.sweep.SweepReport`; with ``dry_run``, the :class:`wkvlab.sweep.SweepPlan`
    instead (nothing runs, and a store that does not exist is not created). Stored results read back
    with ``wkvlab.store.open_store(store).results()``. See docs/sweeps.md.
    """
    from pathlib import Path

    from wkvlab.store import open_store
    from wkvlab.sweep import plan_sweep, run_sweep  # here, not at the top: wkvlab.sweep imports this module

    if dry_run:
        if not Path(store).exists():
            return plan_sweep(spec, None)
        with open_store(store, create=False) as db:
            return plan_sweep(spec, db)
    return run_sweep(spec, store, executor=executor, progress=progress)


__all__ = ["Workload", "sweep", "prepare", "prepare_calibration", "CalibrationSpec", "parse_weights", "parse_kv", "evaluate", "evaluate_workload",
           "grid_steps", "check_kv_specs", "run_options", "total_steps", "RunOptions", "save_reference", "reference_steps", "check_reference_path", "store_results"]
