"""Text rendering of a :class:`PlanResult`: one table row per combination, then launch lines."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wkvlab.plan.guard import RISKY_K_BITS, UNMEASURED, thresholds
from wkvlab.plan.launch import LaunchCommand
from wkvlab.plan.planner import Combination, PlanResult
from wkvlab.plan.verdict import EXCEEDS, UNDECIDED, WITHIN


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f}"


def _where(result: PlanResult) -> str:
    n = result.layout.gpus
    return f"one {result.gpu.name}" if n == 1 else f"{n} x {result.gpu.name}"


def render(result: PlanResult, console: Console, *, brief: bool = False) -> None:
    m, g = result.model, result.gpu
    console.print(f"[bold]wkvlab plan[/bold]  {escape(m.name)} on {escape(_where(result))} ({escape(g.label)}, "
                  f"{g.memory_bytes:,} B = {g.memory_bytes / 1e9:.1f} GB = {g.memory_bytes / 2**30:.1f} GiB, "
                  f"{g.bandwidth_gb_s:.0f} GB/s, sm_{g.sm})  batch {result.batch} x context {result.ctx}"
                  + (f"  engine {result.engine}" if result.engine else ""))
    console.print(f"model: {m.num_layers} layers ({len(m.kv_layers)} with KV), hidden {m.hidden_size}, "
                  f"{m.num_heads} heads / {m.num_kv_heads} KV heads x {m.head_dim}, vocab {m.vocab_size}"
                  + (f", MoE {m.moe.num_experts}x top-{m.moe.experts_per_token}" if m.moe else "")
                  + (f", MLA latent {m.mla.cache_dim}" if m.mla else "")
                  + (f", sliding window {m.sliding_window}" if m.sliding_window else "")
                  + f"  (source: {m.source})", highlight=False, markup=False)
    if result.measured:
        console.print(measured_header(result), highlight=False, markup=False)
    if not brief:
        table = rows_table(result)
        # one line per row: the quality cell carries the guard's words whole (a wider line beats a folded one)
        wide = console.measure(table, options=console.options.update_width(400)).maximum
        out = console if wide <= console.width else Console(file=console.file, width=wide, highlight=False, soft_wrap=True,
                                                             color_system=console.color_system, force_terminal=console.is_terminal)
        out.print(table)
        for label in dict.fromkeys(r.quality.label for r in result.rows if r.quality.is_measured):
            console.print(f"{label}", highlight=False, markup=False)
        if result.screen is not None:
            console.print(result.screen.summary(), highlight=False, markup=False, soft_wrap=True)
        tolerance_lines(result, console)
        if any(r.quality.unsafe for r in result.rows):
            console.print(f"UNSAFE rows are never ranked or recommended: {thresholds()} (plan/guard.py)", highlight=False, markup=False)
        if any(r.quality.caution for r in result.rows):
            console.print(f"{UNMEASURED}: a prior only, never recommended — caches collapse on models with outlier key channels "
                          f"(Qwen2/Qwen2.5 with QKV bias are a known case: per-token caches below {RISKY_K_BITS} bits, and 8-bit and "
                          "FP8 ones where the outliers are large enough); no prior can tell", highlight=False, markup=False)
        console.print("* roofline estimate at the requested batch, every sequence at full context; not a measurement", highlight=False)
    if result.probe_cost:
        c = result.probe_cost
        console.print(f"probe: {c['configs']} configuration(s) measured on {c['tokens']:,} tokens ({c['windows']} windows x {c['ctx']}) "
                      f"in {c['seconds']:.0f} s on {c['threads']} CPU thread(s), the model load ({c.get('load_seconds', 0):.0f} s) included"
                      + (f", against a --probe-budget of {c['budget_s']:g} s" if c.get("budget_s") else ""), highlight=False, markup=False)
        if c.get("unmeasured"):
            console.print(f"probe: left unmeasured by the budget, never recommended: {', '.join(c['unmeasured'])} (the notes say how to "
                          "measure them)", highlight=False, markup=False, soft_wrap=True)
        if c["ctx"] < result.ctx:
            console.print(probed_context(c["ctx"], result), highlight=False, markup=False, soft_wrap=True)
    for verified in (True, False):
        recs = [r for r in result.recommendations if r.verified == verified]
        if recs:
            console.print("\n[bold]Recommended launch lines[/bold] (measured on this model, or the checkpoint itself)" if verified else
                          "\n[bold]Launch lines UNVERIFIED ON THIS MODEL[/bold] (priors only: not recommended until measured)")
        for rec in recs:
            tag = "" if verified else escape(" [unverified on this model]")
            console.print(f"\n[bold]{rec.engine}[/bold]: {escape(rec.weights)} weights x {escape(rec.kv)} KV{tag}", highlight=False)
            print_command(rec.command, console)
            for line in rec.why + rec.command.notes:
                console.print(f"  - {line}", highlight=False, markup=False)
    if result.measure_hint:
        console.print(f"\nto measure the unmeasured rows: {result.measure_hint}", highlight=False, markup=False, soft_wrap=True)
    best = next((r for r in result.rows if r.rank == 1), None)
    if best is not None and not brief:
        memory_of(best, result, console)
    for line in result.warnings:
        console.print(f"[bold red]warning[/bold red]: {escape(line)}", highlight=False)
    for line in result.notes:
        console.print(f"note: {line}", highlight=False, markup=False)


def probed_context(ctx: int, result: PlanResult) -> str:
    """What context the probe measured and what the plan extrapolates: a CPU affords short windows, not the served context."""
    window = result.model.sliding_window
    local = (f"; the sliding-window layers ({window} tokens) see as much in the probe as served" if window and window <= ctx
             else "")
    return (f"probed context: every measured KLD is over windows of {ctx:,} tokens; the plan is for {result.ctx:,}, which is "
            f"extrapolated: the cache's rounding error per token is what was measured, while attention over {result.ctx:,} tokens "
            f"can add to it{local}; 'wkvlab eval --ctx N' measures a longer window")


def tolerance_lines(result: PlanResult, console: Console) -> None:
    """Under ``--tolerance``: each tested row's decision (interval, family, the tokens that would decide it), and the priors."""
    tested = [r for r in result.rows if _tested(r)]
    if not tested:
        return
    console.print("against your tolerance (one-sided non-inferiority on the per-unit values of each measurement; "
                  "only a config shown within tolerance is recommended):", highlight=False, markup=False)
    priors = [r for r in tested if not r.quality.is_measured and not r.quality.exact]
    for row in tested:
        if row not in priors:
            console.print(f"  {row.weights} x {row.kv}: {row.verdict.reason}", highlight=False, markup=False, soft_wrap=True)
    if priors:
        console.print(f"  {len(priors)} row(s) on a prior only: undecided, unmeasured on this model — never recommended "
                      f"({', '.join(f'{r.weights} x {r.kv}' for r in priors)})", highlight=False, markup=False, soft_wrap=True)


def _tested(row: Combination) -> bool:
    """Whether the row was decided against a tolerance (within / exceeds / undecided)."""
    return row.verdict is not None and row.verdict.state in (WITHIN, EXCEEDS, UNDECIDED)


def measured_header(result: PlanResult) -> str:
    """What the measured rows are and where they rank, counted from the rows themselves."""
    rows = [r for r in result.rows if r.quality.is_measured]
    ranked = sum(r.rank is not None for r in rows)
    unsafe = sum(r.rank is None and bool(r.quality.unsafe) for r in rows)
    rest = len(rows) - ranked - unsafe
    text = (f"quality: {result.measured} measurement(s) apply to this model ({len(rows)} row(s) measured); "
            f"the {ranked} that fit and an engine runs rank first, "
            + ("those shown within your tolerance by memory" if any(r.verdict is not None and r.verdict.state == WITHIN for r in rows)
               else "by measured KLD"))
    if unsafe:
        text += f"; {unsafe} dropped as unsafe"
    if rest:
        text += f"; {rest} listed last (no engine runs them here, or they do not fit)"
    return text


def rows_table(result: PlanResult) -> Table:
    per = " /GPU" if result.layout.gpus > 1 else ""
    table = Table(title=f"weight x KV combinations (GB = 1e9 B; KV = batch x context incl. scales{'; per GPU: the tightest one' if per else ''})",
                  show_lines=False, pad_edge=False)
    for col, just in [("#", "right"), ("weights", "left"), ("KV", "left"), ("engine", "left"),
                      (f"weights GB{per}", "right"), (f"KV GB{per}", "right"), (f"total GB{per}", "right"),
                      ("fits", "center"), ("max batch", "right"),
                      ("decode tok/s*", "right"), ("bound", "left"), ("KLD", "right"), ("quality", "left")]:
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in result.rows:
        kv_bytes = row.fit.kv_needed_bytes
        total = row.gpu_weights_bytes + kv_bytes
        fits = "yes" if row.fits else ("no engine" if row.engine == "none" else "no")
        speed = f"{row.throughput.decode.tokens_per_s:,.0f}" if row.fits else "—"
        table.add_row(str(row.rank or "—"), row.weights, row.kv, row.engine, _gb(row.gpu_weights_bytes), _gb(kv_bytes), _gb(total),
                      fits, str(row.fit.max_batch), speed,
                      row.throughput.decode.bound if row.fits else "—", f"{row.quality.kld:.4f}", row.quality.shown)
    return table


def print_command(cmd: LaunchCommand, console: Console, *, why_not_ready: bool = False) -> None:
    for step in cmd.prepare:
        console.print(step, soft_wrap=True, highlight=False, markup=False)
    console.print(cmd.text(), soft_wrap=True, highlight=False, markup=False)
    state = "" if cmd.ready else "  [needs --model-id" + ("]" if why_not_ready else ": see below]")
    exact = "" if cmd.exact else "  [approximates a per-layer plan]"
    console.print(f"  (flags checked against {cmd.version}: {cmd.checked}){state}{exact}", highlight=False, markup=False, soft_wrap=True)
    if why_not_ready and not cmd.ready:
        for note in (n for n in cmd.notes if "--model-id" in n):
            console.print(f"  - {note}", highlight=False, markup=False, soft_wrap=True)


def memory_of(best: Combination, result: PlanResult, console: Console) -> None:
    ev = best.evaluation(best.engine)
    console.print(f"\n[bold]Memory of #1[/bold] ({escape(best.weights)} x {escape(best.kv)}, {best.engine} rule, "
                  f"{escape(ev.parallel.label if ev else '1 GPU')}):", highlight=False)
    console.print(f"  checkpoint: {best.weight_bytes.total_bytes:,} B = {best.weight_bytes.gb:.2f} GB; KV of the spec (as wkvlab "
                  f"simulates and measures it): {best.kv_bytes.total_bytes:,} B per token", highlight=False, markup=False)
    if "(the file as it is)" in best.weights and result.source.gguf_parts:
        parts = dict(result.source.gguf_parts)
        console.print(f"  the file's tensors as llama.cpp loads them (GGUF header): linear layers {parts['linear']:,} B, token embedding "
                      f"{parts['embedding']:,} B (in the file's own types), output matrix "
                      + (f"{parts['output']:,} B" if parts["output"] else "tied to the embedding (read from it, no bytes of its own)")
                      + f", norms and biases {parts['norm']:,} B (f32)", highlight=False, markup=False)
    elif best.engine in ("vllm", "sglang", "trtllm"):
        console.print(f"  {best.engine} keeps the token embedding and the output matrix (lm_head) in 16 bits unless the config "
                      "quantizes them; they are counted in the weights above", highlight=False, markup=False)
    storage = ev.support.kv.storage if ev and ev.support.kv else ""
    engine_total = ev.kv_per_token_bytes if ev else 0
    if ev and engine_total != best.kv_bytes.total_bytes:
        console.print(f"  {best.engine} allocates {engine_total:,} B per token (summed over its GPUs) for it: its own storage "
                      f"{storage or 'format'} (scale sizes and layout as the engine keeps them"
                      + (", KV heads replicated across tensor-parallel ranks" if ev.parallel.tp > result.model.num_kv_heads else "")
                      + ") — the memory below uses the engine's bytes", highlight=False, markup=False)
    for gpu in (ev.gpus if ev else ()):
        b = gpu.budget
        head = f"  {gpu.name}" + (f" (x{gpu.count})" if gpu.count > 1 else "") + ":"
        console.print(head, highlight=False, markup=False)
        for label, n in [("weights", gpu.weights_bytes), ("KV cache", gpu.fit.kv_needed_bytes), ("KV pool", b.kv_pool_bytes),
                         ("reserve (activations, graphs, runtime, communication; estimate)", b.reserve_bytes),
                         ("engine budget", b.usable_bytes)]:
            console.print(f"    {label}: {n:,} B = {n / 1e9:.2f} GB = {n / 2**30:.2f} GiB", highlight=False, markup=False)
        console.print(f"    KV per token on this GPU: {gpu.kv_bytes_per_token:,} B; up to {gpu.fit.max_batch} sequences", highlight=False, markup=False)
    if best.budget.rule:
        console.print(f"  rule: {best.budget.rule}", highlight=False, markup=False, soft_wrap=True)
    t = best.throughput
    crit = (f"turns compute-bound at batch {t.critical_batch}" if t.critical_batch is not None
            else "stays memory-bound at every batch up to 8192 (KV reads dominate)")
    comm = f"; all-reduce {t.decode.comm_time_s * 1e3:.2f} ms per step" if t.decode.comm_time_s else ""
    console.print(f"  speed (roofline estimate, not measured): GEMMs on {t.gemm}; decode {crit}{comm}; prefill of one {result.ctx}-token prompt ~{t.prefill.tokens_per_s:,.0f} tok/s",
                  highlight=False, markup=False, soft_wrap=True)


def render_counts(results: list[PlanResult], console: Console) -> None:
    """Several GPU counts side by side: each engine's recommendation per count, then their launch lines."""
    first = results[0]
    console.print(f"[bold]wkvlab plan[/bold]  {escape(first.model.name)} on {', '.join(str(r.layout.gpus) for r in results)} x "
                  f"{escape(first.gpu.name)}  batch {first.batch} x context {first.ctx}", highlight=False)
    table = Table(title="recommendation per engine and GPU count (per-GPU bytes on the tightest GPU)", pad_edge=False)
    for col, just in [("GPUs", "right"), ("engine", "left"), ("split", "left"), ("weights", "left"), ("KV", "left"),
                      ("weights GB/GPU", "right"), ("KV GB/GPU", "right"), ("KV pool GB/GPU", "right"), ("max batch", "right"),
                      ("decode tok/s*", "right"), ("KLD", "right"), ("quality", "left")]:
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for result in results:
        if not result.recommendations:
            words = "no engine runs it" if not any(r.engine != "none" for r in result.rows) else (
                "nothing fits" if not any(r.fits for r in result.rows) else "none recommendable")
            table.add_row(str(result.layout.gpus), "—", "—", words, "", "", "", "", "", "", "", "")
        for rec in result.recommendations:
            row = next(r for r in result.rows if r.weights == rec.weights and r.kv == rec.kv)
            ev = row.evaluation(rec.engine)
            gpu = min(ev.gpus, key=lambda x: x.fit.max_batch)
            table.add_row(str(result.layout.gpus), rec.engine, ev.parallel.how, rec.weights, rec.kv, _gb(gpu.weights_bytes),
                          _gb(gpu.fit.kv_needed_bytes), _gb(gpu.budget.kv_pool_bytes), str(ev.fit.max_batch),
                          f"{row.throughput.decode.tokens_per_s:,.0f}", f"{row.quality.kld:.4f}",
                          row.verdict.state if _tested(row) else row.quality.source.split(" ")[0])
    console.print(table)
    console.print("* roofline estimate; not a measurement", highlight=False)
    for result in results:
        console.print(f"\n[bold]{result.layout.gpus} x {escape(result.gpu.name)}[/bold]", highlight=False)
        tolerance_lines(result, console)
        for rec in result.recommendations:
            console.print(f"{rec.engine}: {escape(rec.weights)} x {escape(rec.kv)}", highlight=False)
            print_command(rec.command, console, why_not_ready=True)
        for line in result.warnings:
            console.print(f"[bold red]warning[/bold red]: {escape(line)}", highlight=False)
