"""The ``wkvlab`` command line: parse, check, call :mod:`wkvlab.api`, print. Errors are one line.

Start-up stays under a second: this module and the command modules it registers import only
typer, rich and torch-free checks when loaded. Each command checks its options, the model's files
and its output paths first (:mod:`wkvlab.preflight`), then imports the API (torch, transformers)
inside its body. A new command follows the same pattern: heavy imports go in the function body.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from wkvlab.cache_cli import cache_app
from wkvlab.cliopts import CacheDirOption, NoWeightCacheOption, ThreadsOption, ToleranceOption, start_run
from wkvlab.display import console, describe_run, err_console, progress_bar, results_table, status
from wkvlab.engines.cli import engine_app
from wkvlab.errors import ConfigError, OutOfMemory, WkvlabError
from wkvlab.eval.cli import reference_app
from wkvlab.eval.constants import DEFAULT_TOPK
from wkvlab.explain.cli import compare_command, explain_command
from wkvlab.export_cli import export_command
from wkvlab.findings.cli import findings_command
from wkvlab.io import check_output_file, write_json_atomic
from wkvlab.listing import kv_help, weights_help
from wkvlab.plan.cli import optional_probe_value, plan_command
from wkvlab.models.cache_writes import planned_writes
from wkvlab.preflight import (check_calibration, check_device, check_grid, check_memory_budget, check_model, check_tokens_in_text, parse_configs,
                              resolved_dtype, text_shortfall)
from wkvlab.report.cli import report_command
from wkvlab.search.cli import profile_command, search_command
from wkvlab.sweep.cli import results_command, sweep_command
from wkvlab.tasks.cli import tasks_command
from wkvlab.weights.parse import PRESETS as WEIGHT_PRESETS

try:  # typer 0.29 vendors click; usage errors are raised as its classes
    from typer._click import exceptions as click_errors
except ImportError:  # older typer: click itself
    from click import exceptions as click_errors
# typer's vendored click has no Abort (Ctrl-C arrives as KeyboardInterrupt); naming a missing attribute in an
# except clause raised AttributeError for any exception that reached it, hiding the real one.
_ABORT = getattr(click_errors, "Abort", KeyboardInterrupt)

if TYPE_CHECKING:
    from rich.table import Table

    from wkvlab.kv.spec import KVSpec
    from wkvlab.weights.calibration import CalibrationSpec
    from wkvlab.weights.spec import WeightSpec

# rich_markup_mode=None: click's plain help. typer's rich help labels every flag "<bool>" (--help
# included) and draws boxes; the plain text says the same in fewer lines.
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Measure, explain and plan the combined quantization of LLM weights and KV cache.",
)

DEMO_WEIGHTS = ("bf16", "int8", "int4-g128")
DEMO_KV = ("fp16", "fp8_e4m3", "int8", "int4")
NO_CONFIG = ("give --weights, --kv, or both, e.g. 'wkvlab eval --weights int4-g128 --kv q4_0' (weights alone: 16-bit cache; "
             "KV alone: unquantized weights); 'wkvlab demo' runs the main grid and 'wkvlab presets' lists every name")


@dataclass(frozen=True)
class RunFlags:
    """Where and how a grid runs (--device, --dtype, --chunk, --reference, --topk, --store) and what its KLD is against (--baseline)."""

    device: str = "auto"
    dtype: str = "auto"
    chunk: Optional[int] = None
    reference: Optional[Path] = None
    topk: int = DEFAULT_TOPK
    store: Optional[Path] = None
    baseline: str = "auto"
    plan: str = "auto"  # --memory-plan, or the preflight estimate's choice
    interleave: Optional[int] = None  # KV caches side by side in the one-model plan (from the estimate)
    max_memory: Optional[int] = None  # --max-memory, in bytes
    device_map: str = "auto"  # how --device cuda uses the GPUs (wkvlab.models.placement)
    attn: str = "auto"  # --attn: the attention implementation (wkvlab.models.attn)


def _write_eval_json(path: Path, results) -> None:
    from wkvlab.eval.depth import depth_tables

    depth = {(t.weights, t.kv): t.to_dict() for t in depth_tables(results)}
    payload = [{**r.to_dict(), **({"depth": depth[(r.weights, r.kv)]} if (r.weights, r.kv) in depth else {})} for r in results]
    write_json_atomic(path, payload[0] if len(payload) == 1 else payload)
    err_console.print(f"wrote {escape(str(path))}")


def _run_and_print(model: str, data: str, ctx: int, tokens: int, weight_specs: list[WeightSpec], kv_specs: list[KVSpec],
                   score: str, title: str, calibration: CalibrationSpec | None = None, run: RunFlags | None = None,
                   json_out: Path | None = None, tolerance=None):
    """Evaluate, then keep the results every way asked — JSON, store, terminal — each attempted even
    when another fails (a store another wkvlab changed mid-run must not cost an hour's results); the
    first failure is raised once everything else is written."""
    from wkvlab import api
    from wkvlab.display import reference_notes
    from wkvlab.errors import WkvlabError

    run = run or RunFlags()
    with status(f"loading {model} and {data} text"):
        work = api.prepare(model, data, ctx=ctx, tokens=tokens, score=score, device=run.device, dtype=run.dtype, device_map=run.device_map,
                           attn=run.attn)
    net = work.loaded.model  # a vision-language class runs its text decoder alone (models.loading.model_class)
    err_console.print(escape(f"model: {type(net).__name__} on {work.loaded.placement}, {work.loaded.dtype}, "
                             f"{net.config._attn_implementation or 'eager'} attention"), highlight=False, soft_wrap=True)
    shortfall = text_shortfall(tokens, ctx, work.windows.n_windows)
    if shortfall is not None:  # said before the first pass, not only in the results' token count
        err_console.print(f"[yellow]note:[/] {escape(shortfall)}")
    api.check_kv_specs(work.loaded.model, kv_specs)
    options = api.run_options(work, weight_specs, chunk=run.chunk, reference=run.reference, topk=run.topk, plan=run.plan,
                              interleave=run.interleave, max_memory=run.max_memory)
    failures: list[WkvlabError] = []
    with progress_bar(api.total_steps(work, weight_specs, kv_specs, options), title, grid=(weight_specs, kv_specs)) as advance:
        try:
            results = api.evaluate_workload(work, weight_specs, kv_specs, advance, calibration, options, run.baseline)
        except OutOfMemory as exc:  # keep what finished: written and printed below, then the one line
            results, failures = exc.results, [exc]
    if not results:
        raise failures[0]
    if json_out is not None:  # first: a finished evaluation must not be lost to a store or display error
        try:
            _write_eval_json(json_out, results)
        except (WkvlabError, OSError) as exc:
            failures.append(exc if isinstance(exc, WkvlabError) else WkvlabError(f"cannot write {json_out} ({exc}); the results are printed below"))
    if run.store is not None:
        try:
            written = api.store_results(results, run.store, work=work, weights=weight_specs, kv=kv_specs, calibration=calibration,
                                        score=score, chunk=run.chunk)
            err_console.print(f"wrote {written} result(s) to {escape(str(run.store))}")
        except WkvlabError as exc:
            failures.append(exc)
    print_results(results, tolerance)
    for note in dict.fromkeys([*(n for r in results for n in r.notes), *reference_notes(results)]):
        err_console.print(f"[yellow]note:[/] {escape(note)}")
    if failures:
        raise failures[0]
    return results


def memory_preflight(model: str, weight_specs: list[WeightSpec], kv_specs: list[KVSpec], ctx: int, tokens: int, score: str,
                     run: RunFlags, calibration: CalibrationSpec | None, dry_run: bool = False) -> RunFlags:
    """The memory estimate, before the model loads: with ``dry_run`` every plan's parts, else the
    one line saying which plan runs; a grid that fits no plan is refused here. Returns ``run`` with
    the chosen plan."""
    from dataclasses import replace

    from wkvlab import api

    kwargs = dict(ctx=ctx, tokens=tokens, score=score, dtype=run.dtype, device=run.device, chunk=run.chunk, reference=run.reference,
                  plan=run.plan, max_memory=run.max_memory, calibration=calibration, topk=run.topk)
    try:
        api.describe_model(model)
    except ConfigError as exc:  # shapes the planner cannot read: the run goes on without an estimate
        if dry_run:
            raise
        err_console.print(f"memory: no estimate ({escape(str(exc))}); the plan follows --memory-plan")
        return run
    try:
        estimate = api.memory_estimate(model, weight_specs, kv_specs, **kwargs)
    except ConfigError:
        if dry_run:  # the table first, then the refusal's one line
            console.print("\n".join(escape(line) for line in api.memory_estimate(model, weight_specs, kv_specs, choose=False, **kwargs).lines()))
        raise
    if dry_run:
        console.print("\n".join(escape(line) for line in estimate.lines()))
    chosen = estimate.chosen
    err_console.print(escape(estimate.one_line()))
    if run.store is not None and chosen.plan != "copies":
        raise ConfigError(f"--store keeps exact results, and this grid needs the one-model plan ({estimate.one_line()[8:60]}...); "
                          "run it as a sweep with reference: <folder> (docs/sweeps.md), or raise --max-memory")
    return replace(run, plan=chosen.plan, interleave=chosen.interleave)


def check_run_flags(chunk: Optional[int], reference: Optional[Path], topk: int, store: Optional[Path]) -> None:
    """--chunk, --reference, --topk and --store checked before anything loads."""
    if chunk is not None and chunk < 1:
        raise ConfigError(f"--chunk {chunk} must be a positive number of tokens")
    if topk < 1:
        raise ConfigError(f"--topk {topk} must be at least 1")
    if reference is not None and not reference.exists():
        check_output_file(reference, "--reference")  # a new file: its folder must take it
    if store is not None:
        if reference is not None:
            raise ConfigError("--store keeps in-memory-reference results; for a stored reference run a sweep with reference: <folder> (docs/sweeps.md)")
        from wkvlab.preflight import require_store

        require_store(store, create=True)


def check_placement(device_map: str, attn: str, device: str, dtype: str, kv_specs: list[KVSpec]) -> None:
    """--device-map and --attn checked before anything loads (flash: installed, on CUDA, 16-bit, no float32-K/V preset)."""
    from wkvlab.models.attn import check_attn
    from wkvlab.models.placement import check_device_map

    check_device_map(device_map)
    check_attn(attn, device=device, dtype=dtype, kv_specs=kv_specs)


def _grid_facts(model: str, data: str, ctx: int, tokens: int, weights: list[WeightSpec], kv: list[KVSpec]) -> str:
    return (f"{model} on {data}, ctx {ctx}, {tokens} tokens, {len(weights)} weight × {len(kv)} KV config(s)")


@app.command("eval")
def eval_command(
    model: Annotated[str, typer.Option(help="'default' (SmolLM2-135M), 'gemma3-270m', a .gguf file, an HF folder, or an HF id org/name (local HF cache first)")] = "default",
    data: Annotated[str, typer.Option(help="'default' (pydoc prose), 'code' (stdlib source), a UTF-8 .txt/.jsonl file, hf:<dataset>, or selfgen[:<tokens>] (text the model samples itself, cached)")] = "default",
    ctx: Annotated[int, typer.Option(help="tokens per window (BOS included when the model wants one)")] = 1024,
    tokens: Annotated[int, typer.Option(help="tokens to evaluate, rounded down to whole windows")] = 8192,
    weights: Annotated[Optional[list[str]], typer.Option(help=weights_help(tuple(WEIGHT_PRESETS)))] = None,
    kv: Annotated[Optional[list[str]], typer.Option(help=kv_help())] = None,
    score: Annotated[str, typer.Option(help="'all' positions or 'second-half' of each window (llama.cpp)")] = "all",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write results as JSON (a list when several configs run)")] = None,
    calib: Annotated[str, typer.Option(help="calibration text for gptq/awq/w8a8-int8/static scales: prose, code, math, or a file (samples come from its end)")] = "prose",
    calib_samples: Annotated[int, typer.Option(help="calibration samples")] = 16,
    calib_len: Annotated[int, typer.Option(help="tokens per calibration sample")] = 512,
    threads: ThreadsOption = None,
    cache_dir: CacheDirOption = None,
    no_weight_cache: NoWeightCacheOption = False,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda (one GPU when it holds the model, else the visible GPUs; never offloaded) or cuda:<N>")] = "auto",
    device_map: Annotated[str, typer.Option("--device-map", help="how --device cuda uses the GPUs: auto (one GPU when it holds the weights, else split in order), balanced (split evenly), sequential (fill GPU 0 first); layers are never offloaded to the CPU or disk")] = "auto",
    dtype: Annotated[str, typer.Option(help="precision of the reference: auto (bfloat16 on a GPU, float32 on the CPU), float32, bfloat16, float16")] = "auto",
    attn: Annotated[str, typer.Option("--attn", help="attention implementation: auto (transformers' default, sdpa), sdpa, eager, flash_attention_2 (needs flash-attn, CUDA and 16-bit; not with llamacpp: presets, which attend in float32)")] = "auto",
    chunk: Annotated[Optional[int], typer.Option(help="queries per prefill chunk (default: from the vocabulary size; the numbers do not depend on it)")] = None,
    reference: Annotated[Optional[Path], typer.Option(help="stored reference file: read if it matches this model/text/windows, written otherwise; KLD: its top-k head exact + a sampled tail, and weight configs run one at a time (docs/scale.md)")] = None,
    topk: Annotated[int, typer.Option(help="top-k log-probs a new --reference file keeps per token")] = DEFAULT_TOPK,
    store: Annotated[Optional[Path], typer.Option(help="also write the results (per-token arrays included) into this results store, under the ids a sweep of the same configs gives them")] = None,
    baseline: Annotated[str, typer.Option(help="what the KLD is against: 'float' reference, 'engine' (llama.cpp's own f16 cache with its q8 activations, for llamacpp: presets on a GGUF), or 'auto' (engine when every KV config is a llamacpp: preset on a GGUF with its own weights)")] = "auto",
    memory_plan: Annotated[str, typer.Option("--memory-plan", help="'copies' (the reference beside a copy per weight config: exact KLD), 'one-model' (each weight config built in place on the one model, against a per-token reference), or 'auto' (copies when the estimate fits the device) — docs/scale.md")] = "auto",
    max_memory: Annotated[Optional[float], typer.Option("--max-memory", help="GiB the run may use on its device (default: what the device has free)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the memory estimate of every plan and the chosen one, load nothing (--model may also be a published model's name, e.g. llama-3-8b)")] = False,
    tolerance: ToleranceOption = None,
) -> None:
    """Evaluate weights × KV configs against the unquantized reference: PPL, KLD, top-1, Δp, by position."""
    from wkvlab.data.corpora import check_data, is_selfgen
    from wkvlab.weights.calibration import CalibrationSpec

    if not weights and not kv:
        raise ConfigError(NO_CONFIG)
    weight_specs, kv_specs = parse_configs(weights or ["none"], kv or ["fp16"])
    ship = None
    if tolerance is not None:  # a bad --tolerance: one line, before any model loads
        from wkvlab.stats.tolerance import Tolerance

        ship = Tolerance.parse(tolerance)
    if dry_run:  # nothing loads: the model may be a published model's name the planner knows
        from wkvlab.data.windows import check_window_options
        from wkvlab.eval.baseline_rules import baseline_kind

        check_window_options(ctx, score)
        baseline_kind(baseline, model, weight_specs, kv_specs)
    else:
        check_grid(model, weight_specs, kv_specs, check_model(model, ctx, tokens, score), baseline)
        if not is_selfgen(data):  # self-generated text is checked once the model that writes it is loaded
            check_data(data)
            check_tokens_in_text(data, ctx, tokens)
        check_device(device)  # a dry run may plan for a GPU this machine lacks
    check_calibration(calib, calib_samples, calib_len)
    check_output_file(json_out, "--json")
    check_run_flags(chunk, reference, topk, store)
    if max_memory is not None and max_memory <= 0:
        raise ConfigError(f"--max-memory {max_memory} must be a positive number of GiB")
    check_placement(device_map, attn, device, dtype, kv_specs)
    max_bytes = int(max_memory * 2**30) if max_memory is not None else None
    if not dry_run:
        check_memory_budget(model, weight_specs, kv_specs, ctx=ctx, tokens=tokens, score=score, dtype=dtype, device=device, chunk=chunk,
                            stored_reference=reference is not None, plan=memory_plan, max_memory=max_bytes,
                            calibration=(calib_samples, calib_len), topk=topk)
    start_run("eval", threads, _grid_facts(model, data, ctx, tokens, weight_specs, kv_specs), cache_dir=cache_dir, weight_cache=not no_weight_cache,
              writes=None if dry_run else lambda: planned_writes(model, weight_specs, resolved_dtype(dtype, device)))
    calibration = CalibrationSpec(calib, calib_samples, calib_len)
    run = RunFlags(device, dtype, chunk, reference, topk, store, baseline, memory_plan, max_memory=max_bytes, device_map=device_map, attn=attn)
    run = memory_preflight(model, weight_specs, kv_specs, ctx, tokens, score, run, calibration, dry_run)
    if dry_run:
        return
    _run_and_print(model, data, ctx, tokens, weight_specs, kv_specs, score, "eval", calibration, run, json_out=json_out, tolerance=ship)


def print_results(results, tolerance=None) -> None:
    """What eval prints for its results: the table, the position tables, the ship decision under ``--tolerance``."""
    from wkvlab.display import depth_table
    from wkvlab.eval.depth import depth_tables

    console.print(results_table(results, describe_run(results)))
    for table in depth_tables(results):
        console.print(depth_table(table))
    if tolerance is not None:
        print_tolerance(results, tolerance)


def print_tolerance(results, tolerance) -> None:
    """One line per config: within tolerance / exceeds it / undecided, with its interval, family and units."""
    from wkvlab.stats.tolerance import ship_lines, tolerance_verdicts

    for line in ship_lines(tolerance_verdicts(results, tolerance), tolerance):
        console.print(line, highlight=False, markup=False)


@app.command("demo")
def demo_command(
    model: Annotated[str, typer.Option(help="model to run the demo grid on")] = "default",
    tokens: Annotated[int, typer.Option(help="tokens to evaluate")] = 4096,
    ctx: Annotated[int, typer.Option(help="tokens per window")] = 512,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the grid as JSON")] = None,
    report: Annotated[Optional[Path], typer.Option(help="also write the grid's HTML report, PNGs and tables into this folder (docs/report.md)")] = None,
    threads: ThreadsOption = None,
    cache_dir: CacheDirOption = None,
    no_weight_cache: NoWeightCacheOption = False,
) -> None:
    """The main job: weights {bf16, int8, int4-g128} × KV {fp16, fp8_e4m3, int8, int4} on the default model and text."""
    from wkvlab.report.output import check_folder as check_report_folder

    weight_specs, kv_specs = parse_configs(DEMO_WEIGHTS, DEMO_KV)
    check_grid(model, weight_specs, kv_specs, check_model(model, ctx, tokens), "auto")
    check_tokens_in_text("default", ctx, tokens)
    check_output_file(json_out, "--json")
    if report is not None:
        check_report_folder(report)  # before the grid: a refused folder must not cost the whole run
    start_run("demo", threads, _grid_facts(model, "default", ctx, tokens, weight_specs, kv_specs), cache_dir=cache_dir, weight_cache=not no_weight_cache,
              writes=lambda: planned_writes(model, weight_specs, resolved_dtype("auto", "auto")))
    results = _run_and_print(model, "default", ctx, tokens, weight_specs, kv_specs, "all", "demo")
    if report is not None:
        from wkvlab.report import write_report
        from wkvlab.report.cli import print_written as print_report_written

        with status(f"writing the report to {report}"):
            written = write_report(results, report, source=f"wkvlab demo ({model}, {tokens} tokens, ctx {ctx})")
        print_report_written(written)
    if json_out is not None:
        write_json_atomic(json_out, [r.to_dict() for r in results])
        err_console.print(f"wrote {escape(str(json_out))}")


def _forms_table(title: str, forms) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in ("accepted", "example", "meaning"):
        table.add_column(column, overflow="fold")
    for form in forms:
        table.add_row(escape(form.pattern), escape(form.example), escape(form.meaning))
    return table


@app.command("presets")
def presets_command() -> None:
    """List every name and form --weights and --kv accept: presets, formats, grammar, options, and where each comes from."""
    from rich.table import Table

    from wkvlab import listing
    from wkvlab.kv import KV_FORMATS, KVSpec
    from wkvlab.weights import PRESETS, WeightSpec

    listing.check_examples()
    weights = Table(title="weights (--weights): names and presets", title_justify="left")
    for column in ("name", "method", "format", "bits", "group", "activations", "what"):
        weights.add_column(column, overflow="fold")
    rows = [(form.pattern, WeightSpec.parse(form.example), form.meaning) for form in listing.WEIGHT_NAMES]
    rows += [(name, spec, "preset (docs/weights.md)") for name, spec in PRESETS.items()]
    for name, spec, what in rows:
        weights.add_row(name, spec.method, spec.format, str(spec.bits), str(spec.group_size or "-"), spec.activations, what)
    console.print(weights)
    console.print(_forms_table("weights: grammar", listing.WEIGHT_GRAMMAR))
    console.print(_forms_table("weights: options after '+' (several allowed)", listing.WEIGHT_OPTIONS))
    formats = Table(title="KV element formats (--kv)", title_justify="left")
    formats.add_column("name")
    formats.add_column("what", overflow="fold")
    formats.add_column("bytes per head vector (head_dim 64)", justify="right")
    for fmt in KV_FORMATS.values():
        formats.add_row(fmt.name, fmt.description, f"{fmt.bytes_per_vector(64):g}")
    console.print(formats)
    console.print(_forms_table("KV: grammar", listing.KV_GRAMMAR))
    console.print(_forms_table("KV: options after '+' (several allowed)", listing.KV_OPTIONS))
    kv = Table(title="KV presets (--kv): engines and papers; fidelity: bit-exact > engine-checked > source-faithful > approximate; identity: nothing quantized",
               title_justify="left")
    for column in ("name", "spec", "fidelity", "source"):
        kv.add_column(column, overflow="fold")
    for row in listing.kv_preset_rows():
        kv.add_row(*(escape(cell) for cell in row))
    console.print(kv)
    releases = Table(title="engine releases: what '<engine>@<release>:' (--kv) and 'plan --engine-version <engine>=<release>' model "
                     "(src/wkvlab/plan/data/engines.yaml); without one, the default", title_justify="left")
    for column in ("engine", "release", "version", "commit", "features; formats stored differently"):
        releases.add_column(column, overflow="fold")
    for row in listing.engine_release_rows():
        releases.add_row(*(escape(cell) for cell in row))
    console.print(releases)
    console.print("Details: docs/weights.md, docs/kv.md. Weight sizes are MiB (2^20 bytes) everywhere; KV caches are bytes per token.")


app.command("plan", help="Will it fit, how fast, which combination: memory, roofline throughput and engine command lines.")(plan_command)
# Sweeps into a results store, resumable after a crash (docs/sweeps.md); the commands live in wkvlab.sweep.cli.
app.command("sweep")(sweep_command)
app.command("results")(results_command)
# Sensitivity profiles and mixed-precision search (docs/search.md); the commands live in wkvlab.search.cli.
app.command("profile")(profile_command)
app.command("search")(search_command)
# Where weight and KV errors meet (docs/explain.md); the commands live in wkvlab.explain.cli.
app.command("explain")(explain_command)
app.command("compare")(compare_command)
# The HTML/PNG/Markdown report of a store (docs/report.md); the command lives in wkvlab.report.cli.
app.command("report")(report_command)
# Quantized checkpoints written from a weight config (read back with --weights checkpoint:<folder>).
app.command("export")(export_command)
# Downstream tasks through lm-evaluation-harness next to KLD (docs/tasks.md); the command imports lm_eval only when it runs.
app.command("tasks")(tasks_command)
# Real engines (llama.cpp, OpenAI-compatible servers) and the simulation fidelity check (docs/engines.md).
app.add_typer(engine_app, name="engine")
# The seeds' questions, measured (docs/findings.md); the command lives in wkvlab.findings.cli.
app.command("findings")(findings_command)
# Stored references: the reference's per-token distributions on disk (docs/scale.md).
app.add_typer(reference_app, name="reference")
# The disk cache: what it holds, and pruning it (docs/cli.md); the commands live in wkvlab.cache_cli.
app.add_typer(cache_app, name="cache")


def _usage_line(exc: click_errors.UsageError) -> str:
    """click's 4-line usage error ('Usage: ...', 'Try ...', blank, 'Error: ...') as one line."""
    command = exc.ctx.command_path if exc.ctx is not None else "wkvlab"
    return f"{exc.format_message()} (see '{command} --help')"


def main() -> None:
    """Console entry point: user errors and usage errors become one line on stderr and exit code 2."""
    try:
        code = app(args=optional_probe_value(sys.argv[1:]), standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:  # 'wkvlab' alone or 'wkvlab engine' alone: the help is the answer
        print(exc.ctx.get_help() if exc.ctx is not None else str(exc))
        sys.exit(0)
    except click_errors.UsageError as exc:
        err_console.print(f"[red]error:[/] {escape(_usage_line(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except WkvlabError as exc:
        # escaped: a message naming e.g. an install extra in [brackets] must not be read as rich markup
        err_console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (KeyboardInterrupt, _ABORT):
        err_console.print("interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
