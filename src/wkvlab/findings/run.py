"""Run a finding: its sweeps into a results store (resumable), then its analysis.

A finding's sweeps are ordinary sweeps (:mod:`wkvlab.sweep`): a config already in the store — from
an earlier, interrupted run of the finding, from ``wkvlab sweep``, or from ``wkvlab eval --store``
— is not run again. The analysis reads the per-token arrays back from the store.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Sequence

from wkvlab.errors import ConfigError
from wkvlab.findings import FINDINGS, analysis, grids, render
from wkvlab.stats.decision import DEFAULT_MARGIN


def torch_threads() -> int:
    """The threads this run chose (``--threads``/``WKVLAB_THREADS``), for llama.cpp too."""
    import torch

    return torch.get_num_threads()

ProgressFactory = Callable[..., ContextManager]  # (total steps, title[, grid=...]) -> context yielding tick(desc, n)


@contextmanager
def _silent(_total: int, _title: str, grid=None):
    yield lambda _desc, _n: None


@dataclass
class Finding:
    name: str
    model: str
    markdown: str
    data: dict
    seconds: float
    commands: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "model": self.model, "data": self.data, "seconds": self.seconds, "markdown": self.markdown,
                "commands": self.commands}


def _run_sweeps(specs, store: Path, progress: ProgressFactory) -> list[list]:
    """Run each spec into the store and return its results, in each spec's config order."""
    from wkvlab.store import open_store
    from wkvlab.sweep.run import plan_sweep, run_sweep

    out = []
    with open_store(store) as db:
        for spec in specs:
            plan = plan_sweep(spec, db)
            with progress(plan.steps, f"{spec.name}: {len(plan.missing)} of {len(plan.configs)} configs to run",
                          grid=[task.grid for task in plan.tasks]) as tick:
                report = run_sweep(spec, db, progress=tick, plan=plan)
            out.append(db.results(report.config_ids))
    return out


def analyse(name: str, cells: dict[tuple, list], margin, replicates: Sequence[dict[tuple, list]] = ()) -> tuple[str, dict]:
    """(markdown, data) of the additivity, methods or calibration finding from its grids' results
    (``cells``: one grid under ``("grid",)``; calibration: ``(calibration text, evaluation data)`` → grid);
    ``replicates``: the same grids measured again, pooled into every interval (:mod:`wkvlab.findings.analysis`).

    The data keep every cell's per-unit values in every replicate (:mod:`wkvlab.findings.records`), so the
    verdicts can be decided again from a run record by :func:`wkvlab.findings.records.redecide`, which calls this."""
    from wkvlab.findings.records import cells_record
    from wkvlab.stats.decision import MarginRule

    rule = MarginRule.parse(margin)
    again = [run[("grid",)] for run in replicates] if name in ("additivity", "methods") else replicates
    if name == "additivity":
        rows = analysis.additivity(cells[("grid",)], margin=rule, replicates=again)
        markdown, data = render.additivity_markdown(rows), {"rows": [r.to_dict() for r in rows]}
    elif name == "methods":
        results = cells[("grid",)]
        rows = analysis.penalties(results, margin=rule, replicates=again)
        differences = analysis.method_differences(results, margin=rule, replicates=again)
        markdown = render.penalty_markdown(rows) + "\n\n" + render.method_differences_markdown(differences)
        data = {"rows": [r.to_dict() for r in rows], "differences": [d.to_dict() for d in differences]}
    elif name == "calibration":
        rows = analysis.calibration(cells, margin=rule, replicates=again)
        markdown, data = render.calibration_markdown(rows), {"rows": [r.to_dict() for r in rows]}
    else:
        raise ConfigError(f"the {name} finding is not analysed from grids of results; use one of additivity, methods, calibration")
    return markdown, {**data, "margin": str(rule), "replicates": 1 + len(replicates), "units": cells_record(cells, replicates)}


def run_finding(name: str, *, model: str = "default", store: str | Path = "out/findings.db", tokens: int | None = None,
                ctx: int | None = None, device: str = "auto", dtype: str = "auto", progress: ProgressFactory = _silent,
                margin=None, replicates: int | None = None) -> Finding:
    """Measure (or read back) one finding on ``model`` and analyse it (``ctx``/``tokens`` override its size);
    ``margin``: the decision rule's ``--margin`` (None: each finding's default, 10% but for depth's pre-declared 5%);
    ``replicates``: how many times the additivity, methods and calibration grids are measured (replicate r ≥ 1: the
    r-th disjoint calibration sample, chunks halved r times; each its own configs in the store, replicate 0's those
    of a run before replicates existed), pooled into every interval; None: :data:`~wkvlab.findings.grids.DEFAULT_REPLICATES`."""
    if name not in FINDINGS:
        raise ConfigError(f"unknown finding {name!r}; use one of {', '.join(FINDINGS)}")
    replicates = grids.replicate_count(name, replicates)
    stated, margin = margin, DEFAULT_MARGIN if margin is None else margin
    store = Path(store)
    # the grids' windows (search and engine have their own, checked where they are built)
    sized = lambda: grids.size_for(model, tokens=tokens, ctx=ctx, depth=name.startswith("depth"))  # noqa: E731
    where = {"device": device, "dtype": dtype}
    started = time.perf_counter()
    if name in ("additivity", "methods"):
        # replicate 0 first (a store measured before replicates existed already holds it), then each further one
        runs = [{("grid",): _run_sweeps(grids.additivity_sweeps(model, sized(), replicate=r, **where), store, progress)[0]}
                for r in range(replicates)]
        markdown, data = analyse(name, runs[0], margin, runs[1:])
    elif name == "attention":
        from wkvlab.findings.attention import measure_attention

        size = sized()
        windows = grids.ATTENTION_WINDOWS if tokens is None else size.tokens // size.ctx
        rows = measure_attention(model, grids.ATTENTION_WEIGHTS, grids.ATTENTION_KV, ctx=size.ctx, windows=windows, progress=progress,
                                margin=margin, **where)
        markdown, data = render.attention_markdown(rows), {"rows": [r.to_dict() for r in rows], "ctx": size.ctx}
    elif name == "calibration":
        runs = []
        for r in range(replicates):
            specs = grids.calibration_sweeps(model, sized(), replicate=r, **where)
            runs.append({(s.calibration.data, s.data[0]): results for s, results in zip(specs, _run_sweeps(specs, store, progress))})
        markdown, data = analyse(name, runs[0], margin, runs[1:])
    elif name in ("depth", "depth-long"):
        from wkvlab.findings.depth import (DEPTH_DATA, DEPTH_DOCUMENTS, DEPTH_MARGIN, DEPTH_TARGET, LONG_DATA, LONG_DOCUMENTS,
                                           measure_depth)

        # identical target tokens after prefixes of increasing length (findings/depth.py); --tokens: the target
        # tokens per document, --ctx: the longest window (default: the model's limit); depth: the longest prefix at
        # least 32 standard-library modules reach, depth-long: the eight longest modules to the model's limit. It
        # resumes per prefix length from the on-disk cache, as search does from its profiles and scores
        target = tokens or DEPTH_TARGET
        data, documents = (DEPTH_DATA, DEPTH_DOCUMENTS) if name == "depth" else (LONG_DATA, LONG_DOCUMENTS)
        found = measure_depth(model, grids.DEPTH_KV, target=target, longest=(ctx - target) if ctx else None, data=data,
                              documents=documents, progress=progress, margin=DEPTH_MARGIN if stated is None else stated, **where)
        data = found.to_dict()
        markdown = render.identical_depth_markdown(data)
    elif name == "search":
        from wkvlab.findings.search import measure_search

        grid = grids.search_grid(model, tokens=tokens, ctx=ctx)
        found = measure_search(model, grid, progress=progress, margin=margin, **where)
        data = {**found.to_dict(), "grid": grid.__dict__}
        markdown = render.search_markdown(data)
    elif name == "engine":
        engine_ctx, engine_tokens = ctx or grids.ENGINE_CTX, tokens or grids.ENGINE_TOKENS
        grids.check_windows(engine_ctx, engine_tokens)
        from wkvlab.engines.api import fidelity

        with progress(1, "engine: llama.cpp against the simulated presets") as tick:
            report = fidelity(model, grids.ENGINE_KV, ctx=engine_ctx, tokens=engine_tokens, threads=torch_threads())
            tick("engine compare", 1)
        data = report.to_dict()
        markdown = render.engine_markdown(data)
    finding = Finding(name, model, markdown, data, time.perf_counter() - started)
    from wkvlab.store import open_store

    with open_store(store) as db:  # the analysis next to its results, for 'wkvlab report'
        db.put_finding(name, model, finding.seconds, data, markdown)
    return finding
