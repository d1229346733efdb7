"""``wkvlab cache list`` and ``wkvlab cache prune``: what the disk cache holds, and trimming it
(:mod:`wkvlab.models.cache_entries`; no torch)."""
from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from wkvlab.cliopts import CacheDirOption

cache_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="The disk cache (model copies, calibrated builds, K/V statistics, ...): list it, prune it (docs/cli.md).")


def _age(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= span:
            return f"{seconds / span:.1f} {unit} ago"
    return "just now"


def _root(cache_dir: Optional[Path]) -> Path:
    from wkvlab.models.cache import cache_dir as default_root

    return Path(cache_dir).expanduser() if cache_dir is not None else default_root()


@cache_app.command("list")
def list_command(cache_dir: CacheDirOption = None) -> None:
    """Every entry under the cache root, least recently used first: kind, model, size, last use; totals per kind."""
    from rich.table import Table

    from wkvlab.display import console
    from wkvlab.models.cache import gib, warn_gib
    from wkvlab.models.cache_entries import describe_model, list_entries, model_names

    root = _root(cache_dir)
    entries = list_entries(root)
    if not entries:
        console.print(escape(f"cache {root}: empty"), highlight=False)
        return
    names, now = model_names(root), time.time()
    table = Table(title=escape(f"cache {root}: {len(entries)} entries, {gib(sum(e.size for e in entries))}"), title_justify="left")
    for name, justify in (("kind", "left"), ("model", "left"), ("size", "right"), ("last use", "right"), ("entry", "left")):
        table.add_column(name, justify=justify, no_wrap=justify == "right")
    for e in entries:
        when = f"{datetime.fromtimestamp(e.last_used):%Y-%m-%d %H:%M} ({_age(now - e.last_used)})"
        table.add_row(e.kind + (" (partial)" if e.partial else ""), escape(describe_model(e.model, names) if e.model else "-"),
                      gib(e.size), when, escape(f"{e.part}/{e.path.name}"))
    console.print(table)
    totals: dict[str, int] = {}
    for e in entries:
        totals[e.kind] = totals.get(e.kind, 0) + e.size
    console.print(escape("; ".join(f"{kind} {gib(size)}" for kind, size in sorted(totals.items(), key=lambda kv: -kv[1]))), highlight=False)
    limit = warn_gib()
    if limit:
        console.print(escape(f"runs warn past {limit:g} GiB (WKVLAB_CACHE_WARN_GIB); 'wkvlab cache prune --max-size 2G' trims "
                             "the least recently used first"), highlight=False)


@cache_app.command("prune")
def prune_command(
    older_than: Annotated[Optional[str], typer.Option("--older-than", help="remove entries not used for this long: 7d, 12h, 30m, 2w")] = None,
    max_size: Annotated[Optional[str], typer.Option("--max-size", help="then remove least recently used entries until the cache holds at most this: 2G, 500M")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="only this model's entries (a path, name or hub id; alone: all of them)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be removed, remove nothing")] = False,
    cache_dir: CacheDirOption = None,
) -> None:
    """Remove cache entries, least recently used first; never one a running wkvlab may be writing or reading."""
    from wkvlab.display import console, err_console
    from wkvlab.models.cache import gib
    from wkvlab.models.cache_entries import (describe_model, list_entries, model_fingerprint, model_names, parse_age, parse_size,
                                             plan_prune, pruning_lock, remove_entry)

    age = parse_age(older_than) if older_than is not None else None
    size = parse_size(max_size) if max_size is not None else None
    root = _root(cache_dir)
    with pruning_lock(root) as busy:
        entries = list_entries(root)
        names = model_names(root)
        fingerprint = model_fingerprint(model) if model is not None else None
        plan = plan_prune(entries, older_than=age, max_size=size, model=model, busy=busy, names=names, fingerprint=fingerprint)
        verb = "would remove" if dry_run else "removed"
        for e in plan.remove:
            if not dry_run:
                remove_entry(e)
            console.print(escape(f"{verb} {e.part}/{e.path.name} ({e.kind}, {describe_model(e.model, names)}, {gib(e.size)}, "
                                 f"last used {datetime.fromtimestamp(e.last_used):%Y-%m-%d %H:%M})"), highlight=False)
    kept = f"; kept {len(plan.kept_in_use)} being written or in use by a running wkvlab" if plan.kept_in_use else ""
    err_console.print(escape(f"cache {root}: {verb} {len(plan.remove)} entries, {gib(plan.freed)}; "
                             f"{'would leave' if dry_run else 'left'} {gib(plan.total - plan.freed)}{kept}"), highlight=False)
