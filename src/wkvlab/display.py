"""Rich tables, progress and status lines for the CLI; no computation happens here.

Progress goes to stderr. On a terminal it is a rich bar; anywhere else (a log file, a pipe, CI,
``nohup``) a bar would print only its last state, so progress becomes plain timestamped lines, one
every ``WKVLAB_PROGRESS_SECONDS`` (default 10 s), each with the elapsed time and an ETA — inside a
long step too (:mod:`wkvlab.heartbeat`).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Iterator

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table

from wkvlab.costs import relative_costs
from wkvlab.heartbeat import POLL, Heartbeat
from wkvlab.units import mib

if TYPE_CHECKING:
    from wkvlab.eval.depth import DepthTable
    from wkvlab.eval.result import EvalResult
    from wkvlab.threads import ThreadChoice

LOG_WIDTH = 140  # text lines in a log or pipe when $COLUMNS does not say (tables take the width they need)


LOG_PROSE_WIDTH = 300  # a log's widest table line before text columns fold; wider ones come only from prose
LOG_PROSE_COLUMN = 100  # ...and the width they fold at


class TableConsole(Console):
    """A console whose tables never lose a digit.

    In a log or pipe (not a terminal) a table is printed at its natural width: rich otherwise cuts it
    to the console's fixed width (``PPL 12.9…``), and nobody reads a log through a window that needs
    it narrower. Only a table wider than :data:`LOG_PROSE_WIDTH` (columns of prose) has its text
    columns folded at :data:`LOG_PROSE_COLUMN` characters: nothing is cut, numbers stay whole. On a terminal narrower than a table, its columns wrap (long cells
    fold onto more lines: names first, numbers only if that is not enough) instead of being cut
    with "…" or dropped."""

    def print(self, *objects, **kwargs) -> None:  # noqa: A003  (rich's name)
        tables = [o for o in objects if isinstance(o, Table)]
        natural = max((self.measure(t, options=self.options.update_width(1 << 16)).maximum for t in tables), default=0)
        if natural <= self.width:
            super().print(*objects, **kwargs)
        elif self.is_terminal:
            for table in tables:
                _fit_columns(table, self.width, lambda r: self.measure(r).maximum)
            super().print(*objects, **kwargs)
        else:  # print's own width= is capped at the console's, so widen the console for this call
            if natural > max(self.width, LOG_PROSE_WIDTH):  # a prose column (a preset's source, 1,500 characters) would pad every row
                for table in tables:
                    for column in table.columns:
                        if column.justify != "right":  # text folds onto more lines; numbers stay whole
                            column.no_wrap, column.overflow, column.max_width = False, "fold", LOG_PROSE_COLUMN
                natural = max(self.measure(t, options=self.options.update_width(1 << 16)).maximum for t in tables)
            saved, self.width = self.width, natural
            try:
                super().print(*objects, **kwargs)
            finally:
                self.width = saved


def _fit_columns(table: Table, width: int, measure: Callable[[object], int]) -> None:
    """Make ``table`` fit ``width`` columns by wrapping, never by cutting: lighter rules (one space
    between columns), headers wrap at their spaces, numbers stay whole while the names still get
    4 characters a column, names fold into the rest; when even that does not fit, every column
    folds into an equal share. rich, left alone, shrinks every column alike and cuts with "…" or
    drops one, since a name's longest "word" (awq-int4-g128+skip=0,1) is its minimum width."""
    table.box, table.padding, table.show_edge = box.SIMPLE_HEAD, (0, 0), False
    columns = table.columns
    room = width - (len(columns) - 1)
    numbers = [c for c in columns if c.justify == "right"]
    names = [c for c in columns if c.justify != "right"]
    need = {id(c): max(measure(Group(*c._cells)) if c._cells else 0, *(len(w) for w in str(c.header).split()), 1) for c in numbers}
    spare = room - sum(need.values())
    whole = not names or spare >= 4 * len(names)
    for column in columns:
        column.no_wrap, column.overflow = False, "fold"
        if whole:
            column.min_width = column.max_width = need[id(column)] if column in numbers else max(1, spare // len(names))
        else:
            column.min_width, column.max_width = None, max(1, room // len(columns))


def _console(stderr: bool = False) -> TableConsole:
    """stdout's or stderr's console: the terminal's width, else $COLUMNS, else :data:`LOG_WIDTH` (rich's
    default for a pipe is 80 columns, and a fixed width used to ignore $COLUMNS)."""
    terminal = Console(stderr=stderr).is_terminal
    columns = os.environ.get("COLUMNS", "")
    return TableConsole(stderr=stderr, width=None if terminal else int(columns) if columns.isdigit() and int(columns) > 0 else LOG_WIDTH)


console = _console()
err_console = _console(stderr=True)

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


ESTIMATING = "estimating…"
TAIL = 1e-3  # a build step smaller than this, with no build in progress, is the end of the one just closed


class StepCosts:
    """The ETA of a run whose steps cost very different amounts: weight builds and calibrations
    (a GPTQ build of a 0.5B model: minutes) beside window passes (a 256-token pass: a second).

    ``builds`` names the run's build steps: weight label → its cost class (``cheap`` for a cast or
    round-to-nearest, ``calibrated`` for GPTQ/AWQ/SmoothQuant), and ``kv-calibration`` → how many KV
    calibrations run. Each class is timed on its own: the time between two progress calls is the
    cost of the step the second one reports. A build in progress (per-layer fractions) finishes at
    its own rate; a build not yet started costs what its class has cost so far (the one in progress
    counted at its projected total); the passes left cost what the passes so far cost. A class not
    yet timed (the first GPTQ build still ahead; the passes, while the copies plan builds every
    weight config first) adds nothing, and the ETA then reads ``5:12+``: a lower bound. With an empty
    ``builds`` (a command that cannot list its builds ahead: search's profile, findings' attention and
    depth) a build is still timed apart when it comes, at its own rate, and none is foreseen. With
    ``builds=None`` it is the old rule: the average time per step so far times the steps left.
    """

    def __init__(self, total: float, builds: dict[str, str] | list[tuple[str, str]] | None, clock: Callable[[], float],
                 kv_calibrations: int = 0, weights: dict[str, float] | None = None) -> None:
        self.total, self.clock = max(total, 1e-9), clock
        # each class's prior cost in window passes: the cost model sweep --dry-run prices with (wkvlab.costs)
        self.weights = weights or relative_costs()
        # one (label, class) pair per build the run reports (a sweep or explain builds a label once per grid); a dict: once each
        pairs = list(builds.items()) if isinstance(builds, dict) else builds
        self.classes = dict(pairs) if pairs is not None else None
        self.expected: dict[str, int] = {}
        for _, kind in pairs or ():
            self.expected[kind] = self.expected.get(kind, 0) + 1
        if kv_calibrations:
            self.expected["kv-calibration"] = kv_calibrations
        self.start = self.last = clock()
        self.done = 0.0
        self.pass_seconds = self.pass_steps = 0.0
        self.finished: dict[str, list[float]] = {}  # class -> seconds of each finished build
        self.current: list = [None, 0.0, 0.0]  # the build in progress: class, fraction done, seconds so far
        self.first: tuple[float, float] | None = None  # its first sub-step: (fraction, seconds) — setup included

    def kind(self, description: str) -> str:
        """The cost class of the step ``description`` reports (wkvlab.weights.apply, eval.runner word them)."""
        if self.classes is None:
            return "pass"
        if description.startswith("calibrated KV statistics"):
            return "kv-calibration"
        for prefix, end in (("quantizing ", ": "), ("quantized weights ", None)):
            if description.startswith(prefix):
                label = description[len(prefix):]
                label = label.split(end)[0] if end else label
                return self.classes.get(label, "calibrated")
        return "pass"

    def advance(self, description: str, steps: float) -> None:
        now, kind = self.clock(), self.kind(description)
        spent, self.last = now - self.last, now
        self.done = min(self.total, self.done + steps)
        if kind == "pass":
            self.pass_seconds += spent
            self.pass_steps += steps
            return
        if self.current[0] is None and steps < TAIL:
            # "quantized weights X" after its layers closed the build (within 1e-6): its step is the
            # remainder 1 − Σ fractions, float dust, not a new build — timed as one, its seconds over a
            # fraction of 3e-7 projected a build of years (an "eta 160042:59:59" under GPTQ in findings)
            if kind in self.finished and spent > 0:
                self.finished[kind][-1] += spent
            return
        if self.current[0] not in (None, kind):  # a build that never reported its end: count it as finished
            self._close()
        self.current = [kind, self.current[1] + steps, self.current[2] + spent]
        if self.first is None:
            self.first = (self.current[1], self.current[2])
        if self.current[1] >= 1 - 1e-6:
            self._close()

    def projected(self) -> float | None:
        """The build in progress' total seconds, or None while only its first sub-step is in.

        A build's first sub-step carries its setup (GPTQ's first layer also gathers the calibration
        inputs, AWQ's its activations): projected at its rate, a 9-minute GPTQ build read "51:51 left"
        (issue 42). So the rate is measured on the sub-steps after the first, which is counted as it took."""
        kind, fraction, seconds = self.current
        if kind is None or self.first is None or fraction <= self.first[0]:
            return None
        first_fraction, first_seconds = self.first
        return first_seconds + (seconds - first_seconds) / (fraction - first_fraction) * (1 - first_fraction)

    def _close(self) -> None:
        kind, fraction, seconds = self.current
        if fraction > 0:  # nothing of it reported: no build to time
            projected = self.projected() if fraction < 1 - 1e-6 else seconds
            if projected is not None:
                self.finished.setdefault(kind, []).append(projected)
        self.current, self.first = [None, 0.0, 0.0], None

    def remaining(self) -> tuple[float | None, bool]:
        """(seconds left, whether some steps left are not yet timed: then a lower bound); (None, True) before any step."""
        if self.done <= 0:
            return None, True
        if self.classes is None:
            return (self.clock() - self.start) / self.done * max(self.total - self.done, 0.0), False
        kind, fraction, spent = self.current
        projected = self.projected()
        left, untimed = 0.0, False
        for cls, count in self.expected.items():
            measured = list(self.finished.get(cls, []))
            running = cls == kind and fraction > 0
            if running:
                # its own rate once past its first sub-step; until then what its class has cost, if anything
                own = projected if projected is not None else (sum(measured) / len(measured) if measured else None)
                if own is None:
                    untimed = True
                else:
                    left += max(0.0, own - spent)
                    measured.append(own)
            future = count - len(self.finished.get(cls, [])) - running
            if future > 0:
                if measured:
                    left += future * sum(measured) / len(measured)
                else:
                    untimed = True
        if kind is not None and kind not in self.expected and fraction > 0:  # a build the caller did not list: its own rate
            if projected is None:
                untimed = True
            else:
                left += max(0.0, projected - spent)
        builds = sum(self.expected.values())
        passes_left = max(0.0, self.total - builds - self.pass_steps)
        if passes_left > 0:
            if self.pass_steps > 0:
                left += passes_left * self.pass_seconds / self.pass_steps
            else:
                untimed = True
        return left, untimed

    def untimed_seconds(self) -> float | None:
        """What the steps left that no measurement prices would cost, by the cost model's weights
        (:func:`wkvlab.costs.relative_costs`) at the seconds per unit the steps timed so far took; None
        before anything is timed. Not an estimate to print — it decides whether the timed part is a basis."""
        weights = self.weights
        calibrated = weights.get("calibrated", 1.0)
        kind, fraction, spent = self.current
        units = self.pass_steps + fraction * weights.get(kind, calibrated) if kind else self.pass_steps
        seconds = self.pass_seconds + (spent if kind else 0.0)
        for cls, done in self.finished.items():
            units += len(done) * weights.get(cls, calibrated)
            seconds += sum(done)
        if units <= 0 or seconds <= 0:
            return None
        untimed = 0.0
        for cls, count in self.expected.items():
            if self.finished.get(cls):
                continue
            running = cls == kind and fraction > 0
            if running and self.projected() is not None:
                continue
            untimed += ((1 - fraction) if running else 0.0) * weights.get(cls, calibrated)
            untimed += max(0, count - running) * weights.get(cls, calibrated)
        if kind is not None and kind not in self.expected and fraction > 0 and self.projected() is None:
            untimed += (1 - fraction) * weights.get(kind, calibrated)
        if self.pass_steps <= 0:
            untimed += max(0.0, self.total - sum(self.expected.values()) - self.pass_steps) * weights["pass"]
        return untimed * seconds / units

    def text(self) -> str:
        """``4:10``; ``5:12+`` (a lower bound: some steps left not yet timed, but the timed ones are most of the
        work ahead by the cost model's weights); ``estimating…`` until the timed steps are such a basis — a
        number then would be a guess (the demo's first line read ``0:01+``: a cast timed, 104 passes not)."""
        left, untimed = self.remaining()
        if left is None:
            return ESTIMATING
        if untimed and self.done < self.total:
            rest = self.untimed_seconds() if self.classes is not None else None
            if left < 1 or rest is None or rest > left:  # the steps not yet timed may well be most of what is left
                return ESTIMATING
            return _clock(left) + "+"
        return _clock(left)


def build_classes(weights, kv) -> tuple[dict[str, str], int]:
    """:class:`StepCosts`' ``builds`` and ``kv_calibrations`` for a weights × KV grid (one build per weight config)."""
    classes = {w.label: "calibrated" if w.needs_calibration else "cheap" for w in weights}
    return classes, len(weights) if any(k.needs_calibration for k in kv) else 0


def grids_classes(grids) -> tuple[list[tuple[str, str]], int]:
    """``builds`` and ``kv_calibrations`` for a run of several grids (each (weight specs, KV specs)), as every
    long-running command runs them (eval/demo one; sweep and findings one per task; explain one per analysis):
    each grid builds each of its weight configs once, and calibrates KV once per weight config when it needs to."""
    grids = [grids] if isinstance(grids, tuple) else list(grids)
    pairs, calibrations = [], 0
    for weights, kv in grids:
        classes, n = build_classes(weights, kv)
        pairs += list(classes.items())
        calibrations += n
    return pairs, calibrations


class PlainProgress:
    """Timestamped progress lines for non-terminals, at most one per ``interval`` seconds, each with
    the ETA of :class:`StepCosts` (``builds``: how many of the steps are weight builds)."""

    def __init__(self, total: float, title: str, write: Callable[[str], None], interval: float,
                 clock: Callable[[], float] = time.monotonic, builds: dict[str, str] | None = None, kv_calibrations: int = 0) -> None:
        self.total, self.title, self.write, self.interval, self.clock = max(total, 1e-9), title, write, interval, clock
        self.costs = StepCosts(total, builds, clock, kv_calibrations)
        self.start = self.costs.start
        self.last_line: float | None = None
        self.last_step, self.last_description = self.start, ""
        # inside a long step, a line at least every interval (wkvlab.heartbeat): due POLL early, as it is polled
        self.heartbeat = Heartbeat(self._still, max(interval - POLL, POLL) if interval else 0, clock)

    @property
    def done(self) -> float:
        return self.costs.done

    def line(self, description: str) -> str:
        elapsed = self.clock() - self.start
        stamp = datetime.now().strftime("%H:%M:%S")
        return (f"{stamp} {self.title} {self.done:.4g}/{self.total:.4g} ({100 * self.done / self.total:.0f}%) "
                f"elapsed {_clock(elapsed)} eta {self.costs.text()}" + (f" · {description}" if description else ""))

    def advance(self, description: str, steps: float) -> None:
        with self.heartbeat.lock:
            self.costs.advance(description, steps)
            now = self.clock()
            self.last_step, self.last_description = now, description
            if self.last_line is None or now - self.last_line >= self.interval or self.done >= self.total:
                self.last_line = now
                self.write(self.line(description))
                self.heartbeat.spoke()

    def _still(self, now: float) -> None:
        after = f" after {self.last_description}" if self.last_description else ""
        self.write(self.line(f"working, {_clock(now - self.last_step)} into this step{after}"))

    def finish(self) -> None:
        if self.done < self.total:  # an upper-bound step count finished early: say so once
            self.costs.done = self.total
            self.write(self.line("done"))


def _plain_write(text: str) -> None:
    err_console.print(escape(text), highlight=False, soft_wrap=True)


@contextmanager
def progress_bar(total: float, title: str, grid=None) -> Iterator[Advance]:
    """Progress with ETA on stderr (a bar on a terminal, timestamped lines elsewhere); yields the
    callback the runner expects. ``grid`` (weight specs, KV specs), or a list of them for a run of
    several grids: the ETA times the weight builds and calibrations apart from the window passes
    (:class:`StepCosts`, :func:`grids_classes`)."""
    if total <= 0:  # everything already measured (a resumed finding's finished grid): one line, not a 0/0 bar
        _plain_write(f"{datetime.now():%H:%M:%S} {title}: nothing left to run")
        yield lambda _description, _steps: None
        return
    # no grid: builds still timed apart from the passes as they come (one in progress at its own rate), none foreseen
    builds, kv_calibrations = grids_classes(grid) if grid is not None else ([], 0)
    if not err_console.is_terminal:
        plain = PlainProgress(total, title, _plain_write, _interval(), builds=builds, kv_calibrations=kv_calibrations)
        plain.write(f"{datetime.now():%H:%M:%S} {title}: {total:.4g} steps")
        with plain.heartbeat:
            yield plain.advance
        plain.finish()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta {task.fields[eta]}"))
    costs = StepCosts(total, builds, time.monotonic, kv_calibrations)
    with Progress(*columns, console=err_console, transient=False) as bar:
        task = bar.add_task(title, total=total, eta="-")

        def advance(description: str, steps: float) -> None:
            costs.advance(description, steps)
            bar.update(task, advance=steps, description=f"{title}: {escape(description)}", eta=costs.text())

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
    interval = _interval()
    say = lambda now: _plain_write(f"{datetime.now():%H:%M:%S} {message}: still working, {_clock(now - start)}")  # noqa: E731
    with Heartbeat(say, max(interval - POLL, POLL) if interval else 0):  # a conversion or hash of minutes is not silence
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
             f"{table.summary()}")
    out = Table(title=title, title_justify="left")
    for name in ("positions", "tokens", "penalty [95%]", "minus first bucket [95%]", "relative"):
        out.add_column(name, justify="left" if name == "positions" else "right", no_wrap=True)
    for row in table.rows:
        out.add_row(f"{row.start:,}–{row.end:,}", f"{row.tokens:,}", f"{row.penalty:.5f}",
                    "—" if row.growth is None else f"{row.growth:+.5f}",
                    "—" if row.relative_growth is None else f"{100 * row.relative_growth:+.1f}%")
    return out
