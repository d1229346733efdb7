"""The one decision rule: paired per-unit draws → interval, margin, verdict (and what would decide it).

Every effect the tool names (an interaction in explain and the findings, a difference in compare
and search, a penalty in the report) is decided the same way, by :func:`decide`:

* a **margin** m, stated with the effect it qualifies: by default 10% of the cache's own cost
  (``KLD(C)`` for an interaction; the baseline's KLD for a difference), changed with ``--margin``;
* the effect's studentized interval (:mod:`wkvlab.stats.bootstrap`), **family-adjusted**: the tests
  of one table (a grid's interactions, one explain run's three metrics) form a family, and Holm's
  step-down procedure (Holm 1979, *Scand. J. Statist.* 6:65–70) controls the chance of any wrong
  verdict in it at 5%. A test's adjusted interval is the same bootstrap at the level its Holm
  step allows, so a verdict read off the adjusted interval is exactly Holm's decision;
* the verdict from the adjusted interval and ±m:

  ========================= =========================================
  interval entirely above +m  *above* (an interaction: **compounds**)
  interval entirely below −m  *below* (**sub-additive**)
  interval inside [−m, +m]    *within* (**additive within ±m**)
  anything else               **undecided** — with the tokens and units
                              that would decide it at this estimate
  ========================= =========================================

No interval (fewer than :data:`~wkvlab.stats.bootstrap.MIN_UNITS` units, a statistic undefined on
most resamples) is *undecided*, never *additive*. A test's p-value is the smallest α at which its
interval would decide anything (the three outcomes exclude each other, and intervals shrink with
α, so that decision is unique); Holm orders the family by these p-values.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

from wkvlab.stats.bootstrap import MIN_UNITS, Interval, Resampled

DEFAULT_MARGIN = 0.10  # of the cache's own cost (or the baseline's), see the module docstring
LEVEL = 0.95
ADJUSTMENT = "Holm"
INTERACTION = ("compounds", "sub-additive", "additive within ±m")
DIFFERENCE = ("higher", "lower", "equivalent within ±m")
OUTCOMES = ("above", "below", "within", "undecided")


@dataclass(frozen=True)
class Margin:
    """The practical margin m: ``relative`` × |``reference``|, the value of the quantity ``of``."""

    value: float
    relative: float
    of: str
    reference: float

    @classmethod
    def relative_to(cls, reference: float, of: str, relative: float = DEFAULT_MARGIN) -> "Margin":
        if not relative >= 0:
            raise ValueError(f"a margin must be a non-negative fraction, got {relative}")
        return cls(relative * abs(reference) if math.isfinite(reference) else float("nan"), relative, of, float(reference))

    def __str__(self) -> str:
        return self.format()

    def format(self, spec: str = ".3g") -> str:
        """``±m (10% of KLD(C) 0.0446)``; a percent ``spec`` (top-1 shares) prints both numbers as percents."""
        spec = spec if spec.endswith("%") else ".3g"
        return f"±{self.value:{spec}} ({100 * self.relative:g}% of {self.of} {self.reference:{spec}})"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "Margin":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True, eq=False)
class Effect:
    """One effect to decide: its bootstrap draws, its margin, the tokens it rests on, its words."""

    name: str
    draws: Resampled
    margin: Margin
    tokens: int = 0
    words: tuple = INTERACTION  # what above / below / within are called for this effect


def classify(interval: Interval, margin: float) -> str:
    """above / below / within / undecided for an interval against ±``margin`` (no interval: undecided)."""
    if not interval.decided or not math.isfinite(margin):
        return "undecided"
    if interval.low > margin:
        return "above"
    if interval.high < -margin:
        return "below"
    if -margin <= interval.low and interval.high <= margin:
        return "within"
    return "undecided"


def p_value(draws: Resampled, margin: float) -> float:
    """Smallest two-sided α at which the interval decides anything against ±``margin`` (1: never)."""
    if not draws.usable or not math.isfinite(margin):
        return 1.0
    above = draws.tail_beyond(margin, "low")
    below = draws.tail_beyond(-margin, "high")
    if draws.se == 0.0:  # a point interval: inside ±m whenever it is not beyond
        return 0.0
    within = max(draws.tail_beyond(-margin, "low"), draws.tail_beyond(margin, "high"))
    return float(min(1.0, above, below, within))


def holm(p: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values: ``max over earlier steps of min(1, (k − i)·p_(i))`` in ascending order."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [1.0] * len(p), 0.0
    for step, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - step) * p[i]))
        out[i] = running
    return out


@dataclass(frozen=True)
class Verdict:
    """One effect's decision: raw and family-adjusted intervals, margin, outcome, what would decide it."""

    name: str
    outcome: str  # above / below / within / undecided
    word: str  # the outcome in the effect's words (compounds, sub-additive, additive within ±m, undecided)
    raw: Interval  # at the nominal level
    adjusted: Interval  # at the level Holm's step allows this test
    margin: Margin
    p: float
    p_adjusted: float
    family: str
    family_size: int
    tokens: int
    tokens_needed: int | None  # undecided: tokens at which an interval this wide would decide (None: none would)
    units_needed: int | None

    @property
    def decided(self) -> bool:
        return self.outcome != "undecided"

    @property
    def adjustment(self) -> str:
        return f"{ADJUSTMENT} over {self.family_size} test{'s' if self.family_size != 1 else ''}" + (f" ({self.family})" if self.family else "")

    def need(self) -> str:
        """What would decide an undecided verdict ("" when decided)."""
        if self.decided:
            return ""
        unit = self.raw.unit
        if self.raw.n_units < MIN_UNITS:
            return f"needs ≥ {MIN_UNITS} {unit} for an interval (has {self.raw.n_units}; ~{self.tokens_needed:,} tokens)" if self.tokens_needed \
                else f"needs ≥ {MIN_UNITS} {unit} for an interval (has {self.raw.n_units})"
        if self.tokens_needed is None:
            return "no sample size decides it at this estimate (it sits on the margin)" if self.adjusted.decided else "no interval"
        return f"~{self.tokens_needed:,} tokens ({self.units_needed:,} {unit}) would decide it at this estimate"

    @property
    def resampling(self) -> str:
        """``16 documents resampled, 0 of 2000 resamples dropped``: the unit and the drops, on every verdict."""
        drops = self.raw.drops
        return f"{self.raw.n_units} {self.raw.unit} resampled" + (f", {drops}" if drops else "")

    def describe(self, spec: str = ".4f") -> str:
        """``word: estimate [adjusted] (raw 95% [..]; margin ±m (…); Holm over k tests; n documents resampled,
        d of B resamples dropped)`` plus what would decide it."""
        raw = "no raw interval" if not self.raw.decided else f"raw {100 * self.raw.level:.0f}% [{self.raw.low:{spec}}, {self.raw.high:{spec}}]"
        need = self.need()
        adj = self.adjusted
        bounds = f"{adj.estimate:{spec}} [{adj.low:{spec}}, {adj.high:{spec}}]" if adj.decided else f"{adj:{spec}}"  # drops: below
        return (f"{self.word}: {bounds} adjusted ({raw}; margin {self.margin.format(spec)}; {self.adjustment}; "
                f"{self.resampling})" + (f"; {need}" if need else ""))

    def to_dict(self) -> dict:
        data = {k: getattr(self, k) for k in ("name", "outcome", "word", "p", "p_adjusted", "family", "family_size", "tokens",
                                                 "tokens_needed", "units_needed")}
        return {**data, "raw": self.raw.to_dict(), "adjusted": self.adjusted.to_dict(), "margin": self.margin.to_dict(),
                "adjustment": self.adjustment, "resampling": self.resampling, "text": self.describe()}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Verdict":
        plain = {k: data[k] for k in ("name", "outcome", "word", "p", "p_adjusted", "family", "family_size", "tokens",
                                        "tokens_needed", "units_needed")}
        return cls(**plain, raw=Interval.from_dict(data["raw"]), adjusted=Interval.from_dict(data["adjusted"]),
                   margin=Margin.from_dict(data["margin"]))


def _needed(interval: Interval, raw: Interval, margin: float, tokens: int) -> tuple[int | None, int | None]:
    """Tokens and units at which this interval (shrinking as 1/√n) would decide.

    A bootstrap interval is not symmetric, so the width that matters is the one on the side facing
    the threshold the interval must clear: with the estimate inside ±m both sides must come inside,
    beyond +m (−m) the lower (upper) side must clear it. Sizing by the mean half-width instead could
    name fewer tokens than the run already has. An undecided interval needs more than it has, so the
    answer is never below the tokens present."""
    if raw.n_units < MIN_UNITS:
        units = MIN_UNITS
        return (math.ceil(tokens * units / raw.n_units) if tokens and raw.n_units else None), units
    if not interval.decided or not math.isfinite(margin):
        return None, None
    est, below, above = interval.estimate, max(interval.estimate - interval.low, 0.0), max(interval.high - interval.estimate, 0.0)
    if abs(est) < margin:
        ratios = [above / (margin - est), below / (est + margin)]
    elif est > margin:
        ratios = [below / (est - margin)]
    elif est < -margin:
        ratios = [above / (-margin - est)]
    else:
        return None, None  # on the margin itself: no sample decides it
    scale = max(max(ratios) ** 2, 1.0)
    up = lambda n: max(math.ceil(n * scale - 1e-9), n + 1)  # 1e-9: 2.25 computed as 2.2500000000000004 is 2.25
    return (up(tokens) if tokens else None), up(raw.n_units)


def decide(tests: Sequence[Effect], *, level: float = LEVEL, family: str = "") -> list[Verdict]:
    """The verdicts of one family of tests (Holm-adjusted at ``level``), in the order given."""
    p = [p_value(t.draws, t.margin.value) for t in tests]
    adjusted_p = holm(p)
    alpha = 1.0 - level
    steps = {i: len(p) - rank for rank, i in enumerate(sorted(range(len(p)), key=lambda i: p[i]))}
    out = []
    for i, test in enumerate(tests):
        # the level at which this test's interval decides exactly when Holm's adjusted p ≤ α
        test_alpha = min(alpha / steps[i], alpha * p[i] / adjusted_p[i]) if p[i] > 0 else alpha / steps[i]
        raw, adj = test.draws.interval(level), test.draws.interval(1.0 - test_alpha)
        outcome = classify(adj, test.margin.value) if adjusted_p[i] <= alpha else "undecided"
        word = dict(zip(("above", "below", "within"), test.words)).get(outcome, "undecided")
        tokens_needed, units_needed = _needed(adj, raw, test.margin.value, test.tokens) if outcome == "undecided" else (None, None)
        out.append(Verdict(test.name, outcome, word.replace("±m", f"±{test.margin.value:.3g}"), raw, adj, test.margin, p[i],
                           adjusted_p[i], family, len(tests), test.tokens, tokens_needed, units_needed))
    return out
