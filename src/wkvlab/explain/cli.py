"""``wkvlab explain`` and ``wkvlab compare``: parse, call the API, print rich tables. No computation here."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from wkvlab.cliopts import CacheDirOption, MarginOption, NoWeightCacheOption, ResamplesGoneOption, ThreadsOption, ToleranceOption, refuse_resamples, start_run
from wkvlab.display import console, err_console, progress_bar
from wkvlab.errors import DataError
from wkvlab.explain.options import DEFAULT_REPLICATES, STEPS, ExplainOptions, planned_grids, planned_steps
from wkvlab.io import check_output_file, write_json_atomic
from wkvlab.preflight import check_grid, check_model, check_one_config, parse_configs, require_store

if TYPE_CHECKING:  # the explain pipeline (torch) is imported by the commands, after their checks
    from wkvlab.explain.compare import Comparison
    from wkvlab.explain.context import ContextCurve
    from wkvlab.explain.factorial import Factorial
    from wkvlab.explain.mitigations import Mitigations
    from wkvlab.explain.run import ExplainReport

SPARK = "▁▂▃▄▅▆▇█"


def _table(title: str, columns: list[str], left: int = 1) -> Table:
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i < left else "right", no_wrap=True)
    return table


def _two_lines(iv, fmt: str) -> str:
    """An interval as estimate over [low, high]: keeps the factorial table inside 140 columns."""
    return f"{iv.estimate:{fmt}}\n[{iv.low:{fmt}}, {iv.high:{fmt}}]"


def _verdict_cell(v, fmt: str = ".3g", metric: str = "") -> str:
    """The verdict word over its margin (the adjustment is in the table title); percents for top-1."""
    if metric in NO_VERDICT:
        return NO_VERDICT[metric]
    if v is None:
        return "undecided\n(stored without a rule)"
    return f"[bold]{v.word}[/]\nm ±{v.margin.value:{fmt if fmt.endswith('%') else '.3g'}}"


NO_VERDICT = {"top1": "no verdict\n(scale makes −pq)", "ppl": "no verdict\n(decided on NLL)"}


def factorial_table(f: Factorial, ppl_ref: float) -> Table:
    from wkvlab.explain.factorial import METRIC_LABELS
    from wkvlab.explain.verdict import factorial_source

    v = f.kld.verdict
    family = (f"; verdicts: {v.adjustment}, KLD margin {v.margin.format()}; {v.resampling}; interactions decided on KLD and "
              "NLL (mean log-loss), none on PPL or top-1") if v is not None else ""
    replicates = f"; {f.variation}" if f.variation else ""
    table = _table(f"2×2 factorial {escape(factorial_source(f))}: {f.weights} × {f.kv} on {f.model}/{f.data} (effects vs the unquantized "
                   f"reference, PPL {ppl_ref:.3f}; 95% intervals paired over units{family}{replicates})",
                   ["metric", "W", "C", "W+C", "interaction (raw 95%)", "Holm-adjusted", "verdict", "ratio (W+C)/(W + C)"])
    blank = "—"
    for name in ("kld", "ppl", "nll", "top1"):
        e = f.metric("ppl" if name == "nll" else name)
        fmt = ".2%" if name == "top1" else ".4f"
        singles = [blank] * 3 if name == "nll" else [_two_lines(getattr(e, k), fmt) for k in ("w", "c", "wc")]
        if name == "ppl":  # the W, C, W+C columns in PPL; the interaction of its log is the NLL row
            table.add_row("PPL", *singles, blank, blank, _verdict_cell(None, fmt, name), blank)
            continue
        adjusted = _two_lines(e.verdict.adjusted, fmt) if e.verdict is not None else blank
        label = "NLL interaction (nats)" if name == "nll" else METRIC_LABELS[name]
        table.add_row(label, *singles, _two_lines(e.interaction, fmt), adjusted, _verdict_cell(e.verdict, fmt, name),
                      _two_lines(e.ratio, ".2f"))
    return table


def noise_table(report: ExplainReport) -> Table:
    table = _table("noise floor (difference b − a, 95% paired skew-robust t, analytic)", ["a", "b", "ΔKLD", "Δ top-1 agreement", "max |ΔKLD| per token"], left=2)
    for c in (report.noise.repeat, report.noise.backend):
        if c is not None:
            table.add_row(c.a, c.b, f"{c.kld:.2e}", f"{c.top1:.3%}", f"{c.max_abs_kld_diff:.2e}")
    return table


def cross_term_table(attention) -> Table:
    table = _table(f"where the cross term ε_q·ε_kᵀ sits ({attention.n_windows} window(s) of {attention.ctx}): share of the network's cross-term energy",
                   ["layer", "head", "cross-term share", "cross / all terms", "attention KL"], left=0)
    per_head_share, kl = attention.cross_share(), attention.kl()
    for layer, share in attention.top_layers(5):
        table.add_row(str(layer), "all", f"{share:.1%}", f"{per_head_share[layer].mean():.1%}", f"{kl[layer].mean():.2e}")
    for layer, head, share in attention.top_heads(5):
        table.add_row(str(layer), str(head), f"{share:.1%}", f"{per_head_share[layer, head]:.1%}", f"{kl[layer, head]:.2e}")
    return table


def sparkline(values: list[float]) -> str:
    top = max(values, default=0.0)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int(max(v, 0.0) / top * (len(SPARK) - 1) + 0.5))] for v in values)


def context_table(c: ContextCurve) -> Table:
    excess = [r.kv_excess.estimate for r in c.rows]
    table = _table(f"KLD by query position: {c.documents} documents of {c.max_ctx} tokens; cache excess {sparkline(excess)} "
                   f"(change last vs first bucket after the sinks: {c.growth_wc:.4f})",
                   ["positions", "tokens", "KLD W", "KLD C", "KLD W+C", "W+C − W (cache excess)", "top-1 W+C", "Δ top-1 from cache"])
    for r in c.rows:
        table.add_row(f"{r.start}-{r.end - 1}", str(r.tokens), *(f"{r.kld[k].estimate:.4f}" for k in ("w", "c", "wc")),
                      f"{r.kv_excess:.4f}", f"{r.top1['wc'].estimate:.2%}", f"{r.kv_top1:.2%}")
    return table


def mitigations_table(m: Mitigations) -> Table:
    whys = "; ".join(dict.fromkeys(r.why for r in m.results if r.why.startswith(("N=", "the fewest"))))
    table = _table(f"mitigations of {m.weights} × {m.kv} (cache excess KLD(W+C) − KLD(W) = {m.excess:.4f} at {m.kv_bytes_per_token:,.0f} B/token), "
                   f"best first; layers: {whys or 'none'}", ["mitigation", "KV spec", "B/token", "KLD", "excess recovered", "Δ top-1 vs W+C"], left=2)
    for r in m.results:
        table.add_row(r.name, r.kv, f"{r.kv_bytes_per_token:,.0f}", f"{r.kld.estimate:.4f}", f"{r.recovered:.0%}", f"{r.top1:.2%}")
    return table


def print_report(report: ExplainReport) -> None:
    console.print(factorial_table(report.factorial, report.ppl_ref))
    if report.noise is not None:
        console.print(noise_table(report))
    if report.attention is not None:
        console.print(cross_term_table(report.attention))
    if report.context is not None:
        console.print(context_table(report.context))
    if report.mitigations is not None:
        console.print(mitigations_table(report.mitigations))
    console.print("[bold]verdict[/]")
    for line in report.verdict:
        console.print(f"• {escape(line)}", highlight=False)  # "[factorial: 16 windows …]" is text, not rich markup
    if report.tolerance:
        from wkvlab.stats.tolerance import ship_lines

        for line in ship_lines(report.tolerance, report.tolerance[0].tolerance):
            console.print(line, highlight=False, markup=False)


def explain_command(
    weights: Annotated[str, typer.Option(help="the weight config W, e.g. int4-g128 (one config)")],
    kv: Annotated[str, typer.Option(help="the KV-cache config C, e.g. int4, q8_0, fp8_e4m3 (one config)")],
    model: Annotated[str, typer.Option(help="'default' (SmolLM2-135M), 'gemma3-270m', a .gguf file or an HF folder")] = "default",
    data: Annotated[str, typer.Option(help="'default' (pydoc prose), 'code' (stdlib source), a .txt/.jsonl file")] = "default",
    ctx: Annotated[int, typer.Option(help="tokens per evaluation window (factorial, noise floor, mitigations)")] = 512,
    tokens: Annotated[int, typer.Option(help="tokens to evaluate, rounded down to whole windows (more windows: tighter intervals)")] = 2048,
    max_ctx: Annotated[int, typer.Option(help="length of the long documents for the position curve (up to the model's maximum, 8192 for the default model)")] = 1024,
    context_docs: Annotated[int, typer.Option(help="long documents for the position curve")] = 4,
    diag_windows: Annotated[int, typer.Option(help="windows for the attention decomposition and per-layer diagnostics")] = 1,
    skip: Annotated[Optional[str], typer.Option(help=f"steps to leave out, comma-separated: {', '.join(STEPS)}")] = None,
    replicates: Annotated[int, typer.Option(help="factorial runs pooled into every factorial interval, each with another calibration "
                                                 "sample (calibrated W or C) and another chunk size (float order): run-to-run "
                                                 "variance inside the interval; each adds the factorial's cost once more")] = DEFAULT_REPLICATES,
    resamples: ResamplesGoneOption = None,
    margin: MarginOption = "10%",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write everything (tables, per-layer/head arrays, verdict) as JSON")] = None,
    tolerance: ToleranceOption = None,
    threads: ThreadsOption = None,
    cache_dir: CacheDirOption = None,
    no_weight_cache: NoWeightCacheOption = False,
) -> None:
    """Is W + C just the sum of the two errors? Factorial with intervals, where the cross term sits, position curve, measured mitigations, verdict."""
    refuse_resamples(resamples)
    ship = None
    if tolerance is not None:  # a bad --tolerance: one line, before any model loads
        from wkvlab.stats.tolerance import Tolerance

        ship = Tolerance.parse(tolerance)
    skipped = tuple(s.strip() for s in (skip or "").split(",") if s.strip())
    options = ExplainOptions(weights, kv, model, data, ctx, tokens, max_ctx, context_docs, diag_windows, skipped, margin=margin,
                             replicates=replicates)
    # Everything that can be refused without the model, before the progress bar draws: a typo is one error line.
    weight_specs, kv_specs = parse_configs([weights], [kv])
    check_one_config(weight_specs, kv_specs, "explain")
    facts = check_model(model, ctx, tokens)
    check_grid(model, weight_specs, kv_specs, facts)
    if facts is not None and options.runs("context"):
        from wkvlab.preflight import check_context_fits

        check_context_fits(max_ctx, None, facts.max_context, model, option="--max-ctx")
    _check_explain_data(data, tokens, ctx)
    check_output_file(json_out, "--json")
    from wkvlab.models.cache_writes import planned_writes
    from wkvlab.preflight import resolved_dtype

    choice = start_run("explain", threads, f"{weights} × {kv} on {model}/{data}, ctx {ctx}, {tokens} tokens", cache_dir=cache_dir,
                       weight_cache=not no_weight_cache, writes=lambda: planned_writes(model, weight_specs, resolved_dtype("auto", "auto")))
    from wkvlab.explain.run import explain

    total = planned_steps(options, max(1, tokens // ctx))
    with progress_bar(total, "explain", grid=planned_grids(options, weight_specs[0], kv_specs[0])) as advance:
        report = explain(weights, kv, model=model, data=data, ctx=ctx, tokens=tokens, max_ctx=max_ctx, context_docs=context_docs,
                         diag_windows=diag_windows, skip=skipped, margin=margin, replicates=replicates, progress=advance,
                         tolerance=ship)
    print_report(report)
    if json_out is not None:
        write_json_atomic(json_out, {**report.to_dict(), "threads": choice.to_dict()})
        err_console.print(f"wrote {json_out}")


def _check_explain_data(data: str, tokens: int, ctx: int) -> None:
    from wkvlab.data.corpora import check_data, is_selfgen
    from wkvlab.preflight import check_tokens_in_text

    if not is_selfgen(data):  # self-generated text is checked once the model that writes it is loaded
        check_data(data)
        check_tokens_in_text(data, ctx, tokens)


def _resolve(db, ident: str) -> str:
    """A full config id from an id or a unique prefix of one (listings show 12 characters)."""
    matches = [r.config_id for r in db.rows() if r.config_id.startswith(ident)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise DataError(f"no result {ident!r} in {db.path}; 'wkvlab results --store {db.path}' lists them")
    raise DataError(f"{ident!r} matches {len(matches)} results in {db.path}; give more characters of the id")


def comparison_table(c: Comparison) -> Table:
    v = c.verdicts.get("kld")
    family = f"; verdicts: {v.adjustment}, m {v.margin.format()}" if v is not None else ""
    table = _table(f"{c.b} − {c.a}: {c.tokens} tokens in {c.windows} windows (95% skew-robust t intervals, paired{family})",
                   ["metric", "difference [raw 95%]", "Holm-adjusted", "verdict"])
    for key, name, fmt in (("kld", "KLD", ".5f"), ("ppl", "PPL", ".4f"), ("top1", "top-1 agreement", ".3%")):
        verdict = c.verdicts.get(key)
        table.add_row(name, format(c.metric(key), fmt), "—" if verdict is None else format(verdict.adjusted, fmt),
                      "—" if verdict is None else f"{verdict.word} (m ±{verdict.margin.value:.3g})")
    table.add_row("max |ΔKLD| per token", f"{c.max_abs_kld_diff:.3g}", "", "")
    return table


def compare_command(
    a: Annotated[str, typer.Argument(help="config id (or a unique prefix) of the first result")],
    b: Annotated[str, typer.Argument(help="config id (or a unique prefix) of the second result")],
    store: Annotated[Path, typer.Option(help="results store written by 'wkvlab sweep' (it keeps the per-token arrays pairing needs)")] = Path("results.db"),
    resamples: ResamplesGoneOption = None,
    margin: MarginOption = "10%",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the comparison as JSON")] = None,
) -> None:
    """Compare two stored results scored on the same tokens: b − a for KLD, PPL and top-1, with paired intervals."""
    refuse_resamples(resamples)
    require_store(store)
    check_output_file(json_out, "--json")
    from wkvlab.explain.compare import compare_results
    from wkvlab.store import open_store

    with open_store(store, create=False) as db:
        first, second = db.get(_resolve(db, a)), db.get(_resolve(db, b))
    comparison = compare_results(first, second, margin=margin)
    console.print(comparison_table(comparison))
    if json_out is not None:
        write_json_atomic(json_out, comparison.to_dict())
        err_console.print(f"wrote {json_out}")
