"""Run one finding and keep its run record in docs/runs/, so docs/findings.md's tables are renderings of a run.

    python scripts/findings_record.py additivity --model default --store out/findings.db \\
        --out docs/runs/findings-additivity-default.json [-- --tokens 4096 ...]

runs ``wkvlab findings NAME --model M --store S --threads T [extra options]`` (T from ``--threads``, default 1) from this checkout (its
progress on this terminal), samples the machine's load average every 30 s while it runs, and writes a
record: the command, the commit, the date, the wall time, the load before / after / lowest / highest,
the weight cache's state at the start (a cold cache means the quantizations are inside the wall time),
and the finding exactly as the store keeps it (its rows with intervals, the Markdown it printed and,
for additivity, methods and calibration, every cell's per-unit values: src/wkvlab/findings/records.py).
``python scripts/doc_tables.py --write findings-<name>-<model>`` then renders the record into the doc —
those three decided again from the per-unit values by the rule of the checkout that renders them —
and the fast tier checks that the doc is that rendering.

The store makes a finding resumable: a record written after an interrupted run measures only the
rest, which the record says (``resumed``: configs already in the store at the start). A finding that
reads another finding's store (``methods`` reads ``additivity``'s grid) or a re-analysis after a fix to
the analysis measures nothing: ``--filled-by RECORD`` keeps the run that filled the store (its command,
commit, wall time and load) in the new record, and the caption names both. Search and depth resume from the on-disk
cache instead, and a run of theirs longer than one machine's life goes on on the next with ``--carry DIR`` (a folder in
the repository: scripts/findings_carry.py, carry/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "src"))

from doc_tables import _commit  # noqa: E402  (the same commit words as the demo's record)
import findings_carry  # noqa: E402  (SYNC_SECONDS, read at each sync: a test shortens it)
from findings_carry import FINDINGS, carried_words, carry_in, carry_out, earlier_runs  # noqa: E402
from output_record import PauseClock, load_words, sampled_run  # noqa: E402  (one sampler for both records)
import output_record  # noqa: E402  (SAMPLE_SECONDS, read when a carried run starts: a test shortens it)
from wkvlab.models.cache import cache_dir  # noqa: E402  (the cache root wkvlab itself uses; no torch)


STORE_GRIDS = ("additivity", "methods", "calibration")


def resumed_configs(name: str, store: Path) -> int:
    """What the caption calls "configs already in the store": the grid findings read their configs back from the
    store; depth says which parts (prefix length × documents) it read back from the cache (in its data) and search resumes from the cache, so
    a count of the whole shared store would credit them with every other finding's configs."""
    return _stored_configs(store) if name in STORE_GRIDS else 0


def _stored_configs(store: Path) -> int:
    """Configs already measured in the store (0 for a new one): a resumed run's wall time covers only the rest."""
    import sqlite3

    if not store.exists():
        return 0
    with sqlite3.connect(store) as conn:
        try:
            return conn.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def _cache_state() -> str:
    root = cache_dir() / "quantized"
    entries = list(root.iterdir()) if root.is_dir() else []
    return f"{len(entries)} quantized weight set(s) cached" if entries else "empty (every quantization inside the wall time)"


def search_cache_state(root: Path | None = None) -> str:
    """The search finding keeps its profiles and held-out scores in the on-disk cache, not in the store:
    what is there at the start (a run that resumes after an interruption measures only the rest).
    Counts every cached entry, so it is an upper bound on what this run reuses."""
    root = root or cache_dir()
    profiles = len(list((root / "search-profiles").glob("*.json")))
    scores = len(list((root / "findings-search").glob("*.npz")))
    if not profiles and not scores:
        return "empty (every profile and held-out score inside the wall time)"
    return f"{profiles} profile(s) and {scores} held-out score(s) cached (measured before this run; its wall time covers the rest)"


def _keep_carrying(carry: Path, this_run: dict, since: float):
    """Every SYNC_SECONDS while the run goes: its new files into the carry folder and its entry (``exit`` None) into the
    manifest, so a machine that ends mid-run (its processes killed with it) leaves them in the checkout. Returns the
    function that stops it."""
    import threading

    # The clock and the load are sampled as often as the run's own sampler: a pause is seen from the first late wake-up
    # on, so a sampler that woke only at each sync (5 min) missed up to that much of every pause
    period = min(output_record.SAMPLE_SECONDS, findings_carry.SYNC_SECONDS)
    stop, loads, clock = threading.Event(), [os.getloadavg()[0]], PauseClock(period)
    start = clock.last

    def sync() -> None:
        copied = start
        while not stop.wait(period):
            now = clock.tick()
            loads.append(os.getloadavg()[0])
            if now - copied >= findings_carry.SYNC_SECONDS - 1e-3:
                copied = now
                carry_out(carry, cache_dir(), {**this_run, "wall_s": round(now - start, 1), "paused_s": round(clock.paused, 1),
                                               **load_words(loads), "exit": None}, since)

    thread = threading.Thread(target=sync, daemon=True)
    thread.start()

    def stopped() -> tuple[float, list[float]]:  # the pauses and loads it saw, for a run whose own sampler never returned
        stop.set()
        thread.join()
        return round(clock.paused, 1), [*loads, os.getloadavg()[0]]
    return stopped


def run(name: str, model: str, store: Path, extra: list[str], threads: int = 1, carry: Path | None = None) -> dict:
    command = ["findings", name, "--model", model, "--store", str(store), "--threads", str(threads), *extra]
    resumed = resumed_configs(name, store)
    carried = carry_in(carry, cache_dir()) if carry is not None else 0
    since = time.time()  # what the run itself writes to the cache is newer than what was carried in
    commit, cache, date = _commit(), _cache_state(), f"{datetime.now(timezone.utc):%Y-%m-%d}"
    from_cache = {"search_cache": search_cache_state()} if name == "search" else {}  # what the run resumes from
    if carry is not None:
        print(f"--carry {carry}: {carried} file(s) copied into the cache {cache_dir()}")
        from_cache["carried"] = earlier_runs(carry)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    this_run = {"commit": commit, "date": date, "started": datetime.now(timezone.utc).isoformat(), "threads": threads}
    syncing = _keep_carrying(carry, this_run, since) if carry is not None else None

    def keep(code, wall: float, loads: list[float] | None, paused: float | None, words: str) -> None:  # finished, failed or stopped
        seen_paused, seen_loads = syncing()
        # A run stopped from outside has no sampler result: the sync thread's samples are its whole record
        paused, loads = (seen_paused if paused is None else paused), (seen_loads if loads is None else loads)
        carry_out(carry, cache_dir(), {**this_run, "wall_s": round(wall, 1), "paused_s": paused, **load_words(loads), "exit": code},
                  since)
        mine = next(r for r in earlier_runs(carry) if r.get("started") == this_run["started"])
        print(f"--carry {carry}: {words}; {mine['files_added']} file(s) this run measured kept there (commit them to go on elsewhere)")

    started = time.monotonic()
    try:
        code, _, wall, loads, paused = sampled_run([sys.executable, "-m", "wkvlab.cli", *command], env, capture=False)
    except BaseException:  # Ctrl-C, or SIGTERM (main): subprocess.run has killed the finding; keep what it measured
        if carry is not None:
            keep("interrupted", time.monotonic() - started, None, None, "interrupted")
        raise
    if carry is not None:
        keep(code, wall, loads, paused, f"exit {code}")
    if code != 0:
        raise SystemExit(f"wkvlab findings {name} failed (exit {code}); nothing recorded"
                         + (f"; its measurements so far are in {carry}" if carry is not None else ""))
    from wkvlab.store import open_store

    with open_store(store) as db:
        stored = next(f for f in db.findings() if f.name == name and f.model == model)
    shown = ["wkvlab", *command[:-len(extra) or None], *extra]
    shown[shown.index("--store") + 1] = "out/findings.db"
    return {"command": " ".join(shown), "commit": commit, "date": date, "wall_s": round(wall, 1), "paused_s": paused,
            **load_words(loads), "threads": threads, "weight_cache": cache, "resumed": resumed, **from_cache,
            "name": name, "model": model, "data": stored.data, "markdown": stored.markdown}


FILLED_BY_KEYS = ("command", "commit", "date", "wall_s", "load_min", "load_max", "threads", "weight_cache")


def filled_by_words(path: Path) -> dict:
    """What a re-analysis must still say about the measurement itself: the filling run's provenance
    (a re-analysis's own wall time is seconds, and its commit is not the one that measured)."""
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"--filled-by {path}: not a readable run record ({exc}); give the record of the run that filled the store")
    missing = [k for k in FILLED_BY_KEYS if k not in earlier]
    if missing:
        raise SystemExit(f"--filled-by {path}: a run record has {', '.join(missing)}; give one written by scripts/findings_record.py")
    return {k: earlier[k] for k in FILLED_BY_KEYS}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the finding (wkvlab findings --help)")
    parser.add_argument("--model", default="default")
    parser.add_argument("--store", type=Path, required=True, help="the results store (resumable)")
    parser.add_argument("--out", type=Path, required=True, help="the run record to write (docs/runs/findings-NAME-MODEL.json)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the run (1 leaves the other core to the machine)")
    parser.add_argument("--filled-by", type=Path, help="the record of the run that measured the store's configs (when this one "
                        "only re-analyses them): its command, commit, wall time and load are kept in this record")
    parser.add_argument("--carry", type=Path, help="search and depth: a folder in the repository for what the finding "
                        "measured so far, read into the cache before the run and written back after it, finished or not, so "
                        "a run longer than one machine's life goes on on the next (scripts/findings_carry.py)")
    args = parser.parse_args(argv)
    if args.carry is not None and args.name not in FINDINGS:
        raise SystemExit(f"--carry is for {', '.join(FINDINGS)} (they resume from the cache); {args.name} resumes from --store")
    if not args.out.parent.is_dir():
        raise SystemExit(f"folder {args.out.parent} does not exist; create it or choose another --out")
    if "--threads" in extra:
        raise SystemExit("give --threads before --, to findings_record.py itself (the record names it)")
    filled_by = filled_by_words(args.filled_by) if args.filled_by else None
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # killed like Ctrl-C: the finding stopped, --carry kept
    record = run(args.name, args.model, args.store, extra, args.threads, args.carry)
    if filled_by:
        record["filled_by"] = filled_by
    args.out.write_text(json.dumps(record, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {record['command']} at {record['commit']}, wall {record['wall_s']:.0f} s, "
          f"load {record['load_min']}–{record['load_max']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
