"""The probe's time budget, kept as the user runs it: every second counts from the moment the probe starts.

A prior (FLOPs over a nominal CPU speed) guessed the probe's cost before this, and a loaded machine
made a 180 s budget 466-690 s of wall time, model load and GGUF conversion not counted. Here the
budget is spent on measured costs only:

* the model load (a GGUF's conversion included) is timed and counted;
* one window of the first group of configurations is timed (a pilot, whose numbers are thrown
  away: one window has no interval), giving seconds per token and pass *on this machine, under its
  present load*; a kind of run with costs of its own (llama.cpp's engine baseline, whose q8
  activation rounding made a group 1.8x slower per pass than plain ones) gets a pilot of its own;
* before each group the configurations that fit the time left are chosen with the latest measured
  rate (and, for weight formats, the measured cost of a build); those that do not fit are left
  unmeasured, named, and never recommended;
* after each group the rate is re-measured from its wall time, so a machine that gets busier
  shrinks what is planned next.

What remains unguarded is one group running slower than the rate measured just before it; a
:data:`MARGIN` on every estimate keeps the overrun within about 15% for a load that doubles
mid-group on a short budget. Torch-free: a fake clock drives it in tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MARGIN = 1.1  # estimates are inflated by this before they are compared with the time left


@dataclass
class BudgetClock:
    """Seconds spent and measured rates of one probe; ``clock`` is injected (time.monotonic, or a test's fake)."""

    budget_s: float
    clock: object
    began: float | None = None
    load_s: float = 0.0
    rates: dict[str, float] = field(default_factory=dict)  # seconds of one pass over one token, by kind of run, measured
    setups: dict[str, float] = field(default_factory=dict)  # seconds a run of that kind takes before its first step
    build_s: float | None = None  # seconds to build one quantized weight format, beyond its passes; None until timed
    planned_end: float | None = None  # elapsed seconds at which the work planned so far should end
    skipped: list[str] = field(default_factory=list)

    def start(self) -> None:
        if self.began is None:
            self.began = self.clock()

    @property
    def elapsed(self) -> float:
        return 0.0 if self.began is None else self.clock() - self.began

    @property
    def left(self) -> float:
        return self.budget_s - self.elapsed

    def estimate(self, tokens: int, configs: int, builds: int = 0, kind: str = "float") -> float | None:
        """Seconds of a group: a reference pass and one pass per configuration over ``tokens``, plus its weight builds."""
        rate = self.rates.get(kind)
        if rate is None:
            return None
        return MARGIN * (self.setups.get(kind, 0.0) + tokens * (1 + configs) * rate + builds * (self.build_s or 0.0))

    def affordable(self, tokens: int, configs: int, weights: bool, kind: str = "float") -> int:
        """How many of ``configs`` configurations (weight formats when ``weights``) fit the time left, at ``tokens``."""
        for n in range(configs, 0, -1):
            cost = self.estimate(tokens, n, n if weights else 0, kind)
            if cost is not None and cost <= self.left:
                return n
        return 0

    def ahead(self, tokens: int, groups: list[tuple[int, bool, str]]) -> float:
        """Seconds of the groups still queued ((configurations, weight formats?, kind) each), as far as the time left
        affords them; a kind not timed yet is guessed at the rate of plain passes (its own pilot will tell)."""
        left, total = self.left, 0.0
        for configs, weights, kind in groups:
            for n in range(configs, 0, -1):
                cost = self.estimate(tokens, n, n if weights else 0, kind if kind in self.rates else "float") or 0.0
                if cost <= left:
                    left, total = left - cost, total + cost
                    break
        return total

    def measured(self, seconds: float, tokens: int, configs: int, builds: int = 0, kind: str = "float",
                 setup: float | None = None) -> None:
        """A group of ``configs`` configurations over ``tokens`` took ``seconds``, ``setup`` of them before its first step
        (None: not seen): the rates its successors are planned with."""
        passes = tokens * (1 + configs)
        if builds and kind in self.rates:  # weight formats: what the passes do not explain is the builds'
            self.build_s = max(0.0, (seconds - passes * self.rates[kind]) / builds)
            return
        if setup is not None and not builds:  # a fixed cost per run (llama.cpp's baseline: ~10 s) does not scale with tokens
            self.setups[kind] = setup
            seconds -= setup
        self.rates[kind] = max(seconds, 0.0) / max(1, passes)

    def eta_text(self) -> str:
        """The time still to go: 'estimating…' until something has been timed."""
        if self.planned_end is None:
            return "estimating…"
        return _clock(max(0.0, self.planned_end - self.elapsed))

    def line(self, doing: str) -> str:
        return f"probe: {_clock(self.elapsed)} of the {self.budget_s:g} s budget used ({doing}); eta {self.eta_text()}"


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"
