"""`wkvlab search`'s rivals at equal memory, on SmolLM2-135M-shaped costs (30 layers, 3 KV heads of 64) and synthetic
sensitivities: every plan and rival spends the budget within one layer-format step, a uniform format only within ±2%."""
from __future__ import annotations

import numpy as np
import pytest

from wkvlab.search.api import plan_candidates, rival_candidates
from wkvlab.search.baselines import at_budget, budget_step
from wkvlab.search.choices import FP16, choice_bytes, parse_choices

CHOICES = parse_choices(None)  # fp16, K8V8, K8V4, K4V4, K4V2, K2V2
PER = {c: choice_bytes(c, kv_heads=3, head_dim=64) for c in CHOICES}
LAYERS = 30
COSTS = [[PER[c] for c in CHOICES] for _ in range(LAYERS)]
STEP = budget_step(COSTS)
FP16_BYTES = PER[FP16] * LAYERS


def _values(seed):
    base = np.random.default_rng(seed).lognormal(0, 1, LAYERS)
    return [[0.0, *(b * w for w in (0.004, 0.02, 0.06, 0.4, 4.0))] for b in base]


def _all(budget, **kw):
    aware, unaware = _values(0), _values(1)
    plans = plan_candidates(aware, COSTS, [(c, False) for c in CHOICES], budget, candidates=kw.pop("candidates", 1))
    rivals, notes, uniform = rival_candidates(CHOICES, PER, LAYERS, budget, aware, unaware, kvtuner_values=unaware, **kw)
    return plans, rivals, notes, uniform


def test_smollm2_shape():
    assert FP16_BYTES == 23_040 and PER[CHOICES[2]] * LAYERS == 9_180 and STEP == 372  # the fp16 − K8V8 step of one layer


@pytest.mark.parametrize("budget", [4000, 5040, 5500, 6480, 7000, 8000, 9050, 9180, 10500, 12000, 15000])
def test_every_plan_and_rival_spends_the_budget_within_one_step(budget):
    plans, rivals, notes, uniform = _all(budget)
    assert [c.kind for c in plans] == ["plan"]
    kinds = [c.kind for c in rivals]
    assert kinds[:3] == ["greedy", "unaware", "kvtuner"] and kinds.count("random") == 5
    for cand in plans + rivals:
        spent = cand.spec.bytes_per_token(layers=LAYERS, kv_heads=3, head_dim=64)
        assert cand.budget == budget
        if cand.kind == "uniform":
            assert abs(spent - budget) <= 0.02 * budget
        else:
            assert at_budget(spent, budget, STEP), (cand.name, spent, budget)
    # a uniform rival exactly where one is within ±2%: K4V2 5,040, K4V4 6,480, K8V4 9,180 (9,050: K8V4 is +1.4%), K8V8 11,880 (12,000: −1.0%)
    nearest = {4000: "", 5040: "K4V2", 5500: "", 6480: "K4V4", 7000: "", 8000: "", 9050: "K8V4", 9180: "K8V4", 10500: "",
               12000: "K8V8", 15000: ""}
    assert uniform == nearest[budget]
    assert ("uniform" in kinds) == bool(uniform)
    if not uniform:
        assert any(n.startswith("no uniform format within ±2% of the budget (nearest: ") for n in notes)


def test_more_candidates_are_distinct_plans_at_the_same_budget():
    plans, *_ = _all(8000, candidates=4)
    assert len(plans) >= 2 and len({c.plan for c in plans}) == len(plans)
    assert all(at_budget(c.spec.bytes_per_token(layers=LAYERS, kv_heads=3, head_dim=64), 8000, STEP) for c in plans)


def test_no_rival_at_or_above_the_16_bit_cache():
    _, rivals, notes, uniform = _all(FP16_BYTES)
    assert rivals == [] and uniform == "" and "16-bit cache" in notes[0]


def test_switches():
    _, rivals, _, _ = _all(8000, random_mixes=0)
    assert "random" not in [c.kind for c in rivals]
    rivals, _, _ = rival_candidates(CHOICES, PER, LAYERS, 8000, _values(0))
    assert [c.kind for c in rivals].count("unaware") == 0 and "kvtuner" not in [c.kind for c in rivals]
