"""A finding's per-unit values: what its record keeps so that any verdict is decided again by today's rule.

Every interval of the additivity, methods and calibration findings is a function of token-weighted
means of per-token arrays, resampled by unit (document or window, :mod:`wkvlab.stats.bootstrap`):
the estimate from the units' sums over their tokens, the analytic interval from the statistic with
each unit left out in turn. Each unit's token count and its sums of each array are therefore all
the rule reads. The finding keeps them for every cell it compared (:func:`cells_record`, a few
kilobytes per cell, in the store's finding and so in ``docs/runs/findings-*.json``), and
:func:`redecide` rebuilds the cells from them and runs the finding's analysis again — the code the
run used, at today's commit, so a change to the rule (``src/wkvlab/stats/``, docs/stats.md)
re-decides a committed finding without measuring it again.

The rebuilt per-token arrays put each unit's mean on every token of that unit: every token-weighted
mean and every leave-one-unit-out mean equals the run's (to float rounding), which is all an
interval or verdict depends on. Per-token distributions (a p99, a position bucket) are not kept:
the search finding's two-stage design is not re-decided this way. The depth finding keeps each
document's mean KLD and reference NLL at every prefix over the same number of target tokens per
document, which gives the same sums (:func:`redecide_depth`).

**Replicates.** A finding measured with ``--replicates R`` keeps the per-unit values of every cell in
every replicate (format 2: each grid names its replicate), and :func:`redecide` pools them again as the
run did. A format-1 record (before replicates) holds one measurement: it is decided as one replicate.

A record written before these values existed keeps only intervals; :func:`redecide` refuses it in
one line that says to measure it again.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from wkvlab.errors import DataError
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.stats.bootstrap import per_unit, unit_labels

FORMAT = 2  # version of the per-unit block written: 2 names each grid's replicate
READS = (1, 2)  # versions read (1: one measurement, before replicates); a reader refuses any other
ARRAYS = ("kld", "nll", "nll_ref", "top1_agree", "delta_p")  # TokenArrays' per-token metrics
REDECIDED = ("additivity", "methods", "calibration")  # findings whose every interval is a function of unit sums
# the attention finding: its cross-term verdicts from the per-window means its rows keep (windows of equal length)
REDECIDED_VERDICTS = ("attention",)
# the depth findings: every interval from each document's means over its (equal) target tokens at every prefix length
REDECIDED_DEPTH = ("depth", "depth-long")
# what an EvalResult keeps besides its arrays, carried through the record unchanged
IDENTITY = ("model", "data", "ctx", "weights", "kv", "weights_spec", "kv_spec", "weight_bytes", "kv_bytes_per_token", "seconds",
            "fingerprints", "notes", "run", "threads", "quantized_fraction")


def unit_values(result: EvalResult) -> dict:
    """One cell: its identity and, per resampling unit, the token count and each metric's sum (sorted unit labels)."""
    units = result.arrays.units
    labels, kind = unit_labels(units)
    counts, sums = per_unit({name: getattr(result.arrays, name) for name in ARRAYS}, units)
    return {**{k: getattr(result, k) for k in IDENTITY}, "unit": kind, "labels": [int(x) for x in np.unique(labels)],
            "counts": [int(x) for x in counts], "sums": {k: [float(x) for x in v] for k, v in sums.items()}}


def result_from_units(cell: Mapping) -> EvalResult:
    """The cell as an :class:`EvalResult` whose per-token arrays hold each unit's mean on each of its tokens."""
    try:
        counts = np.asarray(cell["counts"], dtype=np.int64)
        labels = np.asarray(cell["labels"], dtype=np.int64)
        means = {k: np.repeat(np.asarray(cell["sums"][k], dtype=np.float64) / counts, counts) for k in ARRAYS}
        kind = cell["unit"]
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"a cell of the record has no readable per-unit values ({exc}); measure the finding again") from None
    if labels.shape != counts.shape or (counts < 1).any():
        raise DataError("a cell of the record has per-unit values of different lengths; measure the finding again")
    per_token = np.repeat(labels, counts)
    position = np.concatenate([np.arange(n) for n in counts]) if counts.size else np.zeros(0, np.int64)
    arrays = TokenArrays(**means, position=position,
                         window=per_token if kind != "documents" else np.repeat(np.arange(counts.size), counts),
                         document=per_token if kind == "documents" else None)
    return EvalResult(**{k: cell.get(k) for k in IDENTITY if k not in ("notes", "run", "fingerprints")}, arrays=arrays, buckets=[],
                      fingerprints=dict(cell.get("fingerprints") or {}), notes=list(cell.get("notes") or []), run=dict(cell.get("run") or {}))


def cells_record(grids: Mapping[tuple, list[EvalResult]], replicates: Sequence[Mapping[tuple, list[EvalResult]]] = ()) -> dict:
    """The per-unit block of a finding's data: each grid (its key, a tuple of names) in each replicate (0: ``grids``,
    r: ``replicates[r − 1]``) and the per-unit values of its cells."""
    return {"format": FORMAT, "grids": [{"key": list(key), "replicate": r, "cells": [unit_values(x) for x in results]}
                                        for r, run in enumerate([grids, *replicates]) for key, results in run.items()]}


def runs_from_record(data: Mapping, where: str = "the record") -> list[dict[tuple, list[EvalResult]]]:
    """The cells of every grid of a finding's data in each replicate (the first: the measurement itself), rebuilt
    from its per-unit block (DataError when it has none)."""
    block = data.get("units")
    if not block:
        raise DataError(f"{where} keeps intervals, not per-unit values (written before they were recorded), so its verdicts "
                        "cannot be decided again; measure the finding again (scripts/findings_record.py)")
    if block.get("format") not in READS:
        raise DataError(f"{where}: per-unit values of format {block.get('format')!r}, this wkvlab reads {' and '.join(map(str, READS))}; "
                        "measure the finding again with this checkout")
    runs: dict[int, dict] = {}
    for grid in block["grids"]:
        runs.setdefault(int(grid.get("replicate", 0)), {})[tuple(grid["key"])] = [result_from_units(c) for c in grid["cells"]]
    if sorted(runs) != list(range(len(runs))) or any(run.keys() != runs[0].keys() for run in runs.values()):
        raise DataError(f"{where}: its replicates do not each hold every grid (replicates {sorted(runs)}); measure the finding again")
    return [runs[r] for r in range(len(runs))]


def grids_from_record(data: Mapping, where: str = "the record") -> dict[tuple, list[EvalResult]]:
    """The cells of every grid of the measurement itself (replicate 0), rebuilt from the per-unit block."""
    return runs_from_record(data, where)[0]


def can_redecide(name: str, data: Mapping) -> bool:
    """Whether :func:`redecide` can decide this finding's data again (it keeps the values that needs)."""
    if name in REDECIDED_VERDICTS:
        return any((row.get("cross") or {}).get("per_window") for row in data.get("rows", []))
    if name in REDECIDED_DEPTH:
        return bool(data.get("per_document"))
    return name in REDECIDED and bool(data.get("units"))


def redecide(name: str, data: Mapping, margin=None, where: str = "the record") -> tuple[str, dict]:
    """(markdown, data) of finding ``name`` decided again by today's rule from the per-unit values in ``data``;
    ``margin``: the rule's --margin (default: the one the run stated, else today's default)."""
    from wkvlab.findings.run import analyse

    if name in REDECIDED_VERDICTS:
        return redecide_attention(data, margin, where)
    if name in REDECIDED_DEPTH:
        return redecide_depth(data, margin, where)
    if name not in REDECIDED:
        raise DataError(f"the {name} finding is not re-decided from per-unit values (only "
                        f"{', '.join(REDECIDED + REDECIDED_VERDICTS + REDECIDED_DEPTH)}); "
                        "measure it again")
    runs = runs_from_record(data, where)
    return analyse(name, runs[0], margin if margin is not None else data.get("margin", "10%"), runs[1:])


def redecide_attention(data: Mapping, margin=None, where: str = "the record") -> tuple[str, dict]:
    """The attention finding with its cross-term verdicts decided again by today's rule from the per-window means its
    record keeps for every (W, C) pair (each window's mean on each of its tokens: the windows are of equal length).
    The rows' energy shares keep the intervals the run stored: the record has no per-window energies."""
    from dataclasses import replace

    from wkvlab.explain.crossterm import ATTENTION_CELLS, CELLS, CrossTermData, cross_terms
    from wkvlab.findings.attention import AttentionRow
    from wkvlab.findings.render import attention_markdown

    pairs = []
    for row in data.get("rows", []):
        cross = row.get("cross")
        if not cross:
            continue
        means, windows, tokens = cross.get("per_window"), cross["windows"], cross["tokens"]
        if not means or not windows or tokens % windows:
            raise DataError(f"{where}: the {row['weights']} × {row['kv']} pair keeps no per-window means of equal windows, so its "
                            "verdicts cannot be decided again; measure the finding again")
        pairs.append((row["weights"], row["kv"], CrossTermData({c: [np.full(tokens // windows, v) for v in means[c]] for c in CELLS},
                                                                 {c: list(means[f"attention_{c}"]) for c in ATTENTION_CELLS})))
    if not pairs:
        raise DataError(f"{where} keeps no cross-term per-window means; measure the attention finding again")
    margin = margin if margin is not None else data.get("margin", "10%")
    crossed = {(x.weights, x.kv): x for x in cross_terms(pairs, family=f"attention finding: {len(pairs)} (W, C) pairs × 5 effects",
                                                         margin=margin)}
    rows = [replace(AttentionRow.from_dict(r), cross=crossed.get((r["weights"], r["kv"]))) for r in data["rows"]]
    return attention_markdown(rows), {"rows": [r.to_dict() for r in rows], "ctx": data.get("ctx"), "margin": str(margin)}


def depth_margin(data: Mapping) -> str:
    """The margin a depth run decided with, as ``--margin`` states it: its decided rows keep it (a share of the penalty
    at the shortest prefix, or an absolute one), else depth's pre-declared default."""
    from wkvlab.findings.depth import DEPTH_MARGIN
    from wkvlab.stats.decision import Margin

    for row in data.get("rows", []):
        if (row.get("decision") or {}).get("margin"):
            margin = Margin.from_dict(row["decision"]["margin"])
            return f"{margin.value:g}" if margin.stated else f"{100 * margin.relative:g}%"
    return DEPTH_MARGIN


def redecide_depth(data: Mapping, margin=None, where: str = "the record") -> tuple[str, dict]:
    """The depth finding (``depth``, ``depth-long``) decided again by today's rule from the per-document means its record
    keeps (``per_document``: each cache's mean KLD and the reference's mean NLL over each document's target tokens, at
    every prefix length). Every document is scored on the same ``target`` tokens, so a mean times ``target`` is the sum
    the run resampled; ``margin``: the rule's --margin (default: the one the run decided with)."""
    from wkvlab.findings.depth import LengthScores, depth_table
    from wkvlab.findings.render import identical_depth_markdown

    per, lengths, kvs = data.get("per_document") or {}, data.get("lengths") or [], list(dict.fromkeys(r["kv"] for r in data.get("rows", [])))
    documents, target = data.get("documents"), data.get("target")
    if not per or not lengths or not kvs or not documents or not target:
        raise DataError(f"{where} keeps no per-document values of the depth finding, so its verdicts cannot be decided again; "
                        "measure it again")
    if any(r.get("tokens") != documents * target for r in data["rows"]):
        raise DataError(f"{where}: its rows did not score {target} target tokens in each of its {documents} documents, so the "
                        f"per-document means do not give the sums the rule resamples; measure the depth finding again")
    counts = np.full(documents, float(target))

    def sums(name: str, length: int) -> np.ndarray:
        values = np.asarray((per.get(name) or {}).get(str(length), []), dtype=np.float64)
        if values.shape != (documents,):
            raise DataError(f"{where} keeps {values.size} per-document values of {name} at prefix {length}, not {documents}; "
                            "measure the depth finding again")
        return values * counts

    scores = {length: LengthScores(counts, sums("reference NLL", length), {kv: sums(kv, length) for kv in kvs}) for length in lengths}
    rule = margin if margin is not None else depth_margin(data)
    rows = depth_table(scores, margin=rule)
    again = {**data, "rows": [r.to_dict() for r in rows], "margin": str(rule)}
    return identical_depth_markdown(again), again


def factorial_record(cells: Mapping[str, EvalResult], replicates: Sequence[Mapping[str, EvalResult]] = ()) -> dict:
    """``wkvlab explain``'s four factorial cells (ref, w, c, wc) as a per-unit block, one grid per cell, in each replicate."""
    as_grids = lambda run: {(name,): [result] for name, result in run.items()}  # noqa: E731
    return cells_record(as_grids(cells), [as_grids(run) for run in replicates])


def redecide_factorial(units: Mapping, margin=None, where: str = "the record"):
    """``wkvlab explain``'s factorial (its KLD and NLL interaction verdicts) decided again by today's rule from
    the per-unit values of a record (:func:`factorial_record`), its replicates pooled; ``margin``: --margin (default 10%)."""
    from wkvlab.explain.factorial import factorial

    runs = [{key[0]: results[0] for key, results in run.items()} for run in runs_from_record({"units": units}, where)]
    return factorial(runs[0], margin=margin if margin is not None else "10%", replicates=runs[1:])


def dicts_with(data, keys: tuple[str, ...]) -> list[dict]:
    """Every dict inside a finding's data that has all of ``keys`` (intervals: low/high/n_units; verdicts:
    outcome/adjusted), depth first, the per-unit block left out."""
    found = []

    def walk(x) -> None:
        if isinstance(x, dict):
            if all(k in x for k in keys):
                found.append(x)
            for key, value in x.items():
                if key != "units":
                    walk(value)
        elif isinstance(x, list):
            for value in x:
                walk(value)
    walk(data)
    return found
