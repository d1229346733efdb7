"""``wkvlab engine eval`` and ``wkvlab engine compare``: thin commands over :mod:`wkvlab.engines.api`."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table
from rich.markup import escape

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
    reference: Annotated[Optional[str], typer.Option(help="the reference: a model for transformers (default: the GGUF for llamacpp, 'default' for openai), "
                                                          "or a stored-reference file from 'wkvlab reference save' (no model is loaded)")] = None,
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
    threads: ThreadsOption = None,
) -> None:
    """Run a real engine on the reference's token windows and compare: PPL, KLD, top-1, Δp, by position.

    The reference is transformers in float32, a stored reference file, or with --reference-url /
    --reference-gguf another engine (engine against engine: both sides' log-probs on the same token ids).
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown --engine {engine!r}; use one of {', '.join(ENGINES)}")
    # Everything below is checked before any model loads.
    if reference_url and reference_gguf:
        raise ConfigError("give one reference engine: --reference-url or --reference-gguf, not both")
    engine_reference = bool(reference_url or reference_gguf)
    stored = reference is not None and reference.lower().endswith(".safetensors")
    if engine_reference and reference:
        raise ConfigError("--reference names the transformers reference or a stored one; with --reference-url/--reference-gguf use --tokenizer for the windows")
    if not engine_reference and tokenizer and not stored:
        raise ConfigError("--tokenizer is for engine or stored references only; otherwise the --reference model tokenizes")
    if stored and not Path(reference).expanduser().is_file():
        raise ConfigError(f"stored reference not found: {reference}; make one with 'wkvlab reference save --out {reference}'")
    if flavor not in FLAVORS:
        raise ConfigError(f"unknown server flavour {flavor!r}; use one of {', '.join(FLAVORS)}")
    servers, cache_types = [], _names([kv]) if engine == "llamacpp" else []
    for cache in [*cache_types, reference_kv]:
        parse_cache_types(cache)  # a typo is one line, before the progress bar draws
    if engine == "openai":
        urls, names = _names(url), _names([model] if model else [])
        if not urls or not names:
            raise ConfigError("--engine openai needs --url (e.g. http://127.0.0.1:8000/v1) and --model (the served name)")
        if len(names) not in (1, len(urls)):
            raise ConfigError(f"give one --model for all {len(urls)} --url, or one per --url (got {len(names)})")
        servers = list(zip(urls, names * len(urls) if len(names) == 1 else names))
    else:
        flash_attention_on(flash_attn, parse_cache_types(cache_types[0])[1])
        _check_gguf(gguf)
    if not engine_reference and len(servers) + len(cache_types) > 1:
        raise ConfigError("several candidates (--kv a,b or several --url) are compared in one run against an engine reference "
                          "(--reference-url or --reference-gguf); against transformers, run one command per candidate")
    if reference_url and not (reference_model or servers):
        raise ConfigError("--reference-url needs the served name: --reference-model NAME")
    if reference_gguf:
        _check_gguf(reference_gguf)
    if not engine_reference and not stored:
        check_model(reference or (gguf if engine == "llamacpp" else "default"), ctx, tokens, score)
    _check_text(data)
    check_output_file(json_out, "--json")
    target = gguf if engine == "llamacpp" else ", ".join(_names(url))
    choice = start_run("engine eval", threads, f"{engine} ({target}) on {data}, ctx {ctx}, {tokens} tokens")
    from wkvlab.engines import api
    from wkvlab.engines.openai import ServerSpec  # torch: only now, after every check

    specs = [ServerSpec(url=u, model=n, flavor=flavor, topk=topk, batch=batch, timeout=timeout, retries=retries) for u, n in servers]
    steps = max(1, tokens // ctx) * (1 + max(1, len(specs) + len(cache_types)))
    with progress_bar(steps, f"engine {engine}") as advance:
        if engine_reference:
            ref = reference_gguf or ServerSpec(url=reference_url, model=reference_model or specs[0].model, flavor=reference_flavor or flavor,  # type: ignore[arg-type]
                                               topk=reference_topk or topk, batch=batch, timeout=timeout, retries=retries)
            results = api.evaluate_engines(ref, servers=specs, gguf=gguf if cache_types else None, kv=cache_types, reference_kv=reference_kv,
                                           tokenizer=tokenizer, data=data, ctx=ctx, tokens=tokens, score=score, flash_attn=flash_attn,
                                           rotation=not no_rotation, progress=advance)
        elif specs:
            results = [api.evaluate_server(specs[0], reference=reference or "default", data=data, ctx=ctx, tokens=tokens, score=score,
                                           progress=advance, tokenizer=tokenizer or "default")]
        else:
            results = [api.evaluate_llamacpp(gguf, cache_types[0], reference=reference, data=data, ctx=ctx, tokens=tokens, score=score,
                                             flash_attn=flash_attn, rotation=not no_rotation, threads=choice.threads, progress=advance)]
    title = describe_engine_run(results) if engine_reference else describe_run(results)
    console.print(results_table(results, title))
    if len(results) > 1:
        console.print(kv_delta_table(results))
    for note in dict.fromkeys(n for r in results for n in r.notes):
        err_console.print(f"[yellow]note:[/] {note}")
    if json_out is not None:
        for result in results:
            result.threads = choice.threads  # torch's (the reference) and llama.cpp's n_threads alike
        payload = [r.to_dict() for r in results]
        write_json_atomic(json_out, payload[0] if len(payload) == 1 else payload)
        err_console.print(f"wrote {json_out}")


def describe_engine_run(results) -> str:
    first = results[0]
    ref = first.reference
    where = ref.get("gguf") or ref.get("server", {}).get("url", "?")
    return (f"{first.model} on {first.data}: {first.tokens} scored tokens, ctx {first.ctx}, reference engine {ref.get('name')} "
            f"({where}, cache {ref.get('kv')}), reference PPL {first.ppl_ref:.4f}; KLD {first.kld_method}")


def kv_delta_table(results) -> Table:
    base = results[0]
    delta = results[1].kv_delta or {}
    prompts = len(delta.get("per_prompt", []))
    unit = (delta.get("kld") or {}).get("unit") or "prompts"
    unit = "prompts" if unit in ("windows", "units") else unit  # a served window is one prompt
    dropped = (delta.get("kld") or {}).get("dropped", 0)
    table = Table(title=f"KV delta vs {base.kv}, paired over {prompts} prompts (95% skew-robust t over {unit}, analytic: "
                        f"no Monte-Carlo error" + (f"; {dropped} {unit} left out leave it undefined" if dropped else "") + ")",
                  title_justify="left")
    for name in ("candidate", "ΔKLD [95%]", "Δtop-1 [95%]", "per-prompt ΔKLD (first 8)"):
        table.add_column(name, justify="left" if name == "candidate" else "right", no_wrap=name != "per-prompt ΔKLD (first 8)")
    for r in results[1:]:
        d = r.kv_delta or {}
        kld, top1 = d["kld"], d["top1"]
        prompts = " ".join(f"{p['kld_delta']:+.4f}" for p in d["per_prompt"][:8])
        if kld.get("low") is None:  # too few prompts for an interval (wkvlab.stats: at least 8 units)
            table.add_row(r.kv, f"{kld['estimate']:+.5f} [no interval: {kld['n_units']} {unit}]",
                          f"{100 * top1['estimate']:+.2f} pt", prompts)
            continue
        table.add_row(r.kv, f"{kld['estimate']:+.5f} [{kld['low']:+.5f}, {kld['high']:+.5f}]",
                      f"{100 * top1['estimate']:+.2f} [{100 * top1['low']:+.2f}, {100 * top1['high']:+.2f}] pt", prompts)
    return table


def fidelity_table(report: FidelityReport) -> Table:
    floor = report.noise_floor
    table = Table(title=f"{report.model}: llama.cpp vs simulation, {report.tokens} tokens, ctx {report.ctx}, rotation {'on' if report.rotation else 'off'}; "
                        f"noise floor (transformers fp32 vs llama.cpp f16) KLD {floor['mean']:.6f} ± {floor['se']:.6f}; "
                        f"simulated: vs llamacpp:f16, {report.sim_activations}", title_justify="left")
    from wkvlab.engines.compare import fidelity_verdicts

    verdicts = fidelity_verdicts(report.rows)
    if verdicts:  # the one rule on ratio − 1: its margin and family, said once under the table
        v = verdicts[0]
        table.caption = (f"verdict: ratio − 1 against margin {v.margin.format('.2g')}; {v.adjustment}; {v.resampling}. "
                         "± after a KLD: its standard error over tokens (a description, as llama.cpp reports it)")
        table.caption_justify = "left"
    for name in ("KV", "simulated preset", "engine KLD", "simulated KLD", "ratio [95%, windows resampled]", "verdict", "engine top-1", "sim top-1"):
        table.add_column(name, justify="left" if name in ("KV", "simulated preset", "verdict") else "right", no_wrap=True)
    for row, v in zip(report.rows, verdicts):
        style = {"within": "green", "above": "red", "below": "red"}.get(v.outcome, "")
        word = v.word + (f" ({v.need()})" if v.need() else "")
        table.add_row(row.kv, f"{row.preset} ({row.sim_spec})", f"{row.engine_kld['mean']:.6f} ± {row.engine_kld['se']:.6f}",
                      f"{row.sim_kld['mean']:.6f} ± {row.sim_kld['se']:.6f}", f"{row.ratio_interval():.2f}",
                      f"[{style}]{escape(word)}[/]" if style else escape(word), f"{100 * row.engine_top1:.2f}%", f"{100 * row.sim_top1:.2f}%")
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
