"""Sweeps: a YAML spec of models × data × weights × KV expanded to configs with stable ids, run by
an executor into a results store, resumable after a crash. See docs/sweeps.md."""
from wkvlab.sweep.executor import Executor, InProcessExecutor, TaskOutcome, run_task
from wkvlab.sweep.plan import GridTask, SweepConfig, expand, make_tasks
from wkvlab.sweep.run import SweepPlan, SweepReport, plan_sweep, run_sweep
from wkvlab.sweep.spec import SweepSpec, load_spec

__all__ = ["Executor", "InProcessExecutor", "TaskOutcome", "run_task", "GridTask", "SweepConfig", "expand", "make_tasks",
           "SweepPlan", "SweepReport", "plan_sweep", "run_sweep", "SweepSpec", "load_spec"]
