"""Executors run grid tasks and hand back their results; the sweep driver alone writes the store.

The interface is one method::

    class Executor(Protocol):
        def run(self, tasks: Iterable[GridTask], progress: Progress | None) -> Iterator[TaskOutcome]

``run`` may execute tasks in any order and in parallel, and yields each task's outcome as soon as
that task is finished; the driver writes every result of an outcome in its own transaction before
asking for the next one. Executors never touch the store, so a remote executor (Ray) needs no
access to the file: it ships ``GridTask.to_dict()`` to a worker, runs
:func:`run_task` there, and returns the results (EvalResult with numpy arrays, picklable). The
``tasks`` iterable is lazy: the driver re-checks the store before handing out each task, so a
config finished meanwhile by a concurrent sweep is not run again; an executor that wants to
submit ahead (Ray) may read it eagerly and accept a little duplicate work, which the store absorbs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol

from wkvlab.errors import DataError
from wkvlab.eval.result import EvalResult
from wkvlab.eval.runner import Progress
from wkvlab.sweep.plan import GridTask


@dataclass(frozen=True)
class TaskOutcome:
    """A finished task and its results, one per config, in ``task.configs`` order."""

    task: GridTask
    results: tuple[EvalResult, ...]


class Executor(Protocol):
    def run(self, tasks: Iterable[GridTask], progress: Progress | None = None) -> Iterator[TaskOutcome]: ...


def run_task(task: GridTask, progress: Progress | None = None, *, workload=None) -> TaskOutcome:
    """Run one grid in this process (``workload``: an :class:`wkvlab.api.Workload` to reuse)."""
    from wkvlab import api
    from wkvlab.kv.spec import KVSpec
    from wkvlab.weights.calibration import CalibrationSpec
    from wkvlab.weights.spec import WeightSpec

    first = task.first
    work = workload or api.prepare(first.model, first.data, ctx=first.ctx, tokens=first.tokens, score=first.score, stride=first.stride,
                                   device=first.device, dtype=first.dtype)
    if work.loaded.fingerprint != first.model_sha256 or work.corpus.sha256 != first.data_sha256:
        raise DataError(f"{first.model} or {first.data} changed since the sweep was planned; run the sweep again to plan it anew")
    calibration = CalibrationSpec.from_dict(task.calibration) if task.calibration else None
    weights = [WeightSpec.from_dict(w) for w in task.weights]
    options = api.run_options(work, weights, chunk=first.chunk or None, reference=first.reference_file())
    results = api.evaluate_workload(work, weights, [KVSpec.from_dict(k) for k in task.kv], progress, calibration, options,
                                    calibration_replicate=first.replicate)
    # A result stored under the wrong id would be silently wrong forever: check the pairing.
    for config, result in zip(task.configs, results, strict=True):
        if (result.weights_spec, result.kv_spec) != (config.weights, config.kv):
            raise RuntimeError(f"grid order mismatch: {config.label} got the result of {result.weights} × {result.kv}")
    return TaskOutcome(task, tuple(results))


class InProcessExecutor:
    """Runs tasks one after another here, keeping the last model and windows loaded between
    tasks of the same group (tasks arrive grouped, so each model loads once per sweep)."""

    def __init__(self) -> None:
        self._model_key: tuple | None = None
        self._loaded = None
        self._work_key: tuple | None = None
        self._work = None

    def _workload(self, task: GridTask):
        from wkvlab import api
        from wkvlab.models.loading import load_model

        first = task.first
        if self._model_key != (first.model, first.model_sha256, first.device, first.dtype):
            self._loaded = self._work = self._work_key = None  # free the previous model before loading the next
            self._loaded = load_model(first.model, device=first.device, dtype=first.dtype)
            self._model_key = (first.model, first.model_sha256, first.device, first.dtype)
        if self._work_key != first.group:
            self._work = api.prepare(self._loaded, first.data, ctx=first.ctx, tokens=first.tokens, score=first.score, stride=first.stride)
            self._work_key = first.group
        return self._work

    def run(self, tasks: Iterable[GridTask], progress: Progress | None = None) -> Iterator[TaskOutcome]:
        for task in tasks:
            yield run_task(task, progress, workload=self._workload(task))
