"""Rich tables and progress bars for the CLI; no computation happens here."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

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
    baseline = first.fidelity.get("baseline", {}).get("label") or "float32, unquantized weights and cache"
    return (
        f"{first.model} on {first.data}: {first.tokens} scored tokens, ctx {first.ctx}, "
        f"reference PPL {first.ppl_ref:.4f} (KLD against {baseline})"
    )
