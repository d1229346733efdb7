"""``wkvlab reference``: write a stored reference once, read what one holds.

A stored reference (:mod:`wkvlab.eval.reference`) lets ``wkvlab eval --reference FILE`` compare
candidates without the reference model in memory; it is a file a user keeps and reuses.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wkvlab.eval.constants import DEFAULT_TOPK

reference_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Stored references: the reference's per-token distributions on disk (docs/scale.md).")


@reference_app.command("save")
def save_command(
    out: Annotated[Path, typer.Option("--out", help="file to write (safetensors); never overwritten")],
    model: Annotated[str, typer.Option(help="'default', 'gemma3-270m', a .gguf file or an HF folder")] = "default",
    data: Annotated[str, typer.Option(help="text, as for wkvlab eval --data")] = "default",
    ctx: Annotated[int, typer.Option(help="tokens per window")] = 1024,
    tokens: Annotated[int, typer.Option(help="tokens to evaluate, rounded down to whole windows")] = 8192,
    score: Annotated[str, typer.Option(help="'all' positions or 'second-half' of each window")] = "all",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<N>")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (bfloat16 on a GPU, float32 on the CPU), float32, bfloat16, float16")] = "auto",
    chunk: Annotated[Optional[int], typer.Option(help="queries per prefill chunk (default: from the vocabulary size)")] = None,
    topk: Annotated[int, typer.Option(help="top-k log-probs kept per token (the tail beyond them is sampled)")] = DEFAULT_TOPK,
) -> None:
    """Run the reference model once over the windows and keep its per-token distributions in a file."""
    from wkvlab import api
    from wkvlab.display import err_console, progress_bar, status

    api.check_reference_path(out)  # before the model loads: a refused name must not cost the run
    with status(f"loading {model} and {data} text"):  # lines in a log too, every 10 s while a GGUF converts
        work = api.prepare(model, data, ctx=ctx, tokens=tokens, score=score, device=device, dtype=dtype)
    with progress_bar(api.reference_steps(work, chunk), "reference") as advance:
        stored = api.save_reference(work, out, chunk=chunk, topk=topk, progress=advance)
    err_console.print(_summary(out, stored))


@reference_app.command("info")
def info_command(path: Annotated[Path, typer.Argument(help="a stored reference file")]) -> None:
    """What a stored reference was made from, and its size per token."""
    from wkvlab.display import console
    from wkvlab.eval.reference import StoredReference

    console.print(_summary(path, StoredReference.load(path)))


def _summary(path: Path, stored) -> str:
    meta = stored.meta
    vocab = stored.full_logprobs.shape[-1]
    return (f"{path}: {meta.get('model')} on {meta.get('data')}, {meta.get('n_windows')} windows of {meta.get('ctx')} tokens, "
            f"{stored.tokens:,} scored tokens, top-{stored.k}, {meta.get('dtype')}; {stored.bytes_per_token():,.0f} bytes per token "
            f"(llama.cpp's --kl-divergence-base keeps {2 * vocab:,} per token: the full vocabulary of {vocab:,} in 16 bits)")
