"""Run one wkvlab command and keep what it printed as a run record, so a doc's sample output is a rendering of a run.

    python scripts/output_record.py --doc docs/explain.md --out docs/runs/output-explain-default-int4.json \\
        -- explain --model default --weights int4-g128 --kv int4 --ctx 256 --tokens 2048 --threads 1

runs ``wkvlab ARGS`` from this checkout with a fixed terminal width (``COLUMNS=140``, no colour), samples
the load average every 30 s while it runs, and writes a record: the command, the commit, the date, the
wall time, the load before / after / lowest / highest, the doc it belongs in, and the command's
standard output — and, for ``explain``, the per-unit values of its factorial's four cells and the verdicts
it printed on them (from its ``--json``), so that doc_tables.py decides them again by today's rule.
``python scripts/doc_tables.py --write output-<name>`` then puts the output into its doc between ``<!-- doc-table: output-<name> -->`` markers, and the fast tier checks that the doc is
the record's rendering. The run fails (nothing recorded) when the command exits non-zero.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from doc_tables import _commit  # noqa: E402

WIDTH = "140"


SAMPLE_SECONDS = 30
# A sampler that wakes this much later than asked was stopped with the run (SIGSTOP to free the cores for another
# measurement or a test run): the monotonic clock went on, the run did not. Scheduling on a loaded machine delays a
# wake-up by well under a second.
PAUSE_SLACK_SECONDS = 10


def paused_since(last: float, now: float, period: float) -> float:
    """The seconds a sampler that last woke at ``last`` and was to wake ``period`` later stood still (0 if on time)."""
    late = now - last - period
    return late if late > PAUSE_SLACK_SECONDS else 0.0


class PauseClock:
    """A periodic sampler's wake-ups: each late one adds to the time the run stood paused (both samplers use it)."""

    def __init__(self, period: float):
        self.period, self.last, self.paused = period, time.monotonic(), 0.0

    def tick(self) -> float:
        """Called at each wake-up: the monotonic time now."""
        now = time.monotonic()
        self.paused += paused_since(self.last, now, self.period)
        self.last = now
        return now


def sampled_run(command: list[str], env: dict, capture: bool) -> tuple[int, str, float, list[float], float]:
    """Run ``command`` with the load average sampled every 30 s: (exit code, stdout if captured, wall seconds, loads,
    seconds the run stood paused inside that wall time, measured as the sampler's late wake-ups)."""
    loads, done, clock = [os.getloadavg()[0]], threading.Event(), PauseClock(SAMPLE_SECONDS)

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            clock.tick()
            loads.append(os.getloadavg()[0])

    start = time.monotonic()
    threading.Thread(target=sample, daemon=True).start()
    proc = subprocess.run(command, env=env, cwd=ROOT, stdout=subprocess.PIPE if capture else None, text=True)
    done.set()
    wall = time.monotonic() - start
    loads.append(os.getloadavg()[0])
    return proc.returncode, proc.stdout or "", wall, loads, round(clock.paused, 1)


def load_words(loads: list[float]) -> dict:
    """The record's load fields."""
    return {"load_before": round(loads[0], 2), "load_after": round(loads[-1], 2), "load_min": round(min(loads), 2),
            "load_max": round(max(loads), 2)}


def run(args: list[str]) -> dict:
    commit, date = _commit(), f"{datetime.now(timezone.utc):%Y-%m-%d}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": WIDTH, "NO_COLOR": "1", "TERM": "dumb"}
    with tempfile.TemporaryDirectory() as folder:
        # explain also writes its JSON, whose factorial cells' per-unit values the record keeps (its verdicts decided again later)
        json_out = Path(folder) / "explain.json"
        extra = ["--json", str(json_out)] if args[:1] == ["explain"] and "--json" not in args else []
        code, stdout, wall, loads, paused = sampled_run([sys.executable, "-m", "wkvlab.cli", *args, *extra], env, capture=True)
        if code != 0:
            raise SystemExit(f"wkvlab {' '.join(args)} failed (exit {code}); nothing recorded")
        written = json.loads(json_out.read_text(encoding="utf-8")) if extra else {}
    record = {"command": "wkvlab " + " ".join(args), "commit": commit, "date": date, "wall_s": round(wall, 1), "paused_s": paused,
              **load_words(loads),
              "columns": int(WIDTH), "stdout": stdout}
    if written.get("units"):
        record.update(margin=written["options"].get("margin", "10%"), units=written["units"],
                      factorial={m: (written["factorial"][m].get("verdict") or {}).get("word") for m in ("kld", "ppl")})
    return record


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("give the wkvlab command after --, e.g. -- explain --weights int4-g128 --kv int4")
    split = argv.index("--")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, required=True, help="the doc the output belongs in (docs/explain.md)")
    parser.add_argument("--out", type=Path, required=True, help="the record: docs/runs/output-<name>.json")
    args = parser.parse_args(argv[:split])
    if not args.out.name.startswith("output-") or args.out.suffix != ".json":
        raise SystemExit(f"--out {args.out}: name the record output-<name>.json so doc_tables.py finds it")
    if not (ROOT / args.doc).is_file() and not args.doc.is_file():
        raise SystemExit(f"--doc {args.doc} is not a file of this checkout")
    record = run(argv[split + 1:])
    record["doc"] = str(args.doc.resolve().relative_to(ROOT)) if args.doc.resolve().is_relative_to(ROOT) else str(args.doc)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {record['command']} at {record['commit']}, wall {record['wall_s']:.0f} s, "
          f"load {record['load_min']}–{record['load_max']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
