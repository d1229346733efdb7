"""``wkvlab tasks``: lm-eval tasks over a weights × KV grid, with the grid's KLD, into a results store.

Registered in :mod:`wkvlab.cli` without importing torch, transformers or lm_eval here: everything
heavy is imported inside the command, so ``wkvlab --help`` stays fast.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wkvlab.errors import ConfigError


def _items(values: list[str] | None, default: tuple[str, ...] = ()) -> list[str]:
    out = [item.strip() for value in (values or []) for item in value.split(",") if item.strip()]
    return out or list(default)


def tasks_command(
    tasks: Annotated[Optional[list[str]], typer.Option(help="lm-eval task names (repeat or comma-separate), e.g. arc_easy,hellaswag or a local task")] = None,
    include_path: Annotated[Optional[str], typer.Option(help="folder(s) of local lm-eval task YAMLs, ':'-separated (lm-eval's --include_path)")] = None,
    model: Annotated[str, typer.Option(help="'default' (SmolLM2-135M), 'gemma3-270m', a .gguf file or an HF folder")] = "default",
    weights: Annotated[Optional[list[str]], typer.Option(help="weight config(s), as wkvlab eval --weights")] = None,
    kv: Annotated[Optional[list[str]], typer.Option(help="KV config(s), as wkvlab eval --kv")] = None,
    store: Annotated[Path, typer.Option(help="results store: task scores and the grid's KLD results go here")] = Path("results.db"),
    limit: Annotated[Optional[int], typer.Option(help="examples per task (default: all)")] = None,
    num_fewshot: Annotated[Optional[int], typer.Option(help="few-shot examples (default: the task's own)")] = None,
    data: Annotated[str, typer.Option(help="text the grid's KLD is measured on (as wkvlab eval --data)")] = "default",
    ctx: Annotated[int, typer.Option(help="KLD: tokens per window")] = 512,
    tokens: Annotated[int, typer.Option(help="KLD: tokens to evaluate; 0 skips the KLD (the report then shows task scores without it)")] = 2048,
    calib: Annotated[str, typer.Option(help="calibration text for calibrated weight/KV methods: prose, code, math, or a file")] = "prose",
    calib_samples: Annotated[int, typer.Option(help="calibration samples")] = 16,
    calib_len: Annotated[int, typer.Option(help="tokens per calibration sample")] = 512,
    report: Annotated[Optional[Path], typer.Option(help="also write the store's report (docs/report.md) into this folder")] = None,
) -> None:
    """Downstream accuracy next to KLD: lm-eval tasks for every weights × KV config, both into the store."""
    # torch-free checks first (wkvlab.preflight): a typo is one line in a second, not after torch's import
    from wkvlab.preflight import check_calibration, check_grid, check_model, parse_configs, require_store
    from wkvlab.tasks.spec import TaskRunSpec, lm_eval_version

    weight_specs, kv_specs = parse_configs(weights or ["none"], kv or ["fp16"])
    spec = TaskRunSpec(tuple(_items(tasks)), include_path, limit, num_fewshot)
    if tokens < 0:
        raise ConfigError(f"--tokens must be 0 (no KLD) or more, got {tokens}")
    check_grid(model, weight_specs, kv_specs, check_model(model, ctx, tokens or None))  # what the model's files tell
    check_calibration(calib, calib_samples, calib_len)
    require_store(store, create=True)
    lm_eval_version()  # a missing lm-eval is one line, before any model loads
    if report is not None:
        from wkvlab.report.output import check_folder

        check_folder(report)
    from wkvlab import api
    from wkvlab.cliopts import print_estimates
    from wkvlab.display import console, err_console, progress_bar
    from wkvlab.store import open_store
    from wkvlab.sweep.spec import SweepSpec
    from wkvlab.tasks.run import run_tasks, task_manager

    with console.status("indexing lm-eval tasks"):
        manager = task_manager(spec)  # an unknown task name is one line, before any work
    calibration = api.CalibrationSpec(calib, calib_samples, calib_len)
    print_estimates()  # the KLD grid's memory line, as every grid command prints it
    if tokens:  # the grid's KLD through the sweep machinery: stored under the same labels, resumable
        sweep = SweepSpec(models=(model,), data=(data,), ctx=(ctx,), tokens=(tokens,), weights=tuple(weight_specs), kv=tuple(kv_specs),
                          calibration=calibration, name="tasks")
        with progress_bar(max(api.sweep(sweep, store, dry_run=True).steps, 1), "KLD") as advance:
            api.sweep(sweep, store, progress=advance)
    with open_store(store) as db:
        with progress_bar(len(weight_specs) * len(kv_specs), "tasks") as advance:
            outcome = run_tasks(model, weight_specs, kv_specs, spec, db, calibration=calibration, progress=advance, manager=manager)
        from wkvlab.report.build import stored_results

        # KLDs stored earlier (e.g. by wkvlab sweep) count too; a replicate's under its own group, as the report has it
        results, replicates = stored_results(db)
    from wkvlab.report.data import group_results
    from wkvlab.report.tasks import task_rows, tasks_table

    table = tasks_table(task_rows(group_results(results, replicates), outcome.scores))
    console.print(_rich_table(table))
    err_console.print(f"{outcome.ran} configs scored, {outcome.skipped} already in {store}")
    if report is not None:
        from wkvlab.report import report_from_store
        from wkvlab.report.cli import print_written

        print_written(report_from_store(store, report))


def _rich_table(table):
    from rich.table import Table as RichTable

    out = RichTable(title=table.title, title_justify="left")
    for column in table.columns:
        out.add_column(column.header, justify="left" if column.header in ("weights", "kv", "task", "metric") else "right", no_wrap=True)
    for row in table.text_rows():
        out.add_row(*row)
    return out
