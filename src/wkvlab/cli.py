"""The ``wkvlab`` command line: parse, call :mod:`wkvlab.api`, print. Errors are one line."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from wkvlab import api
from wkvlab.display import console, describe_run, err_console, progress_bar, results_table
from wkvlab.engines.cli import engine_app
from wkvlab.errors import WkvlabError
from wkvlab.explain.cli import compare_command, explain_command
from wkvlab.io import write_json_atomic
from wkvlab.kv.spec import split_kv_list
from wkvlab.plan.cli import plan_command
from wkvlab.report import check_folder as check_report_folder, write_report
from wkvlab.report.cli import print_written as print_report_written, report_command
from wkvlab.search.cli import profile_command, search_command
from wkvlab.sweep.cli import results_command, sweep_command
from wkvlab.weights.parse import split_weight_list

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Measure, explain and plan the combined quantization of LLM weights and KV cache.",
)

DEMO_WEIGHTS = ("bf16", "int8", "int4-g128")
DEMO_KV = ("fp16", "fp8_e4m3", "int8", "int4")


def _split(values: list[str] | None, default: tuple[str, ...]) -> list[str]:
    """Accept both repeated options and comma-separated lists."""
    out = [item.strip() for value in (values or []) for item in value.split(",") if item.strip()]
    return out or list(default)


def _split_kv(values: list[str] | None, default: tuple[str, ...]) -> list[str]:
    """Like :func:`_split`, but ``skip=0,1`` inside a KV spec keeps its commas."""
    out = [item for value in (values or []) for item in split_kv_list(value)]
    return out or list(default)


def _run_and_print(model: str, data: str, ctx: int, tokens: int, weights: list[str], kv: list[str], score: str, title: str,
                   calibration: api.CalibrationSpec | None = None, baseline: str = "auto"):
    weight_specs, kv_specs = api.parse_weights(weights), api.parse_kv(kv)
    with console.status(f"loading {model} and {data} text"):
        work = api.prepare(model, data, ctx=ctx, tokens=tokens, score=score)
    api.check_kv_specs(work.loaded.model, kv_specs)
    total = api.grid_steps(work.windows, len(weight_specs), len(kv_specs), any(k.needs_calibration for k in kv_specs))
    with progress_bar(total, title) as advance:
        results = api.evaluate_workload(work, weight_specs, kv_specs, advance, calibration, baseline)
    console.print(results_table(results, describe_run(results)))
    for note in dict.fromkeys(n for r in results for n in r.notes):
        err_console.print(f"[yellow]note:[/] {note}")
    return results


@app.command("eval")
def eval_command(
    model: Annotated[str, typer.Option(help="'default' (SmolLM2-135M), 'gemma3-270m', a .gguf file or an HF folder")] = "default",
    data: Annotated[str, typer.Option(help="'default' (pydoc prose), 'code' (stdlib source), a .txt/.jsonl file, hf:<dataset>, or selfgen[:<tokens>] (text the model samples itself, cached)")] = "default",
    ctx: Annotated[int, typer.Option(help="tokens per window (BOS included when the model wants one)")] = 1024,
    tokens: Annotated[int, typer.Option(help="tokens to evaluate, rounded down to whole windows")] = 8192,
    weights: Annotated[Optional[list[str]], typer.Option(help="weight config(s): none, bf16, int8, int4-g128, gptq-int4-g128, awq-int4-g128, w8a8-int8, llm-int8, fp8, fp8-wo, nvfp4, nvfp4-mlp, mxfp4, options after ';' (repeat or comma-separate)")] = None,
    kv: Annotated[Optional[list[str]], typer.Option(help="KV config(s): fp16, fp8_e4m3, int8, int4, int2, q8_0, q4_0, ..., K/V pairs (q8_0/q4_0), presets (llamacpp:q4_0, vllm:fp8_e4m3, exl3:k4v4), options (+rot, +sinks=4, +residual=128, +skip=0,1, +q=q8_0), @spec.yaml")] = None,
    score: Annotated[str, typer.Option(help="'all' positions or 'second-half' of each window (llama.cpp)")] = "all",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write results as JSON (a list when several configs run)")] = None,
    calib: Annotated[str, typer.Option(help="calibration text for gptq/awq/w8a8-int8/static scales: prose, code, math, or a file (samples come from its end)")] = "prose",
    calib_samples: Annotated[int, typer.Option(help="calibration samples")] = 16,
    calib_len: Annotated[int, typer.Option(help="tokens per calibration sample")] = 512,
    baseline: Annotated[str, typer.Option(help="what the KLD is against: 'float' reference, 'engine' (llama.cpp's own f16 cache with its q8 activations, for llamacpp: presets on a GGUF), or 'auto' (engine when every KV config is a llamacpp: preset on a GGUF with its own weights)")] = "auto",
) -> None:
    """Evaluate weights × KV configs against the unquantized reference: PPL, KLD, top-1, Δp, by position."""
    calibration = api.CalibrationSpec(calib, calib_samples, calib_len)
    results = _run_and_print(model, data, ctx, tokens, [w for v in (weights or ["none"]) for w in split_weight_list(v)], _split_kv(kv, ("fp16",)), score, "eval", calibration, baseline)
    if json_out is not None:
        payload = [r.to_dict() for r in results]
        write_json_atomic(json_out, payload[0] if len(payload) == 1 else payload)
        err_console.print(f"wrote {json_out}")


@app.command("demo")
def demo_command(
    model: Annotated[str, typer.Option(help="model to run the demo grid on")] = "default",
    tokens: Annotated[int, typer.Option(help="tokens to evaluate")] = 4096,
    ctx: Annotated[int, typer.Option(help="tokens per window")] = 512,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write the grid as JSON")] = None,
    report: Annotated[Optional[Path], typer.Option(help="also write the grid's HTML report, PNGs and tables into this folder (docs/report.md)")] = None,
) -> None:
    """The main job: weights {bf16, int8, int4-g128} × KV {fp16, fp8_e4m3, int8, int4} on the default model and text."""
    if report is not None:
        check_report_folder(report)  # before the grid: a refused folder must not cost the whole run
    results = _run_and_print(model, "default", ctx, tokens, list(DEMO_WEIGHTS), list(DEMO_KV), "all", "demo")
    if report is not None:
        print_report_written(write_report(results, report, source=f"wkvlab demo ({model}, {tokens} tokens, ctx {ctx})"))
    if json_out is not None:
        write_json_atomic(json_out, [r.to_dict() for r in results])
        err_console.print(f"wrote {json_out}")


@app.command("presets")
def presets_command() -> None:
    """List the weight and KV-cache presets, KV element formats, and where each comes from."""
    from rich.table import Table

    from wkvlab.kv import KV_FORMATS, KVSpec
    from wkvlab.kv.presets import fidelity_of, preset_names as kv_preset_names
    from wkvlab.weights import PRESETS

    weights = Table(title="weight presets (--weights)", title_justify="left")
    for column in ("name", "method", "format", "bits", "group", "activations"):
        weights.add_column(column)
    for name, spec in PRESETS.items():
        weights.add_row(name, spec.method, spec.format, str(spec.bits), str(spec.group_size or "-"), spec.activations)
    console.print(weights)
    kv = Table(title="KV presets (--kv); fidelity: bit-exact > engine-checked > source-faithful > approximate", title_justify="left")
    for column in ("name", "spec", "fidelity", "source"):
        kv.add_column(column)
    for name in kv_preset_names():
        if "<" in name:
            kv.add_row(name, "", "", "any bit widths / pair of the types above")
            continue
        info = fidelity_of(KVSpec.parse(name))
        label = info["label"] + (f" ({info['differs']})" if info["label"] == "approximate" or "+" in name else "")
        kv.add_row(name, KVSpec.parse(name).canonical(), label, info["source"])
    console.print(kv)
    formats = Table(title="KV element formats", title_justify="left")
    formats.add_column("name")
    formats.add_column("what")
    formats.add_column("bytes per head vector (head_dim 64)", justify="right")
    for fmt in KV_FORMATS.values():
        formats.add_row(fmt.name, fmt.description, f"{fmt.bytes_per_vector(64):g}")
    console.print(formats)
    console.print("also: int<b>[-g<G>][-sym|-asym], int<b>-c<G> (per channel over G tokens), nuq<b>[-c] (KVQuant); see docs/kv.md")


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
# Real engines (llama.cpp, OpenAI-compatible servers) and the simulation fidelity check (docs/engines.md).
app.add_typer(engine_app, name="engine")


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit code 2."""
    try:
        app()
    except WkvlabError as exc:
        # escaped: a message naming e.g. an install extra in [brackets] must not be read as rich markup
        err_console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
