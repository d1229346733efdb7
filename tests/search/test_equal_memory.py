"""Rivals of a searched plan at exactly its budget: random and greedy mixes within one layer-format step, uniform only where one hits it."""
from __future__ import annotations

import numpy as np
import pytest

from wkvlab.search.allocate import allocate_exact
from wkvlab.search.baselines import (at_budget, budget_step, fill_to_budget, greedy_mix, plan_cost, random_mixes,
                                     uniform_at_budget)
from wkvlab.search.choices import choice_bytes, parse_choices

CHOICES = parse_choices("fp16,K8V8,K8V4,K4V4,K4V2")
PER = {c: choice_bytes(c, kv_heads=3, head_dim=64) for c in CHOICES}  # SmolLM2-135M's layers: 768 B/token at fp16
LAYERS = 30
COSTS = [[PER[c] for c in CHOICES] for _ in range(LAYERS)]
FP16 = PER[CHOICES[0]] * LAYERS


def _values(seed=0):
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0, 1, LAYERS)
    return [[b * w for w in (0.0, 0.01, 0.05, 0.2, 1.0)] for b in base]


@pytest.mark.parametrize("share", [0.22, 0.25, 0.28, 0.31, 0.34, 0.37, 0.40, 0.44, 0.48, 0.52])
def test_every_mix_spends_the_budget_within_one_step(share):
    budget, step = share * FP16, budget_step(COSTS)
    values = _values()
    mixes = [greedy_mix(values, COSTS, budget), *random_mixes(COSTS, budget, 5, seed=1)]
    dp = allocate_exact(values, COSTS, budget)
    mixes.append(fill_to_budget(dp.options, COSTS, budget, values))
    for options in mixes:
        spent = plan_cost(COSTS, options)
        assert at_budget(spent, budget, step), (share, spent, budget, step)
    if share > 0.23:  # at 22% only all-K4V2 fits (28 B of slack): one mix
        assert len(set(mixes[1:6])) > 1  # the random mixes differ


def test_filling_never_costs_predicted_quality_the_dp_had():
    values, budget = _values(3), 0.40 * FP16
    dp = allocate_exact(values, COSTS, budget)
    filled = fill_to_budget(dp.options, COSTS, budget, values)
    assert sum(values[l][o] for l, o in enumerate(filled)) <= dp.value + 1e-12  # costlier options are never predicted worse here


def test_uniform_only_where_one_hits_the_budget():
    plan_bytes = lambda plan: sum(PER[c] for c in plan)  # noqa: E731
    k8v4 = plan_bytes([CHOICES[2]] * LAYERS)
    assert uniform_at_budget(CHOICES, LAYERS, k8v4, plan_bytes) == CHOICES[2]
    assert uniform_at_budget(CHOICES, LAYERS, 1.015 * k8v4, plan_bytes) == CHOICES[2]  # inside ±2%
    assert uniform_at_budget(CHOICES, LAYERS, 0.33 * FP16, plan_bytes) is None  # K4V4 at 28% would spend 15% less


def test_a_budget_outside_the_formats_is_refused():
    with pytest.raises(ValueError, match="outside"):
        random_mixes(COSTS, 0.1 * FP16, 2)
    with pytest.raises(ValueError, match="over the budget"):
        fill_to_budget([0] * LAYERS, COSTS, 0.5 * FP16)
