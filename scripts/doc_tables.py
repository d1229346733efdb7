"""Tables of measured numbers in docs/, produced from a run and checked against a fresh one.

    python scripts/doc_tables.py demo --write            # run `wkvlab demo`, rewrite docs/results.md's table
    python scripts/doc_tables.py demo --check            # run it again, fail when the doc differs
    python scripts/doc_tables.py demo --json demo.json --check   # compare an existing run's JSON instead

A table lives between ``<!-- doc-table: NAME -->`` and ``<!-- /doc-table -->``; its caption line says the
command, the machine load before and after, the commit and the date, and carries a
``<!-- measured: commit=... -->`` marker that ``make docs-check`` (scripts/docs_check.py) reads.
``--check`` compares every number of the documented table with the fresh run within TOLERANCE and exits 1
listing the cells that differ (tests/test_doc_tables.py, in the slow tier: the demo takes minutes).
The demo is deterministic on one machine; across CPUs float32 sums may differ in the last digits,
which the tolerance allows for.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "results.md"
HEADER = "| weights | KV | PPL | ΔPPL | KLD mean ± se | KLD p99 | top-1 | weights MiB | KV B/token |"
# Relative tolerance per number (and an absolute floor for numbers near zero): the run is deterministic
# on one machine; another CPU's float32 summation order may move the last printed digits.
TOLERANCE, FLOOR = 0.02, 2e-5


def _cells(row: dict) -> list[str]:
    kld = row["kld"]
    return [f"`{row['weights']}`", f"`{row['kv']}`", f"{row['ppl']:.3f}", f"{row['ppl'] - row['ppl_ref']:+.3f}",
            f"{kld['mean']:.5f} ± {kld['se']:.5f}", f"{kld['p99']:.4f}", f"{100 * row['top1_agreement']:.2f}%",
            f"{row['weight_bytes'] / 2**20:.1f}", f"{row['kv_bytes_per_token']:,.0f}"]


def render(rows: list[dict], caption: str) -> str:
    lines = [caption, "", HEADER, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def _numbers(text: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"[-+]?\d[\d,]*\.?\d*", text)]


def table_rows(block: str) -> dict[tuple[str, str], list[str]]:
    """(weights, KV) -> the row's cells, from a rendered block."""
    rows = {}
    for line in block.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[(cells[0].strip("`"), cells[1].strip("`"))] = cells
    return rows


def differences(documented: str, fresh: str) -> list[str]:
    """Cells of ``documented`` that differ from ``fresh`` beyond the tolerance (rows missing either side too)."""
    old, new = table_rows(documented), table_rows(fresh)
    out = [f"{w} × {k}: only in the {'doc' if (w, k) in old else 'fresh run'}" for w, k in sorted(set(old) ^ set(new))]
    header = [h.strip() for h in HEADER.strip("|").split("|")]
    for key in [k for k in old if k in new]:
        for name, a, b in zip(header[2:], old[key][2:], new[key][2:]):
            for x, y in zip(_numbers(a), _numbers(b)):
                if abs(x - y) > max(FLOOR, TOLERANCE * max(abs(x), abs(y))):
                    out.append(f"{key[0]} × {key[1]} {name}: doc {a}, fresh {b}")
                    break
    return out


def _block(text: str, name: str) -> tuple[int, int]:
    start, end = f"<!-- doc-table: {name} -->", "<!-- /doc-table -->"
    a = text.index(start) + len(start)
    return a, text.index(end, a)


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def run_demo() -> tuple[list[dict], str]:
    """`wkvlab demo --json` from this checkout, with the load before and after."""
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "demo.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        done = subprocess.run([sys.executable, "-m", "wkvlab.cli", "demo", "--json", str(out)], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"wkvlab demo failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
        rows = json.loads(out.read_text())
    threads = rows[0].get("threads", "?")
    load = f"load {before:.1f} before, {os.getloadavg()[0]:.1f} after, {threads} thread(s)"
    return rows, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["demo"])
    parser.add_argument("--json", type=Path, help="a `wkvlab demo --json` file to use instead of running the demo")
    parser.add_argument("--write", action="store_true", help="rewrite the table in docs/results.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when the documented table differs from this run")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args(argv)
    if args.json is not None:
        rows, load = json.loads(args.json.read_text()), f"from {args.json.name}"
    else:
        rows, load = run_demo()
    commit = _commit()
    caption = (f"Generated by `python scripts/doc_tables.py demo --write` (= `wkvlab demo --json`) at commit {commit.split('+')[0]} "
               f"on {datetime.now(timezone.utc):%Y-%m-%d}, {load}; `--check` compares a fresh run within "
               f"{TOLERANCE:.0%} per number. <!-- measured: commit={commit.split('+')[0]} covers=src/wkvlab -->")
    fresh = render(rows, caption)
    text = args.doc.read_text(encoding="utf-8")
    a, b = _block(text, args.table)
    if args.check:
        diffs = differences(text[a:b], fresh)
        for line in diffs:
            print(line)
        print(f"{args.doc.name} {args.table}: {len(diffs)} cell(s) differ beyond {TOLERANCE:.0%} from the fresh run ({load})")
        if diffs:
            return 1
    if args.write:
        args.doc.write_text(text[:a] + "\n" + fresh + "\n" + text[b:], encoding="utf-8")
        print(f"wrote the {args.table} table into {args.doc}")
    if not (args.check or args.write):
        print(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
