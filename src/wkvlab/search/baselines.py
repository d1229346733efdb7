"""The rivals a searched plan must beat at its own budget, and what "at the budget" means.

``wkvlab search`` and ``wkvlab findings search`` compare a plan only with configurations that spend
the same memory (issue #24 item 6): per-layer mixes filled to the budget within one layer-format step
(:func:`fill_to_budget`: the greedy allocator's mix, random mixes), a uniform format only where its
bytes are within ±:data:`UNIFORM_TOLERANCE` of the budget. The weight-unaware plan needs a second
profile and KVTuner's rule its own module (:mod:`wkvlab.search.kvtuner`); both are built in
:mod:`wkvlab.search.api`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from wkvlab.kv.spec import KVSpec
from wkvlab.search.choices import Choice


@dataclass(frozen=True)
class Candidate:
    """A configuration to measure: its KV spec, its per-layer plan, the budget it was built for."""

    name: str
    kind: str  # plan | greedy | unaware | kvtuner | random | uniform | reference
    spec: KVSpec
    plan: tuple | None = None  # per-layer choices
    keep_16bit: tuple = ()
    method: str = ""
    notes: tuple = field(default_factory=tuple)
    budget: float = math.nan  # bytes per token (NaN: the reference, built for no budget)


def uniform_plan(choice: Choice, n_layers: int) -> tuple[Choice, ...]:
    return tuple([choice] * n_layers)


# --- plans at equal memory (issue #24 item 6) -------------------------------------------------
# Every comparison of a searched plan is made at the budget itself: a rival that spends less is
# not a rival. On plain numbers as in :mod:`wkvlab.search.allocate` (``costs[l][o]``: bytes of
# option o at layer l), a plan is *at* a budget when it spends at most the budget and less than one
# layer-format step below it — no layer could move to a costlier option and still fit.

UNIFORM_TOLERANCE = 0.02  # a uniform format is "at" a budget when its bytes are within ±2% of it


def budget_step(costs: list[list[float]]) -> float:
    """One layer-format step: the largest gap between consecutive distinct option costs of any layer."""
    gaps = [b - a for row in costs for a, b in zip(sorted(set(row)), sorted(set(row))[1:])]
    return max(gaps, default=0.0)


def plan_cost(costs: list[list[float]], options) -> float:
    return float(sum(costs[l][o] for l, o in enumerate(options)))


def at_budget(spent: float, budget: float, step: float) -> bool:
    """Within one step under the budget, never over it."""
    return budget - step - 1e-9 < spent <= budget + 1e-9


def fill_to_budget(options, costs: list[list[float]], budget: float, values: list[list[float]] | None = None,
                   rng=None) -> tuple[int, ...]:
    """Move layers to costlier options until none fits: with ``values`` the move that costs the least
    predicted KLD per byte (ties: fewer bytes), with ``rng`` a random fitting move, else the cheapest.

    It stops only when no layer can move up within ``budget``, so the slack is below every layer's
    next step, i.e. below :func:`budget_step` (or every layer is at its costliest option)."""
    current = list(options)
    spent = plan_cost(costs, current)
    if spent > budget + 1e-9:
        raise ValueError(f"the plan spends {spent:g} B, over the budget {budget:g} B")
    while True:
        moves = [(l, o) for l, row in enumerate(costs) for o in range(len(row))
                 if row[o] > row[current[l]] and spent + row[o] - row[current[l]] <= budget + 1e-9]
        if not moves:
            return tuple(current)
        if rng is not None:
            layer, option = moves[int(rng.integers(len(moves)))]
        elif values is not None:
            layer, option = min(moves, key=lambda m: ((values[m[0]][m[1]] - values[m[0]][current[m[0]]])
                                                      / (costs[m[0]][m[1]] - costs[m[0]][current[m[0]]]), costs[m[0]][m[1]]))
        else:
            layer, option = min(moves, key=lambda m: costs[m[0]][m[1]] - costs[m[0]][current[m[0]]])
        spent += costs[layer][option] - costs[layer][current[layer]]
        current[layer] = option


def cheapest(costs: list[list[float]]) -> tuple[int, ...]:
    return tuple(min(range(len(row)), key=row.__getitem__) for row in costs)


def check_reachable(costs: list[list[float]], budget: float) -> None:
    low, high = plan_cost(costs, cheapest(costs)), sum(max(row) for row in costs)
    if not low <= budget + 1e-9 or budget > high + 1e-9:
        raise ValueError(f"budget {budget:g} B is outside what the formats can spend ({low:g}–{high:g} B)")


def greedy_mix(values: list[list[float]], costs: list[list[float]], budget: float) -> tuple[int, ...]:
    """The classic greedy allocator (:func:`~wkvlab.search.allocate.allocate_greedy`), filled to the budget."""
    from wkvlab.search.allocate import allocate_greedy

    check_reachable(costs, budget)
    alloc = allocate_greedy(values, costs, budget)
    return fill_to_budget(alloc.options, costs, budget, values)


def random_mixes(costs: list[list[float]], budget: float, count: int, seed: int = 0) -> list[tuple[int, ...]]:
    """``count`` random per-layer mixes at the budget: from every layer's cheapest option, random
    fitting moves up until none fits (each mix at the budget within one step)."""
    import numpy as np

    check_reachable(costs, budget)
    rng = np.random.default_rng([seed, count, len(costs)])
    return [fill_to_budget(cheapest(costs), costs, budget, rng=rng) for _ in range(count)]


def uniform_at_budget(choices: tuple[Choice, ...], n_layers: int, budget: float,
                      plan_bytes: Callable[[tuple[Choice, ...]], float],
                      tolerance: float = UNIFORM_TOLERANCE) -> Choice | None:
    """The uniform format whose bytes are closest to ``budget`` when within ±``tolerance`` of it (else None:
    no uniform at this budget). fp16 counts only at a budget of the whole 16-bit cache."""
    near = [(abs(plan_bytes(uniform_plan(c, n_layers)) - budget), c) for c in choices]
    near = [(gap, c) for gap, c in near if gap <= tolerance * budget + 1e-9]
    return min(near, key=lambda x: x[0])[1] if near else None
