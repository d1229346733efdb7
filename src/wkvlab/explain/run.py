"""``wkvlab explain``: every diagnosis of one weights × KV combination, in one run, with a verdict.

Order and what each step costs (passes of the model over one window):

1. factorial: weights [none, W] × KV [fp16, C] on the evaluation windows (1 reference + 4 cells);
2. noise floor: W+C evaluated a second time (1 + 1), and the reference under the other attention
   backend (2 per window);
3. attention decomposition and per-layer diagnostics (part B's modules) on the first
   ``diag_windows`` windows;
4. context: the factorial again on ``context_docs`` documents of ``max_ctx`` tokens (reused from
   step 1 when ``max_ctx`` ≤ ``ctx``);
5. mitigations: W × [C', ...] on the evaluation windows (1 + one per mitigation), chosen from
   step 3's per-layer cross-term mass;
6. generation, retrieval and self-generated text (part B's modules);
7. the verdict, from all of the above.

Any step but the factorial can be skipped (``skip``); the verdict then says less.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from wkvlab import api
from wkvlab.errors import ConfigError
from wkvlab.eval.result import EvalResult
from wkvlab.eval.runner import Progress, RunOptions, run_grid
from wkvlab.explain.compare import NoiseFloor, backend_result, compare_results, other_backend
from wkvlab.explain.context import ContextCurve, context_curve, long_windows
from wkvlab.explain.factorial import Factorial, cells_from_grid, factorial, factorial_specs
from wkvlab.explain.mitigations import Mitigations, candidates, measure
from wkvlab.explain.options import (CANDIDATE_STEPS, DEFAULT_REPLICATES, GENERATION_NEW_TOKENS, GENERATION_PROMPT_TOKENS,
                                    GENERATION_PROMPTS, RETRIEVAL_PER_DEPTH, STEPS, ExplainOptions, planned_steps, replicate_chunk,
                                    selfgen_tokens)
from wkvlab.explain.verdict import verdict
from wkvlab.kv.spec import KVSpec
from wkvlab.specio import reject_unknown_fields
from wkvlab.weights.spec import WeightSpec

@dataclass(frozen=True, eq=False)
class ExplainReport:
    """What ``wkvlab explain`` found; part B's results keep their own classes (``to_dict``, ``lines``)."""

    options: ExplainOptions
    model: str
    data: str
    ppl_ref: float
    factorial: Factorial
    noise: NoiseFloor | None = None
    attention: Any = None  # explain.attention.AttentionDecomposition
    hidden: Any = None  # explain.hidden.LayerDiagnostics
    context: ContextCurve | None = None
    mitigations: Mitigations | None = None
    extras: dict = field(default_factory=dict)  # generation / retrieval / selfgen results (part B)
    verdict: tuple = ()
    seconds: dict = field(default_factory=dict)
    tolerance: tuple = ()  # --tolerance: the ship decision on W, C and W+C (stats.tolerance.ToleranceVerdict each)
    # the factorial cells' per-unit values (wkvlab.findings.records): its verdicts decided again from a record
    units: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        part = lambda x: x.to_dict() if x is not None else None  # noqa: E731
        return {
            "options": self.options.to_dict(), "model": self.model, "data": self.data, "ppl_ref": self.ppl_ref,
            "factorial": self.factorial.to_dict(), "noise": part(self.noise), "attention": part(self.attention),
            "hidden": part(self.hidden), "context": part(self.context), "mitigations": part(self.mitigations),
            **{name: part(value) for name, value in self.extras.items()},
            "verdict": list(self.verdict), "seconds": self.seconds, "tolerance": [v.to_dict() for v in self.tolerance],
            "units": self.units,
        }


def _noop(_desc: str, _n: int) -> None:
    pass


def kv_stats_under(quantized, kv: KVSpec, calibration, fingerprint: str):
    """KV calibration statistics under these weights, from the same cache run_grid uses."""
    if not kv.needs_calibration:
        return None
    from wkvlab.kv.calibrate import stats_under_weights

    return stats_under_weights(quantized, calibration, fingerprint)


def explain(
    weights: str,
    kv: str,
    *,
    model: str = "default",
    data: str = "default",
    ctx: int = 512,
    tokens: int = 2048,
    max_ctx: int = 1024,
    context_docs: int = 4,
    diag_windows: int = 1,
    skip: tuple | list = (),
    seed: int = 0,
    margin: float = 0.10,
    replicates: int = DEFAULT_REPLICATES,
    progress: Progress | None = None,
    loaded=None,
    tolerance=None,
) -> ExplainReport:
    """Run every diagnosis of ``weights`` × ``kv`` (see the module docstring) and return the report.

    ``replicates``: factorial runs pooled into its intervals (see :func:`replicate_factorials`).
    ``loaded``: an already loaded :class:`wkvlab.models.loading.LoadedModel` to use instead of ``model``.
    ``tolerance`` (:class:`wkvlab.stats.tolerance.Tolerance`): the ship decision on the factorial's W, C and W+C cells,
    one Holm family of three, as ``eval --tolerance`` decides it.
    """
    options = ExplainOptions(weights, kv, model, data, ctx, tokens, max_ctx, context_docs, diag_windows, tuple(skip), seed, margin,
                             replicates)
    w_spec, c_spec = WeightSpec.parse(weights), KVSpec.parse(kv)
    work = api.prepare(loaded or model, data, ctx=ctx, tokens=tokens, device="cpu")  # explain has no --device: CPU float32, as always
    net = work.loaded.model
    api.check_kv_specs(net, [c_spec])
    if options.runs("context") and max_ctx > work.loaded.max_context:
        raise ConfigError(f"--max-ctx {max_ctx} is longer than {work.loaded.name}'s maximum context {work.loaded.max_context}; use --max-ctx {work.loaded.max_context} or less")
    tick = progress or _noop
    seconds: dict[str, float] = {}
    calibration = api.prepare_calibration(work, [w_spec], None, [c_spec])
    fingerprint = work.loaded.fingerprint

    def grid(windows, w_list, kv_list, samples=calibration, chunk: int | None = None) -> list[EvalResult]:
        return run_grid(net, windows, w_list, kv_list, model_name=work.loaded.name, data_name=work.corpus.name,
                        fingerprints={"model_sha256": fingerprint, "data_sha256": work.corpus.sha256},
                        progress=tick, calibration=samples, options=RunOptions(chunk=chunk))

    def timed(name: str, fn: Callable):
        start = time.perf_counter()
        value = fn()
        seconds[name] = round(time.perf_counter() - start, 2)
        return value

    # inputs of the later steps are built now, so a context too short for them fails before any work
    prompts = items = None
    if options.runs("generation"):
        from wkvlab.explain.generation import corpus_prompts

        prompts = corpus_prompts(work.loaded.tokenizer, work.corpus.text, GENERATION_PROMPTS, GENERATION_PROMPT_TOKENS, _bos(work))
    if options.runs("retrieval"):
        from wkvlab.explain.retrieval import build_items

        items = build_items(work.loaded.tokenizer, work.corpus.text, ctx=max_ctx, per_depth=RETRIEVAL_PER_DEPTH, seed=seed, bos_id=_bos(work))

    cells = timed("factorial", lambda: cells_from_grid(grid(work.windows, *factorial_specs(w_spec, c_spec))))
    runs, variation = timed("replicates", lambda: replicate_factorials(work, net, w_spec, c_spec, calibration, replicates, grid))
    fact = factorial(cells, margin=margin, replicates=runs, variation=variation)

    noise = None
    if options.runs("noise"):
        def noise_floor() -> NoiseFloor:
            again = grid(work.windows, [w_spec], [c_spec])[0]
            current, other = net.config._attn_implementation, other_backend(net)
            backend = backend_result(net, work.windows, cells["ref"], other, progress=tick)
            return NoiseFloor(
                repeat=compare_results(cells["wc"], again, b_label="the same, run again"),
                backend=compare_results(cells["ref"], backend, a_label=f"reference ({current})", b_label=f"reference ({other})"),
            )
        noise = timed("noise", noise_floor)

    attention = hidden = None
    extras: dict[str, Any] = {}
    diag_tokens = work.windows.tokens[: min(diag_windows, work.windows.n_windows)]
    if any(options.runs(step) for step in CANDIDATE_STEPS):
        # one weight-quantized copy shared by every diagnosis that runs the candidate model itself
        from wkvlab.weights.apply import quantize_model_weights

        quantized = quantize_model_weights(net, w_spec, calibration, model_key=fingerprint)
        stats = kv_stats_under(quantized, c_spec, calibration, fingerprint)
        common = dict(weights_label=w_spec.label, stats=stats, progress=tick)
        if options.runs("attention"):
            from wkvlab.explain.intervention import decompose_and_intervene

            # the (none, C) cell's calibration is the reference's own
            ref_stats = kv_stats_under(quantize_model_weights(net, WeightSpec.parse("none")), c_spec, calibration, fingerprint)
            attention, extras["cross_term"] = timed("attention", lambda: decompose_and_intervene(
                net, quantized.model, c_spec, diag_tokens, reference_stats=ref_stats, margin=margin,
                kld_margin=factorial_margin(fact), **common))
        if options.runs("hidden"):
            from wkvlab.explain.hidden import layer_diagnostics

            hidden = timed("hidden", lambda: layer_diagnostics(net, quantized.model, c_spec, diag_tokens, **common))
        if options.runs("generation"):
            from wkvlab.explain.generation import generation_agreement

            extras["generation"] = timed("generation", lambda: generation_agreement(
                net, quantized.model, c_spec, prompts, new_tokens=GENERATION_NEW_TOKENS, **common))
        if options.runs("retrieval"):
            from wkvlab.explain.retrieval import retrieval_eval

            extras["retrieval"] = timed("retrieval", lambda: retrieval_eval(net, quantized.model, c_spec, items, **common))
        del quantized
    if options.runs("selfgen"):
        extras["selfgen"] = timed("selfgen", lambda: _selfgen_factorial(work, options, w_spec, c_spec, grid, tick))

    context = None
    if options.runs("context"):
        def run_context() -> ContextCurve:
            if max_ctx <= ctx:  # the evaluation windows are already the longest asked for
                return context_curve(cells)
            docs = long_windows(work.corpus, work.loaded.tokenizer, max_ctx, context_docs, work.loaded.max_context)
            return context_curve(cells_from_grid(grid(docs, *factorial_specs(w_spec, c_spec))))
        context = timed("context", run_context)

    mitigations = None
    if options.runs("mitigations"):
        def run_mitigations() -> Mitigations:
            shares = attention.cross_mass().sum(1) if attention is not None else None
            from wkvlab.kv.override import model_head_dim

            chosen = candidates(c_spec, net.config.get_text_config().num_hidden_layers, model_head_dim(net), shares)
            results = grid(work.windows, [w_spec], [c.kv for c in chosen])
            return measure(cells, results, chosen, margin=margin)
        mitigations = timed("mitigations", run_mitigations)

    tick("done", 0)
    ship = ()
    if tolerance is not None:
        from wkvlab.stats.tolerance import tolerance_verdicts

        ship = tuple(tolerance_verdicts([cells["w"], cells["c"], cells["wc"]], tolerance, family="W, C and W+C of this explain"))
    from wkvlab.findings.records import factorial_record

    report = ExplainReport(options, work.loaded.name, work.corpus.name, cells["ref"].ppl_ref, fact, noise, attention, hidden,
                           context, mitigations, extras, seconds=seconds, tolerance=ship, units=factorial_record(cells, runs))
    return _with_verdict(report)


def replicate_factorials(work, net, w_spec: WeightSpec, c_spec: KVSpec, calibration, replicates: int, grid) -> tuple[list, str]:
    """The factorial's cells again, ``replicates`` − 1 times, and what differs between the runs.

    Replicate r (1, 2, …) takes the r-th disjoint calibration sample of the same size (when W or C is
    calibrated: GPTQ, AWQ, SmoothQuant, a calibrated cache) and chunks of half the size of the run before
    (another float order: the reference, W, C and W+C are all summed in another order). Its cells are on
    the same windows, so :func:`~wkvlab.explain.factorial.factorial` pools them by
    :func:`wkvlab.stats.bootstrap.pool`."""
    from wkvlab.kv.tokens import token_group_multiple

    specs = factorial_specs(w_spec, c_spec)
    base = RunOptions().chunk_for(net, work.windows.ctx, specs[1])
    multiple = max(token_group_multiple(k) for k in specs[1])
    chunks = [base] + [replicate_chunk(base, r, multiple) for r in range(1, replicates)]
    samples = [calibration] + [api.prepare_calibration(work, [w_spec], None, [c_spec], replicate=r) if calibration is not None else None
                               for r in range(1, replicates)]
    runs = [cells_from_grid(grid(work.windows, *specs, samples=samples[r], chunk=chunks[r])) for r in range(1, replicates)]
    if replicates == 1:
        return runs, "one run: run-to-run variance not measured (--replicates 2 or more measures it)"
    varied = [f"chunk sizes {', '.join(map(str, chunks))} (float order)"]
    if calibration is not None:
        calibrated = " and ".join(s.label for s in (w_spec, c_spec) if s.needs_calibration)
        varied.append(f"{replicates} disjoint calibration samples of {calibration.spec.label} ({calibrated})")
    else:
        varied.append(f"no calibration sample to vary ({w_spec.label} and {c_spec.label} are not calibrated)")
    if len(set(chunks)) < len(chunks):
        varied[0] += f"; the cache's token group ({multiple}) leaves no smaller chunk to try"
    return runs, f"{replicates} replicates: " + "; ".join(varied)


def factorial_margin(f: Factorial):
    """The factorial's KLD margin, saying where it was measured: the cross-term step states the same m, not one
    from its own few diagnosis windows (two values of KLD(C) in one run's margins read as a contradiction)."""
    from dataclasses import replace

    v = f.kld.verdict
    if v is None or v.margin.stated:
        return None if v is None else v.margin
    of = v.margin.of[len("the "):] if v.margin.of.startswith("the ") else v.margin.of
    return replace(v.margin, of=f"the factorial's ({f.windows} windows) {of}")


def _with_verdict(report: ExplainReport) -> ExplainReport:
    from dataclasses import replace

    return replace(report, verdict=tuple(verdict(report)))


def _bos(work) -> int | None:
    from wkvlab.data import tokenizer_wants_bos

    return work.loaded.tokenizer.bos_token_id if tokenizer_wants_bos(work.loaded.tokenizer) else None


@dataclass(frozen=True, eq=False)
class SelfGenFactorial:
    """The factorial again, on text the reference model sampled itself (data/selfgen.py)."""

    data: str
    factorial: Factorial

    def to_dict(self) -> dict:
        return {"data": self.data, "factorial": self.factorial.to_dict()}

    def lines(self) -> list[str]:
        k = self.factorial.kld
        return [f"on the model's own samples ({self.data}, {self.factorial.tokens} tokens): KLD(W) {k.w.estimate:.4f}, "
                f"KLD(C) {k.c.estimate:.4f}, KLD(W+C) {k.wc.estimate:.4f}, interaction "
                + (k.verdict.describe(".4f") if k.verdict is not None else f"{k.interaction:.4f}")]


def _selfgen_factorial(work, options: ExplainOptions, w_spec, c_spec, grid, tick) -> SelfGenFactorial:
    from wkvlab.data.selfgen import parse_selfgen, selfgen_corpus

    data = f"selfgen:{selfgen_tokens(options)}"
    spec = parse_selfgen(data)
    selfgen_corpus(work.loaded, spec, progress=tick)  # sampled here with progress, then read from the disk cache by prepare
    sg = api.prepare(work.loaded, data, ctx=options.ctx, tokens=spec.n_tokens)
    cells = cells_from_grid(grid(sg.windows, *factorial_specs(w_spec, c_spec)))
    return SelfGenFactorial(sg.corpus.name, factorial(cells, margin=options.margin))
