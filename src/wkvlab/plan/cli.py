"""``wkvlab plan``: a thin command over :func:`wkvlab.plan.plan`.

The main CLI registers it with ``app.command("plan")(plan_command)``; bad input raises
:class:`wkvlab.errors.ConfigError`, which the main CLI prints as one line. Option names follow
docs/options.md: ``--context`` is the served sequence length (``--ctx``, the name of a window in
the measuring commands, is accepted here as an alias because plan runs no windows).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from wkvlab.cliopts import ThreadsOption
from wkvlab.errors import ConfigError
from wkvlab.plan.probe import DEFAULT_BUDGET_S, DEFAULT_TOKENS


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--gpus {text!r}: give a GPU count or a comma list such as 1,2,4") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"--gpus {text!r}: counts must be at least 1")
    return values


def optional_probe_value(argv: list[str]) -> list[str]:
    """``plan ... --probe`` without a number means the default token count (Typer has no optional option values)."""
    if "plan" not in argv or "--probe" not in argv:
        return argv
    out = list(argv)
    i = out.index("--probe")
    if i + 1 >= len(out) or not out[i + 1].isdigit():
        out.insert(i + 1, str(DEFAULT_TOKENS))
    return out


def _loadable(model: str) -> bool:
    """Whether plan can run this model here (header only; a bad --model is refused by plan itself)."""
    from wkvlab.errors import WkvlabError
    from wkvlab.plan.probe import LOADABLE
    from wkvlab.plan.source import resolve_source

    try:
        return resolve_source(model)[1].kind in LOADABLE
    except WkvlabError:
        return False


def _model_help() -> str:
    from wkvlab.models.packaged import PACKAGED_MODELS
    from wkvlab.plan.models import builtin_model_names

    return ("A packaged model ('default' = smollm2, " + ", ".join(n for n in PACKAGED_MODELS if n != "smollm2")
            + "), an HF folder, a config.json, a .gguf, or a built-in name (shapes only): " + ", ".join(builtin_model_names()) + ".")


_MODEL_HELP = _model_help()


def plan_command(
    model: Annotated[str, typer.Option("--model", "-m", help=_MODEL_HELP)],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU name, e.g. A100-80GB, H100, RTX-4090, L40S.")],
    batch: Annotated[int, typer.Option("--batch", "-b", help="Concurrent sequences.")],
    context: Annotated[int, typer.Option("--context", "--ctx", "-c", help="Tokens per served sequence (prompt + output); --ctx is an alias.")],
    weights: Annotated[list[str] | None, typer.Option(
        "--weights", "-w", help="Weight config(s), as for wkvlab eval: int4-g128, fp8, q4_0, 'int4-g128+skip=0,79' (repeat or comma-separate).")] = None,
    kv: Annotated[list[str] | None, typer.Option(
        "--kv", help="KV spec(s), as for wkvlab eval: fp8_e4m3, q8_0/q4_0, int4+skip=0,1, K8V4, @plan.yaml (repeat or comma-separate).")] = None,
    gpus: Annotated[str, typer.Option("--gpus", "-n", help="GPUs per server; a comma list (1,2,4) plans each count side by side.")] = "1",
    tp: Annotated[int | None, typer.Option("--tp", help="vLLM/SGLang tensor-parallel size (default: --gpus / --pp).")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="vLLM/SGLang pipeline-parallel size (default 1).")] = None,
    split: Annotated[str | None, typer.Option("--split", help="llama.cpp -sm: layer (default) or row.")] = None,
    results: Annotated[list[Path] | None, typer.Option("--results", help="wkvlab eval/demo --json file(s): rank by your measured KLD.")] = None,
    store: Annotated[list[Path] | None, typer.Option("--store", help="wkvlab sweep store(s) (SQLite): rank by your measured KLD.")] = None,
    model_id: Annotated[str | None, typer.Option("--model-id", help="The Hub id, folder or .gguf the launch lines load (e.g. a quantized checkpoint).")] = None,
    engine_version: Annotated[list[str] | None, typer.Option("--engine-version", help="Target an engine release: vllm=0.23, sglang=0.5.20 (default: the newest modelled; 'wkvlab presets' lists them).")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the full plan as JSON here.")] = None,
    engine: Annotated[str | None, typer.Option("--engine", "-e", help="Restrict to one engine: vllm, sglang, llama.cpp, trtllm.")] = None,
    gpu_file: Annotated[Path | None, typer.Option("--gpu-file", help="YAML/JSON file adding or overriding GPUs (schema: data/gpus.yaml).")] = None,
    probe: Annotated[int | None, typer.Option(
        "--probe", help=f"Measure on exactly TOKENS tokens instead of sizing the probe to --probe-budget ('--probe' alone = "
                        f"{DEFAULT_TOKENS}); an error for a model known by name only.", metavar="[TOKENS]", show_default=False)] = None,
    probe_budget: Annotated[float, typer.Option(
        "--probe-budget", help="Seconds the probe may take: plan measures the KV formats and weight configs it would recommend on "
                               "this model (a packaged model, .gguf, folder or cached Hub id) before ranking, through wkvlab eval's "
                               "path; the budget sets the tokens (and drops configs it cannot afford, which are then never "
                               "recommended). Counted from the probe's start, the model load (and a GGUF's conversion) included; sized on "
                               "measured time (one window is timed first), so a busy machine measures less rather than overrunning.", metavar="SECONDS")] = DEFAULT_BUDGET_S,
    no_probe: Annotated[bool, typer.Option("--no-probe", help="Do not measure: every quantized row stays a prior, unmeasured and "
                                                              "not recommended (launch lines labelled unverified).")] = False,
    probe_data: Annotated[str, typer.Option("--probe-data", help="Text the probe measures on (as eval --data).")] = "default",
    screen: Annotated[bool, typer.Option("--screen", help="Read the key projections (no forward pass) and flag layers whose outlier "
                                         "key channels a per-token 4-bit cache cannot represent (docs/planner.md).")] = False,
    tolerance: Annotated[str | None, typer.Option(
        "--tolerance", help="What you can tolerate, as for wkvlab eval: a mean KLD in nats (0.01) or a top-1 agreement (top1=0.95). "
                            "Each measured config is then within tolerance, exceeds it or undecided (one-sided non-inferiority, Holm "
                            "over the configs); the smallest-memory config shown within tolerance is recommended (docs/planner.md).")] = None,
    threads: ThreadsOption = None,
) -> None:
    """Which weight x KV combinations fit, how fast they run, and the engine command lines."""
    from wkvlab.kv.spec import split_kv_list
    from wkvlab.plan.engines import parse_engine_versions
    from wkvlab.plan.measured import load_measurements
    from wkvlab.plan.planner import plan
    from wkvlab.plan.render import render, render_counts
    from wkvlab.weights.parse import split_weight_list

    counts = _ints(gpus)
    verdict = {}
    if tolerance is not None:  # a bad --tolerance: one line, before any model loads
        from wkvlab.plan.verdict import tolerance_rule
        from wkvlab.stats.tolerance import Tolerance

        verdict = {"verdict": tolerance_rule(Tolerance.parse(tolerance))}
    if json_out is not None and not (json_out.parent if str(json_out.parent) else Path(".")).is_dir():
        raise ConfigError(f"--json {json_out}: folder {json_out.parent} does not exist; create it or choose another path")
    w_list = [w for value in (weights or []) for w in split_weight_list(value)] or None
    k_list = [k for value in (kv or []) for k in split_kv_list(value)] or None
    measurements = load_measurements(results or [], store or [])
    versions = parse_engine_versions(engine_version)
    from wkvlab.plan.planner import check_inputs, check_size
    from wkvlab.plan.engines import normalize_engine
    from wkvlab.plan.source import resolve_source

    desc = resolve_source(model)[0]  # the header only: every input is refused before the probe loads anything
    check_size(desc, batch, context)
    for n in counts:
        check_inputs(desc, w_list, normalize_engine(engine), n, tp, pp, split)
    prober = None
    if probe is not None and no_probe:
        raise ConfigError("--probe and --no-probe contradict each other; keep one")
    if probe is not None and probe < 1:
        raise ConfigError(f"--probe {probe}: give a positive number of tokens, or --probe alone for {DEFAULT_TOKENS}")
    if probe_budget <= 0:
        raise ConfigError(f"--probe-budget {probe_budget:g}: give a positive number of seconds, or --no-probe to measure nothing")
    if not no_probe and (probe is not None or _loadable(model)):
        from wkvlab.cliopts import start_run
        from wkvlab.display import err_console, progress_bar, status
        from wkvlab.plan.probe import Probe

        start_run("plan (probe)", threads, f"{model}, " + (f"{probe:,} tokens" if probe else f"budget {probe_budget:g} s"))
        say = lambda line: err_console.print(line, highlight=False, markup=False)  # noqa: E731
        prober = Probe(probe, probe_data, budget_s=None if probe else probe_budget, explicit=probe is not None,
                       progress=progress_bar, say=say, status=status)
    plans = [plan(model, gpu, batch, context, weights=w_list, kv=k_list, engine=engine, measurements=measurements, gpu_file=gpu_file,
                  gpus=n, tp=tp, pp=pp, split=split, model_id=model_id, versions=versions, probe=prober, screen=screen, **verdict) for n in counts]
    width = max(shutil.get_terminal_size((160, 40)).columns, 140)
    console = Console(width=width, highlight=False, soft_wrap=True)
    if len(plans) == 1:
        render(plans[0], console)
    else:
        render_counts(plans, console)
    if json_out is not None:
        from wkvlab.io import write_json_atomic

        payload = [p.to_dict() for p in plans]
        write_json_atomic(json_out, payload[0] if len(payload) == 1 else payload)
