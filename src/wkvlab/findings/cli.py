"""``wkvlab findings NAME``: run (or resume) one finding into a store and print its tables."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from wkvlab.cliopts import CacheDirOption, NoWeightCacheOption, ThreadsOption, start_run


def findings_command(
    name: Annotated[str, typer.Argument(help="additivity, methods, attention, calibration, depth, depth-long, search, engine (docs/findings.md)")],
    model: Annotated[str, typer.Option(help="'default' (SmolLM2-135M), 'gemma3-270m', a .gguf file or an HF folder")] = "default",
    store: Annotated[Path, typer.Option(help="results store the finding's sweeps write into (resumable)")] = Path("out/findings.db"),
    ctx: Annotated[Optional[int], typer.Option(help="tokens per window (default: sized per model; for depth, the longest window, prefix + targets: the model's limit)")] = None,
    tokens: Annotated[Optional[int], typer.Option(help="tokens per grid (default: sized per model, docs/findings.md; for depth, the target tokens per document, 2048)")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:<N>")] = "auto",
    dtype: Annotated[str, typer.Option(help="auto (bfloat16 on a GPU, float32 on the CPU), float32, bfloat16, float16")] = "auto",
    markdown: Annotated[Optional[Path], typer.Option(help="also write the finding's tables as Markdown here")] = None,
    margin: Annotated[Optional[str], typer.Option("--margin", help="the decision rule's practical margin m (docs/stats.md): a percent "
                      "of the predicted total KLD(W)+KLD(C) for an interaction or of the baseline for a difference, an absolute "
                      "number (0.002 nats), or cache:10%; default 10%, and for depth and depth-long 5% of the penalty at the "
                      "shortest prefix (the margin the design has its power at, docs/findings.md)")] = None,
    replicates: Annotated[Optional[int], typer.Option(help="additivity, methods, calibration: how many times each grid is "
                          "measured — replicate r ≥ 1 with the r-th disjoint calibration sample and chunks halved r times (another "
                          "float order), each its own configs in the store — pooled into every interval with the run-to-run variance "
                          "(docs/findings.md); default 2 (twice the cost of 1; a store holding a run without replicates measures only "
                          "the second); 1: one measurement, run-to-run variance not included")] = None,
    threads: ThreadsOption = None,
    cache_dir: CacheDirOption = None,
    no_weight_cache: NoWeightCacheOption = False,
) -> None:
    """Measure one of the seeds' questions on a model (resumable through the store) and print its tables with intervals."""
    from wkvlab.display import console, err_console, progress_bar
    from wkvlab.errors import ConfigError
    from wkvlab.findings import FINDINGS, grids

    if name not in FINDINGS:
        raise ConfigError(f"unknown finding {name!r}; use one of {', '.join(FINDINGS)}")
    if not store.parent.is_dir():
        raise ConfigError(f"folder {store.parent} does not exist; create it or choose another --store")
    if markdown is not None and markdown.is_dir():
        raise ConfigError(f"--markdown {markdown} is a folder; give a file name such as {markdown / (name + '.md')}")
    if markdown is not None and not markdown.parent.is_dir():
        raise ConfigError(f"folder {markdown.parent} does not exist; create it or choose another --markdown")
    from wkvlab.stats.decision import MarginRule

    margin = None if margin is None else MarginRule.parse(margin)  # a bad --margin: one line, before any model loads
    grids.check_size(name, model, ctx=ctx, tokens=tokens)
    replicates = grids.replicate_count(name, replicates)
    start_run("findings", threads, f"{name} on {model} (store {store})", cache_dir=cache_dir, weight_cache=not no_weight_cache)
    from wkvlab.findings.run import run_finding

    finding = run_finding(name, model=model, store=store, tokens=tokens, ctx=ctx, device=device, dtype=dtype, progress=progress_bar,
                          margin=margin, replicates=replicates)
    console.print(finding.markdown, markup=False, highlight=False, soft_wrap=True)
    err_console.print(f"{name} on {model}: {finding.seconds:,.0f} s (store {store})")
    if markdown is not None:  # the finding is already in the store: a failed write loses nothing
        try:
            markdown.write_text(f"## {name} — {model}\n\n{finding.markdown}\n", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"could not write --markdown {markdown} ({exc.strerror}); the finding is in {store}: "
                              f"rerun with another --markdown to print it again without measuring") from None
        err_console.print(f"wrote {markdown}")
