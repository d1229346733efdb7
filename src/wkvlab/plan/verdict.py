"""Which rows of a plan may be recommended: one verdict per configuration, from a pluggable rule.

The planner ranks and recommends only what a verdict allows. A rule is a function from the plan's
quality estimates (all rows at once, so that a rule can correct for testing many configurations —
Holm over configs) to one :class:`Verdict` each. :func:`guard_verdicts` is the rule used today:

* ``exact`` — the checkpoint itself (16-bit weights, 16-bit cache; or a quantized file served as it
  is): nothing is rounded beyond the reference, so nothing needs measuring;
* ``measured`` — measured on this model (``--probe``, ``--results``, ``--store``) and not unsafe under
  the catastrophe guard (:mod:`.guard`): recommendable;
* ``unsafe`` — measured and over the guard's thresholds, or holding a half measured unsafe: dropped;
* ``unmeasured`` — a prior only: listed, never recommended (no prior can tell whether this model is
  one whose outlier keys break a cache, 8-bit ones included).

:func:`tolerance_rule` (``plan --tolerance``: one-sided non-inferiority, "within tolerance / exceeds /
undecided", Holm over the measured rows) plugs in with the same signature: ``within`` maps to a
recommendable verdict, ``exceeds`` to a dropped one, ``undecided`` to a listed one whose ``reason``
says what would decide it. Under it the recommendable rows are ordered by memory, the smallest
first (:func:`wkvlab.plan.planner.plan`'s ``verdict`` argument; ``_rank`` in the planner).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.guard import UNMEASURED
from wkvlab.plan.quality import MEASURED, QualityEstimate

if TYPE_CHECKING:
    from wkvlab.stats.tolerance import Tolerance

EXACT, MEASURED_OK, UNSAFE, UNMEASURED_STATE = "exact", "measured", "unsafe", "unmeasured"


@dataclass(frozen=True)
class Verdict(JsonMixin):
    state: str  # exact | measured | unsafe | unmeasured (a tolerance rule may add its own words)
    recommendable: bool  # may get a launch line
    dropped: bool = False  # never ranked (unsafe, or outside the tolerance)
    reason: str = ""  # the words the table and the launch lines show


VerdictRule = Callable[[Sequence[QualityEstimate]], list[Verdict]]


def guard_verdicts(qualities: Sequence[QualityEstimate]) -> list[Verdict]:
    """The catastrophe guard as a verdict rule: exact and safe measured rows are recommendable."""
    out = []
    for q in qualities:
        if q.unsafe:
            out.append(Verdict(UNSAFE, False, True, q.unsafe))
        elif q.exact:
            out.append(Verdict(EXACT, True, reason="the checkpoint itself: nothing rounded beyond the reference"))
        elif q.source == MEASURED:
            out.append(Verdict(MEASURED_OK, True, reason=q.label))
        else:  # a prior, or a transfer from a smaller model of the family: not this model
            out.append(Verdict(UNMEASURED_STATE, False, reason=q.caution or f"{UNMEASURED} ({q.label})"))
    return out


WITHIN, EXCEEDS, UNDECIDED = "within tolerance", "exceeds it", "undecided"


def tolerance_rule(tolerance: "Tolerance") -> VerdictRule:
    """``plan --tolerance``: the ship decision (:func:`wkvlab.stats.tolerance.ship_decision`) as a verdict rule.

    The rows measured with per-unit values (the probe keeps them) form one Holm family; each is
    ``within tolerance`` (recommendable), ``exceeds it`` (dropped, with its interval) or ``undecided``
    (listed, with the tokens that would decide it at 80% power). The checkpoint itself is within any
    tolerance (nothing is rounded); a prior, a transfer or a measurement without per-unit values is
    ``undecided`` and never recommended; the catastrophe guard still drops what it drops."""
    from wkvlab.stats.tolerance import ship_decision

    def rule(qualities: Sequence[QualityEstimate]) -> list[Verdict]:
        family = {}
        for i, q in enumerate(qualities):
            if not q.unsafe and not q.exact and q.source == MEASURED and q.units is not None \
                    and (tolerance.metric == "kld" or q.units.top1):
                # a store's replicates of the config pooled in: its run-to-run variance is inside the decision
                family[i] = (q.units.resampled(tolerance.metric), sum(q.units.tokens))
        decided = dict(zip(family, ship_decision({str(i): family[i] for i in family}, tolerance,
                                                 family="measured configs of this plan") if family else []))
        out = []
        for i, q in enumerate(qualities):
            if q.unsafe:
                out.append(Verdict(UNSAFE, False, True, q.unsafe))
            elif q.exact:
                out.append(Verdict(WITHIN, True, reason=f"within tolerance ({tolerance}): the checkpoint itself, nothing rounded"))
            elif i in decided:
                v = decided[i]
                out.append(Verdict(v.outcome, v.outcome == WITHIN, v.outcome == EXCEEDS, v.describe()))
            elif q.source == MEASURED:
                out.append(Verdict(UNDECIDED, False, reason=f"undecided ({tolerance}): {q.detail[0] if q.detail else q.label} kept no "
                                                             "per-unit values to test (written before results recorded them); re-run its "
                                                             "'wkvlab eval ... --json' (or sweep) with this version, or drop it "
                                                             "and let plan probe it"))
            else:
                out.append(Verdict(UNDECIDED, False, reason=f"undecided: {q.caution or UNMEASURED} ({q.label}); a prior decides nothing"))
        return out

    return rule
