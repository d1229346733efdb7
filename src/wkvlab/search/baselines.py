"""The configurations a searched plan must beat, built from the same allowed formats and budget.

* uniform: every layer in one allowed pair (fp16 included, as the reference point);
* skip first/last N: one quantized pair, the first and last N layers at fp16, with the largest N
  that fits the budget — the rule of thumb engines expose (vLLM ``--kv-cache-dtype-skip-layers``,
  llama.cpp users keeping the ends at higher precision) and the seed's "errors concentrate at both
  ends" in its simplest form;
* sinks-only: a uniform pair that fits, with the first 4 positions at fp16 (StreamingLLM /
  KVSink's observation that sink tokens carry the outliers); its bytes are the long-context limit
  (the sinks' extra 4 tokens amortize to nothing).

The KVTuner-style weight-unaware plan needs a second profile and is built in :mod:`wkvlab.search.api`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from wkvlab.kv.spec import KVSpec
from wkvlab.search.choices import FP16, Choice, choice_label

SINK_TOKENS = 4


@dataclass(frozen=True)
class Candidate:
    """A configuration to measure: its KV spec, and its per-layer plan when it has one."""

    name: str
    kind: str  # plan | uniform | skip-ends | sinks | unaware | reference
    spec: KVSpec
    plan: tuple | None = None  # per-layer choices (None: not a per-layer plan, e.g. sinks)
    keep_16bit: tuple = ()
    method: str = ""
    notes: tuple = field(default_factory=tuple)


def uniform_plan(choice: Choice, n_layers: int) -> tuple[Choice, ...]:
    return tuple([choice] * n_layers)


def skip_ends_plan(choice: Choice, n_layers: int, ends: int) -> tuple[Choice, ...]:
    return tuple(FP16 if i < ends or i >= n_layers - ends else choice for i in range(n_layers))


def baseline_candidates(choices: tuple[Choice, ...], n_layers: int, budget: float,
                        plan_bytes: Callable[[tuple[Choice, ...]], float]) -> list[Candidate]:
    out = []
    for choice in choices:
        plan = uniform_plan(choice, n_layers)
        kind = "reference" if choice == FP16 else "uniform"
        out.append(Candidate(f"uniform {choice_label(choice)}", kind, KVSpec(k=choice[0], v=choice[1]), plan))
    for choice in choices:
        if choice == FP16:
            continue
        best = 0
        for ends in range(1, n_layers // 2):
            if plan_bytes(skip_ends_plan(choice, n_layers, ends)) <= budget + 1e-9:
                best = ends
        if best:
            plan = skip_ends_plan(choice, n_layers, best)
            skip = tuple(i for i, c in enumerate(plan) if c == FP16)
            out.append(Candidate(f"{choice_label(choice)} + first/last {best} at fp16", "skip-ends",
                                 KVSpec(k=choice[0], v=choice[1], skip=skip), plan))
    for choice in choices:
        if choice != FP16 and plan_bytes(uniform_plan(choice, n_layers)) <= budget + 1e-9:
            out.append(Candidate(f"{choice_label(choice)} + sinks={SINK_TOKENS}", "sinks",
                                 KVSpec(k=choice[0], v=choice[1], sinks=SINK_TOKENS)))
    return out


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
