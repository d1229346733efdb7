"""``wkvlab tasks``: lm-eval tasks for a whole weights × KV grid, next to the grid's KLD, in one results store.

For each config the task scores come from lm-evaluation-harness running :class:`wkvlab.tasks.harness.WkvlabLM`
(the same simulation as ``wkvlab eval``), and the KLD from the sweep machinery on the same model and
configs (:func:`wkvlab.api.sweep`), so both land in the store under the same weights and KV labels
and the report can put accuracy next to KLD. Each weight config is quantized once and shared by its
KV configs. Resumable: a config whose scores are stored is not run again (nor are stored KLDs).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from wkvlab.errors import ConfigError
from wkvlab.kv.spec import KVSpec
from wkvlab.models.loading import LoadedModel, load_model
from wkvlab.store.tasks import TaskScore
from wkvlab.sweep.plan import canonical_json
from wkvlab.tasks.simulation import SimulatedModel, kv_statistics
from wkvlab.weights.apply import quantize_model_weights
from wkvlab.weights.calibration import CalibrationSpec, calibration_set
from wkvlab.weights.spec import WeightSpec
from wkvlab.tasks.spec import LM_EVAL_PIN, TaskRunSpec, lm_eval_version  # noqa: F401  (torch-free: the CLI checks with them first)

Progress = Callable[[str, int], None]
@dataclass
class TasksReport:
    scores: list[TaskScore]  # of this grid, stored earlier or now
    ran: int  # configs scored by this run
    skipped: int  # configs already in the store
    kld_written: int = 0
    notes: list[str] = field(default_factory=list)


def task_config(loaded: LoadedModel, weights: WeightSpec, kv: KVSpec, spec: TaskRunSpec, calibration: CalibrationSpec) -> dict:
    """Everything that determines a config's task scores; its hash is the stored id."""
    config = {"model": loaded.name, "model_sha256": loaded.fingerprint, "weights": weights.to_dict(), "kv": kv.to_dict(),
              "run": spec.to_dict(), "lm_eval": lm_eval_version()}
    if weights.needs_calibration or kv.needs_calibration:
        config["calibration"] = calibration.to_dict()
    return config


def config_id(config: dict) -> str:
    return hashlib.sha256(canonical_json(config).encode("utf-8")).hexdigest()


def scores_of(output: dict, config_id_: str, loaded: LoadedModel, weights: WeightSpec, kv: KVSpec) -> list[TaskScore]:
    """lm-eval's ``results`` block as rows: every metric (with its filter) and its standard error."""
    rows = []
    samples = output.get("n-samples", {})
    for task, metrics in output["results"].items():
        n = (samples.get(task) or {}).get("effective")
        for key, value in metrics.items():
            if "," not in key or "_stderr," in key or not isinstance(value, (int, float)):
                continue
            name, _, filt = key.partition(",")
            stderr = metrics.get(f"{name}_stderr,{filt}")
            rows.append(TaskScore(config_id_, task, key, loaded.name, loaded.fingerprint, weights.label, kv.label, float(value),
                                  float(stderr) if isinstance(stderr, (int, float)) else None, int(n) if n is not None else None))
    return rows


def task_manager(spec: TaskRunSpec):
    """lm-eval's task index with the local folders; unknown task names are refused before any model loads."""
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=spec.include_path.split(":") if spec.include_path else None)
    known = set(manager.all_tasks)
    unknown = [t for t in spec.tasks if t not in known]
    if unknown:
        where = f" (with --include-path {spec.include_path})" if spec.include_path else "; local YAML tasks need --include-path DIR"
        raise ConfigError(f"lm-eval knows no task {', '.join(unknown)}{where}; 'lm-eval ls tasks' lists them")
    return manager


def run_tasks(model: str, weights: list[WeightSpec], kv: list[KVSpec], spec: TaskRunSpec, store, *,
              calibration: CalibrationSpec | None = None, progress: Progress | None = None, manager=None) -> TasksReport:
    """Score every weights × KV config on ``spec``'s tasks into ``store`` (a :class:`wkvlab.store.ResultStore`).

    ``manager``: the :func:`task_manager` of ``spec`` when already built (it indexes every lm-eval task: seconds).
    """
    from lm_eval import simple_evaluate

    from wkvlab.tasks.harness import WkvlabLM

    tick = progress or (lambda _d, _n: None)
    calibration = calibration or CalibrationSpec()
    manager = manager or task_manager(spec)
    logging.getLogger("lm_eval").setLevel(logging.ERROR)  # its per-task notices would interleave with the progress bar
    loaded = load_model(model)
    for k in kv:  # a cache format the model's head_dim cannot hold fails before any task runs
        k.check_model(_head_dim(loaded), loaded.model.config.get_text_config().num_hidden_layers)
    done = store.task_config_ids()
    ran = skipped = 0
    for w in weights:
        cells = [(k, task_config(loaded, w, k, spec, calibration)) for k in kv]
        todo = [(k, c, config_id(c)) for k, c in cells if config_id(c) not in done]
        skipped += len(cells) - len(todo)
        tick(f"{w.label}: {len(cells) - len(todo)} already scored", len(cells) - len(todo))
        if not todo:
            continue
        needs = w.needs_calibration or any(k.needs_calibration for k, _, _ in todo)
        calib = calibration_set(calibration, loaded.tokenizer) if needs else None
        built = quantize_model_weights(loaded.model, w, calib, model_key=loaded.fingerprint)
        for k, config, cid in todo:
            sim = SimulatedModel(loaded, built, k, kv_statistics(loaded, built, k, calib))
            with quiet_harness():
                output = simple_evaluate(model=WkvlabLM.of(sim), tasks=list(spec.tasks), task_manager=manager, limit=spec.limit,
                                         num_fewshot=spec.num_fewshot, bootstrap_iters=spec.bootstrap_iters, log_samples=False)
            store.put_task_scores(config, scores_of(output, cid, loaded, w, k))
            ran += 1
            tick(f"{w.label} × {k.label}", 1)
        del built, sim
    ids = {config_id(task_config(loaded, w, k, spec, calibration)) for w in weights for k in kv}
    return TasksReport([s for s in store.task_scores() if s.task_config_id in ids], ran, skipped)


@contextlib.contextmanager
def quiet_harness() -> Iterator[None]:
    """lm-eval draws tqdm bars per request type and runs ``git describe`` (whose error goes to fd 2); our progress bar says enough."""
    from wkvlab.engines.llamacpp import quiet_stderr

    previous = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        with quiet_stderr():
            yield
    finally:
        if previous is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = previous


def _head_dim(loaded: LoadedModel) -> int:
    from wkvlab.kv.override import model_head_dim

    return model_head_dim(loaded.model)
