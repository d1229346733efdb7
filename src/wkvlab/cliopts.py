"""Options and the start of a run, shared by every computing command (typer + torch-free checks).

Every command that computes follows the same order, so a mistake costs a second, not a run:
parse and check options, model files and output paths (:mod:`wkvlab.preflight`, :mod:`wkvlab.io`);
then :func:`start_run` chooses the threads and prints the run header; only then import the API.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.markup import escape

from wkvlab.display import run_header
from wkvlab.threads import ENV, ThreadChoice, apply_threads, choose_threads

ThreadsOption = Annotated[Optional[int], typer.Option(
    "--threads", help=f"CPU threads (torch, llama.cpp); default: the cores other work leaves idle, at least 1 "
                      f"(docs/threads.md); also {ENV}", show_default=False)]

ToleranceOption = Annotated[Optional[str], typer.Option(
    "--tolerance", help="what you can tolerate: a mean KLD in nats (0.01) or a top-1 agreement (top1=0.95); each config is then "
                        "within tolerance, exceeds it or undecided, Holm-adjusted over the configs (docs/stats.md)")]
MarginOption = Annotated[str, typer.Option(
    "--margin", help="the decision rule's practical margin m: a percent (10%: of the predicted total KLD(W)+KLD(C) for an "
                     "interaction, of the baseline's value for a difference), an absolute number in the metric's units "
                     "(0.002 nats), or cache:10% (an interaction's m as a share of the cache's own KLD(C), the rule before "
                     "issue #38) — docs/stats.md")]

# --resamples set the bootstrap's resample count; every interval is analytic since issue #38, so the option
# is gone from the help, and an old command line that still passes it gets one line saying so (refuse_resamples)
ResamplesGoneOption = Annotated[Optional[str], typer.Option("--resamples", hidden=True, show_default=False)]
RESAMPLES_GONE = ("--resamples is gone: every interval is analytic since issue #38 (Student t with a skewness allowance: "
                  "no resampling, no seed, no Monte-Carlo error; docs/stats.md); drop the option")


def refuse_resamples(value: str | None) -> None:
    """A one-line error for a command line that still passes the removed ``--resamples``."""
    if value is not None:
        from wkvlab.errors import ConfigError

        raise ConfigError(RESAMPLES_GONE)


CacheDirOption = Annotated[Optional[Path], typer.Option(
    "--cache-dir", help="wkvlab's disk cache: calibrated weight builds, K/V statistics, GGUF copies (docs/weights.md); "
                        "default $WKVLAB_CACHE or ~/.cache/wkvlab", show_default=False)]
NoWeightCacheOption = Annotated[bool, typer.Option(
    "--no-weight-cache", help="neither read nor write calibrated weight builds (GPTQ/AWQ/SmoothQuant, about the decoder's size each) on disk")]


def start_run(command: str, threads: int | None, facts: str = "", cache_dir: Path | None = None,
              weight_cache: bool = True, writes: Callable[[], str] | None = None) -> ThreadChoice:
    """Choose and set the threads, apply ``--cache-dir`` / ``--no-weight-cache``, print the header
    line (with the cache's size and, from ``writes``, what the run may add to it) and a warning when
    the cache is past its threshold; hold the cache for the run (prune keeps what it uses). Call
    after all checks, before heavy work."""
    from wkvlab.display import err_console
    from wkvlab.models.cache import describe_cache, hold_cache, use_cache

    use_cache(cache_dir, weight_cache)
    chosen = choose_threads(threads)  # the last refusal: nothing is hashed or locked before it
    hold_cache()
    cache, warning = describe_cache()
    if writes is not None:
        cache = f"{cache}; this run {writes()}"
    facts = f"{facts}; {cache}" if facts else cache
    # transformers' GGUF converter draws a tqdm bar that our status line already says; tqdm reads
    # TQDM_DISABLE only when it is imported, so it must be set before the API imports transformers.
    os.environ.setdefault("TQDM_DISABLE", "1")
    choice = apply_threads(chosen)
    run_header(command, choice, facts)
    print_estimates()
    if warning is not None:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    return choice


def print_estimates() -> None:
    """Print each memory estimate a grid of this run makes for itself (explain's factorial, a probe,
    a sweep's grids), once per distinct line: the header's ``memory:`` line where no preflight gave one."""
    from wkvlab.eval.memory import listen

    listen(_show_estimate)


_PRINTED: set[str] = set()


def _show_estimate(estimate) -> None:
    from wkvlab.display import err_console

    line = estimate.one_line()
    if line not in _PRINTED:
        _PRINTED.add(line)
        err_console.print(escape(line), highlight=False, soft_wrap=True)
