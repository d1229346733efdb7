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

A tolerance rule (``plan --tolerance``: one-sided non-inferiority, "within tolerance / exceeds /
undecided") plugs in here with the same signature: ``within`` maps to a recommendable verdict,
``exceeds`` to a dropped one, ``undecided`` to a listed one whose ``reason`` says what would decide
it — see :func:`wkvlab.plan.planner.plan`'s ``verdict`` argument.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.guard import UNMEASURED
from wkvlab.plan.quality import MEASURED, QualityEstimate

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
