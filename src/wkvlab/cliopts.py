"""Options and the start of a run, shared by every computing command (typer + torch-free checks).

Every command that computes follows the same order, so a mistake costs a second, not a run:
parse and check options, model files and output paths (:mod:`wkvlab.preflight`, :mod:`wkvlab.io`);
then :func:`start_run` chooses the threads and prints the run header; only then import the API.
"""
from __future__ import annotations

import os
from typing import Annotated, Optional

import typer

from wkvlab.display import run_header
from wkvlab.threads import ENV, ThreadChoice, apply_threads, choose_threads

ThreadsOption = Annotated[Optional[int], typer.Option(
    "--threads", help=f"CPU threads (torch, llama.cpp); default: the cores other work leaves idle, at least 1 "
                      f"(docs/threads.md); also {ENV}", show_default=False)]

MarginOption = Annotated[float, typer.Option(
    "--margin", help="the decision rule's practical margin m as a fraction: of the cache's own effect for an interaction, "
                     "of the baseline's KLD for a difference (docs/explain.md, 'The decision rule')")]


def start_run(command: str, threads: int | None, facts: str = "") -> ThreadChoice:
    """Choose and set the threads, print the header line; call after all checks, before heavy work."""
    # transformers' GGUF converter draws a tqdm bar that our status line already says; tqdm reads
    # TQDM_DISABLE only when it is imported, so it must be set before the API imports transformers.
    os.environ.setdefault("TQDM_DISABLE", "1")
    choice = apply_threads(choose_threads(threads))
    run_header(command, choice, facts)
    return choice
