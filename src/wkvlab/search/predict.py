"""The additive predictor: a plan's KLD from per-layer profile deltas, with a measured correction.

    KLD(plan) ≈ base + α_kv · Σ_l [ΔK_l(k_l) + ΔV_l(v_l)] − α_w · Σ_{l kept 16-bit} W_l

``ΔK_l(f)`` is the KLD added by quantizing only layer l's keys to f (likewise V), measured under
the weight config; ``W_l`` is the KLD of quantizing only layer l's weights. Errors do not add
exactly (KVTuner and the seed both observe super- or sub-additive interactions), so the sums are
scaled by factors fitted on configurations that were actually measured: ``α_kv`` by least squares
(through the origin) on the uniform formats' measured KLD excess over ``base``, ``α_w`` as
``base`` over the sum of the per-layer weight KLDs. Negative deltas are measurement noise on
near-lossless layers and are clipped to 0 so the allocator never pays bytes to "buy" noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wkvlab.search.choices import Choice
from wkvlab.search.profile import SensitivityProfile


@dataclass(frozen=True)
class Predictor:
    base: float
    k_delta: dict  # format -> per-layer tuple
    v_delta: dict
    weight_kld: tuple = ()
    alpha_kv: float = 1.0
    alpha_w: float = 1.0

    def layer_kv(self, layer: int, choice: Choice) -> float:
        """Additive (uncorrected) KV term of one layer."""
        k, v = choice
        dk = self.k_delta[k][layer] if k != "fp16" else 0.0
        dv = self.v_delta[v][layer] if v != "fp16" else 0.0
        return max(dk, 0.0) + max(dv, 0.0)

    def layer_weight_gain(self, layer: int) -> float:
        return max(self.weight_kld[layer], 0.0) if self.weight_kld else 0.0

    def additive(self, plan: tuple[Choice, ...]) -> float:
        return sum(self.layer_kv(i, c) for i, c in enumerate(plan))

    def predict(self, plan: tuple[Choice, ...], keep_16bit: tuple[int, ...] = ()) -> float:
        gain = sum(self.layer_weight_gain(i) for i in keep_16bit)
        return self.base + self.alpha_kv * self.additive(plan) - self.alpha_w * gain

    def to_dict(self) -> dict:
        return {"base": self.base, "alpha_kv": self.alpha_kv, "alpha_w": self.alpha_w,
                "k_delta": {k: list(v) for k, v in self.k_delta.items()},
                "v_delta": {k: list(v) for k, v in self.v_delta.items()}, "weight_kld": list(self.weight_kld)}


def fit_scale(additive: list[float], measured_excess: list[float]) -> float:
    """Least-squares α with measured ≈ α · additive (no intercept); 1.0 when there is nothing to fit."""
    x, y = np.asarray(additive, dtype=float), np.asarray(measured_excess, dtype=float)
    denom = float(x @ x)
    return float(x @ y / denom) if denom > 0 else 1.0


def predictor_from_profile(profile: SensitivityProfile, correct: bool = True) -> Predictor:
    k_delta = {f: tuple(profile.k_delta(f)) for f in profile.k}
    v_delta = {f: tuple(profile.v_delta(f)) for f in profile.v}
    raw = Predictor(profile.base_kld, k_delta, v_delta, tuple(profile.weight_gain()))
    if not correct:
        return raw
    sums, excess = [], []
    for key, kld in profile.uniform.items():
        k, v = key.split("/")
        sums.append(raw.additive(tuple([(k, v)] * profile.layers)))
        excess.append(kld - profile.base_kld)
    alpha_kv = fit_scale(sums, excess)
    total_w = sum(max(x, 0.0) for x in profile.weight_layers)
    alpha_w = profile.base_kld / total_w if total_w > 0 else 1.0
    return Predictor(profile.base_kld, k_delta, v_delta, tuple(profile.weight_gain()), alpha_kv, alpha_w)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties); nan with fewer than 3 points."""
    if len(a) < 3:
        return float("nan")

    def ranks(x):
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for value in np.unique(x):  # ties share their mean rank
            mask = x == value
            r[mask] = r[mask].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])
