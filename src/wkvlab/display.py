"""Rich tables, progress and status lines for the CLI; no computation happens here.

Progress goes to stderr. On a terminal it is a rich bar; anywhere else (a log file, a pipe, CI,
``nohup``) a bar would print only its last state, so progress becomes plain timestamped lines, one
every ``WKVLAB_PROGRESS_SECONDS`` (default 10 s), each with the elapsed time and an ETA.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from wkvlab.units import mib

if TYPE_CHECKING:
    from wkvlab.eval.depth import DepthTable
    from wkvlab.eval.result import EvalResult
    from wkvlab.threads import ThreadChoice

# When output goes to a file or pipe rich assumes 80 columns and wraps every cell; the results
# table needs about 110, so give non-terminals room instead of mangling the numbers.
console = Console(width=None if Console().is_terminal else 140)
err_console = Console(stderr=True, width=None if Console(stderr=True).is_terminal else 140)

PROGRESS_ENV = "WKVLAB_PROGRESS_SECONDS"
Advance = Callable[[str, float], None]  # (description of the step just done, steps advanced; fractions allowed)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get(PROGRESS_ENV, "10")))
    except ValueError:
        return 10.0


class PlainProgress:
    """Timestamped progress lines for non-terminals, at most one per ``interval`` seconds.

    The ETA is the average time per step so far times the steps left: steps are chosen to cost
    about the same (a window, a layer of a calibrated method), and the average over the whole run
    does not swing with one slow step the way a short moving window does.
    """

    def __init__(self, total: float, title: str, write: Callable[[str], None], interval: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.title, self.write, self.interval, self.clock = max(total, 1e-9), title, write, interval, clock
        self.done = 0.0
        self.start = clock()
        self.last_line: float | None = None

    def line(self, description: str) -> str:
        elapsed = self.clock() - self.start
        eta = "-" if self.done <= 0 else _clock(elapsed / self.done * max(self.total - self.done, 0.0))
        stamp = datetime.now().strftime("%H:%M:%S")
        return (f"{stamp} {self.title} {self.done:.4g}/{self.total:.4g} ({100 * self.done / self.total:.0f}%) "
                f"elapsed {_clock(elapsed)} eta {eta}" + (f" · {description}" if description else ""))

    def advance(self, description: str, steps: float) -> None:
        self.done = min(self.total, self.done + steps)
        now = self.clock()
        if self.last_line is None or now - self.last_line >= self.interval or self.done >= self.total:
            self.last_line = now
            self.write(self.line(description))

    def finish(self) -> None:
        if self.done < self.total:  # an upper-bound step count finished early: say so once
            self.done = self.total
            self.write(self.line("done"))


def _plain_write(text: str) -> None:
    err_console.print(escape(text), highlight=False, soft_wrap=True)


@contextmanager
def progress_bar(total: float, title: str) -> Iterator[Advance]:
    """Progress with ETA on stderr (a bar on a terminal, timestamped lines elsewhere); yields the
    callback the runner expects."""
    if not err_console.is_terminal:
        plain = PlainProgress(total, title, _plain_write, _interval())
        plain.write(f"{datetime.now():%H:%M:%S} {title}: {total:.4g} steps")
        yield plain.advance
        plain.finish()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=False) as bar:
        task = bar.add_task(title, total=total)

        def advance(description: str, steps: float) -> None:
            bar.update(task, advance=steps, description=f"{title}: {escape(description)}")

        yield advance
        bar.update(task, completed=total, description=title)


@contextmanager
def status(message: str) -> Iterator[None]:
    """A spinner on a terminal; elsewhere one timestamped line before and one with the time taken."""
    if err_console.is_terminal:
        with err_console.status(message):
            yield
        return
    start = time.monotonic()
    _plain_write(f"{datetime.now():%H:%M:%S} {message} ...")
    yield
    _plain_write(f"{datetime.now():%H:%M:%S} {message}: done in {_clock(time.monotonic() - start)}")


def run_header(command: str, threads: ThreadChoice, facts: str = "") -> None:
    """The first line of every computing command: what runs, and on how many threads."""
    err_console.print(escape(f"wkvlab {command}: {facts}{'; ' if facts else ''}{threads.describe()}"), highlight=False, soft_wrap=True)


def results_table(results: list[EvalResult], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("weights", "KV", "PPL", "ΔPPL", "KLD mean ± se", "KLD p99", "top-1", "Δp rms", "weights MiB", "KV B/token"):
        table.add_column(name, justify="left" if name in ("weights", "KV") else "right", no_wrap=True)
    for r in results:
        kld = r.kld
        table.add_row(
            r.weights, r.kv, f"{r.ppl:.3f}", f"{r.ppl - r.ppl_ref:+.3f}", f"{kld['mean']:.5f} ± {kld['se']:.5f}",
            f"{kld['p99']:.4f}", f"{100 * r.top1_agreement:.2f}%", f"{r.delta_p['rms']:.4f}",
            mib(r.weight_bytes), f"{r.kv_bytes_per_token:,.0f}",
        )
    return table


def describe_run(results: list[EvalResult]) -> str:
    first = results[0]
    run = first.run or {}
    where = f"{run.get('dtype', 'float32')} on {run.get('device', 'cpu')}"
    chunk = f", chunks of {run['chunk']}" if run.get("chunk") and run["chunk"] < first.ctx else ""
    baseline = first.fidelity.get("baseline", {}).get("label") or f"the reference ({where}, unquantized weights and cache)"
    return (
        f"{first.model} on {first.data}: {first.tokens} scored tokens, ctx {first.ctx}{chunk}, "
        f"reference PPL {first.ppl_ref:.4f}; KLD against {baseline}"
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
        (f"KLD against the stored reference {ref['path']}{' (written by this run)' if ref.get('created') else ''}: " if ref.get("path")
         else "KLD against the reference recorded per token in memory (the one-model plan: one model in memory, docs/scale.md): ")
        + f"the top-{ref['k']} head exact, the tail estimated from {ref['samples']} sampled tokens per position (unbiased); "
        f"NLL, PPL, top-1 and Δp exact. Per config: the mean's sampling standard error, the top-k lower bound, and exact − estimate "
        f"on the {ref['error']['tokens']} tokens whose full reference the record keeps — {per_config}"
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
