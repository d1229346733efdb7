"""The allocator against brute force on small cases, and its budget guarantee."""
import random

import pytest

from wkvlab.search.allocate import allocate_brute, allocate_exact, allocate_greedy, candidate_allocations


def _case(seed: int, layers: int, options: int, integral: bool):
    rng = random.Random(seed)
    costs = [[(rng.randint(1, 12) if integral else rng.uniform(0.5, 12.0)) for _ in range(options)] for _ in range(layers)]
    values = [[rng.uniform(0, 1) for _ in range(options)] for _ in range(layers)]
    total_min = sum(min(r) for r in costs)
    total_max = sum(max(r) for r in costs)
    return values, costs, rng.uniform(total_min, total_max)


@pytest.mark.parametrize("seed", range(25))
def test_exact_matches_brute_force_on_integer_costs(seed):
    values, costs, budget = _case(seed, layers=4, options=3 + seed % 3, integral=True)
    exact, brute = allocate_exact(values, costs, budget), allocate_brute(values, costs, budget)
    assert brute is not None and exact is not None
    assert exact.value == pytest.approx(brute.value, abs=1e-12)
    assert exact.cost <= budget


@pytest.mark.parametrize("seed", range(5))
def test_float_costs_always_fit_and_are_near_optimal(seed):
    values, costs, budget = _case(100 + seed, layers=4, options=4, integral=False)
    exact, brute = allocate_exact(values, costs, budget), allocate_brute(values, costs, budget)
    assert exact.cost <= budget + 1e-9
    # rounding costs up by at most budget/MAX_CELLS per layer can only cost optimality at the margin
    assert exact.value >= brute.value - 1e-12
    tighter = allocate_brute(values, costs, budget - 4 * budget / 200_000)
    assert exact.value <= tighter.value + 1e-12


@pytest.mark.parametrize("seed", range(20))
def test_greedy_fits_and_is_never_better_than_exact(seed):
    values, costs, budget = _case(200 + seed, layers=5, options=4, integral=True)
    greedy, exact = allocate_greedy(values, costs, budget), allocate_exact(values, costs, budget)
    assert greedy.cost <= budget and greedy.value >= exact.value - 1e-12


def test_hand_case():
    # two layers, options (cost, value): layer 0 is sensitive, layer 1 is not; budget buys one upgrade
    costs = [[1, 4], [1, 4]]
    values = [[1.0, 0.0], [0.1, 0.0]]
    alloc = allocate_exact(values, costs, 5)
    assert alloc.options == (1, 0) and alloc.value == pytest.approx(0.1) and alloc.cost == 5
    assert allocate_greedy(values, costs, 5).options == (1, 0)


def test_nothing_fits():
    assert allocate_exact([[0.0, 1.0]], [[3, 2]], 1) is None
    assert allocate_greedy([[0.0, 1.0]], [[3, 2]], 1) is None


def test_candidates_are_distinct_and_fit():
    values, costs, budget = _case(7, layers=6, options=4, integral=True)
    found = candidate_allocations(values, costs, budget, count=4)
    assert len({a.options for a in found}) == len(found) >= 1
    assert all(a.cost <= budget for a in found)
    assert found[0].value == pytest.approx(allocate_brute(values, costs, budget).value)
