"""The cross-term effects of one (W, C) pair, decided by the one rule (numpy only; the runs are
:mod:`wkvlab.explain.intervention`'s).

Per window: the per-token output KLD against the reference of the cells W, C, W+C and of the two
interventions on the (W, C) run (ε_q·ε_k,cᵀ removed, sinks at 16 bits), and the mean attention-row KL of
W, C, W+C. The effects (:data:`EFFECTS`):

* ``interaction`` I = KLD(W+C) − KLD(W) − KLD(C), the output 2×2 interaction (KLD(R) = 0);
* ``interaction_removed`` I′, the same with ε_q·ε_k,cᵀ removed from the (W, C) scores;
* ``removed`` = KLD(W+C)′ − KLD(W+C) = I′ − I (negative: the term was raising the KLD);
* ``attention_interaction`` = KL(W+C) − KL(W) − KL(C) on the attention rows;
* ``sinks`` = KLD(W, C+sinks) − KLD(W, C), the sinks kept at 16 bits, paired against the plain run.

Each is a paired interval over windows (the analytic skew-robust t of wkvlab.stats; the tokens of a window together,
every cell on the same windows) and decided by :func:`wkvlab.stats.decide` with margin m by ``margin``
(default 10% of the predicted total KLD(W)+KLD(C); the attention-KL interaction: of the attention KLs'
own predicted total); all effects of one table
form one Holm family. ``explained`` = (I − I′) / I, the share of the output interaction the term
carries, is an interval only (a ratio: undefined when I is near 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from wkvlab.stats import Interval, Resampled, resample
from wkvlab.stats.bootstrap import Units
from wkvlab.stats.decision import DEFAULT_MARGIN, DIFFERENCE, INTERACTION, Effect, Margin, MarginRule, Verdict, decide

SINK_TOKENS = 4  # = wkvlab.explain.attention.SINK_TOKENS (kept torch-free here)
CELLS = ("w", "c", "wc", "wc_removed", "wc_sinks")  # output KLD per token of each cell and intervention
ATTENTION_CELLS = ("w", "c", "wc")  # attention-row KL per window


@dataclass
class CrossTermData:
    """Per-window measurements of one (W, C) pair: per-token output KLD of every cell, per-window attention KL."""

    kld: dict[str, list[np.ndarray]]
    attention_kl: dict[str, list[float]]

    @classmethod
    def empty(cls) -> "CrossTermData":
        return cls({c: [] for c in CELLS}, {c: [] for c in ATTENTION_CELLS})

    def add(self, kld: Mapping[str, np.ndarray], attention_kl: Mapping[str, float]) -> None:
        for c in CELLS:
            self.kld[c].append(np.asarray(kld[c], dtype=np.float64))
        for c in ATTENTION_CELLS:
            self.attention_kl[c].append(float(attention_kl[c]))

    @property
    def windows(self) -> int:
        return len(self.kld["wc"])


EFFECTS = ("interaction", "interaction_removed", "removed", "attention_interaction", "sinks")
EFFECT_LABELS = {
    "interaction": "output KLD interaction KLD(W+C) − KLD(W) − KLD(C)",
    "interaction_removed": "the same with ε_q·ε_k,cᵀ removed",
    "removed": "KLD change when ε_q·ε_k,cᵀ is removed from the (W, C) scores",
    "attention_interaction": "attention-KL interaction KL(W+C) − KL(W) − KL(C)",
    "sinks": f"KLD change with the first {SINK_TOKENS} tokens at 16 bits in the (W, C) cache",
}


@dataclass(frozen=True)
class CrossTerm:
    """One (W, C) pair's cross-term effects: intervals, the share of the output interaction the term
    carries, and the verdicts of the one rule."""

    weights: str
    kv: str
    windows: int
    tokens: int
    kld: dict[str, Interval]  # each cell's mean output KLD (w, c, wc, wc_removed, wc_sinks)
    effects: dict[str, Interval]  # EFFECTS, raw intervals
    explained: Interval  # (I − I′) / I: the share of the output interaction the term carries
    verdicts: dict[str, Verdict]  # EFFECTS, decided in the family the caller chose
    per_window: dict[str, list[float]] | None = None  # mean output KLD (CELLS) and attention KL ("attention_<cell>") per window

    @property
    def explained_defined(self) -> bool:
        """The share (I − I′)/I means something only when the interaction's interval excludes 0."""
        return self.effects["interaction"].excludes_zero

    def explained_text(self, spec: str = ".2f") -> str:
        return format(self.explained, spec) if self.explained_defined else "— (the interaction's interval contains 0)"

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, "windows": self.windows, "tokens": self.tokens,
                "kld": {k: v.to_dict() for k, v in self.kld.items()}, "effects": {k: v.to_dict() for k, v in self.effects.items()},
                "explained": self.explained.to_dict(), "verdicts": {k: v.to_dict() for k, v in self.verdicts.items()},
                "per_window": self.per_window}

    @classmethod
    def from_dict(cls, data: Mapping) -> "CrossTerm":
        return cls(data["weights"], data["kv"], data["windows"], data["tokens"], {k: Interval.from_dict(v) for k, v in data["kld"].items()},
                   {k: Interval.from_dict(v) for k, v in data["effects"].items()}, Interval.from_dict(data["explained"]),
                   {k: Verdict.from_dict(v) for k, v in data["verdicts"].items()}, data.get("per_window"))

    def lines(self) -> list[str]:
        v = self.verdicts
        return [
            f"output KLD interaction of {self.weights} × {self.kv}: {v['interaction'].describe('.4f')}",
            f"with ε_q·ε_k,cᵀ removed from the scores: KLD(W+C) {self.kld['wc'].estimate:.4f} → {self.kld['wc_removed'].estimate:.4f}, "
            f"{v['removed'].describe('+.4f')}; share of the interaction it carries {self.explained_text()}; "
            f"what remains: {v['interaction_removed'].describe('+.4f')}",
            f"attention-KL interaction: {v['attention_interaction'].describe('+.2e')}",
            f"first {SINK_TOKENS} tokens at 16 bits: KLD(W+C) {self.kld['wc'].estimate:.4f} → {self.kld['wc_sinks'].estimate:.4f}, "
            f"{v['sinks'].describe('+.4f')}",
        ]


def cross_term_draws(data: CrossTermData) -> dict[str, Resampled]:
    """Paired draws over windows of every cell's KLD and every effect (the tokens of one window are one unit)."""
    arrays = {c: np.concatenate(data.kld[c]) for c in CELLS}
    # the unit is the diagnosis window (its verdicts say "windows resampled", not a vague "units"):
    # the passes are recorded per window, without the document it came from
    units = Units(np.concatenate([np.full(len(a), i) for i, a in enumerate(data.kld["wc"])]), "windows")
    cell = lambda name: (lambda m: m[name])  # noqa: E731
    interaction = lambda m: m["wc"] - m["w"] - m["c"]  # noqa: E731
    statistics = {**{f"kld_{c}": cell(c) for c in CELLS},
                  "interaction": interaction,
                  "interaction_removed": lambda m: m["wc_removed"] - m["w"] - m["c"],
                  "removed": lambda m: m["wc_removed"] - m["wc"],
                  "sinks": lambda m: m["wc_sinks"] - m["wc"],
                  "explained": lambda m: (m["wc"] - m["wc_removed"]) / interaction(m)}
    draws = {name: resample(stat, arrays, units) for name, stat in statistics.items()}
    attn = {c: np.asarray(data.attention_kl[c]) for c in ATTENTION_CELLS}
    windows = Units(np.arange(data.windows), "windows")
    draws["attention_interaction"] = resample(lambda m: m["wc"] - m["w"] - m["c"], attn, windows)
    draws["attention_c"] = resample(lambda m: m["c"], attn, windows)
    draws["attention_w"] = resample(lambda m: m["w"], attn, windows)
    return draws


def cross_term_tests(draws: Mapping[str, Resampled], tokens: int, label: str, margin: "float | str | MarginRule" = DEFAULT_MARGIN,
                     kld_margin: Margin | None = None) -> list[Effect]:
    """The :data:`EFFECTS` of one pair as tests for :func:`wkvlab.stats.decide`: m by ``margin``
    (:class:`MarginRule`; by default 10% of the predicted total KLD(W)+KLD(C), for the attention-KL
    interaction its attention-KL counterpart). ``kld_margin``: the KLD effects' m as another measurement
    already set it (explain: the factorial's, so one run states one KLD(W)+KLD(C) per margin)."""
    rule = MarginRule.parse(margin)
    words = {"interaction": INTERACTION, "interaction_removed": INTERACTION, "removed": DIFFERENCE, "attention_interaction": INTERACTION,
             "sinks": DIFFERENCE}
    # every effect's m from the single effects' draws on the same windows (the margin's own uncertainty in the test)
    singles = {e: ("attention_w", "attention_c", "attention KL") if e == "attention_interaction" else ("kld_w", "kld_c", "KLD") for e in EFFECTS}
    return [rule.interaction_effect(f"{label}: {EFFECT_LABELS[e]}", draws[e], draws[singles[e][0]], draws[singles[e][1]], tokens,
                                    label=singles[e][2], words=words[e], measured=None if singles[e][2] != "KLD" else kld_margin)
            for e in EFFECTS]


def cross_terms(pairs: Sequence[tuple[str, str, CrossTermData]], *, family: str, margin: float = DEFAULT_MARGIN,
                kld_margin: Margin | None = None) -> list[CrossTerm]:
    """Every pair's :class:`CrossTerm`, all their effects decided as one Holm family named ``family``
    (``kld_margin``: see :func:`cross_term_tests`)."""
    draws = [cross_term_draws(d) for _, _, d in pairs]
    tokens = [int(sum(len(a) for a in d.kld["wc"])) for _, _, d in pairs]
    tests = [t for (w, c, _), dr, n in zip(pairs, draws, tokens) for t in cross_term_tests(dr, n, f"{w} × {c}", margin, kld_margin)]
    verdicts = decide(tests, family=family)
    out = []
    for i, ((w, c, d), dr, n) in enumerate(zip(pairs, draws, tokens)):
        mine = verdicts[i * len(EFFECTS) : (i + 1) * len(EFFECTS)]
        per_window = {**{c: [float(a.mean()) for a in d.kld[c]] for c in CELLS},
                      **{f"attention_{c}": list(d.attention_kl[c]) for c in ATTENTION_CELLS}}
        out.append(CrossTerm(w, c, d.windows, n, {k: dr[f"kld_{k}"].interval() for k in CELLS}, {e: dr[e].interval() for e in EFFECTS},
                             dr["explained"].interval(), dict(zip(EFFECTS, mine)), per_window))
    return out


__all__ = ["ATTENTION_CELLS", "CELLS", "CrossTerm", "CrossTermData", "EFFECTS", "cross_term_draws", "cross_term_tests", "cross_terms"]
