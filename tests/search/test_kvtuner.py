"""KVTuner's rule (approximate, src/wkvlab/search/kvtuner.py) on a hand-made sensitivity table and on SmolLM2-shaped costs."""
from __future__ import annotations

import numpy as np
import pytest

from wkvlab.search.baselines import at_budget, budget_step, plan_cost
from wkvlab.search.choices import choice_bytes, parse_choices
from wkvlab.search.kvtuner import group_layers, kvtuner_rule, prune

# 4 layers; options 0, 1, 2 (KVTuner's pairs, 1/2/3 B) and 3 (16-bit, 6 B, not a KVTuner pair)
COSTS = [[1.0, 2.0, 3.0, 6.0] for _ in range(4)]
VALUES = [
    [1.0, 0.1, 0.01, 0.0],  # layer 0: log10 features (0, -1, -2)
    [1.0, 0.1, 0.01, 0.0],  # layer 1: the same as layer 0
    [0.001, 0.001, 0.0001, 0.0],  # layer 2: option 1 costs more than option 0 for the same KLD -> pruned
    [0.01, 0.001, 0.0001, 0.0],  # layer 3: (-2, -3, -4)
]
ALLOWED = (0, 1, 2)


def test_pruning_drops_the_dominated_pair():
    assert prune(VALUES[2], COSTS[2], ALLOWED) == (0, 2)
    assert prune(VALUES[0], COSTS[0], ALLOWED) == (0, 1, 2)


def test_grouping_by_hand():
    pruned = [prune(v, c, ALLOWED) for v, c in zip(VALUES, COSTS)]
    # layers 0 and 1 are at distance 0: merged first; then {0,1} and 3 (distance sqrt(12)); layer 2's pruned list differs,
    # so it can never join them
    assert group_layers(VALUES, pruned, ALLOWED, groups=2) == ((0, 1, 3), (2,))
    assert group_layers(VALUES, pruned, ALLOWED, groups=1) == ((0, 1, 3), (2,))  # no merge across pruned lists
    assert group_layers(VALUES, pruned, ALLOWED, groups=4) == ((0,), (1,), (2,), (3,))


def test_rule_by_hand_at_8_bytes():
    plan = kvtuner_rule(VALUES, COSTS, 8.0, ALLOWED, groups=2)
    # group {0,1,3}: option 1 costs 6 B for 0.201, group {2}: option 0 costs 1 B for 0.001 -> 7 B, 0.202 (the best that fits 8)
    assert plan.groups == ((0, 1, 3), (2,))
    assert plan.grouped == (1, 1, 0, 1)
    # filled: the last byte goes to the move with the least predicted KLD per byte, layer 0 to option 2 (-0.09 per B;
    # layer 1's equal move loses the tie by order)
    assert plan.options == (2, 1, 0, 1)
    assert plan_cost(COSTS, plan.options) == 8.0


def test_rule_by_hand_at_the_top_of_the_pairs_and_above():
    assert kvtuner_rule(VALUES, COSTS, 12.0, ALLOWED, groups=2).options == (2, 2, 2, 2)  # every layer at its best pair
    above = kvtuner_rule(VALUES, COSTS, 15.0, ALLOWED, groups=2)  # more than the pairs can spend: 16 bits may enter
    assert plan_cost(COSTS, above.options) == 15.0 and 3 in above.options
    assert kvtuner_rule(VALUES, COSTS, 3.0, ALLOWED, groups=2) is None  # under 4 x 1 B: nothing fits


CHOICES = parse_choices("fp16,K8V8,K8V4,K4V4,K4V2,K2V2")
PER = {c: choice_bytes(c, kv_heads=3, head_dim=64) for c in CHOICES}  # SmolLM2-135M: 30 layers, 3 KV heads of 64
LAYERS = 30
SMOL_COSTS = [[PER[c] for c in CHOICES] for _ in range(LAYERS)]
FP16 = PER[CHOICES[0]] * LAYERS


@pytest.mark.parametrize("share", [0.16, 0.22, 0.28, 0.34, 0.40, 0.46, 0.52, 0.70])
def test_rule_spends_the_budget_within_one_step_on_smollm2_costs(share):
    rng = np.random.default_rng(7)
    base = rng.lognormal(0, 1, LAYERS)
    values = [[0.0, *(b * w for w in (0.005, 0.02, 0.05, 0.3, 3.0))] for b in base]
    budget = share * FP16
    plan = kvtuner_rule(values, SMOL_COSTS, budget, range(1, len(CHOICES)))
    assert at_budget(plan_cost(SMOL_COSTS, plan.options), budget, budget_step(SMOL_COSTS))
    assert len(plan.groups) <= 6 and sorted(l for g in plan.groups for l in g) == list(range(LAYERS))
    assert (0 in plan.options) == (share > PER[CHOICES[1]] * LAYERS / FP16)  # fp16 only above all-K8V8
