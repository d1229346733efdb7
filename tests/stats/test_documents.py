"""Documents as the resampling unit: coverage by simulation, and what every verdict prints.

Windows cut from one document share its difficulty (a hard page makes every window on it hard), so
resampling windows as if they were independent counts one document's difficulty several times and
the interval is too narrow. On synthetic data with a known mean and document-level difficulty,
the 95% interval that resamples documents covers near its level; the one that resamples the
windows of the same data does not. ``pytest -s`` prints the rates (docs/explain.md quotes them).
"""
from __future__ import annotations

import numpy as np
import pytest

from wkvlab.eval.result import TokenArrays
from wkvlab.stats import paired_interval, resample
from wkvlab.stats.bootstrap import Units
from wkvlab.stats.decision import Effect, Margin, decide

DOCUMENTS, WINDOWS, TOKENS = 12, 4, 8  # windows per document, tokens per window


def _corpus(rng) -> tuple[dict, np.ndarray, np.ndarray, float]:
    """A paired difference per token: document difficulty (shared by its windows) + window + token noise."""
    truth = 0.05
    document = rng.normal(0.0, 0.04, DOCUMENTS)
    window = rng.normal(0.0, 0.01, (DOCUMENTS, WINDOWS))
    token = rng.normal(0.0, 0.02, (DOCUMENTS, WINDOWS, TOKENS))
    values = truth + document[:, None, None] + window[:, :, None] + token
    docs = np.repeat(np.arange(DOCUMENTS), WINDOWS * TOKENS)
    windows = np.repeat(np.arange(DOCUMENTS * WINDOWS), TOKENS)
    return {"d": values.ravel()}, docs, windows, truth


def _coverage(trials: int = 200, n_resamples: int = 400) -> dict[str, float]:
    rng = np.random.default_rng(20240624)
    hits = {"documents": 0, "windows": 0}
    for trial in range(trials):
        arrays, docs, windows, truth = _corpus(rng)
        for name, units in (("documents", Units(docs, "documents")), ("windows", Units(windows, "windows"))):
            iv = paired_interval(lambda m: m["d"], arrays, units)
            hits[name] += iv.low <= truth <= iv.high
    rates = {k: v / trials for k, v in hits.items()}
    print(f"\ncoverage of 95% intervals, {DOCUMENTS} documents × {WINDOWS} windows, document-level difficulty, {trials} trials: "
          + ", ".join(f"resampling {k} {v:.1%}" for k, v in rates.items()))
    return rates


def test_resampling_documents_covers_where_resampling_their_windows_does_not():
    rates = _coverage()
    assert rates["documents"] >= 0.88  # 12 documents, normal difficulty: near the 95% level
    assert rates["windows"] <= 0.80  # 48 "independent" windows: far too narrow (77.5% with the skew-robust t)
    assert rates["documents"] - rates["windows"] >= 0.15


def _arrays(documents):
    n = len(documents) * TOKENS
    rng = np.random.default_rng(0)
    return TokenArrays(kld=rng.exponential(0.01, n), nll_ref=np.ones(n), nll=np.ones(n), top1_agree=np.ones(n, bool),
                       delta_p=np.zeros(n), position=np.tile(np.arange(TOKENS), len(documents)),
                       window=np.repeat(np.arange(len(documents)), TOKENS),
                       document=None if documents is None else np.repeat(np.asarray(documents), TOKENS))


def test_token_arrays_resample_documents_when_they_have_them_and_say_so():
    several = _arrays([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])  # 12 windows of 6 documents
    iv = paired_interval(lambda m: m["k"], {"k": several.kld}, several.units)
    assert several.units.kind == "documents" and iv.n_units == 6 and not iv.decided
    assert "[no interval: 6 < 8 documents]" in f"{iv:.4f}"
    stream = TokenArrays(**{**several.__dict__, "document": None})  # one stream: its windows are the units
    assert stream.units.kind == "windows" and paired_interval(lambda m: m["k"], {"k": stream.kld}, stream.units).n_units == 12


def test_every_verdict_prints_its_unit_margin_family_and_method():
    arrays = _arrays(list(range(10)))
    draws = resample(lambda m: m["k"], {"k": arrays.kld}, arrays.units)
    v = decide([Effect("kld", draws, Margin.relative_to(0.01, "KLD(C)"))], family="test")[0]
    text = v.describe()
    assert "margin ±0.001 (10% of KLD(C) 0.01)" in text and "Holm over 1 test" in text
    assert "10 documents, skew-robust t" in text and "no Monte-Carlo error" in text
    assert v.to_dict()["resampling"].startswith("10 documents, skew-robust t")


def test_the_interval_takes_no_seed():
    """Issue #38: no Monte-Carlo verdicts. The interval is analytic: there is no seed to give, and every call gives
    the same bounds."""
    arrays = _arrays(list(range(10)))
    draw = lambda: paired_interval(lambda m: m["k"], {"k": arrays.kld}, arrays.units)  # noqa: E731
    assert draw() == draw()
    with pytest.raises(TypeError):
        paired_interval(lambda m: m["k"], {"k": arrays.kld}, arrays.units, seed=7)

