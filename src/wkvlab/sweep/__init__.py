"""Sweeps: a YAML spec of models × data × weights × KV expanded to configs with stable ids, run by
an executor into a results store, resumable after a crash. See docs/sweeps.md."""
from __future__ import annotations

from wkvlab.lazy import lazy_exports, names

_EXPORTS = {
    **names("executor", "Executor", "InProcessExecutor", "TaskOutcome", "run_task"),
    **names("plan", "GridTask", "SweepConfig", "expand", "make_tasks"),
    **names("run", "SweepPlan", "SweepReport", "plan_sweep", "run_sweep"),
    **names("spec", "SweepSpec", "load_spec"),
}
__all__ = ["Executor", "InProcessExecutor", "TaskOutcome", "run_task", "GridTask", "SweepConfig", "expand", "make_tasks",
           "SweepPlan", "SweepReport", "plan_sweep", "run_sweep", "SweepSpec", "load_spec"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
