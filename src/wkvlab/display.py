"""Rich tables and progress bars for the CLI; no computation happens here."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from wkvlab.eval.depth import DepthTable
from wkvlab.eval.result import EvalResult

# When output goes to a file or pipe rich assumes 80 columns and wraps every cell; the results
# table needs about 110, so give non-terminals room instead of mangling the numbers.
console = Console(width=None if Console().is_terminal else 140)
err_console = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 140)


@contextmanager
def progress_bar(total: int, title: str) -> Iterator:
    """A progress bar with ETA on stderr; yields the callback the runner expects."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=False) as bar:
        task = bar.add_task(title, total=total)

        def advance(description: str, steps: int) -> None:
            bar.update(task, advance=steps, description=f"{title}: {description}")

        yield advance
        bar.update(task, description=title)


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def results_table(results: list[EvalResult], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("weights", "KV", "PPL", "ΔPPL", "KLD mean ± se", "KLD p99", "top-1", "Δp rms", "weights MB", "KV B/token"):
        table.add_column(name, justify="left" if name in ("weights", "KV") else "right", no_wrap=True)
    for r in results:
        kld = r.kld
        table.add_row(
            r.weights, r.kv, f"{r.ppl:.3f}", f"{r.ppl - r.ppl_ref:+.3f}", f"{kld['mean']:.5f} ± {kld['se']:.5f}",
            f"{kld['p99']:.4f}", f"{100 * r.top1_agreement:.2f}%", f"{r.delta_p['rms']:.4f}",
            _mb(r.weight_bytes), f"{r.kv_bytes_per_token:,.0f}",
        )
    return table


def describe_run(results: list[EvalResult]) -> str:
    first = results[0]
    run = first.run or {}
    where = f"{run.get('dtype', 'float32')} on {run.get('device', 'cpu')}"
    chunk = f", chunks of {run['chunk']}" if run.get("chunk") and run["chunk"] < first.ctx else ""
    return (
        f"{first.model} on {first.data}: {first.tokens} scored tokens, ctx {first.ctx}{chunk}, "
        f"reference PPL {first.ppl_ref:.4f} ({where}, unquantized weights and cache)"
    )


def reference_notes(results: list[EvalResult]) -> list[str]:
    """What the KLD column is measured against, when it is not the exact in-memory reference."""
    stored = [r for r in results if (r.run or {}).get("reference", {}).get("kind") == "stored"]
    if not stored:
        return []
    ref = stored[0].run["reference"]
    per_config = ", ".join(f"{r.weights} × {r.kv}: ±{r.run['reference']['sampling_se']:.1e}, ≥ {r.run['reference']['kld_lower_bound_mean']:.5f}, "
                           f"{r.run['reference']['error']['mean']:+.1e}" for r in stored)
    return [
        f"KLD against the stored reference {ref['path']}{' (written by this run)' if ref.get('created') else ''}: "
        f"the top-{ref['k']} head exact, the tail estimated from {ref['samples']} sampled tokens per position (unbiased); "
        f"NLL, PPL, top-1 and Δp exact. Per config: the mean's sampling standard error, the top-k lower bound, and exact − estimate "
        f"on the {ref['error']['tokens']} tokens whose full reference the file keeps — {per_config}"
    ]


def depth_table(table: DepthTable) -> Table:
    """The seed's depth buckets for one cache config: its penalty and the growth from the first bucket."""
    title = (f"KV penalty by depth: {table.weights} × {table.kv} (minus {table.paired_with}); intervals: bootstrap over "
             f"{table.units} blocks of {table.block} positions (penalty autocorrelation < 0.05 after {table.lag}); "
             f"{table.verdict()}")
    out = Table(title=title, title_justify="left")
    for name in ("positions", "tokens", "penalty [95%]", "minus first bucket [95%]", "relative"):
        out.add_column(name, justify="left" if name == "positions" else "right", no_wrap=True)
    for row in table.rows:
        out.add_row(f"{row.start:,}–{row.end:,}", f"{row.tokens:,}", f"{row.penalty:.5f}",
                    "—" if row.growth is None else f"{row.growth:+.5f}",
                    "—" if row.relative_growth is None else f"{100 * row.relative_growth:+.1f}%")
    return out
