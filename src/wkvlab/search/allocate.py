"""Per-layer assignment under a memory budget: exact multiple-choice knapsack DP, and greedy.

Pure functions on plain numbers: ``values[l][o]`` is what option ``o`` of layer ``l`` costs in
predicted KLD, ``costs[l][o]`` what it costs in bytes; exactly one option per layer is chosen, the
sum of costs must not exceed ``budget`` and the sum of values is minimized.

The DP runs on integer cost units. When every cost is a multiple of 1/8 byte (true of every KV
format here) and the budget spans at most :data:`MAX_CELLS` units, it is exact. Otherwise costs
are rounded *up* to a unit of budget/MAX_CELLS: the result always fits the real budget and loses
at most ``layers × unit`` bytes of it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

MAX_CELLS = 200_000


@dataclass(frozen=True)
class Allocation:
    options: tuple[int, ...]  # chosen option index per layer
    value: float
    cost: float
    method: str = "exact"


def _check(values: list[list[float]], costs: list[list[float]]) -> None:
    if len(values) != len(costs) or any(len(v) != len(c) or not v for v, c in zip(values, costs)):
        raise ValueError("values and costs need the same non-empty option lists per layer")


def _unit(costs: list[list[float]], budget: float) -> tuple[float, bool]:
    for q in (1, 2, 4, 8):
        if all(abs(c * q - round(c * q)) < 1e-9 for row in costs for c in row) and budget * q <= MAX_CELLS:
            return 1.0 / q, True
    return max(budget / MAX_CELLS, 1e-12), False


def _total(values, costs, options) -> tuple[float, float]:
    return (sum(values[l][o] for l, o in enumerate(options)), sum(costs[l][o] for l, o in enumerate(options)))


def allocate_exact(values: list[list[float]], costs: list[list[float]], budget: float) -> Allocation | None:
    """The assignment with the least total value whose total cost fits ``budget`` (None: nothing fits)."""
    _check(values, costs)
    if budget < 0:
        return None
    unit, exact = _unit(costs, budget)
    cells = int(math.floor(budget / unit + 1e-9))
    units = [[int(round(c / unit)) if exact else int(math.ceil(c / unit - 1e-9)) for c in row] for row in costs]
    # best[c] = least value of the layers so far with total cost <= c units
    best = np.zeros(cells + 1)
    choice = np.zeros((len(values), cells + 1), dtype=np.int32)
    for layer, (vals, cost_units) in enumerate(zip(values, units)):
        new = np.full(cells + 1, np.inf)
        pick = np.full(cells + 1, -1, dtype=np.int32)
        for option, (value, cu) in enumerate(zip(vals, cost_units)):
            if cu > cells:
                continue
            candidate = np.full(cells + 1, np.inf)
            candidate[cu:] = best[: cells + 1 - cu] + value
            better = candidate < new
            new[better], pick[better] = candidate[better], option
        best, choice[layer] = new, pick
    if not np.isfinite(best[cells]):
        return None
    options = []
    c = cells
    for layer in range(len(values) - 1, -1, -1):
        option = int(choice[layer, c])
        options.append(option)
        c -= units[layer][option]
    options.reverse()
    value, cost = _total(values, costs, options)
    return Allocation(tuple(options), value, cost, "exact" if exact else f"exact (costs rounded up to {unit:.3g} B)")


def allocate_greedy(values: list[list[float]], costs: list[list[float]], budget: float) -> Allocation | None:
    """Start from each layer's cheapest option; repeatedly take the upgrade with the best value saved
    per byte that still fits (the classic convex-hull heuristic, what most mixed-precision tools do)."""
    _check(values, costs)
    current = [min(range(len(row)), key=lambda o, r=row, v=vals: (r[o], v[o])) for row, vals in zip(costs, values)]
    spent = sum(costs[l][o] for l, o in enumerate(current))
    if spent > budget + 1e-9:
        return None
    while True:
        best, best_ratio = None, 0.0
        for layer, (vals, row) in enumerate(zip(values, costs)):
            now = current[layer]
            for option in range(len(row)):
                gain, extra = vals[now] - vals[option], row[option] - row[now]
                if gain <= 0 or spent + extra > budget + 1e-9:
                    continue
                ratio = math.inf if extra <= 0 else gain / extra
                if best is None or ratio > best_ratio:
                    best, best_ratio = (layer, option, extra), ratio
        if best is None:
            break
        layer, option, extra = best
        current[layer] = option
        spent += extra
    value, cost = _total(values, costs, current)
    return Allocation(tuple(current), value, cost, "greedy")


def allocate_brute(values: list[list[float]], costs: list[list[float]], budget: float) -> Allocation | None:
    """Every assignment (small cases only): the reference the DP is tested against."""
    _check(values, costs)
    best = None
    for options in itertools.product(*(range(len(row)) for row in values)):
        value, cost = _total(values, costs, options)
        if cost <= budget + 1e-9 and (best is None or value < best.value - 1e-12):
            best = Allocation(tuple(options), value, cost, "brute")
    return best


def candidate_allocations(values: list[list[float]], costs: list[list[float]], budget: float, count: int = 4) -> list[Allocation]:
    """Distinct plans worth measuring: the DP optimum, greedy's, and DP optima at slightly smaller
    budgets (they trade a little predicted quality for margin against the predictor's errors)."""
    found: dict[tuple[int, ...], Allocation] = {}
    for alloc in [allocate_exact(values, costs, budget), allocate_greedy(values, costs, budget)]:
        if alloc is not None and alloc.options not in found:
            found[alloc.options] = alloc
    step = 0
    while len(found) < count and step < 4 * count:
        step += 1
        alloc = allocate_exact(values, costs, budget * (1 - 0.02 * step))
        if alloc is None:
            break
        if alloc.options not in found:
            found[alloc.options] = Allocation(alloc.options, alloc.value, alloc.cost, f"exact at {100 - 2 * step}% of the budget")
    return list(found.values())
