"""The Python API; the CLI only parses arguments and calls these functions.

    >>> from wkvlab import api
    >>> results = api.evaluate(model="default", data="default", ctx=512, tokens=2048,
    ...                        weights=["int4-g128"], kv=["fp16", "q4_0"])
    >>> results[1].kld["mean"], results[1].top1_agreement
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from wkvlab.data import Corpus, WindowSet, load_corpus, make_windows, tokenize, tokenizer_wants_bos
from wkvlab.data.selfgen import parse_selfgen, selfgen_corpus
from wkvlab.errors import ConfigError
from wkvlab.eval.baseline import choose_baseline
from wkvlab.eval.result import EvalResult
from wkvlab.eval.runner import Progress, check_kv_specs, grid_steps, run_grid
from wkvlab.kv.spec import KVSpec
from wkvlab.models.loading import LoadedModel, load_model
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec, calibration_corpus, calibration_set
from wkvlab.weights.spec import WeightSpec


@dataclass
class Workload:
    """A loaded model and the token windows it will be evaluated on."""

    loaded: LoadedModel
    corpus: Corpus
    windows: WindowSet


def prepare(
    model: str | LoadedModel = "default",
    data: str = "default",
    *,
    ctx: int = 1024,
    tokens: int = 8192,
    score: str = "all",
    stride: int | None = None,
) -> Workload:
    selfgen = parse_selfgen(data, default_tokens=tokens)  # text the model writes itself: needs the model first
    corpus = None if selfgen else load_corpus(data)  # first: a typo in --data should not cost a model load
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    corpus = corpus or selfgen_corpus(loaded, selfgen)
    if ctx > loaded.max_context:
        raise ConfigError(f"--ctx {ctx} is longer than {loaded.name}'s maximum context {loaded.max_context}; use --ctx {loaded.max_context} or less")
    if tokens < ctx:
        raise ConfigError(f"--tokens {tokens} is less than one window of --ctx {ctx}; ask for at least {ctx} tokens")
    ids = tokenize(loaded.tokenizer, corpus.text)
    bos = loaded.tokenizer.bos_token_id if tokenizer_wants_bos(loaded.tokenizer) else None
    windows = make_windows(ids, ctx=ctx, n_tokens=tokens, bos_id=bos, stride=stride, score=score)  # type: ignore[arg-type]
    return Workload(loaded, corpus, windows)


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
                        kv: Iterable[KVSpec] = ()) -> CalibrationSet | None:
    """Calibration tokens for the weight and KV configs that need them (None when none does).

    Samples come from the end of the calibration text; when it is the evaluation text, the tokens
    evaluation uses at its start are reserved, so the two never overlap.
    """
    if not any(w.needs_calibration for w in weights) and not any(k.needs_calibration for k in kv):
        return None
    spec = calibration or CalibrationSpec()
    corpus = calibration_corpus(spec.data)
    reserved = work.windows.n_windows * work.windows.ctx if corpus.sha256 == work.corpus.sha256 else 0
    return calibration_set(spec, work.loaded.tokenizer, corpus=corpus, reserved_tokens=reserved)


def evaluate_workload(work: Workload, weights: list[WeightSpec], kv: list[KVSpec], progress: Progress | None = None,
                      calibration: CalibrationSpec | None = None, baseline: str = "auto") -> list[EvalResult]:
    """``baseline``: ``auto``, ``float`` or ``engine`` — what every pass runs with (see
    :mod:`wkvlab.eval.baseline`; ``auto`` measures ``llamacpp:`` presets on a GGUF as llama.cpp does)."""
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
        calibration=prepare_calibration(work, weights, calibration, kv),
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
    baseline: str = "auto",
) -> list[EvalResult]:
    """Evaluate every weights × KV combination against the unquantized reference.

    ``calibration`` (default: 16 × 512 tokens of prose) is used by GPTQ, AWQ, SmoothQuant and
    static activation scales only. ``baseline``: see :func:`evaluate_workload`.
    """
    weight_specs, kv_specs = parse_weights(weights), parse_kv(kv)
    work = prepare(model, data, ctx=ctx, tokens=tokens, score=score, stride=stride)
    return evaluate_workload(work, weight_specs, kv_specs, progress, calibration, baseline)


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


__all__ = ["Workload", "sweep", "prepare", "prepare_calibration", "CalibrationSpec", "parse_weights", "parse_kv", "evaluate", "evaluate_workload", "grid_steps", "check_kv_specs"]
