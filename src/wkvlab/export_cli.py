"""``wkvlab export``: write a weight config as a real quantized checkpoint (compressed-tensors, GPTQ, AWQ).

Kept outside ``wkvlab.weights`` so that importing the CLI does not import torch; the work is done
by :func:`wkvlab.weights.checkpoints.export.write_checkpoint`. The folder it writes is readable by
``wkvlab eval --weights checkpoint:<folder>`` (and by the format's own loaders).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def export_command(
    out: Annotated[Path, typer.Option("--out", help="new folder to write the checkpoint into")],
    weights: Annotated[str, typer.Option(help="weight config to quantize with: int4-g64-sym, gptq-int4-g64, awq-int4-g64, int8;a=int8, fp8, fp8-static, nvfp4 ...")] = "gptq-int4-g64-sym",
    format: Annotated[str, typer.Option("--format", help="compressed-tensors (llm-compressor / vLLM), gptq (AutoGPTQ / GPTQModel) or awq (AutoAWQ GEMM)")] = "compressed-tensors",
    model: Annotated[str, typer.Option(help="'default' (SmolLM2-135M), 'gemma3-270m', a .gguf file or an HF folder")] = "default",
    calib: Annotated[str, typer.Option(help="calibration text for gptq/awq/w8a8-int8/static scales: prose, code, math, or a file")] = "prose",
    calib_samples: Annotated[int, typer.Option(help="calibration samples")] = 16,
    calib_len: Annotated[int, typer.Option(help="tokens per calibration sample")] = 512,
) -> None:
    """Quantize a model with a weight config and write it as a checkpoint folder, with its tokenizer."""
    from rich.console import Console

    from wkvlab.models.loading import load_model
    from wkvlab.weights.calibration import CalibrationSpec, calibration_corpus, calibration_set
    from wkvlab.weights.checkpoints.export import EXPORT_FORMATS, write_checkpoint
    from wkvlab.weights.spec import WeightSpec

    console = Console(stderr=True)
    if format not in EXPORT_FORMATS:
        from wkvlab.errors import ConfigError

        raise ConfigError(f"unknown checkpoint format {format!r}; use one of {', '.join(EXPORT_FORMATS)}")
    spec = WeightSpec.parse(weights)
    from wkvlab.display import status  # lines in a log too, every 10 s while a GGUF converts or GPTQ runs

    with status(f"loading {model}"):
        loaded = load_model(model)
    calibration = None
    if spec.needs_calibration:
        cspec = CalibrationSpec(calib, calib_samples, calib_len)
        calibration = calibration_set(cspec, loaded.tokenizer, corpus=calibration_corpus(cspec.data))
    with status(f"quantizing {loaded.name} with {spec.label} and writing {format}"):
        written = write_checkpoint(loaded.model, loaded.tokenizer, spec, format, out, calibration)
    for note in written.notes:
        console.print(f"[yellow]note:[/] {note}")
    typer.echo(f"wrote {written.folder} ({written.format}, {written.linears} quantized linears, {written.bytes / 1e6:.1f} MB); "
               f"evaluate it with: wkvlab eval --model {model} --weights checkpoint:{written.folder}")
