"""The ship decision: is each config within the user's own tolerance, by a one-sided non-inferiority test?

A practitioner's question is not whether two errors interact but whether a config is good enough:
*its KLD is at most τ nats* (``--tolerance 0.01``) or *its top-1 agreement is at least a*
(``--tolerance top1=0.95``). For each config compared, on its per-unit values (documents where the
text has them, windows otherwise):

* **within tolerance** — the family-adjusted interval lies entirely on the good side of τ
  (for KLD: its upper bound is below τ), so the config is shown to be no worse than τ;
* **exceeds it** — the interval lies entirely on the bad side (its lower bound above τ);
* **undecided** — it straddles τ, with the units (and tokens) that would decide it with 80% power
  if the config is what was measured (:func:`wkvlab.stats.decision.units_to_decide`).

Both claims are read off one two-sided interval at the family-adjusted level, so at most one can be
wrong for a given truth and the chance of any wrong claim over the configs compared stays at 5%
(Holm over the configs, as :func:`wkvlab.stats.decide` does; the interval is the same analytic
skew-robust one, :mod:`wkvlab.stats.skewt`). :func:`ship_decision` is the function a planner calls
with any per-unit draws; :func:`tolerance_verdicts` applies it to evaluated results.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Mapping, Sequence

from wkvlab.errors import ConfigError
from wkvlab.stats.bootstrap import MIN_UNITS, Interval, Resampled, resample
from wkvlab.stats.decision import ADJUSTMENT, LEVEL, POWER, holm, holm_levels, replicates_to_decide, threshold_sides, units_to_decide

OUTCOMES = ("within tolerance", "exceeds it", "undecided")


@dataclass(frozen=True)
class Tolerance:
    """What the user can tolerate: ``kld`` at most ``value`` nats, or ``top1`` agreement at least ``value``."""

    metric: str
    value: float

    @classmethod
    def parse(cls, text: str) -> "Tolerance":
        """``0.01`` or ``kld=0.01`` (mean KLD in nats, at most); ``top1=0.95`` (top-1 agreement, at least)."""
        raw = str(text).strip()
        metric, _, body = raw.rpartition("=")
        metric = metric.strip().lower() or "kld"
        if metric not in ("kld", "top1"):
            raise ConfigError(f"--tolerance {raw!r}: use a KLD in nats (0.01 or kld=0.01) or a top-1 agreement (top1=0.95)")
        try:
            value = float(body.rstrip("%")) / (100 if body.endswith("%") else 1)
        except ValueError:
            raise ConfigError(f"--tolerance {raw!r}: {body!r} is not a number; e.g. --tolerance 0.01 or --tolerance top1=0.95") from None
        if metric == "kld" and not 0 < value < math.inf:
            raise ConfigError(f"--tolerance {raw!r}: a KLD tolerance is a positive number of nats, e.g. 0.01")
        if metric == "top1" and not 0 < value < 1:
            raise ConfigError(f"--tolerance {raw!r}: a top-1 agreement is between 0 and 1 (exclusive), e.g. top1=0.95")
        return cls(metric, value)

    @property
    def threshold(self) -> float:
        """τ on the scale tested, where larger is worse: KLD itself, or the loss of top-1 agreement."""
        return self.value if self.metric == "kld" else 1.0 - self.value

    def __str__(self) -> str:
        return f"mean KLD ≤ {self.value:g} nats" if self.metric == "kld" else f"top-1 agreement ≥ {self.value:.2%}"

    def shown(self, value: float) -> str:
        return f"{value:.4g}" if self.metric == "kld" else f"{1.0 - value:.3%}"


@dataclass(frozen=True)
class ToleranceVerdict:
    """One config against the tolerance: outcome, adjusted interval, family, what would decide it."""

    name: str
    outcome: str  # within tolerance / exceeds it / undecided
    tolerance: Tolerance
    raw: Interval
    adjusted: Interval  # on the tested scale (KLD, or loss of top-1 agreement)
    p: float
    p_adjusted: float
    family: str
    family_size: int
    tokens: int
    units_needed: int | None = None
    tokens_needed: int | None = None
    replicates_needed: int | None = None  # more units alone would not decide it; these replicates would

    @property
    def decided(self) -> bool:
        return self.outcome != "undecided"

    def describe(self) -> str:
        """``within tolerance (mean KLD ≤ 0.01 nats): 0.0042 [0.0031, 0.0060] adjusted; Holm over 3 configs (...); 16 documents``."""
        adj, tol = self.adjusted, self.tolerance
        if tol.metric == "top1":  # print agreement, whose interval runs the other way
            bounds = f"{tol.shown(adj.estimate)} [{tol.shown(adj.high)}, {tol.shown(adj.low)}]" if adj.decided else f"{tol.shown(adj.estimate)}"
        else:
            bounds = f"{adj.estimate:.4g} [{adj.low:.4g}, {adj.high:.4g}]" if adj.decided else f"{adj.estimate:.4g}"
        if not adj.decided:
            bounds += f" [no interval: {adj.n_units} {adj.unit}" + (f" < {MIN_UNITS}]" if adj.n_units < MIN_UNITS else "]")
        need = ""
        if not self.decided:
            need = (f"; ~{self.tokens_needed:,} tokens ({self.units_needed:,} {self.raw.unit}) would decide it with {POWER:.0%} power "
                    "if it is what was measured") if self.units_needed else (
                    f"; more {self.raw.unit} alone would not decide it: the replicates disagree; ~{self.replicates_needed} replicates "
                    f"would decide it with {POWER:.0%} power if it is what was measured") if self.replicates_needed else (
                    "; no sample size decides it at this estimate" + (
                        " (neither more units nor more replicates alone)" if self.raw.replicates > 1 else ""))
        return (f"{self.outcome} ({tol}): {bounds} adjusted ({ADJUSTMENT} over {self.family_size} config"
                f"{'s' if self.family_size != 1 else ''}{' (' + self.family + ')' if self.family else ''}; "
                f"{self.raw.n_units} {self.raw.unit}; {adj.precision or self.raw.precision}){need}")

    def to_dict(self) -> dict:
        data = {k: getattr(self, k) for k in ("name", "outcome", "p", "p_adjusted", "family", "family_size", "tokens", "units_needed",
                                                 "tokens_needed", "replicates_needed")}
        return {**data, "tolerance": asdict(self.tolerance), "raw": self.raw.to_dict(), "adjusted": self.adjusted.to_dict(),
                "text": self.describe()}


def ship_decision(configs: Mapping[str, tuple[Resampled, int]], tolerance: Tolerance, *, family: str = "",
                  level: float = LEVEL) -> list[ToleranceVerdict]:
    """Each config's verdict against ``tolerance``, Holm-adjusted over the configs (in the order given).

    ``configs``: name → (draws of the tested quantity — mean KLD, or the loss of top-1 agreement —
    from :func:`wkvlab.stats.resample`, tokens it rests on)."""
    tau = tolerance.threshold
    names = list(configs)
    draws = [configs[n][0] for n in names]
    p = [min(d.tail_beyond(tau, "low"), d.tail_beyond(tau, "high")) if d.usable else 1.0 for d in draws]
    adjusted_p = holm(p)
    alpha = 1.0 - level
    out = []
    for i, (name, d, test_alpha) in enumerate(zip(names, draws, holm_levels(p, alpha))):
        raw, adj = d.interval(level), d.interval(1.0 - test_alpha)
        outcome = "undecided"
        if adjusted_p[i] <= alpha and adj.decided:
            outcome = "exceeds it" if adj.low > tau else "within tolerance" if adj.high < tau else "undecided"
        tokens = configs[name][1]
        units = tokens_needed = replicates = None
        if outcome == "undecided":
            if d.n_units < MIN_UNITS:
                units = MIN_UNITS
            elif d.usable:
                # with replicates only the units' share of the variance shrinks with more units (as decision._needed);
                # where that cannot decide it, the same side projected over more replicates
                sides = threshold_sides(d.estimate, d.se, d.skew, tau, tau, d.components) or []
                units = units_to_decide(d.estimate, d.se, d.skew, d.n_units, tau, tau, test_alpha / 2, spread=d.components)
                units = None if units is None else max(units, d.n_units + 1)
                if units is None:
                    replicates = replicates_to_decide(sides, d.n_units, test_alpha / 2)
            tokens_needed = math.ceil(tokens * units / d.n_units) if units and tokens and d.n_units else None
        out.append(ToleranceVerdict(name, outcome, tolerance, raw, adj, p[i], adjusted_p[i], family, len(names), tokens, units,
                                    tokens_needed, replicates))
    return out


def tolerance_verdicts(results: Sequence, tolerance: Tolerance, *, family: str = "") -> list[ToleranceVerdict]:
    """:func:`ship_decision` on evaluated results (anything with ``.arrays`` holding ``kld``, ``top1_agree``
    and ``units``), each named ``weights × kv``."""
    configs = {}
    for r in results:
        a = r.arrays
        values = a.kld if tolerance.metric == "kld" else 1.0 - a.top1_agree.astype("float64")
        configs[f"{r.weights} × {r.kv}"] = (resample(lambda m: m["x"], {"x": values}, a.units), int(values.size))
    return ship_decision(configs, tolerance, family=family)


def ship_lines(verdicts: Sequence[ToleranceVerdict], tolerance: Tolerance) -> list[str]:
    """The heading and one line per config, as ``eval``/``explain --tolerance`` print them (empty when nothing was decided)."""
    if not verdicts:
        return []
    return ([f"against your tolerance ({tolerance}; one-sided non-inferiority, {verdicts[0].family_size} configs in one Holm family):"]
            + [f"  {v.name}: {v.describe()}" for v in verdicts])


__all__ = ["Tolerance", "ToleranceVerdict", "ship_decision", "ship_lines", "tolerance_verdicts", "OUTCOMES"]
