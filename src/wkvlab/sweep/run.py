"""The sweep driver: plan against the store, hand missing grids to an executor, store each result.

Resume semantics: a config is done exactly when its row is in the store, and a row is written in
one transaction together with its arrays, so after ``kill -9`` the store holds every result that
was finished and nothing of the one in flight; running the same spec again plans only the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from wkvlab.errors import DataError
from wkvlab.eval.runner import Progress
from wkvlab.store import ResultStore, open_store
from wkvlab.sweep.executor import Executor, InProcessExecutor
from wkvlab.costs import Estimate
from wkvlab.sweep.plan import GridTask, SweepConfig, estimate_tasks, expand, make_tasks
from wkvlab.sweep.spec import SweepSpec, load_spec


@dataclass(frozen=True)
class SweepPlan:
    spec: SweepSpec
    configs: tuple[SweepConfig, ...]
    done: frozenset[str]
    tasks: tuple[GridTask, ...]
    cost: Estimate | None = None  # the cost model's estimate of the missing configs (wkvlab.costs); None: nothing to run

    @property
    def seconds(self) -> float:
        """Estimated wall time of everything left: passes, builds, KV calibrations and model loading."""
        return self.cost.seconds if self.cost is not None else 0.0

    def estimate(self, duration) -> str:
        """``about 3m10s (passes 1m02s, builds 1m40s, loading 0m08s; priors scaled by ...)``, or ``about 0``."""
        return self.cost.describe(duration) if self.cost is not None else f"about {duration(0)}"

    @property
    def missing(self) -> list[SweepConfig]:
        return [c for c in self.configs if c.config_id not in self.done]

    @property
    def steps(self) -> int:
        return sum(t.steps for t in self.tasks)

    def to_dict(self) -> dict:
        parts = {} if self.cost is None else {"passes": self.cost.passes, "builds": self.cost.builds,
                                               "kv_calibrations": self.cost.kv_calibrations, "loading": self.cost.loading, "basis": self.cost.basis}
        return {"spec": self.spec.to_dict(), "estimated_seconds": self.seconds, "estimate": parts, "tasks": len(self.tasks),
                "configs": [{"config_id": c.config_id, "label": c.label, "done": c.config_id in self.done} for c in self.configs]}


@dataclass(frozen=True)
class SweepReport:
    planned: int  # configs in the spec
    skipped: int  # already in the store when the sweep started
    written: int  # computed and written by this sweep
    raced: int  # computed here but another sweep wrote them first (identical numbers; the first row is kept)
    config_ids: tuple[str, ...]  # every config of the spec, in plan order


def _as_spec(spec: SweepSpec | str | Path) -> SweepSpec:
    return spec if isinstance(spec, SweepSpec) else load_spec(spec)


def plan_sweep(spec: SweepSpec | str | Path, store: ResultStore | None) -> SweepPlan:
    """What a sweep would run against ``store`` (None: an empty store) and about how long it takes."""
    spec = _as_spec(spec)
    configs = expand(spec)
    done = frozenset(store.done(c.config_id for c in configs)) if store is not None else frozenset()
    missing = [c for c in configs if c.config_id not in done]
    speeds = {fp: store.seconds_per_token(fp) if store is not None else None for fp in {c.model_sha256 for c in missing}}
    tasks = tuple(make_tasks(missing, grid=spec.grid))
    return SweepPlan(spec, tuple(configs), done, tasks, estimate_tasks(list(tasks), speeds))


def _fresh_tasks(plan: SweepPlan, store: ResultStore, tick: Progress):
    """The plan's tasks, each trimmed to what is still missing when its turn comes."""
    for task in plan.tasks:
        done = store.done(c.config_id for c in task.configs)
        if not done:
            yield task
            continue
        remaining = make_tasks(list(task.configs), done, plan.spec.grid)
        tick("done by another sweep", task.steps - sum(t.steps for t in remaining))
        yield from remaining


def run_sweep(spec: SweepSpec | str | Path, store: str | Path | ResultStore, *, executor: Executor | None = None,
              progress: Progress | None = None, plan: SweepPlan | None = None) -> SweepReport:
    """Run every config of ``spec`` that ``store`` lacks; each result is stored as soon as its grid ends.

    ``plan``: one made by :func:`plan_sweep` on this store (saves hashing the models twice).
    """
    own = not isinstance(store, ResultStore)
    db = open_store(store) if own else store
    try:
        plan = plan if plan is not None else plan_sweep(spec, db)
        tick = progress or (lambda _desc, _n: None)
        written = raced = 0
        for outcome in (executor or InProcessExecutor()).run(_fresh_tasks(plan, db, tick), progress):
            if len(outcome.results) != len(outcome.task.configs):
                raise DataError(f"an executor returned {len(outcome.results)} results for {len(outcome.task.configs)} configs; this is a bug in the executor")
            for config, result in zip(outcome.task.configs, outcome.results):
                if db.put(config.config_id, config.to_dict(), result):
                    written += 1
                else:
                    raced += 1
        return SweepReport(len(plan.configs), len(plan.done), written, raced, tuple(c.config_id for c in plan.configs))
    finally:
        if own:
            db.close()
