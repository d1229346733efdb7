"""Run-to-run variance inside the interval: units crossed with replicates (variance components).

A claim about a method or a config ("GPTQ with a 4-bit cache compounds") is a claim about every build
and every run of it, not about the one build measured. Two things change from run to run and the
units (documents, windows) cannot see either:

* **calibration samples** — GPTQ, AWQ, SmoothQuant and every other calibrated method is built from a
  sample of text; another sample is another build;
* **float order** — chunk size, kernel choice and CPU instruction set reorder the sums; a coarse cache
  amplifies the difference (two committed SmolLM2 runs, AVX2 vs AVX-512, moved the interactions by
  1.37 standard errors RMS, GPTQ×KIVI-4 by 4.7: issue #38).

So a replicate is the whole measurement again with another calibration sample (where the configs
have one) and another float order (another chunk size), on the **same units**. With ``R`` replicates
on ``U`` units the estimate is the mean of the replicates' estimates θ_r, and its variance has two
components (a crossed design; Owen 2007, *Ann. Appl. Stat.* 1(2):386–411, §3):

    se² = se_U² + se_R²,   se_U² = Σ_u ψ_u² / (U (U − 1)),   se_R² = Σ_r (θ_r − θ̄)² / (R (R − 1))

with ψ_u the unit's jackknife influence value averaged over the replicates (for a mean: the unit's
mean over replicates minus the grand mean). Both components contain the replicate × unit noise once,
so se errs wide, never narrow. The t quantile takes the **Welch–Satterthwaite** degrees of freedom,

    df = se⁴ / (se_U⁴ / (U − 1) + se_R⁴ / (R − 1)),

which is U − 1 when the replicates agree and falls towards R − 1 when they dominate: two replicates
that disagree leave one degree of freedom, and the interval says so by its width rather than by a
guess. One replicate leaves se_R unknown: the interval is the units' alone and says "1 replicate
(run-to-run variance not measured)".

This module is the pure arithmetic; :func:`wkvlab.stats.bootstrap.pool` turns per-replicate draws
into one :class:`~wkvlab.stats.bootstrap.Resampled`, and every interval and verdict reads ``se`` and
``df`` from there (tests/stats/test_replicates.py checks coverage with a known truth).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy where it computes: the command line imports replicate_chunk before anything heavy
    import numpy as np


@dataclass(frozen=True)
class Components:
    """The two variance components of an estimate over units crossed with replicates, and their df."""

    unit_var: float  # se_U²: from the units (documents, windows)
    replicate_var: float  # se_R²: from the replicates (0 with one)
    n_units: int
    replicates: int

    @property
    def se(self) -> float:
        return math.sqrt(self.unit_var + self.replicate_var)

    @property
    def df(self) -> float:
        """Welch–Satterthwaite degrees of freedom (U − 1 with one replicate)."""
        if self.replicates < 2 or self.replicate_var <= 0.0:
            return float(self.n_units - 1)
        total = self.unit_var + self.replicate_var
        return max(1.0, total ** 2 / (self.unit_var ** 2 / (self.n_units - 1) + self.replicate_var ** 2 / (self.replicates - 1)))

    def at_units(self, n_units: int) -> "Components":
        """The same design with ``n_units`` units: the units' component shrinks as 1/U, the replicates' does not."""
        return Components(self.unit_var * self.n_units / n_units, self.replicate_var, n_units, self.replicates)

    def at_replicates(self, replicates: int) -> "Components":
        """The same units with ``replicates`` replicates: the replicates' component shrinks as 1/R (its df grow as
        R − 1); the units' one is kept as measured (it holds the replicate × unit noise once: errs wide)."""
        return Components(self.unit_var, self.replicate_var * self.replicates / replicates, self.n_units, replicates)


def components(influence: np.ndarray, replicate_estimates: np.ndarray | None = None) -> Components:
    """Variance components from the units' influence values ψ_u and the replicates' estimates θ_r (see the module docstring)."""
    import numpy as np

    psi = np.asarray(influence, dtype=np.float64)
    n = psi.size
    unit_var = float((psi ** 2).sum()) / (n * (n - 1))
    if replicate_estimates is None or np.size(replicate_estimates) < 2:
        return Components(unit_var, 0.0, n, 1 if replicate_estimates is None else max(1, int(np.size(replicate_estimates))))
    theta = np.asarray(replicate_estimates, dtype=np.float64)
    r = theta.size
    return Components(unit_var, float(((theta - theta.mean()) ** 2).sum()) / (r * (r - 1)), n, r)


def describe(replicates: int, df: float | None = None) -> str:
    """``3 replicates (between-replicate variance inside the interval, df 11.2)`` or the one-replicate caveat."""
    if replicates < 1:
        return "replicates not recorded"
    if replicates == 1:
        return "1 replicate (run-to-run variance not measured)"
    return f"{replicates} replicates (between-replicate variance inside the interval" + (f", df {df:.1f})" if df is not None else ")")


def replicate_chunk(base: int, replicate: int, multiple: int = 1) -> int:
    """Replicate r's chunk size: the base chunk halved r times, a multiple of the cache's token group, at least one
    group — another float order for the same tokens (a coarse cache amplifies it, docs/engines.md). One rule for
    ``wkvlab explain``'s replicates and the findings' (:mod:`wkvlab.sweep.plan`)."""
    return max(multiple, (base >> replicate) // multiple * multiple)


def replicate_label(replicate: int, chunk: int) -> str:
    """What tells replicate r of a config from the measurement itself wherever both are listed: ``" (replicate 1,
    chunk 256)"``, ``""`` for replicate 0. One wording for a sweep config's label, store listings and the report."""
    return f" (replicate {replicate}, chunk {chunk})" if replicate else ""


__all__ = ["Components", "components", "describe", "replicate_chunk", "replicate_label"]
