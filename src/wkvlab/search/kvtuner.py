"""KVTuner's own rule as a rival of a searched plan — approximate, because part of it is unpublished.

Source: github.com/cmd2001/KVTuner (the ICML 2025 paper's code), commit
babe775378e3df4dad414bdc72654db7280a13dc, ``search_optuna_adaptive.py``:

* ``STANDARD_KV_QUANT_CONFIG = ['KV8', 'K8V4', 'KV4', 'K4V2', 'KV2']`` — the (K, V) bit pairs a
  layer may take; 16 bits is not among them;
* ``LAYER_GROUPING_CONFIG`` — per model and quantization scheme, the layers split into 4–8 groups
  (the paper's offline *inter-layer clustering*), and ``SPECIAL_LAYERS`` — groups whose pair list
  was *pruned* differently (the paper's offline *intra-layer pair pruning*);
  ``prepare_layer_grouping_config`` refuses a grouping in which one pruned list splits a group;
* ``build_per_layer_config`` — every layer of group i takes group i's pair; the memory measure is
  ``tot_scale = Σ_groups (k_bits + v_bits)·|group| / (2·layers)``, the mean bits;
* ``objective`` / ``__main__`` — Optuna's NSGA-II sampler over one pair index per group, two
  objectives (GSM8K accuracy up, ``tot_scale`` down), the constraint ``tot_scale ≤
  max_per_layer_scale``, 100 trials, each trial a GSM8K run.

The groupings and pruned lists are constants for six models; the code that derived them is not
published (cmd2001/KVTuner issues #4, "Open-source the search-space pruning part for offline
calibration", and #6, "no open-source code about how to offline pair pruning and inter-layer
clustering", both open). So :func:`kvtuner_rule` rebuilds those two steps from the paper's
description on wkvlab's sensitivity profile, and the search step on the same predicted KLD the
searched plan uses:

1. **pruning** — per layer, a pair is dropped when another pair of the list costs no more bytes and
   no more predicted KLD (one of them strictly less);
2. **grouping** — only layers with the same pruned list can share a group (KVTuner's own check);
   starting from one group per layer, the two groups whose centroids are nearest are merged
   (Euclidean distance of the per-pair ``log10(max(predicted KLD, 1e-6))`` vectors; ties: the pair
   with the lowest first layers) until :data:`GROUPS` groups are left or none can merge;
3. **search** — one pair per group from its pruned list, the least summed predicted KLD whose bytes
   fit the budget, exactly (:func:`~wkvlab.search.allocate.allocate_exact` over groups). KVTuner
   samples 100 measured NSGA-II trials instead; here the optimum of the predicted objective stands
   in for the best trial, and bytes (scales included) stand in for mean bits;
4. like every rival in ``wkvlab search``, the plan is then filled to the budget layer by layer
   (:func:`~wkvlab.search.baselines.fill_to_budget`, over KVTuner's pair list), so it spends the
   budget within one layer-format step; a filled layer may leave its group's pair.

16-bit layers enter only when the budget is above what the quantized pairs can spend.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from wkvlab.search.allocate import allocate_exact
from wkvlab.search.baselines import fill_to_budget

SOURCE = "github.com/cmd2001/KVTuner@babe775 search_optuna_adaptive.py"
GROUPS = 6  # KVTuner's published groupings have 4-8 groups (LAYER_GROUPING_CONFIG)
FLOOR = 1e-6  # predicted KLD below this counts as this (log of 0)


@dataclass(frozen=True)
class KVTunerPlan:
    options: tuple[int, ...]  # per layer, an index into the option list (after filling to the budget)
    grouped: tuple[int, ...]  # per layer, the group's pair before filling
    groups: tuple[tuple[int, ...], ...]  # layers of each group, by first layer
    pruned: tuple[tuple[int, ...], ...]  # per layer, the option indices pruning kept


def prune(values: list[float], costs: list[float], allowed) -> tuple[int, ...]:
    """The options of one layer that no other allowed option dominates on (bytes, predicted KLD)."""
    keep = []
    for o in allowed:
        dominated = any(costs[p] <= costs[o] and values[p] <= values[o] and (costs[p] < costs[o] or values[p] < values[o])
                        for p in allowed if p != o)
        if not dominated:
            keep.append(o)
    return tuple(keep)


def group_layers(values: list[list[float]], pruned, allowed, groups: int = GROUPS) -> tuple[tuple[int, ...], ...]:
    """Agglomerative grouping (see the module docstring, step 2); groups sorted by their first layer."""
    features = [[math.log10(max(values[l][o], FLOOR)) for o in allowed] for l in range(len(values))]
    clusters = [[l] for l in range(len(values))]

    def centroid(c):
        return [sum(features[l][j] for l in c) / len(c) for j in range(len(allowed))]

    while len(clusters) > groups:
        cents = [centroid(c) for c in clusters]
        best = None
        for i in range(len(clusters)):
            for j in range(i + 1, len(clusters)):
                if pruned[clusters[i][0]] != pruned[clusters[j][0]]:
                    continue
                d = math.dist(cents[i], cents[j])
                key = (d, min(clusters[i]), min(clusters[j]))
                if best is None or key < best[0]:
                    best = (key, i, j)
        if best is None:
            break
        _, i, j = best
        clusters[i] = sorted(clusters[i] + clusters[j])
        del clusters[j]
    return tuple(tuple(c) for c in sorted(clusters, key=min))


def kvtuner_rule(values: list[list[float]], costs: list[list[float]], budget: float, allowed, *,
                 groups: int = GROUPS) -> KVTunerPlan | None:
    """KVTuner's pruning, grouping and constrained search on predicted KLD (None: nothing fits).

    ``values[l][o]`` / ``costs[l][o]``: predicted KLD and bytes of option o at layer l (as in
    :mod:`wkvlab.search.allocate`); ``allowed``: the option indices KVTuner's pair list has. When the
    budget is above every layer at its costliest allowed option, every option may be used."""
    allowed = tuple(allowed)
    if sum(max(costs[l][o] for o in allowed) for l in range(len(costs))) < budget - 1e-9:
        allowed = tuple(range(len(costs[0])))
    pruned = tuple(prune(values[l], costs[l], allowed) for l in range(len(values)))
    grouping = group_layers(values, pruned, allowed, groups)
    lists = [pruned[g[0]] for g in grouping]
    g_values = [[sum(values[l][o] for l in g) for o in opts] for g, opts in zip(grouping, lists)]
    g_costs = [[sum(costs[l][o] for l in g) for o in opts] for g, opts in zip(grouping, lists)]
    alloc = allocate_exact(g_values, g_costs, budget)
    if alloc is None:
        return None
    grouped = [0] * len(values)
    for g, opts, pick in zip(grouping, lists, alloc.options):
        for l in g:
            grouped[l] = opts[pick]
    # fill over the allowed options only: sub-matrices, mapped back
    sub_costs = [[costs[l][o] for o in allowed] for l in range(len(costs))]
    sub_values = [[values[l][o] for o in allowed] for l in range(len(values))]
    filled = fill_to_budget([allowed.index(o) for o in grouped], sub_costs, budget, sub_values)
    return KVTunerPlan(tuple(allowed[i] for i in filled), tuple(grouped), grouping, pruned)


__all__ = ["KVTunerPlan", "kvtuner_rule", "prune", "group_layers", "SOURCE", "GROUPS"]
