"""The one decision rule: paired per-unit draws → interval, margin, verdict (and what would decide it).

Every effect the tool names (an interaction in explain and the findings, a difference in compare
and search, a penalty in the report) is decided the same way, by :func:`decide`:

* a **margin** m, stated with the effect it qualifies (:class:`MarginRule`, ``--margin``): by default
  10% of the **predicted total** for an interaction (``KLD(W) + KLD(C)``: what the two errors cost if
  they add, so ±m is a share of what a practitioner pays) and 10% of the baseline's own value for a
  difference; ``--margin 0.002`` states an absolute margin in the metric's units (nats for KLD);
  ``--margin cache:10%`` is the rule before issue #38, 10% of the cache's own cost ``KLD(C)`` (a
  bar that shrinks with the cache's cost: for a cheap cache it calls a +1% change of the total
  "compounds");
* the effect's interval (:mod:`wkvlab.stats.skewt`: Student t with a skewness allowance, analytic,
  no seed and no Monte-Carlo error), **family-adjusted**: the tests
  of one table (a grid's interactions, one explain run's three metrics) form a family, and Holm's
  step-down procedure (Holm 1979, *Scand. J. Statist.* 6:65–70) controls the chance of any wrong
  verdict in it at 5%. A test's adjusted interval is the same interval at the level its Holm
  step allows, so a verdict read off the adjusted interval is exactly Holm's decision;
* the verdict from the adjusted interval and ±m:

  ========================= =========================================
  interval entirely above +m  *above* (an interaction: **compounds**)
  interval entirely below −m  *below* (**sub-additive**)
  interval inside [−m, +m]    *within* (**additive within ±m**)
  anything else               **undecided** — with the tokens and units
                              that would decide it with 80% power if the
                              effect is what was estimated
  ========================= =========================================

No interval (fewer than :data:`~wkvlab.stats.bootstrap.MIN_UNITS` units, a statistic undefined with
a unit left out) is *undecided*, never *additive*. A test's p-value is the smallest α at which its
interval would decide anything (the three outcomes exclude each other, and intervals shrink with
α, so that decision is unique); Holm orders the family by these p-values.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

from statistics import NormalDist

from wkvlab.errors import ConfigError
from wkvlab.stats import skewt
from wkvlab.stats.bootstrap import MIN_UNITS, Interval, Resampled
from wkvlab.stats.replicates import Components

DEFAULT_MARGIN = 0.10  # of the predicted total (interactions) or the baseline (differences), see the module docstring
POWER = 0.80  # the chance the suggested sample size decides, if the effect is what was estimated
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

    @classmethod
    def absolute(cls, value: float, unit: str = "", source: str = "--margin") -> "Margin":
        """A margin stated in the metric's units: by the user (``--margin 0.002``) or by ``source`` (a recorded band)."""
        return cls(float(value), float("nan"), f"stated by {source}{' in ' + unit if unit else ''}", float("nan"))

    @property
    def stated(self) -> bool:
        return self.relative != self.relative  # NaN: absolute

    def format(self, spec: str = ".3g") -> str:
        """``±m (10% of KLD(C) 0.0446)``; a percent ``spec`` (top-1 shares) prints both numbers as percents."""
        spec = spec if spec.endswith("%") else ".3g"
        if self.stated:
            return f"±{self.value:{spec}} ({self.of})"
        return f"±{self.value:{spec}} ({100 * self.relative:g}% of {self.of} {self.reference:{spec}})"


    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "Margin":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class MarginRule:
    """How m is set, as ``--margin`` states it: ``10%`` (of the predicted total for an interaction, of the
    baseline for a difference; the default), ``cache:10%`` (an interaction's m as 10% of the cache's own
    cost KLD(C), the rule before issue #38), or a plain number ``0.002`` (absolute, in the metric's units).

    A bare float passed from Python (``margin=0.1``) is a fraction, as it always was."""

    kind: str = "total"  # total / cache / absolute
    value: float = DEFAULT_MARGIN
    source: str = "--margin"  # who states an absolute margin (a recorded band names its file)

    KINDS = ("total", "cache", "absolute")

    @classmethod
    def parse(cls, text: "str | float | MarginRule") -> "MarginRule":
        if isinstance(text, MarginRule):
            return text
        if isinstance(text, (int, float)):
            return cls("total", float(text))
        raw = str(text).strip()
        kind, body = ("cache", raw[len("cache:"):]) if raw.startswith("cache:") else ("total", raw)
        try:
            if body.endswith("%"):
                value = float(body[:-1]) / 100
            elif kind == "cache":
                raise ValueError
            else:
                kind, value = "absolute", float(body)
        except ValueError:
            raise ConfigError(f"--margin {raw!r}: use a percent of the predicted total (10%), an absolute margin in the "
                              "metric's units (0.002), or cache:10% (a percent of the cache's own cost)") from None
        if not value >= 0 or value != value or value == float("inf"):
            raise ConfigError(f"--margin {raw!r} must be a finite number ≥ 0")
        return cls(kind, value)

    def __str__(self) -> str:
        return {"total": f"{100 * self.value:g}%", "cache": f"cache:{100 * self.value:g}%"}.get(self.kind, f"{self.value:g}")

    def interaction(self, w: float, c: float, label: str = "KLD") -> Margin:
        """m for an interaction whose single effects are ``w`` and ``c`` (``label``: the metric's name)."""
        if self.kind == "absolute":
            return Margin.absolute(self.value, label, self.source)
        if self.kind == "cache":
            return Margin.relative_to(c, f"{label}(C)", self.value)
        return Margin.relative_to(w + c, f"the predicted total {label}(W)+{label}(C)", self.value)

    def difference(self, reference: float, of: str, unit: str = "") -> Margin:
        """m for a difference against a baseline whose own value is ``reference``."""
        if self.kind == "absolute":
            return Margin.absolute(self.value, unit, self.source)
        return Margin.relative_to(reference, of, self.value)

    # The two ways an effect is built for :func:`decide`. A relative margin is a share of a quantity estimated
    # on the same units as the effect, so each takes that quantity's draws, not its value: the margin's own
    # uncertainty then goes into the verdict (:func:`sides`). Every command builds its effects here, so no
    # caller can treat an estimated margin as a known constant (tests/stats/test_one_rule.py checks that).

    def interaction_effect(self, name: str, draws: Resampled, w: Resampled, c: Resampled, tokens: int = 0, *,
                           label: str = "KLD", total: Resampled | None = None, words: tuple = INTERACTION,
                           measured: Margin | None = None) -> Effect:
        """The interaction ``draws`` against m from the single effects ``w`` and ``c`` (draws from the same units);
        ``total``: draws of w + c when the caller has them (else combined here).

        ``measured``: m as a larger measurement of the same run already set it (explain's cross-term step takes
        the factorial's, so one run states one KLD(W)+KLD(C)): its units are other windows, so its draws cannot be
        paired with these; its own uncertainty is stated with the measurement that set it, and it enters this
        test as known — a few diagnosis windows' own estimate of the total would be the noisier margin."""
        if measured is not None:
            return Effect(name, draws, measured, tokens, words)
        reference = {"total": total if total is not None else w.combine(c, 1.0), "cache": c}.get(self.kind)
        return Effect(name, draws, self.interaction(w.estimate, c.estimate, label), tokens, words, margin_draws=reference)

    def difference_effect(self, name: str, draws: Resampled, baseline: "Resampled | float", of: str, tokens: int = 0, *,
                          unit: str = "", words: tuple = DIFFERENCE) -> Effect:
        """The difference ``draws`` against m as a share of ``baseline``: its draws from the same units, or a float
        only for a constant known exactly (a share's whole, 1)."""
        estimated = isinstance(baseline, Resampled)
        value = baseline.estimate if estimated else float(baseline)
        return Effect(name, draws, self.difference(value, of, unit), tokens, words, margin_draws=baseline if estimated else None)


@dataclass(frozen=True, eq=False)
class Effect:
    """One effect to decide: its draws (estimate, SE, replicates), its margin, the tokens it rests on, its words."""

    name: str
    draws: Resampled
    margin: Margin
    tokens: int = 0
    words: tuple = INTERACTION  # what above / below / within are called for this effect
    # draws of the quantity a relative margin is a share of (the predicted total, the baseline), from the same
    # units: the margin is then estimated too, and its uncertainty goes into the test (see sides())
    margin_draws: Resampled | None = None


def sides(test: Effect) -> tuple[Resampled, Resampled]:
    """Draws of θ − m and θ + m, the two quantities every outcome is read from.

    *above* ⟺ θ − m > 0, *below* ⟺ θ + m < 0, *within* ⟺ both θ + m > 0 and θ − m < 0. When the margin
    is a share of a quantity estimated on the same units (``margin_draws``), m is itself an estimate:
    θ ∓ f·R is then one statistic whose interval carries both uncertainties (their per-unit influence
    values add). Treating m as known would call "compounds" whenever the estimate of R happens to fall
    low — in the simulated grid that alone made 12–19% of families wrong at the margin."""
    d, m = test.draws, test.margin
    md = test.margin_draws
    if md is not None and not m.stated and math.isfinite(m.relative):
        f = m.relative * (1.0 if md.estimate >= 0 else -1.0)
        minus, plus = d.combine(md, -f), d.combine(md, f)
        if minus is not None and plus is not None:
            return minus, plus
    return d.shifted(-m.value), d.shifted(m.value)


def _outcome_at(minus: Resampled, plus: Resampled, level: float) -> str:
    low_minus, high_minus = minus.interval(level), plus.interval(level)  # θ − m, θ + m
    if not (low_minus.decided and high_minus.decided):
        return "undecided"
    if low_minus.low > 0:
        return "above"
    if high_minus.high < 0:
        return "below"
    if high_minus.low >= 0 and low_minus.high <= 0:
        return "within"
    return "undecided"


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


def p_value(draws: Resampled, margin: float, minus: Resampled | None = None, plus: Resampled | None = None) -> float:
    """Smallest two-sided α at which the test decides anything against ±``margin`` (1: never).

    ``minus``/``plus``: the draws of θ − m and θ + m (:func:`sides`); by default θ shifted by a known m."""
    if not draws.usable or not math.isfinite(margin):
        return 1.0
    if minus is None or plus is None:
        minus, plus = draws.shifted(-margin), draws.shifted(margin)
    above = minus.tail_beyond(0.0, "low")
    below = plus.tail_beyond(0.0, "high")
    if draws.se == 0.0 and abs(draws.estimate) <= margin:  # a point interval inside ±m
        return 0.0
    within = max(plus.tail_beyond(0.0, "low"), minus.tail_beyond(0.0, "high"))
    return float(min(1.0, above, below, within))


def holm_levels(p: Sequence[float], alpha: float) -> list[float]:
    """Each test's two-sided level in a Holm family: the level at which its interval decides exactly when Holm's
    adjusted p ≤ ``alpha``. Holm stops at its first test not rejected, so every test from there on is open at
    that step's level, α over the tests left (Strassburger & Bretz 2008, *Stat. Med.* 27:4914) — read at its
    own rank instead, a family's last test printed its raw 95% interval as "Holm-adjusted"."""
    adjusted = holm(p)
    steps = {i: len(p) - rank for rank, i in enumerate(sorted(range(len(p)), key=lambda i: p[i]))}
    left_open = sum(q > alpha for q in adjusted)
    return [alpha / left_open if adjusted[i] > alpha
            else (min(alpha / steps[i], alpha * p[i] / adjusted[i]) if p[i] > 0 else alpha / steps[i]) for i in range(len(p))]


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
    # undecided, and more units alone would not decide it: the replicates (same units) that would, where more would
    replicates_needed: int | None = None

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
            if not self.adjusted.decided:
                return "no interval"
            if self.replicates_needed:
                return (f"more {unit} alone would not decide it: the replicates disagree; ~{self.replicates_needed} replicates "
                        f"(--replicates {self.replicates_needed}) would decide it with {POWER:.0%} power at this estimate")
            if self.raw.replicates > 1:
                return (f"neither more {unit} nor more replicates alone decides it at this estimate (it sits near the margin, "
                        "or needs both)")
            return "no sample size decides it at this estimate (it sits on the margin)"
        return f"~{self.tokens_needed:,} tokens ({self.units_needed:,} {unit}) would decide it with {POWER:.0%} power at this estimate"

    @property
    def resampling(self) -> str:
        """``16 documents, skew-robust t …: no Monte-Carlo error; 2 replicates (…)``: the unit, the method and
        its Monte-Carlo error (0: analytic), the replicates inside the interval, and anything left undefined,
        on every verdict."""
        drops = self.raw.drops
        iv = self.adjusted if self.adjusted.method else self.raw
        return f"{self.raw.n_units} {self.raw.unit}, {iv.precision}" + (f", {drops}" if drops else "")

    def describe(self, spec: str = ".4f") -> str:
        """``word: estimate [adjusted] (raw 95% [..]; margin ±m (…); Holm over k tests; n documents, the method,
        its Monte-Carlo error and the replicates)`` plus what would decide it."""
        raw = "no raw interval" if not self.raw.decided else f"raw {100 * self.raw.level:.0f}% [{self.raw.low:{spec}}, {self.raw.high:{spec}}]"
        need = self.need()
        adj = self.adjusted
        bounds = f"{adj.estimate:{spec}} [{adj.low:{spec}}, {adj.high:{spec}}]" if adj.decided else f"{adj:{spec}}"  # drops: below
        return (f"{self.word}: {bounds} adjusted ({raw}; margin {self.margin.format(spec)}; {self.adjustment}; "
                f"{self.resampling})" + (f"; {need}" if need else ""))

    def to_dict(self) -> dict:
        data = {k: getattr(self, k) for k in ("name", "outcome", "word", "p", "p_adjusted", "family", "family_size", "tokens",
                                                 "tokens_needed", "units_needed", "replicates_needed")}
        return {**data, "raw": self.raw.to_dict(), "adjusted": self.adjusted.to_dict(), "margin": self.margin.to_dict(),
                "adjustment": self.adjustment, "resampling": self.resampling, "text": self.describe()}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Verdict":
        plain = {k: data[k] for k in ("name", "outcome", "word", "p", "p_adjusted", "family", "family_size", "tokens",
                                        "tokens_needed", "units_needed")}
        plain["replicates_needed"] = data.get("replicates_needed")  # absent from records written before it existed
        return cls(**plain, raw=Interval.from_dict(data["raw"]), adjusted=Interval.from_dict(data["adjusted"]),
                   margin=Margin.from_dict(data["margin"]))


_Z = NormalDist()


def units_to_decide(estimate: float, se: float, skew: float, n_units: int, threshold_low: float, threshold_high: float,
                    tail: float, power: float = POWER, limit: int = 10 ** 7, spread: "Components | None" = None) -> int | None:
    """Units at which the interval at one-sided ``tail`` decides with probability ``power``, if the effect is ``estimate``.

    The standard error shrinks as 1/√units (se·√(n₀/n)); the estimate is taken as the truth and as
    normal around it. One side decides when its standardised distance to the threshold exceeds the
    decision multiplier (:func:`wkvlab.stats.skewt.multiplier`, at n) plus the power quantile z_power:
    that is P(decide) = P(Z > multiplier − distance) ≥ power. Beyond ``threshold_high`` (below
    ``threshold_low``) one side must clear it; between them, both sides must (each at z of
    (1 + power)/2, so that both clear together with probability ≥ power). Not the plug-in "interval
    this wide would decide": that decides in about half the runs (issue #38). ``None``: on a threshold,
    or beyond ``limit`` units.

    ``spread``: the variance components of ``se`` when it holds replicates (:mod:`wkvlab.stats.replicates`):
    then only the units' component shrinks with more units, the replicates' stays, and the df follow;
    an effect that the replicates alone keep open is undecided at any number of units (``None``)."""
    sides = threshold_sides(estimate, se, skew, threshold_low, threshold_high, spread)
    return None if sides is None else _units_for(sides, n_units, tail, power, limit)


def threshold_sides(estimate: float, se: float, skew: float, threshold_low: float, threshold_high: float,
                    spread: "Components | None" = None) -> "list[Side] | None":
    """The bounds that must clear their thresholds for an effect at ``estimate`` to be decided: beyond
    ``threshold_high`` its low bound, below ``threshold_low`` its high bound, between them both (within).
    None: on a threshold, or no usable se."""
    if not (math.isfinite(se) and se > 0 and math.isfinite(estimate)):
        return None
    if estimate > threshold_high:
        return [Side(estimate - threshold_high, se, -skew, spread)]  # the low bound must clear the high threshold
    if estimate < threshold_low:
        return [Side(threshold_low - estimate, se, skew, spread)]
    if threshold_low < estimate < threshold_high:
        return [Side(estimate - threshold_low, se, -skew, spread), Side(threshold_high - estimate, se, skew, spread)]
    return None


@dataclass(frozen=True)
class Side:
    """One bound a verdict reads: the estimate's distance beyond its threshold (positive: on the deciding side), the
    statistic's se, the skewness that side must allow for, and the variance components (replicates) when known."""

    distance: float
    se: float
    skew: float
    spread: "Components | None" = None


def _units_for(sides: Sequence[Side], n_units: int, tail: float, power: float = POWER, limit: int = 10 ** 7) -> int | None:
    """The fewest units at which every side clears its threshold at one-sided ``tail`` with probability ``power``
    (several sides: each at z of (1 + power)/2, so that all clear together); None beyond ``limit``, or when the
    replicates' variance alone keeps a side open."""
    if n_units < 2 or not sides or not all(math.isfinite(s.se) and s.se > 0 and s.distance > 0 for s in sides):
        return None
    z = _Z.inv_cdf(power if len(sides) == 1 else (1 + power) / 2)

    def decides(n: int) -> bool:
        for side in sides:
            if side.spread is not None and side.spread.replicates > 1:
                at = side.spread.at_units(n)
                se_n, df = at.se, at.df
            else:
                se_n, df = side.se * math.sqrt(n_units / n), None
            if side.distance / se_n < skewt.multiplier(tail, n, side.skew, df) + z:
                return False
        return True

    if decides(n_units):
        return n_units
    lo, hi = n_units, max(2 * n_units, MIN_UNITS)
    while not decides(hi):
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decides(mid) else (mid, hi)
    return hi


def replicates_to_decide(sides: Sequence[Side], n_units: int, tail: float, power: float = POWER, limit: int = 64) -> int | None:
    """The fewest replicates, on the same ``n_units``, at which every side clears its threshold at ``tail`` with
    ``power`` — for a test that more units alone cannot decide because the replicates disagree. The between-replicate
    component shrinks as 1/R and its df grow as R − 1 (:meth:`Components.at_replicates`); the units' stays. None:
    a side without replicates to project, or none up to ``limit`` decides (the estimate sits on a threshold)."""
    if not sides or not all(s.spread is not None and s.spread.replicates > 1 and s.distance > 0 for s in sides):
        return None
    z = _Z.inv_cdf(power if len(sides) == 1 else (1 + power) / 2)

    def decides(r: int) -> bool:
        for side in sides:
            at = side.spread.at_replicates(r)
            if not at.se > 0 or side.distance / at.se < skewt.multiplier(tail, n_units, side.skew, at.df) + z:
                return False
        return True

    return next((r for r in range(max(s.spread.replicates for s in sides) + 1, limit + 1) if decides(r)), None)


def _needed(draws: Resampled, raw: Interval, minus: Resampled, plus: Resampled, tokens: int,
            tail: float) -> tuple[int | None, int | None, int | None]:
    """Tokens and units that would decide an undecided test with :data:`POWER` power at this estimate.

    Sized on the statistics the verdict reads (:func:`sides`): θ − m and θ + m, which carry the margin's
    own uncertainty where m is a share of an estimated quantity — sizing θ against a fixed m promised
    "17 documents would decide it" for GPTQ rows whose margin (a share of GPTQ's KLD, which moves between
    builds) the replicates alone keep open. Fewer than :data:`MIN_UNITS` units: those units, whatever the
    estimate."""
    if raw.n_units < MIN_UNITS:
        units = MIN_UNITS
        return (math.ceil(tokens * units / raw.n_units) if tokens and raw.n_units else None), units, None
    if not (draws.usable and minus.usable and plus.usable):
        return None, None, None

    def side(d: Resampled, sign: int) -> Side:  # sign +1: the low bound must clear 0; −1: the high bound must
        return Side(sign * d.estimate, d.se, -sign * d.skew, d.components)

    if minus.estimate > 0:  # above +m: θ − m's low bound must clear 0
        chosen = [side(minus, +1)]
    elif plus.estimate < 0:  # below −m
        chosen = [side(plus, -1)]
    elif plus.estimate > 0 and minus.estimate < 0:  # inside: θ + m's low bound above 0 and θ − m's high bound below it
        chosen = [side(plus, +1), side(minus, -1)]
    else:
        return None, None, None
    units = _units_for(chosen, draws.n_units, tail)
    if units is None:
        return None, None, replicates_to_decide(chosen, draws.n_units, tail)
    units = max(units, draws.n_units + 1)  # undecided now: more than it has
    return (math.ceil(tokens * units / draws.n_units) if tokens else None), units, None


def decide(tests: Sequence[Effect], *, level: float = LEVEL, family: str = "") -> list[Verdict]:
    """The verdicts of one family of tests (Holm-adjusted at ``level``), in the order given."""
    both = [sides(t) for t in tests]
    p = [p_value(t.draws, t.margin.value, *s) for t, s in zip(tests, both)]
    adjusted_p = holm(p)
    alpha = 1.0 - level
    out = []
    for i, (test, test_alpha) in enumerate(zip(tests, holm_levels(p, alpha))):
        raw, adj = test.draws.interval(level), test.draws.interval(1.0 - test_alpha)
        outcome = "undecided"
        if adjusted_p[i] <= alpha and adj.decided:
            outcome = "within" if test.draws.se == 0.0 and abs(adj.estimate) <= test.margin.value else _outcome_at(*both[i], 1.0 - test_alpha)
        word = dict(zip(("above", "below", "within"), test.words)).get(outcome, "undecided")
        tokens_needed, units_needed, replicates_needed = _needed(test.draws, raw, *both[i], test.tokens, test_alpha / 2) \
            if outcome == "undecided" else (None, None, None)
        out.append(Verdict(test.name, outcome, word.replace("±m", f"±{test.margin.value:.3g}"), raw, adj, test.margin, p[i],
                           adjusted_p[i], family, len(tests), test.tokens, tokens_needed, units_needed, replicates_needed))
    return out
