"""The README's times for its two commands (`make demo`, `make test`): measured from a fresh clone, recorded, and
written into the README from the record (issue #42 item 6).

    python scripts/readme_times.py run demo              # fresh clone of this checkout's HEAD, `make demo`, one record
    python scripts/readme_times.py run test              # the same for `make test`
    python scripts/readme_times.py run demo --repo /path/to/clone/from --rev BRANCH
    python scripts/readme_times.py readme                # rewrite the README's time sentences from docs/runs/readme-times.json
    python scripts/readme_times.py readme --check        # exit 1 when the README is not the record's rendering

A run clones the repository into a temporary folder, times ``make install`` (the venv) and then the target
(``make demo`` or ``make test``, which find the install done), and samples the machine's 1-minute load
average (/proc/loadavg) every few seconds while both run: the record keeps the command, the clone's commit,
the date, each phase's wall time and the load's minimum, median and maximum over the run (the README's
ranges must include runs on a loaded machine, so the load during the run is the number that matters, not
the load before it). The record is appended to ``docs/runs/readme-times.json``; the README's sentences
between ``<!-- readme-times: TARGET -->`` and ``<!-- /readme-times -->`` are its rendering. Runs measured
before this script existed are in the record too, with the load noted before and after them
(``"sampled": false``) and what they ran next to.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "runs" / "readme-times.json"
README = ROOT / "README.md"
TARGETS = ("demo", "test")
SAMPLE_SECONDS = 5.0
LOADED = 4.0  # the README's range must include a run whose load reached this (issue #42 item 6)


def read_load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class LoadSampler:
    """The 1-minute load average every ``period`` seconds on a background thread, until stopped."""

    def __init__(self, period: float = SAMPLE_SECONDS, read=read_load):
        self.period, self.read, self.samples = period, read, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append(self.read())
            if self._stop.wait(self.period):
                return

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.read())

    def summary(self) -> dict:
        return {"min": min(self.samples), "median": round(statistics.median(self.samples), 2),
                "max": max(self.samples), "samples": len(self.samples), "every_s": self.period, "sampled": True}


def timed(command: list[str], cwd: Path, log) -> tuple[float, int]:
    start = time.monotonic()
    done = subprocess.run(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    return round(time.monotonic() - start, 1), done.returncode


def pytest_summary(log_text: str) -> str | None:
    """pytest's last line ("1,943 passed, 5 skipped in 598.12s"), without its '=' rule."""
    lines = [line.strip("= ").strip() for line in log_text.splitlines() if re.search(r"\b(passed|failed)\b", line)]
    return lines[-1] if lines else None


def run(target: str, repo: Path, rev: str, keep: bool) -> dict:
    folder = Path(tempfile.mkdtemp(prefix=f"wkvlab-readme-{target}-"))
    clone = folder / "clone"
    subprocess.run(["git", "clone", "--quiet", str(repo), str(clone)], check=True)
    subprocess.run(["git", "checkout", "--quiet", rev], cwd=clone, check=True)
    commit = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=clone, check=True,
                            capture_output=True, text=True).stdout.strip()
    log_path = folder / "make.log"
    started = datetime.now(timezone.utc)
    with open(log_path, "w") as log, LoadSampler() as load:
        install_s, rc = timed(["make", "install"], clone, log)
        target_s, rc2 = (timed(["make", target], clone, log) if rc == 0 else (0.0, rc))
    text = log_path.read_text(errors="replace")
    record = {
        "target": target, "command": f"git clone <repo> /tmp/x && cd /tmp/x && make {target}",
        "commit": commit, "date": started.strftime("%Y-%m-%d"), "started_utc": started.strftime("%H:%M"),
        "install_s": install_s, "target_s": target_s, "wall_s": round(install_s + target_s, 1),
        "returncode": rc2, "load": load.summary(), "cores": os.cpu_count(),
    }
    if target == "test":
        record["pytest"] = pytest_summary(text)
    if rc2 != 0:
        record["log_tail"] = text[-2000:]
    if keep:
        print(f"readme_times: the clone and its make log are in {folder}", file=sys.stderr)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    return record


def load_record() -> list[dict]:
    return json.loads(RECORD.read_text())["runs"] if RECORD.exists() else []


def save_record(runs: list[dict]) -> None:
    RECORD.write_text(json.dumps({"about": "scripts/readme_times.py: fresh-clone runs of the README's two commands",
                                  "runs": runs}, indent=1, ensure_ascii=False) + "\n")


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def load_text(load: dict) -> str:
    """Sampled during the run: its range and median; an older run noted by hand: the load before → after."""
    if not load.get("sampled", True):
        return f"{load['min']:.1f} before, {load['max']:.1f} after"
    return f"{load['min']:.1f}–{load['max']:.1f}, median {load['median']:.1f}"


def _run_text(r: dict) -> str:
    """``25:13 at load 1.7–15.7, median 12.2 (df4893c, next to ...; install 3:03 of it)``."""
    facts = [r["commit"]] + ([f"next to {r['next_to']}"] if r.get("next_to") else [])
    install = f"; install {clock(r['install_s'])} of it" if r.get("install_s") else ""
    return f"{clock(r['wall_s'])} at load {load_text(r['load'])} ({', '.join(facts)}{install})"


def sentence(target: str, runs: list[dict]) -> str:
    """The README's sentence for one target: the range over every successful recorded run, its two ends with
    their load, and where the rest are."""
    done = sorted((r for r in runs if r["target"] == target and r["returncode"] == 0), key=lambda r: r["wall_s"])
    if not done:
        raise SystemExit(f"readme_times: no successful `make {target}` in {RECORD.relative_to(ROOT)}; "
                         f"record one with `python scripts/readme_times.py run {target}`")
    low, high = int(done[0]["wall_s"] // 60), int(-(-done[-1]["wall_s"] // 60))
    span = f"{low}–{high} minutes" if high > low + 1 else f"about {clock(done[-1]['wall_s'])}"
    ends = [done[0]] + ([done[-1]] if len(done) > 1 else [])
    loaded = [r for r in done if r["load"]["max"] >= LOADED]
    note = "" if loaded else f" No recorded run yet had a load of {LOADED:g} or more."
    return (f"From a fresh clone on a {done[0]['cores']}-core machine it took {span}: "
            f"{' to '.join(_run_text(r) for r in ends)}. Every run, with its date, commit and load, is in "
            f"docs/runs/readme-times.json ({len(done)} runs; `python scripts/readme_times.py run {target}` "
            f"adds one, sampling the load during it, and rewrites this sentence).{note}")


BLOCK = re.compile(r"(<!-- readme-times: (\w+) -->)(.*?)(<!-- /readme-times -->)", re.S)


def render(readme: str, runs: list[dict]) -> str:
    return BLOCK.sub(lambda m: m.group(1) + sentence(m.group(2), runs) + m.group(4), readme)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    go = sub.add_parser("run", help="time one README command from a fresh clone and append the record")
    go.add_argument("target", choices=TARGETS)
    go.add_argument("--repo", type=Path, default=ROOT, help="repository to clone (default: this checkout)")
    go.add_argument("--rev", default="HEAD", help="commit or branch to check out in the clone")
    go.add_argument("--keep", action="store_true", help="keep the clone and its make log")
    go.add_argument("--no-readme", action="store_true", help="record only; leave the README alone")
    doc = sub.add_parser("readme", help="rewrite the README's time sentences from the record")
    doc.add_argument("--check", action="store_true", help="exit 1 when the README differs from the rendering")
    args = parser.parse_args(argv)
    runs = load_record()
    if args.action == "run":
        rev = subprocess.run(["git", "rev-parse", args.rev], cwd=args.repo, check=True,
                             capture_output=True, text=True).stdout.strip()
        record = run(args.target, args.repo, rev, args.keep)
        print(json.dumps(record, ensure_ascii=False))
        save_record(runs + [record])
        runs = load_record()
        if args.no_readme:
            return 0 if record["returncode"] == 0 else 1
    text = README.read_text()
    new = render(text, runs)
    if args.action == "readme" and args.check:
        if new != text:
            print("README.md's times are not docs/runs/readme-times.json's rendering: "
                  "run `python scripts/readme_times.py readme`", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
