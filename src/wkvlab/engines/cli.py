"""``wkvlab engine eval`` and ``wkvlab engine compare``: thin commands over :mod:`wkvlab.engines.api`."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from wkvlab.cliopts import ThreadsOption, start_run
from wkvlab.display import console, describe_run, err_console, progress_bar, results_table
from wkvlab.engines.flavors import FLAVORS
from wkvlab.engines.llamacpp import flash_attention_on, parse_cache_types
from wkvlab.errors import ConfigError, ModelError
from wkvlab.io import check_output_file, write_json_atomic
from wkvlab.models.packaged import canonical_name
from wkvlab.preflight import check_model

if TYPE_CHECKING:  # the engines' API (torch, llama-cpp-python) is imported by the commands, after their checks
    from wkvlab.engines.compare import FidelityReport

engine_app = typer.Typer(no_args_is_help=True, help="Real engines: llama.cpp and OpenAI-compatible servers against the reference; simulation fidelity.")

ENGINES = ("llamacpp", "openai")
# The text and windows both commands evaluate on.
DataOption = Annotated[str, typer.Option(help="'default', 'code', a .txt/.jsonl file")]
CtxOption = Annotated[int, typer.Option(help="tokens per window")]
TokensOption = Annotated[int, typer.Option(help="tokens to evaluate, rounded down to whole windows")]
ScoreOption = Annotated[str, typer.Option(help="'all' or 'second-half'")]


def _check_gguf(gguf: str) -> None:
    """What engines.api.resolve_gguf refuses, without importing it."""
    if canonical_name(gguf) is None and not (Path(gguf).expanduser().is_file() and gguf.lower().endswith(".gguf")):
        raise ModelError(f"--gguf {gguf!r} is not a .gguf file; give a GGUF path or 'default'")


def _check_text(data: str) -> None:
    from wkvlab.data.corpora import check_data

    check_data(data)


@engine_app.command("eval")
def eval_command(
    engine: Annotated[str, typer.Option(help="llamacpp (in-process, llama-cpp-python) or openai (a vLLM / SGLang / llama-cpp-python server)")] = "llamacpp",
    gguf: Annotated[str, typer.Option(help="llamacpp: the GGUF to run ('default' = the packaged SmolLM2)")] = "default",
    kv: Annotated[str, typer.Option(help="llamacpp: a --kv spec llama.cpp has types for: q8_0, q8_0/q4_0, f16, llamacpp:q4_0 (f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)")] = "f16",
    flash_attn: Annotated[str, typer.Option(help="llamacpp: auto (on when V is quantized), on, off")] = "auto",
    no_rotation: Annotated[bool, typer.Option("--no-rotation", help="llamacpp: LLAMA_ATTN_ROT_DISABLE=1 (no Hadamard rotation of quantized caches)")] = False,
    url: Annotated[Optional[str], typer.Option(help="openai: base URL, e.g. http://127.0.0.1:8000/v1")] = None,
    model: Annotated[Optional[str], typer.Option(help="openai: the served model's name")] = None,
    flavor: Annotated[str, typer.Option(help=f"openai: {', '.join(FLAVORS)} (how the server scores prompts)")] = "vllm",
    topk: Annotated[int, typer.Option(help="openai: top-k log-probs per position (vLLM allows 20 unless --max-logprobs)")] = 20,
    batch: Annotated[int, typer.Option(help="openai: windows per request")] = 1,
    timeout: Annotated[float, typer.Option(help="openai: seconds per request")] = 120.0,
    retries: Annotated[int, typer.Option(help="openai: retries after a failed request (exponential backoff)")] = 4,
    reference: Annotated[Optional[str], typer.Option(help="reference model for transformers (default: the GGUF for llamacpp, 'default' for openai)")] = None,
    data: DataOption = "default",
    ctx: CtxOption = 512,
    tokens: TokensOption = 4096,
    score: ScoreOption = "all",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the result as JSON (the same as wkvlab eval, plus engine/kld_method/tail_mass)")] = None,
    threads: ThreadsOption = None,
) -> None:
    """Run a real engine on the reference's token windows and compare: PPL, KLD, top-1, Δp, by position."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown --engine {engine!r}; use one of {', '.join(ENGINES)}")
    # Everything below is checked before any model loads.
    if engine == "openai":
        if not url or not model:
            raise ConfigError("--engine openai needs --url (e.g. http://127.0.0.1:8000/v1) and --model (the served name)")
        if flavor not in FLAVORS:
            raise ConfigError(f"unknown server flavour {flavor!r}; use one of {', '.join(FLAVORS)}")
    else:
        flash_attention_on(flash_attn, parse_cache_types(kv)[1])
        _check_gguf(gguf)
    check_model(reference or (gguf if engine == "llamacpp" else "default"), ctx, tokens, score)
    _check_text(data)
    check_output_file(json_out, "--json")
    choice = start_run("engine eval", threads, f"{engine} ({gguf if engine == 'llamacpp' else url}) on {data}, ctx {ctx}, {tokens} tokens")
    from wkvlab.engines import api

    steps = max(1, tokens // ctx) * 2
    with progress_bar(steps, f"engine {engine}") as advance:
        if engine == "llamacpp":
            result = api.evaluate_llamacpp(gguf, kv, reference=reference, data=data, ctx=ctx, tokens=tokens, score=score,
                                           flash_attn=flash_attn, rotation=not no_rotation, threads=choice.threads, progress=advance)
        else:
            spec = api.ServerSpec(url=url, model=model, flavor=flavor, topk=topk, batch=batch, timeout=timeout, retries=retries)
            result = api.evaluate_server(spec, reference=reference or "default", data=data, ctx=ctx, tokens=tokens, score=score, progress=advance)
    console.print(results_table([result], describe_run([result])))
    for note in result.notes:
        err_console.print(f"[yellow]note:[/] {note}")
    if json_out is not None:
        result.threads = choice.threads  # torch's (the reference) and llama.cpp's n_threads alike
        write_json_atomic(json_out, result.to_dict())
        err_console.print(f"wrote {json_out}")


def fidelity_table(report: FidelityReport) -> Table:
    floor = report.noise_floor
    table = Table(title=f"{report.model}: llama.cpp vs simulation, {report.tokens} tokens, ctx {report.ctx}, rotation {'on' if report.rotation else 'off'}; "
                        f"noise floor (transformers fp32 vs llama.cpp f16) KLD {floor['mean']:.6f} ± {floor['se']:.6f}; "
                        f"simulated: vs llamacpp:f16, {report.sim_activations}", title_justify="left")
    for name in ("KV", "simulated preset", "engine KLD", "simulated KLD", "ratio", "engine top-1", "sim top-1"):
        table.add_column(name, justify="left" if name in ("KV", "simulated preset") else "right", no_wrap=True)
    for row in report.rows:
        ratio = row.ratio
        style = "green" if 0.75 <= ratio <= 1.25 else "red"
        table.add_row(row.kv, f"{row.preset} ({row.sim_spec})", f"{row.engine_kld['mean']:.6f} ± {row.engine_kld['se']:.6f}",
                      f"{row.sim_kld['mean']:.6f} ± {row.sim_kld['se']:.6f}", f"[{style}]{ratio:.2f}[/]",
                      f"{100 * row.engine_top1:.2f}%", f"{100 * row.sim_top1:.2f}%")
    return table


@engine_app.command("compare")
def compare_command(
    gguf: Annotated[str, typer.Option(help="the GGUF llama.cpp runs ('default' = the packaged SmolLM2)")] = "default",
    kv: Annotated[str, typer.Option(help="llama.cpp cache types, comma-separated; K/V pairs as q8_0/q4_0")] = "q8_0,q4_0,q4_1,q5_0,q8_0/q4_0",
    no_rotation: Annotated[bool, typer.Option("--no-rotation", help="compare with LLAMA_ATTN_ROT_DISABLE=1 and the +norot presets")] = False,
    reference: Annotated[Optional[str], typer.Option(help="reference model for transformers (default: the same GGUF)")] = None,
    data: DataOption = "default",
    ctx: CtxOption = 512,
    tokens: TokensOption = 4096,
    score: ScoreOption = "all",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the fidelity report as JSON")] = None,
    threads: ThreadsOption = None,
) -> None:
    """Fidelity: llama.cpp's KLD per cache type next to the simulated llamacpp:<type> preset's, with the noise floor."""
    from wkvlab.kv.spec import split_kv_list  # the --kv list rule of every command

    types = split_kv_list(kv)
    if not types:
        raise ConfigError("give at least one cache type, e.g. --kv q8_0,q4_0")
    for kv_type in types:
        parse_cache_types(kv_type)
    _check_gguf(gguf)
    check_model(reference or gguf, ctx, tokens, score)
    _check_text(data)
    check_output_file(json_out, "--json")
    choice = start_run("engine compare", threads, f"llama.cpp ({gguf}) vs simulation, {len(types)} cache type(s), ctx {ctx}, {tokens} tokens")
    from wkvlab.engines import api
    from wkvlab.engines.compare import compare_steps

    with progress_bar(compare_steps(max(1, tokens // ctx), len(types)), "engine compare") as advance:
        report = api.fidelity(gguf, types, reference=reference, data=data, ctx=ctx, tokens=tokens, score=score,
                              rotation=not no_rotation, threads=choice.threads, progress=advance)
    console.print(fidelity_table(report))
    if json_out is not None:
        write_json_atomic(json_out, {**report.to_dict(), "threads": choice.to_dict()})
        err_console.print(f"wrote {json_out}")
