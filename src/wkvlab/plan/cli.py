"""``wkvlab plan``: a thin command over :func:`wkvlab.plan.plan`.

The main CLI registers it with ``app.command("plan")(plan_command)``; bad input raises
:class:`wkvlab.errors.ConfigError`, which the main CLI prints as one line.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from wkvlab.errors import ConfigError
from wkvlab.plan.planner import plan
from wkvlab.plan.render import render


def plan_command(
    model: Annotated[str, typer.Option("--model", "-m",
                                       help="Built-in model name (e.g. Llama-3-70B) or a config.json path.")],
    gpu: Annotated[str, typer.Option("--gpu", "-g", help="GPU name, e.g. A100-80GB, H100, RTX-4090.")],
    batch: Annotated[int, typer.Option("--batch", "-b", help="Concurrent sequences.")],
    ctx: Annotated[int, typer.Option("--ctx", "-c", help="Tokens per sequence (prompt + output).")],
    weights: Annotated[list[str] | None, typer.Option(
        "--weights", "-w", help="Weight format (repeatable), e.g. int4-g128, fp8, 'int4-g128;skip=0,79'.")] = None,
    kv: Annotated[list[str] | None, typer.Option(
        "--kv", help="KV spec (repeatable), e.g. fp8_e4m3, q8_0, q8_0/q4_0 (K/V), 'int4;skip=0,1'.")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the full plan as JSON here.")] = None,
    engine: Annotated[str | None, typer.Option(
        "--engine", "-e", help="Restrict to one engine: vllm, sglang, llama.cpp, trtllm.")] = None,
    gpu_file: Annotated[Path | None, typer.Option(
        "--gpu-file", help="YAML/JSON file adding or overriding GPUs (schema: data/gpus.yaml).")] = None,
) -> None:
    """Which weight x KV combinations fit, how fast they run, and the engine command lines."""
    result = plan(model, gpu, batch, ctx, weights=weights or None, kv=kv or None, engine=engine,
                  gpu_file=gpu_file)
    width = max(shutil.get_terminal_size((160, 40)).columns, 140)
    render(result, Console(width=width, highlight=False, soft_wrap=True))
    if json_out is not None:
        try:
            json_out.write_text(json.dumps(result.to_dict(), indent=1))
        except OSError as exc:
            raise ConfigError(f"cannot write {json_out} ({exc}); choose a writable path") from exc
