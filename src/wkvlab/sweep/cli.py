"""``wkvlab sweep`` and ``wkvlab results``: thin commands over :mod:`wkvlab.sweep` and the store.

The main CLI registers both; user errors raise :class:`wkvlab.errors.WkvlabError`, which it prints
as one line (exit 2).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.table import Table

from wkvlab.cliopts import CacheDirOption, NoWeightCacheOption, ThreadsOption, start_run
from wkvlab.display import console, err_console, progress_bar, status
from wkvlab.errors import ConfigError
from wkvlab.io import check_output_file, write_json_atomic
from wkvlab.preflight import check_sweep, require_store
from wkvlab.stats.replicates import replicate_label
from wkvlab.sweep.spec import load_spec
from wkvlab.units import mib

if TYPE_CHECKING:  # the store and the runner (numpy, torch) are imported by the commands, after their checks
    from wkvlab.store import StoredRow
    from wkvlab.sweep.executor import Executor
    from wkvlab.sweep.run import SweepPlan


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def plan_table(plan: SweepPlan) -> Table:
    table = Table(title=f"sweep {plan.spec.name}: {len(plan.configs)} configs, {len(plan.done)} done, "
                        f"{len(plan.missing)} to run in {len(plan.tasks)} grid(s), {plan.estimate(_duration)}", title_justify="left")
    for name in ("id", "model", "data", "ctx", "tokens", "weights", "KV", "status"):
        table.add_column(name, no_wrap=True)
    for c in plan.configs:
        status = "[green]done[/]" if c.config_id in plan.done else "to run"
        table.add_row(c.config_id[:12], c.model, c.data, str(c.ctx), str(c.tokens), c.weight_spec.label,
                      c.kv_spec.label + replicate_label(c.replicate, c.chunk), status)
    return table


def rows_table(rows: list[StoredRow], title: str) -> Table:
    """One line per stored result; a replicate's KV cell carries " (replicate r, chunk c)" — the same config measured
    again, whose labels are otherwise the measurement's."""
    table = Table(title=title, title_justify="left")
    for name in ("model", "data", "ctx", "tokens", "weights", "KV", "KLD mean ± se", "top-1", "PPL", "weights MiB", "KV B/token"):
        table.add_column(name, justify="left" if name in ("model", "data", "weights", "KV") else "right", no_wrap=True)
    for r in rows:
        table.add_row(r.model, r.data, str(r.ctx), str(r.tokens), r.weights, r.kv + r.replicate_label, f"{r.kld_mean:.5f} ± {r.kld_se:.5f}",
                      f"{100 * r.top1:.2f}%", f"{r.ppl:.3f}", mib(r.weight_bytes), f"{r.kv_bytes_per_token:,.0f}")
    return table


def make_executor(name: str, *, address: str | None = None, cpus_per_task: float | None = None, gpus_per_task: float = 0,
                  max_workers: int | None = None) -> Executor:
    """The executor ``--executor`` names; Ray options without ``--executor ray`` are an error, not ignored."""
    if name == "ray":
        from wkvlab.sweep.ray_executor import RayExecutor, import_ray

        import_ray()  # a missing install fails before planning hashes the models
        return RayExecutor(address, num_cpus_per_task=cpus_per_task, num_gpus_per_task=gpus_per_task, max_workers=max_workers)
    if name != "in-process":
        raise ConfigError(f"unknown --executor {name!r}; use in-process or ray")
    given = [flag for flag, value in (("--address", address), ("--cpus-per-task", cpus_per_task), ("--max-workers", max_workers)) if value is not None]
    if given or gpus_per_task:
        raise ConfigError(f"{(given or ['--gpus-per-task'])[0]} is an option of the Ray executor; add --executor ray")
    from wkvlab.sweep.executor import InProcessExecutor

    return InProcessExecutor()


def sweep_command(
    spec: Annotated[Path, typer.Argument(help="sweep spec (YAML): models, data, ctx, tokens, weights, kv, ... (docs/sweeps.md)")],
    store: Annotated[Path, typer.Option(help="results store (SQLite); created if missing, shared by concurrent sweeps")] = Path("results.db"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan (configs, which are done, estimated time) and run nothing")] = False,
    executor: Annotated[str, typer.Option(help="in-process (default) or ray: grids run in parallel on Ray workers")] = "in-process",
    address: Annotated[Optional[str], typer.Option(help="Ray cluster: auto (started here by 'ray start --head'), host:port or ray://host:port; default: a local cluster for this sweep")] = None,
    cpus_per_task: Annotated[Optional[float], typer.Option(help="CPUs per Ray worker (default: all CPUs of the largest node)")] = None,
    gpus_per_task: Annotated[float, typer.Option(help="GPUs Ray reserves per worker (places workers on GPU nodes; the evaluation runs on CPU)")] = 0,
    max_workers: Annotated[Optional[int], typer.Option(help="at most this many Ray workers (default: as many as the cluster holds)")] = None,
    threads: ThreadsOption = None,
    cache_dir: CacheDirOption = None,
    no_weight_cache: NoWeightCacheOption = False,
) -> None:
    """Run every weights × KV config of a spec that the store lacks; resumes after a crash without redoing finished configs."""
    sweep_spec = load_spec(spec)  # before the executor: a typo in the spec must not start a Ray cluster
    check_sweep(sweep_spec, device=not dry_run)  # what each model's files tell, as wkvlab eval checks it
    require_store(store, create=True)  # a folder, a missing folder or a foreign file: refused before the run starts
    runner = make_executor(executor, address=address, cpus_per_task=cpus_per_task, gpus_per_task=gpus_per_task, max_workers=max_workers)
    from wkvlab.models.cache_writes import planned_writes
    from wkvlab.preflight import resolved_dtype

    writes = None if dry_run else lambda: planned_writes(list(sweep_spec.models), sweep_spec.weights,
                                                         resolved_dtype(sweep_spec.dtype, sweep_spec.device))
    # this process; Ray workers set their own (--cpus-per-task)
    start_run("sweep", threads, f"{spec} into {store}", cache_dir=cache_dir, weight_cache=not no_weight_cache, writes=writes)
    from wkvlab.store import open_store
    from wkvlab.sweep.run import plan_sweep, run_sweep

    if dry_run:  # never creates the store: a dry run against a new path plans everything
        with status("planning (hashing models and data)"):
            if store.exists():
                with open_store(store, create=False) as db:
                    plan = plan_sweep(sweep_spec, db)
            else:
                plan = plan_sweep(sweep_spec, None)
        console.print(plan_table(plan))
        return
    with open_store(store) as db:
        with status("planning (hashing models and data)"):
            plan = plan_sweep(sweep_spec, db)
        err_console.print(f"sweep {sweep_spec.name}: {len(plan.configs)} configs, {len(plan.done)} already in {store}, "
                          f"{len(plan.missing)} to run ({plan.estimate(_duration)})")
        with progress_bar(plan.steps, "sweep", grid=[task.grid for task in plan.tasks]) as advance:
            report = run_sweep(sweep_spec, db, executor=runner, progress=advance, plan=plan)
        err_console.print(f"wrote {report.written} result(s) to {store}" + (f"; {report.raced} were written first by another sweep" if report.raced else ""))
        ids = set(report.config_ids)
        console.print(rows_table([r for r in db.rows() if r.config_id in ids], f"sweep {sweep_spec.name} ({store})"))


def results_command(
    store: Annotated[Path, typer.Option(help="results store written by 'wkvlab sweep'")] = Path("results.db"),
    json_out: Annotated[Optional[Path], typer.Option("--json", help="also write every stored result (summaries, configs, by-position) as JSON")] = None,
) -> None:
    """List the results in a store: model, data, weights, KV, KLD mean ± se, top-1, PPL, bytes."""
    require_store(store)
    check_output_file(json_out, "--json")
    from wkvlab.store import open_store

    with open_store(store, create=False) as db:
        rows = db.rows()
        console.print(rows_table(rows, f"{len(rows)} result(s) in {store}"))
        if json_out is not None:
            payload = [{"config_id": r.config_id, "config": db.config(r.config_id), **db.get(r.config_id).to_dict()} for r in rows]
            write_json_atomic(json_out, payload)
            err_console.print(f"wrote {json_out}")
