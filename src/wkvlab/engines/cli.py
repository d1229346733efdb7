"""``wkvlab engine eval`` and ``wkvlab engine compare``: thin commands over :mod:`wkvlab.engines.api`."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from wkvlab.display import console, describe_run, err_console, progress_bar, results_table
from wkvlab.engines import api
from wkvlab.engines.compare import FidelityReport, compare_steps
from wkvlab.engines.llamacpp import parse_cache_types
from wkvlab.engines.openai import FLAVORS, ServerSpec
from wkvlab.errors import ConfigError
from wkvlab.io import write_json_atomic

engine_app = typer.Typer(no_args_is_help=True, help="Real engines: llama.cpp and OpenAI-compatible servers against the reference; simulation fidelity.")

ENGINES = ("llamacpp", "openai")
# The text and windows both commands evaluate on.
DataOption = Annotated[str, typer.Option(help="'default', 'code', a .txt/.jsonl file")]
CtxOption = Annotated[int, typer.Option(help="tokens per window")]
TokensOption = Annotated[int, typer.Option(help="tokens to evaluate, rounded down to whole windows")]
ScoreOption = Annotated[str, typer.Option(help="'all' or 'second-half'")]


def _names(values: list[str] | None) -> list[str]:
    """Repeated options and comma-separated lists alike."""
    return [item.strip() for value in (values or []) for item in value.split(",") if item.strip()]


@engine_app.command("eval")
def eval_command(
    engine: Annotated[str, typer.Option(help="llamacpp (in-process, llama-cpp-python) or openai (a vLLM / SGLang / llama-cpp-python server)")] = "llamacpp",
    gguf: Annotated[str, typer.Option(help="llamacpp: the GGUF to run ('default' = the packaged SmolLM2)")] = "default",
    kv: Annotated[str, typer.Option(help="llamacpp: cache type, K/V pair as q8_0/q4_0 (f16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl); "
                                         "with an engine reference a comma list (f16,q4_0): the first is the others' KV-delta baseline")] = "f16",
    flash_attn: Annotated[str, typer.Option(help="llamacpp: auto (on when V is quantized), on, off")] = "auto",
    no_rotation: Annotated[bool, typer.Option("--no-rotation", help="llamacpp: LLAMA_ATTN_ROT_DISABLE=1 (no Hadamard rotation of quantized caches)")] = False,
    url: Annotated[Optional[list[str]], typer.Option(help="openai: base URL, e.g. http://127.0.0.1:8000/v1; with an engine reference, repeat "
                                                          "(or comma-separate) for several candidates: the first is the others' KV-delta baseline")] = None,
    model: Annotated[Optional[str], typer.Option(help="openai: the served model's name (one for all --url, or a comma list, one per --url)")] = None,
    flavor: Annotated[str, typer.Option(help=f"openai: {', '.join(FLAVORS)} (how the server scores prompts)")] = "vllm",
    topk: Annotated[int, typer.Option(help="openai: top-k log-probs per position (vLLM allows 20 unless --max-logprobs)")] = 20,
    batch: Annotated[int, typer.Option(help="openai: windows per request")] = 1,
    timeout: Annotated[float, typer.Option(help="openai: seconds per request")] = 120.0,
    retries: Annotated[int, typer.Option(help="openai: retries after a failed request (exponential backoff)")] = 4,
    reference: Annotated[Optional[str], typer.Option(help="reference model for transformers (default: the GGUF for llamacpp, 'default' for openai)")] = None,
    reference_url: Annotated[Optional[str], typer.Option(help="engine reference: an OpenAI-compatible server running the unquantized model (no transformers model is loaded)")] = None,
    reference_model: Annotated[Optional[str], typer.Option(help="--reference-url: its served name (default: --model's first)")] = None,
    reference_flavor: Annotated[Optional[str], typer.Option(help="--reference-url: how it scores prompts (default: --flavor)")] = None,
    reference_topk: Annotated[Optional[int], typer.Option(help="--reference-url: top-k log-probs per position (default: --topk)")] = None,
    reference_gguf: Annotated[Optional[str], typer.Option(help="engine reference: llama.cpp in-process with this (16-bit) GGUF, full logits")] = None,
    reference_kv: Annotated[str, typer.Option(help="--reference-gguf: its cache type")] = "f16",
    tokenizer: Annotated[Optional[str], typer.Option(help="with an engine reference: the tokenizer that cuts the windows ('default', a .gguf, an HF folder; "
                                                          "default: --reference-gguf, else --gguf for llamacpp, else 'default')")] = None,
    data: DataOption = "default",
    ctx: CtxOption = 512,
    tokens: TokensOption = 4096,
    score: ScoreOption = "all",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the result as JSON (the same as wkvlab eval, plus engine/kld_method/tail_mass/reference; a list for several candidates)")] = None,
) -> None:
    """Run a real engine on the reference's token windows and compare: PPL, KLD, top-1, Δp, by position.

    The reference is transformers in float32, or with --reference-url / --reference-gguf another engine
    (engine against engine: both sides' log-probs on the same token ids).
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown --engine {engine!r}; use one of {', '.join(ENGINES)}")
    if reference_url and reference_gguf:
        raise ConfigError("give one reference engine: --reference-url or --reference-gguf, not both")
    engine_reference = bool(reference_url or reference_gguf)
    if engine_reference and reference:
        raise ConfigError("--reference names the transformers reference; with --reference-url/--reference-gguf use --tokenizer for the windows")
    if not engine_reference and tokenizer:
        raise ConfigError("--tokenizer is for engine references only; without --reference-url/--reference-gguf the transformers --reference tokenizes")
    specs, cache_types = [], _names([kv]) if engine == "llamacpp" else []
    for cache in [*cache_types, reference_kv]:
        parse_cache_types(cache)  # a typo is one line, before the progress bar draws
    if engine == "openai":  # checked before any model loads
        urls, names = _names(url), _names([model] if model else [])
        if not urls or not names:
            raise ConfigError("--engine openai needs --url (e.g. http://127.0.0.1:8000/v1) and --model (the served name)")
        if len(names) not in (1, len(urls)):
            raise ConfigError(f"give one --model for all {len(urls)} --url, or one per --url (got {len(names)})")
        names = names * len(urls) if len(names) == 1 else names
        specs = [ServerSpec(url=u, model=n, flavor=flavor, topk=topk, batch=batch, timeout=timeout, retries=retries) for u, n in zip(urls, names)]
    if not engine_reference and len(specs) + len(cache_types) > 1:
        raise ConfigError("several candidates (--kv a,b or several --url) are compared in one run against an engine reference "
                          "(--reference-url or --reference-gguf); against transformers, run one command per candidate")
    if reference_url and not (reference_model or specs):
        raise ConfigError("--reference-url needs the served name: --reference-model NAME")
    steps = max(1, tokens // ctx) * (1 + max(1, len(specs) + len(cache_types)))
    with progress_bar(steps, f"engine {engine}") as advance:
        if engine_reference:
            ref = reference_gguf or _reference_spec(reference_url, reference_model or (specs[0].model if specs else None),  # type: ignore[arg-type]
                                                    reference_flavor or flavor, reference_topk or topk, batch, timeout, retries)
            results = api.evaluate_engines(ref, servers=specs, gguf=gguf if cache_types else None, kv=cache_types, reference_kv=reference_kv,
                                           tokenizer=tokenizer, data=data, ctx=ctx, tokens=tokens, score=score, flash_attn=flash_attn,
                                           rotation=not no_rotation, progress=advance)
        elif specs:
            results = [api.evaluate_server(specs[0], reference=reference or "default", data=data, ctx=ctx, tokens=tokens, score=score, progress=advance)]
        else:
            results = [api.evaluate_llamacpp(gguf, kv, reference=reference, data=data, ctx=ctx, tokens=tokens, score=score,
                                             flash_attn=flash_attn, rotation=not no_rotation, progress=advance)]
    title = describe_run(results) if not engine_reference else describe_engine_run(results)
    console.print(results_table(results, title))
    if len(results) > 1:
        console.print(kv_delta_table(results))
    for note in dict.fromkeys(n for r in results for n in r.notes):
        err_console.print(f"[yellow]note:[/] {note}")
    if json_out is not None:
        payload = [r.to_dict() for r in results]
        write_json_atomic(json_out, payload[0] if len(payload) == 1 else payload)
        err_console.print(f"wrote {json_out}")


def _reference_spec(url: str, model: str, flavor: str, topk: int, batch: int, timeout: float, retries: int) -> ServerSpec:
    return ServerSpec(url=url, model=model, flavor=flavor, topk=topk, batch=batch, timeout=timeout, retries=retries)


def describe_engine_run(results: list[api.EngineEvalResult]) -> str:
    first = results[0]
    ref = first.reference
    where = ref.get("gguf") or ref.get("server", {}).get("url", "?")
    return (f"{first.model} on {first.data}: {first.tokens} scored tokens, ctx {first.ctx}, reference engine {ref.get('name')} "
            f"({where}, cache {ref.get('kv')}), reference PPL {first.ppl_ref:.4f}; KLD {first.kld_method}")


def kv_delta_table(results: list[api.EngineEvalResult]) -> Table:
    base = results[0]
    prompts = len((results[1].kv_delta or {}).get("per_prompt", []))
    table = Table(title=f"KV delta vs {base.kv}, paired over {prompts} prompts (95% bootstrap over prompts)", title_justify="left")
    for name in ("candidate", "ΔKLD [95%]", "Δtop-1 [95%]", "per-prompt ΔKLD (first 8)"):
        table.add_column(name, justify="left" if name == "candidate" else "right", no_wrap=name != "per-prompt ΔKLD (first 8)")
    for r in results[1:]:
        d = r.kv_delta or {}
        kld, top1 = d["kld"], d["top1"]
        prompts = " ".join(f"{p['kld_delta']:+.4f}" for p in d["per_prompt"][:8])
        table.add_row(r.kv, f"{kld['estimate']:+.5f} [{kld['low']:+.5f}, {kld['high']:+.5f}]",
                      f"{100 * top1['estimate']:+.2f} [{100 * top1['low']:+.2f}, {100 * top1['high']:+.2f}] pt", prompts)
    return table


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
) -> None:
    """Fidelity: llama.cpp's KLD per cache type next to the simulated llamacpp:<type> preset's, with the noise floor."""
    types = [t.strip() for t in kv.split(",") if t.strip()]
    if not types:
        raise ConfigError("give at least one cache type, e.g. --kv q8_0,q4_0")
    with progress_bar(compare_steps(max(1, tokens // ctx), len(types)), "engine compare") as advance:
        report = api.fidelity(gguf, types, reference=reference, data=data, ctx=ctx, tokens=tokens, score=score,
                              rotation=not no_rotation, progress=advance)
    console.print(fidelity_table(report))
    if json_out is not None:
        write_json_atomic(json_out, report.to_dict())
        err_console.print(f"wrote {json_out}")
