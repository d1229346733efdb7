"""Text rendering of a :class:`PlanResult`: one table row per combination, then launch lines."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wkvlab.plan.planner import PlanResult


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f}"


def render(result: PlanResult, console: Console) -> None:
    m, g = result.model, result.gpu
    console.print(f"[bold]wkvlab plan[/bold]  {escape(m.name)} on one {escape(g.name)} ({escape(g.label)}, "
                  f"{g.memory_bytes:,} B = {g.memory_bytes / 1e9:.1f} GB = {g.memory_bytes / 2**30:.1f} GiB, "
                  f"{g.bandwidth_gb_s:.0f} GB/s, sm_{g.sm})  batch {result.batch} x ctx {result.ctx}"
                  + (f"  engine {result.engine}" if result.engine else ""))
    console.print(f"model: {m.num_layers} layers ({len(m.kv_layers)} with KV), hidden {m.hidden_size}, "
                  f"{m.num_heads} heads / {m.num_kv_heads} KV heads x {m.head_dim}, vocab {m.vocab_size}"
                  + (f", MoE {m.moe.num_experts}x top-{m.moe.experts_per_token}" if m.moe else "")
                  + (f", MLA latent {m.mla.cache_dim}" if m.mla else "")
                  + (f", sliding window {m.sliding_window}" if m.sliding_window else "")
                  + f"  (source: {m.source})", highlight=False, markup=False)
    table = Table(title="weight x KV combinations (GB = 1e9 B; KV = batch x ctx incl. scales)",
                  show_lines=False, pad_edge=False)
    for col, just in [("#", "right"), ("weights", "left"), ("KV", "left"), ("engine", "left"),
                      ("weights GB", "right"), ("KV GB", "right"), ("total GB", "right"),
                      ("total GiB", "right"), ("fits", "center"), ("max batch", "right"),
                      ("decode tok/s*", "right"), ("bound", "left"), ("KLD", "right"),
                      ("quality source", "left")]:
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for row in result.rows:
        kv_bytes = row.fit.kv_needed_bytes
        total = row.weight_bytes.total_bytes + kv_bytes
        fits = "yes" if row.fits else ("no engine" if row.engine == "none" else "no")
        speed = f"{row.throughput.decode.tokens_per_s:,.0f}" if row.fits else "—"
        table.add_row(str(row.rank or "—"), row.weights, row.kv, row.engine,
                      _gb(row.weight_bytes.total_bytes), _gb(kv_bytes), _gb(total),
                      f"{total / 2**30:.1f}", fits, str(row.fit.max_batch), speed,
                      row.throughput.decode.bound if row.fits else "—",
                      f"{row.quality.kld:.4f}", row.quality.source)
    console.print(table)
    console.print("* roofline estimate at the requested batch, every sequence at full context; "
                  "not a measurement", highlight=False)
    if result.recommendations:
        console.print("\n[bold]Recommended launch lines[/bold]")
    for rec in result.recommendations:
        console.print(f"\n[bold]{rec.engine}[/bold]: {escape(rec.weights)} weights x {escape(rec.kv)} KV",
                      highlight=False)
        console.print(rec.command.text(), soft_wrap=True, highlight=False, markup=False)
        for line in rec.why + rec.command.notes:
            console.print(f"  - {line}", highlight=False, markup=False)
    best = next((r for r in result.rows if r.rank == 1), None)
    if best is not None:
        b = best.budget
        console.print(f"\n[bold]Memory of #1[/bold] ({escape(best.weights)} x {escape(best.kv)}, {best.engine} rule):",
                      highlight=False)
        for label, n in [("weights", best.weight_bytes.total_bytes),
                         ("KV cache", best.fit.kv_needed_bytes), ("KV pool", b.kv_pool_bytes),
                         ("reserve (activations, graphs, runtime; estimate)", b.reserve_bytes),
                         ("engine budget", b.usable_bytes)]:
            console.print(f"  {label}: {n:,} B = {n / 1e9:.2f} GB = {n / 2**30:.2f} GiB",
                          highlight=False, markup=False)
        console.print(f"  rule: {b.rule}", highlight=False, markup=False, soft_wrap=True)
        t = best.throughput
        crit = t.critical_batch if t.critical_batch is not None else "none up to 8192 (KV reads dominate)"
        console.print(f"  speed (roofline estimate, not measured): GEMMs on {t.gemm}; decode turns compute-bound at batch "
                      f"{crit}; prefill of one {result.ctx}-token prompt ~{t.prefill.tokens_per_s:,.0f} tok/s",
                      highlight=False, markup=False, soft_wrap=True)
    for line in result.warnings:
        console.print(f"[bold red]warning[/bold red]: {escape(line)}", highlight=False)
    for line in result.notes:
        console.print(f"note: {line}", highlight=False, markup=False)
