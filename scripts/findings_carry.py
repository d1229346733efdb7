"""A finding's measurements so far, kept in the repository so a run longer than one machine's life goes on on the next.

The search finding on SmolLM2 is about six hours of two CPU cores (20 profiles, then ~900 held-out scores), the depth
finding about three; the machines these records are measured on live three. Both keep what they measured as
content-addressed cache files of a few kB (``search-profiles/*.json``, ``findings-search/*.npz``: a profile, a plan's
held-out score; ``findings-depth/*.npz``: one part of a prefix length: four documents' scores), so a run resumes from whatever the
cache holds. ``scripts/findings_record.py ... --carry DIR`` copies DIR's files into the cache before the run and the
ones the run wrote back into DIR after it, finished or not (an interrupted run keeps what it measured), and appends the
run to ``DIR/runs.json``:
its commit, date, wall time, load and how many files it added. The record names those earlier runs, so a table measured
over several machines says so. Once the record is written the folder has served its purpose and is removed with it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

SYNC_SECONDS = 300  # how often a running run's new files go to the carry folder (a machine may end mid-run)
CARRIED = {"search-profiles": "*.json", "findings-search": "*.npz", "findings-depth": "*.npz"}  # cache subfolder -> its files
FINDINGS = ("search", "depth", "depth-long")  # the findings that resume from the cache (the grids resume from --store)
MANIFEST = "runs.json"


def _files(root: Path) -> dict[str, list[Path]]:
    # ".tmp." files are half-written (killed mid-save): never carried
    return {sub: sorted(p for p in (root / sub).glob(pattern) if ".tmp." not in p.name) for sub, pattern in CARRIED.items()}


def counts(root: Path) -> dict[str, int]:
    return {sub: len(found) for sub, found in _files(root).items()}


def _copy_missing(src: Path, dst: Path, since: float | None = None) -> int:
    """Copy every finished file under ``src`` that ``dst`` lacks (content-addressed names: same name, same content);
    with ``since``, only files written at or after it (a user's cache may hold other runs' profiles)."""
    copied = 0
    for sub, found in _files(src).items():
        for path in found:
            if since is not None and path.stat().st_mtime < since:
                continue
            target = dst / sub / path.name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target.with_name(target.name + ".part"))
                target.with_name(target.name + ".part").replace(target)
                copied += 1
    return copied


def earlier_runs(carry: Path) -> list[dict]:
    path = carry / MANIFEST
    if not path.is_file():
        return []
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise SystemExit(f"--carry {carry}: {MANIFEST} is not JSON ({exc}); restore it from git (git checkout -- {path})")
    if not isinstance(runs, list):
        raise SystemExit(f"--carry {carry}: {MANIFEST} is not a list of runs; restore it from git (git checkout -- {path})")
    return runs


def carry_in(carry: Path, cache: Path) -> int:
    """Before a run: the carried files into the cache; how many were copied."""
    earlier_runs(carry)  # a broken manifest stops the run before it measures anything
    return _copy_missing(carry, cache) if carry.is_dir() else 0


def carry_out(carry: Path, cache: Path, run: dict, since: float) -> int:
    """During and after a run: the finished files it wrote to the cache (at or after ``since``, a time stamp) into the
    carry folder, and the run in its manifest (one entry per ``run["started"]``, replaced at each call: while it runs
    its ``exit`` is None, so a machine that ends mid-run leaves an entry saying so); how many files this call added."""
    carry.mkdir(parents=True, exist_ok=True)
    added = _copy_missing(cache, carry, since)
    runs = earlier_runs(carry)
    before = sum(r["files_added"] for r in runs if r.get("started") == run["started"])
    runs = [r for r in runs if r.get("started") != run["started"]] + [{**run, "files_added": before + added, "files": counts(carry)}]
    tmp = carry / (MANIFEST + ".part")
    tmp.write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    tmp.replace(carry / MANIFEST)
    return added


def carried_words(runs: list[dict]) -> str:
    """The caption's account of the earlier runs a carried record continues ("" for none)."""
    if not runs:
        return ""
    wall = sum(r.get("wall_s", 0.0) for r in runs)
    each = "; ".join(f"{r['commit']} on {r['date']}, wall {r['wall_s'] / 60:.0f} min"
                     + (f" ({r['paused_s'] / 60:.0f} of them paused)" if r.get("paused_s") else "")
                     + f", load {r['load_min']}–{r['load_max']}, "
                     f"{r['files_added']} file(s){'' if r.get('exit') is not None else ', ended with its machine'}" for r in runs)
    return (f"continues {len(runs)} earlier run(s) on other machines whose measurements were carried in the repository "
            f"({each}; {wall / 3600:.1f} h in all)")
