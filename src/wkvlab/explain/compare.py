"""Paired comparison of two results on the same tokens, and the noise floor such comparisons sit on.

Two configs evaluated on the same windows differ by ``metric(b) − metric(a)``; its interval is
paired over the same units (analytic, :mod:`wkvlab.stats`), so unit-to-unit variation both share cancels. Results
from different tokens cannot be paired and are refused with one line. Each difference is decided
by the one rule (:func:`wkvlab.stats.decide`): margin m = 10% (``margin``) of ``a``'s own effect on
that metric (its KLD, its PPL above the reference's, its top-1 loss), the three metrics one Holm
family; *higher*, *lower*, *equivalent within ±m* or *undecided*.

The noise floor says how big a difference must be before it means anything:

* **repeat**: the identical config evaluated a second time (fresh quantized copy and stores).
  On a CPU with deterministic kernels this is expected to be exactly zero; anything else is
  nondeterminism a reader must know about.
* **backend**: the unquantized reference against itself under another attention implementation
  (``eager`` instead of ``sdpa``), both float32 — pure floating-point reordering. A quantization
  effect smaller than this is indistinguishable from the arithmetic's own noise.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from wkvlab.data.windows import WindowSet
from wkvlab.errors import DataError, ModelError
from wkvlab.eval.chunks import WindowPass, auto_chunk, chunk_bounds, scored_rows
from wkvlab.eval.metrics import ReferenceTokens, chunk_metrics, host_metrics, position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.eval.runner import Progress
from wkvlab.explain.factorial import metric_arrays, metric_value
from wkvlab.stats import Interval, Resampled, resample
from wkvlab.stats.decision import DEFAULT_MARGIN, MarginRule, Verdict, decide


def check_same_tokens(a: EvalResult, b: EvalResult) -> None:
    """Raise DataError unless ``a`` and ``b`` were scored on the same tokens against the same reference."""
    what = f"{a.weights} × {a.kv} and {b.weights} × {b.kv}"
    for key in ("model_sha256", "data_sha256"):
        fa, fb = a.fingerprints.get(key), b.fingerprints.get(key)
        if fa and fb and fa != fb:
            raise DataError(f"{what} come from different {key.split('_')[0]}s; compare only results of one model on one text")
    if a.ctx != b.ctx or a.tokens != b.tokens:
        raise DataError(f"{what} were scored on different windows (ctx {a.ctx} vs {b.ctx}, {a.tokens} vs {b.tokens} tokens); "
                        "evaluate both with the same --ctx and --tokens")
    same = (np.array_equal(a.arrays.window, b.arrays.window) and np.array_equal(a.arrays.position, b.arrays.position)
            and np.array_equal(a.arrays.nll_ref, b.arrays.nll_ref))
    if not same:
        raise DataError(f"{what} were not scored on the same tokens (their reference losses differ); "
                        "evaluate both with the same --model, --data, --ctx, --tokens and --score")


def check_replicates(runs: "Sequence[Mapping[str, EvalResult]]") -> None:
    """Raise DataError unless the cells of every run (a replicate: named results measured together) are on the
    same tokens, and every run on the same windows as the first. Across runs the reference losses may differ in
    the last bits: another chunk size is another float order, the very variation a replicate is there to measure."""
    first = next(iter(runs[0].values()))
    for run in runs:
        cells = list(run.values())
        for cell in cells[1:]:
            check_same_tokens(cells[0], cell)
        if not (np.array_equal(cells[0].arrays.window, first.arrays.window) and np.array_equal(cells[0].arrays.position, first.arrays.position)):
            raise DataError("replicates must be scored on the same windows; evaluate each with the same --model, --data, --ctx and "
                            "--tokens")


@dataclass(frozen=True)
class Comparison:
    """``b − a`` for KLD, PPL and top-1 agreement, with paired intervals over windows."""

    a: str
    b: str
    tokens: int
    windows: int
    kld: Interval
    ppl: Interval
    top1: Interval  # difference of top-1 *agreement* (positive: b agrees more often)
    max_abs_kld_diff: float  # largest per-token |KLD(b) − KLD(a)|: 0.0 means bit-identical scores
    verdicts: dict = field(default_factory=dict)  # metric -> Verdict (the one rule; empty when stored before it)

    @property
    def identical(self) -> bool:
        return self.max_abs_kld_diff == 0.0

    def metric(self, name: str) -> Interval:
        return {"kld": self.kld, "ppl": self.ppl, "top1": self.top1}[name]

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "tokens": self.tokens, "windows": self.windows,
                "kld": self.kld.to_dict(), "ppl": self.ppl.to_dict(), "top1": self.top1.to_dict(),
                "max_abs_kld_diff": self.max_abs_kld_diff, "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()}}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Comparison":
        return cls(data["a"], data["b"], data["tokens"], data["windows"], Interval.from_dict(data["kld"]),
                   Interval.from_dict(data["ppl"]), Interval.from_dict(data["top1"]), data["max_abs_kld_diff"],
                   {k: Verdict.from_dict(v) for k, v in (data.get("verdicts") or {}).items()})


def label(result: EvalResult) -> str:
    return f"{result.weights} × {result.kv}"


OWN_EFFECT = {"kld": "KLD", "ppl": "PPL − reference PPL", "top1": "top-1 loss"}


def _own_effect(m, metric: str):
    """``a``'s own cost on a metric from the means of :func:`_arrays`, the scale its margin is a share of."""
    return np.exp(m["a"]) - np.exp(m["ref"]) if metric == "ppl" else m["a"]  # KLD; top-1 loss (metric_arrays holds the loss)


def _arrays(a: EvalResult, b: EvalResult, metric: str) -> dict[str, np.ndarray]:
    arrays = metric_arrays({"a": a, "b": b}, metric)
    return {**arrays, "ref": a.arrays.nll_ref} if metric == "ppl" else arrays


def compare_results(a: EvalResult, b: EvalResult, *, a_label: str | None = None, b_label: str | None = None,
                    margin: float = DEFAULT_MARGIN) -> Comparison:
    """The paired difference ``b − a`` of two results scored on the same tokens, each decided by the one rule.

    Each difference's m is a share of ``a``'s own cost on that metric, estimated on the same units (its
    uncertainty goes into the verdict, :meth:`wkvlab.stats.decision.MarginRule.difference_effect`)."""
    check_same_tokens(a, b)

    def draws_of(metric: str, statistic: Callable) -> Resampled:
        return resample(statistic, _arrays(a, b, metric), a.arrays.units)

    def difference(metric: str) -> Resampled:
        f = metric_value(metric)
        sign = -1.0 if metric == "top1" else 1.0  # metric_arrays holds top-1 *loss*; report agreement
        return draws_of(metric, lambda m: sign * (f(m["b"]) - f(m["a"])))

    a_name, b_name = a_label or label(a), b_label or label(b)
    draws = {m: difference(m) for m in ("kld", "ppl", "top1")}
    rule = MarginRule.parse(margin)
    effects = [rule.difference_effect(f"Δ{m}", d, draws_of(m, lambda s, m=m: _own_effect(s, m)), f"{OWN_EFFECT[m]} of {a_name}", a.tokens)
               for m, d in draws.items()]
    verdicts = dict(zip(draws, decide(effects, family=f"{b_name} − {a_name}: KLD, PPL, top-1")))
    diff = np.abs(b.arrays.kld - a.arrays.kld)
    return Comparison(
        a=a_name, b=b_name, tokens=a.tokens, windows=int(np.unique(a.arrays.window).size),
        kld=draws["kld"].interval(), ppl=draws["ppl"].interval(), top1=draws["top1"].interval(),
        max_abs_kld_diff=float(diff.max()) if diff.size else 0.0, verdicts=verdicts,
    )


# ---- the attention-backend noise floor -----------------------------------------------------------

OTHER_BACKEND = {"sdpa": "eager", "eager": "sdpa"}


def other_backend(model: torch.nn.Module) -> str:
    """The attention implementation the backend noise floor compares the model's own with."""
    current = model.config._attn_implementation or "eager"
    if current not in OTHER_BACKEND:
        raise ModelError(f"the model runs attention with {current!r}; the backend noise floor compares sdpa with eager, so load it with one of them")
    return OTHER_BACKEND[current]


@torch.no_grad()
def backend_result(model: torch.nn.Module, windows: WindowSet, reference: EvalResult, backend: str, *,
                   progress: Progress | None = None) -> EvalResult:
    """The unquantized model under another attention backend, scored against its usual self.

    ``reference`` is the identity cell (weights none, cache fp16) of the same windows: it supplies
    the labels and metadata, and the returned result pairs with it.
    """
    tick = progress or (lambda _desc, _n: None)
    current, other = model.config._attn_implementation or "eager", backend
    lo, hi = windows.score_from, windows.ctx - 1
    chunk = auto_chunk(model.config.get_text_config().vocab_size, windows.ctx)
    parts = []
    start = time.perf_counter()
    usual, switched = WindowPass(model), WindowPass(model)
    for w in range(windows.n_windows):
        tokens = windows.tokens[w]
        usual.reset(), switched.reset()
        chunks = []
        for begin, end in chunk_bounds(windows.ctx, chunk):  # chunked, as eval runs: no [ctx, vocab] logits
            rows = scored_rows(begin, end, lo, hi)
            ref = ReferenceTokens.from_logits(usual.step(tokens[begin:end], rows), tokens[begin + rows.start + 1 : begin + rows.stop + 1])
            model.set_attn_implementation(other)
            try:
                logits = switched.step(tokens[begin:end], rows)
            finally:
                model.set_attn_implementation(current)
            chunks.append(chunk_metrics(ref, logits))
        parts.append(host_metrics(chunks))
        tick(f"reference with {other} attention", 1)
    return EvalResult(
        model=reference.model, data=reference.data, ctx=windows.ctx, weights=f"none ({other})", kv="fp16",
        weights_spec=reference.weights_spec, kv_spec=reference.kv_spec, weight_bytes=reference.weight_bytes,
        kv_bytes_per_token=reference.kv_bytes_per_token, seconds=time.perf_counter() - start,
        arrays=TokenArrays.concat(parts, np.arange(lo, hi), windows.documents), buckets=position_buckets(windows.ctx),
        fingerprints=dict(reference.fingerprints), notes=[f"reference pass with {current} attention, candidate with {other}"],
    )


@dataclass(frozen=True)
class NoiseFloor:
    """How large a difference must be to mean anything: rerun and other-backend comparisons."""

    repeat: Comparison | None  # the identical config run twice
    backend: Comparison | None  # the reference under another attention backend vs itself

    def to_dict(self) -> dict:
        return {"repeat": self.repeat.to_dict() if self.repeat else None, "backend": self.backend.to_dict() if self.backend else None}

    @classmethod
    def from_dict(cls, data: Mapping) -> "NoiseFloor":
        return cls(*(Comparison.from_dict(data[k]) if data.get(k) else None for k in ("repeat", "backend")))

    def lines(self) -> list[str]:
        out = []
        if self.repeat is not None:
            r = self.repeat
            out.append(f"{r.a} run twice: " + ("bit-identical per-token KLD (difference exactly 0)" if r.identical
                       else f"ΔKLD {r.kld:.2e}, largest per-token difference {r.max_abs_kld_diff:.2e}"))
        if self.backend is not None:
            b = self.backend
            out.append(f"{b.b} vs {b.a}: KLD {b.kld:.2e}, top-1 agreement {1 + b.top1.estimate:.4%}")
        return out
