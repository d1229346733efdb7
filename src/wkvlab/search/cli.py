"""``wkvlab profile`` and ``wkvlab search``: parse, call :mod:`wkvlab.search.api`, print tables."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from wkvlab.cliopts import CacheDirOption, MarginOption, NoWeightCacheOption, ThreadsOption, start_run
from wkvlab.display import console, err_console, progress_bar
from wkvlab.errors import ConfigError
from wkvlab.io import check_output_file, write_json_atomic
from wkvlab.preflight import check_calibration, check_grid, check_model, parse_configs
from wkvlab.weights.calibration import CalibrationSpec
from wkvlab.weights.spec import WeightSpec

if TYPE_CHECKING:  # the search API (torch) is imported by the commands, after their checks
    from wkvlab.search.api import SearchResult
    from wkvlab.search.profile import SensitivityProfile

SPEC_SUFFIXES = (".yaml", ".yml", ".json")

Model = Annotated[str, typer.Option(help="'default' (SmolLM2-135M), 'gemma3-270m', a .gguf file or an HF folder")]
Data = Annotated[str, typer.Option(help="'default' (pydoc prose), 'code', a .txt/.jsonl file: profiling windows from its start, held-out windows right after")]
Weights = Annotated[str, typer.Option(help="weight config the profile is measured under (none = 16-bit weights), e.g. int4-g128, gptq-int4-g128")]
Formats = Annotated[Optional[str], typer.Option(help="allowed per-layer choices: kvtuner (fp16,K8V8,K8V4,K4V4,K4V2,K2V2; default), vllm-fp8, vllm-int8, vllm-int4, or a list such as fp16,K8V4,q8_0/q4_0")]
Ctx = Annotated[int, typer.Option(help="tokens per evaluated window (profiling and held-out text)")]


def _bars(title: str, total: int):
    return progress_bar(total, title)


def _calib(calib: str) -> CalibrationSpec:
    return CalibrationSpec(calib)


def _write_spec(path: Path, data: dict) -> None:
    """The plan as a KV spec file ``wkvlab eval --kv @path`` reads; written atomically."""
    import yaml

    check_output_file(path, "--out", SPEC_SUFFIXES)
    if path.suffix.lower() == ".json":
        write_json_atomic(path, data, "--out")
        return
    parent = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)


def _check_common(model: str, data: str, weights: str, formats: str | None, ctx: int, calib: str):
    """What profile and search refuse before any model loads; returns the allowed choices and the model's facts."""
    from wkvlab.data.corpora import check_data
    from wkvlab.search.choices import parse_choices

    weight_specs, _ = parse_configs([weights], [])
    choices = parse_choices(formats)
    facts = check_model(model, ctx)
    check_grid(model, weight_specs, [], facts)
    check_data(data)
    check_calibration(calib)
    return choices, facts


def _writes(model: str, weights: str):
    """The run header's planned cache writes (wkvlab.models.cache_writes): the model on the CPU or its GPU's dtype."""
    from wkvlab.models.cache_writes import planned_writes
    from wkvlab.preflight import resolved_dtype

    return lambda: planned_writes(model, parse_configs([weights], [])[0], resolved_dtype("auto", "auto"))


def _print_estimate(model: str, estimate) -> None:
    """The run header's ``memory:`` line, before the model loads (wkvlab.search.memory): profile and
    search load the model on the CPU in float32 (wkvlab.search.api.prepare_search), so the estimate
    is the process's peak RSS, against the machine's available RAM; a warning when it is above it."""
    from wkvlab.plan.source import resolve_source
    from wkvlab.runtime import available_memory

    try:
        desc = resolve_source(model)[0]
    except ConfigError as exc:  # shapes the planner cannot read: the run goes on without an estimate
        err_console.print(f"memory: no estimate ({escape(str(exc))})")
        return
    found = estimate(desc, available_memory("cpu"))
    err_console.print(escape(found.one_line()), highlight=False, soft_wrap=True)
    if found.chosen.device_bytes > found.budget_bytes:
        err_console.print("[yellow]warning:[/] that is more than this machine has available; lower --ctx or the tokens, "
                          "or close other programs, before the run is killed", highlight=False)


def profile_command(
    model: Model = "default",
    data: Data = "default",
    weights: Weights = "int4-g128",
    formats: Formats = None,
    ctx: Ctx = 256,
    tokens: Annotated[int, typer.Option(help="profiling tokens (every layer x format is one pass over them)")] = 256,
    weight_profile: Annotated[bool, typer.Option(help="also measure per-layer and per-module weight sensitivity")] = True,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the profile (plain JSON, docs/search.md)")] = None,
    calib: Annotated[str, typer.Option(help="calibration text for gptq/awq weights")] = "prose",
    threads: ThreadsOption = None,
    cache_dir: CacheDirOption = None,
    no_weight_cache: NoWeightCacheOption = False,
) -> None:
    """Per-layer K and V sensitivity under a weight config, per-layer/per-module weight sensitivity, sinks, outlier channels."""
    _check_common(model, data, weights, formats, ctx, calib)
    check_output_file(json_out, "--json")
    start_run("profile", threads, f"{model} on {data} under {weights} weights, ctx {ctx}, {tokens} tokens", cache_dir=cache_dir,
              weight_cache=not no_weight_cache, writes=_writes(model, weights))
    from wkvlab.search.memory import profile_estimate

    spec, calibration = WeightSpec.parse(weights), _calib(calib)
    _print_estimate(model, lambda desc, budget: profile_estimate(desc, spec, ctx=ctx, tokens=tokens, weight_profile=weight_profile,
                                                                 calibration=(calibration.samples, calibration.length), budget=budget))
    from wkvlab.search import api

    prof = api.profile(model, data, weights=weights, formats=formats, ctx=ctx, tokens=tokens, weight_profile=weight_profile,
                       bars=_bars, calibration=_calib(calib))
    print_profile(prof)
    if json_out is not None:
        prof.save(json_out)
        err_console.print(f"wrote {json_out}")


def print_profile(prof: SensitivityProfile) -> None:
    console.print(f"[bold]{prof.model}[/] on {prof.data}, weights {prof.weights}: {prof.tokens} tokens, ctx {prof.ctx}; "
                  f"KLD with the cache untouched {prof.base_kld:.5f}. Cells: KLD added by quantizing only that layer's K or V.",
                  highlight=False)
    table = Table(title="per-layer sensitivity", title_justify="left")
    table.add_column("layer", justify="right")
    columns = [(f"K {f}", prof.k_delta(f)) for f in prof.k] + [(f"V {f}", prof.v_delta(f)) for f in prof.v]
    for name, _ in columns:
        table.add_column(name, justify="right")
    if prof.weight_layers:
        table.add_column("weights only", justify="right")
    for name in ("attn→pos0", "sink positions", "K max/med", "V max/med"):
        table.add_column(name, justify="right")
    for layer in range(prof.layers):
        cells = [f"{values[layer]:+.5f}" for _, values in columns]
        if prof.weight_layers:
            cells.append(f"{prof.weight_layers[layer]:.5f}")
        sink = prof.sinks[layer] if layer < len(prof.sinks) else {}
        out = prof.outliers[layer] if layer < len(prof.outliers) else {}
        cells += [f"{sink.get('attention_to_first', float('nan')):.3f}", ",".join(map(str, sink.get("activation_sink_positions", [])[:4])) or "-",
                  f"{out.get('k_max_over_median', float('nan')):.1f}", f"{out.get('v_max_over_median', float('nan')):.1f}"]
        table.add_row(str(layer), *cells)
    console.print(table)
    if prof.weight_modules:
        modules = Table(title="weights: one module kind quantized in every layer, KV untouched", title_justify="left")
        modules.add_column("module")
        modules.add_column("KLD", justify="right")
        for name, value in prof.weight_modules.items():
            modules.add_row(name, f"{value:.5f}")
        console.print(modules)
    for note in prof.notes:
        err_console.print(f"[yellow]note:[/] {note}")


def search_command(
    budget: Annotated[Optional[float], typer.Option(help="KV budget in bytes per token (all layers, K and V)")] = None,
    budgets: Annotated[Optional[str], typer.Option(help="instead of --budget: a Pareto curve, e.g. 5000,5500,...,12000 (8 or more); a plan and every rival at each")] = None,
    weights: Weights = "int4-g128",
    formats: Formats = None,
    gpu: Annotated[Optional[str], typer.Option(help="instead of --budget: what this GPU leaves for KV at --batch x --context (vLLM's rule)")] = None,
    batch: Annotated[int, typer.Option(help="sequences (GPU budget, total memory)")] = 1,
    context: Annotated[Optional[int], typer.Option(help="tokens per served sequence, as in wkvlab plan: the GPU budget and the total memory column (default: min(8192, the model's maximum))")] = None,
    model: Model = "default",
    data: Data = "default",
    ctx: Ctx = 256,
    profile_tokens: Annotated[int, typer.Option(help="profiling tokens")] = 256,
    heldout_tokens: Annotated[int, typer.Option(help="held-out tokens every plan and rival is measured on (8 windows of --ctx at least for an interval)")] = 2048,
    candidates: Annotated[int, typer.Option(help="searched plans per budget re-measured on held-out text; the best is compared with the rivals on that same text, so more than 1 flatters it")] = 1,
    random: Annotated[int, typer.Option("--random", help="random per-layer mixes at each budget (one rival: their mean)")] = 5,
    joint_weights: Annotated[bool, typer.Option(help="also choose layers whose weights stay 16-bit, paid from the same memory at batch x context")] = False,
    unaware: Annotated[bool, typer.Option(help="include the weight-unaware plan, allocated from a 16-bit-weight profile (a second profile)")] = True,
    kvtuner: Annotated[bool, typer.Option(help="include KVTuner's rule (approximate: pair pruning, layer groups, search on predicted KLD; docs/search.md)")] = True,
    out: Annotated[Optional[Path], typer.Option(help="write the chosen plan as a KV spec (.yaml/.json) for wkvlab eval --kv @file")] = None,
    recipe: Annotated[Optional[Path], typer.Option(help="write the layer-wise recipe JSON (KVTuner bits, ModelOpt quant_cfg)")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the full result as JSON")] = None,
    calib: Annotated[str, typer.Option(help="calibration text for gptq/awq weights")] = "prose",
    margin: MarginOption = "10%",
    threads: ThreadsOption = None,
    cache_dir: CacheDirOption = None,
    no_weight_cache: NoWeightCacheOption = False,
) -> None:
    """Per-layer KV formats (optionally 16-bit weight layers) minimizing measured KLD under a memory budget, against rivals that spend the same budget."""
    from wkvlab.search.choices import check_budget_options, nothing_fits, parse_budgets, smallest_plan_bytes

    curve = parse_budgets(budgets)
    check_budget_options(budget, gpu, batch, context, curve)
    if curve and (out is not None or recipe is not None):
        raise ConfigError("--out and --recipe write one plan; run --budget <one of the curve's budgets> for it")
    if candidates < 1 or random < 0:
        raise ConfigError(f"--candidates must be ≥ 1 and --random ≥ 0, got {candidates} and {random}")
    choices, facts = _check_common(model, data, weights, formats, ctx, calib)
    lowest = min(curve) if curve else budget
    if lowest is not None and facts is not None and not joint_weights:
        smallest = smallest_plan_bytes(choices, layers=facts.layers, kv_heads=facts.kv_heads, head_dim=facts.head_dim)
        if lowest < smallest:  # known from the model's files: refuse before minutes of profiling
            raise nothing_fits(lowest, smallest)
    check_output_file(out, "--out", SPEC_SUFFIXES)
    check_output_file(recipe, "--recipe")
    check_output_file(json_out, "--json")
    from wkvlab.stats.decision import MarginRule

    margin = MarginRule.parse(margin)  # a bad --margin: one line, before any model loads
    what = (f"budget {budget:,.0f} B/token" if budget is not None else f"{len(curve)} budgets {min(curve):,.0f}–{max(curve):,.0f} B/token"
            if curve else f"GPU {gpu}")
    choice = start_run("search", threads, f"{model} on {data} under {weights} weights, {what}", cache_dir=cache_dir,
                       weight_cache=not no_weight_cache, writes=_writes(model, weights))
    from wkvlab.search.memory import search_estimate

    spec, calibration = WeightSpec.parse(weights), _calib(calib)
    _print_estimate(model, lambda desc, budget: search_estimate(desc, spec, ctx=ctx, profile_tokens=profile_tokens,
                                                                heldout_tokens=heldout_tokens, joint_weights=joint_weights,
                                                                calibration=(calibration.samples, calibration.length), budget=budget))
    from wkvlab.search import api

    result = api.search(model, data, budget=budget, budgets=curve, gpu=gpu, batch=batch, context=context, weights=weights, formats=formats,
                        ctx=ctx, profile_tokens=profile_tokens, heldout_tokens=heldout_tokens, candidates=candidates,
                        joint_weights=joint_weights, unaware=unaware, kvtuner=kvtuner, random_mixes=random,
                        calibration=_calib(calib), bars=_bars, margin=margin)
    print_search(result)
    if out is not None and result.spec:
        _write_spec(out, result.spec)
        weights = result.weights + (f"+skip={','.join(map(str, result.keep_16bit))}" if result.keep_16bit else "")
        gpu_part = f" --gpu {gpu} --batch {batch} --context {result.budget['context']}" if gpu else ""
        err_console.print(f"wrote {out} (use: wkvlab eval --weights {weights} --kv @{out}; "
                          f"wkvlab plan --model {model}{gpu_part or ' --gpu <name> --batch <n> --context <tokens>'} --weights {weights} --kv @{out})")
    if recipe is not None and result.exports:
        write_json_atomic(recipe, result.exports["recipe"], "--recipe")
        err_console.print(f"wrote {recipe}")
    if json_out is not None:
        write_json_atomic(json_out, {**result.to_dict(), "threads": choice.to_dict()})
        err_console.print(f"wrote {json_out}")


def _comparison_rows(result: SearchResult):
    """Per budget: the plan, then each rival kind (random mixes as one row: their mean, bytes least–most)."""
    by_key = {r.key: r for r in result.rows}
    for point in result.points:
        plan = by_key.get(f"{point.chosen} @ {point.budget:,.0f}")
        if plan is not None:
            yield point, plan.name, "plan", (plan.kv_bytes_per_token,) * 2, (plan.gap,) * 2, plan.kld, plan.se, None
        for c in point.comparisons:
            members = [r for r in result.rows if r.budget == point.budget and r.kind == c.rival]
            se = members[0].se if len(members) == 1 else float("nan")
            yield point, c.label, c.rival, c.bytes, c.gap, c.kld, se, c
            if len(members) > 1 and not result.is_curve:  # one budget: each random mix too (a curve: --json has them)
                for r in members:
                    yield point, f"  {r.name}", r.kind, (r.kv_bytes_per_token,) * 2, (r.gap,) * 2, r.kld, r.se, None


def _span(pair, spec: str) -> str:
    lo, hi = pair
    return f"{lo:{spec}}" if abs(hi - lo) < 0.5 else f"{lo:{spec}}–{hi:{spec}}"


def print_search(result: SearchResult) -> None:
    b = result.budget
    given = b["source"].endswith("(given)")
    budgets = (f"budget {b['bytes_per_token']:,.0f} B/token" + ("" if given else f" ({b['source']})") if not result.is_curve
               else f"{len(b['budgets'])} budgets {', '.join(f'{x:,.0f}' for x in b['budgets'])} B/token")
    console.print(f"[bold]search[/] {result.model} on {result.data}, weights {result.weights}: {budgets}; profile {result.profile['tokens']} tokens"
                  f"{' (cached)' if result.profile['cached'] else ''}, held-out {result.heldout_tokens} tokens; every rival spends the budget "
                  f"within one layer-format step ({b['step']:,.0f} B/token), a uniform format only within ±2% of it", highlight=False)
    table = Table(title=f"held-out KLD vs the unquantized reference, at equal memory (plan − rival: Holm-adjusted interval, {result.family})",
                  title_justify="left")
    for name, just in (("budget", "right"), ("config", "left"), ("kind", "left"), ("KV B/token", "right"), ("gap", "right"),
                       ("held-out KLD ± se", "right"), ("plan − this (adjusted)", "right"), ("margin", "right"), ("verdict", "left")):
        table.add_column(name, justify=just)  # type: ignore[arg-type]
    for point, name, kind, spent, gap, kld, se, comp in _comparison_rows(result):
        v = comp.verdict if comp is not None else None
        table.add_row(f"{point.budget:,.0f}", ("[bold green]» [/]" if kind == "plan" else "") + name, kind, _span(spent, ",.0f"), _span(gap, ",.0f"),
                      f"{kld:.5f}" + (f" ± {se:.5f}" if se == se else ""),
                      "" if v is None else format(v.adjusted, "+.4f"), "" if v is None else f"±{v.margin.value:.3g}",
                      "" if v is None else v.word)
    for r in result.rows:
        if r.kind == "reference":
            table.add_row("—", r.name, r.kind, f"{r.kv_bytes_per_token:,.0f}", "—", f"{r.kld:.5f} ± {r.se:.5f}", "", "", "")
    console.print(table)
    for point in result.points:
        for note in point.notes:
            console.print(f"{point.budget:,.0f} B/token: {note}", highlight=False)
    if result.plan:
        console.print(f"plan: {' '.join(f'{i}:{c}' for i, c in enumerate(result.plan))}"
                      + (f"; 16-bit weight layers {result.keep_16bit}" if result.keep_16bit else ""), highlight=False)
    console.print(f"[bold]{result.verdict}[/]", highlight=False)
    console.print(f"predictor: α_kv {result.predictor['alpha_kv']:.3f}, α_w {result.predictor['alpha_w']:.3f}; "
                  f"Spearman rank correlation predicted vs held-out KLD over {sum(r.predicted is not None for r in result.rows)} configs: "
                  f"{result.rank_correlation:.3f}", highlight=False)
    for engine in ("vllm", "llama.cpp"):
        line = result.exports.get(engine)
        if not line:
            continue
        console.print(f"\n[bold]{engine}[/] ({'exact' if line['exact'] else 'approximation'}):", highlight=False)
        for step in line.get("prepare", []):
            console.print(step, soft_wrap=True, highlight=False, markup=False)
        if line["command"]:
            console.print(line["command"], soft_wrap=True, highlight=False, markup=False)
            console.print(f"  (flags checked against {line['version']}: {line['checked']})", soft_wrap=True, highlight=False, markup=False)
        elif line["kv_args"]:
            console.print("cache flags: " + " ".join([*line["env"], *line["kv_args"]]), soft_wrap=True, highlight=False, markup=False)
        for note in line["notes"]:
            console.print(f"  - {note}", highlight=False, markup=False, soft_wrap=True)
