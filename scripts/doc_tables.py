"""Every generated table in docs/: a registry, each table rendered from its source and checked against a fresh one.

    python scripts/doc_tables.py --list                          # the tables, their docs, cheap or measured
    python scripts/doc_tables.py --check cheap                   # the plan tables against today's `wkvlab plan` (seconds)
    python scripts/doc_tables.py --save docs/runs/demo.json      # run `wkvlab demo` once and keep the run record
    python scripts/doc_tables.py --from-json docs/runs/demo.json --write demo --write report-demo --write plan-demo
    python scripts/doc_tables.py --check demo                    # a fresh demo run against docs/results.md (minutes)

A table lives between ``<!-- doc-table: NAME -->`` and ``<!-- /doc-table -->`` in its doc; the first line
of the block is its caption, which says how it was made. Two kinds:

* **cheap** — the planner's arithmetic (``wkvlab plan`` on built-in model shapes, or on the recorded demo
  run): regenerated in seconds, compared exactly; tests/test_doc_tables.py checks them in the fast tier.
* **findings** — a finding's tables (docs/findings.md) from its committed run record
  ``docs/runs/findings-<finding>-<model>.json`` (``scripts/findings_record.py``: hours to measure again);
  the doc must be the record's rendering exactly (fast tier).
* **outputs** — a command's printed output (docs/explain.md's sample runs) from its committed record
  ``docs/runs/output-<name>.json`` (``scripts/output_record.py``), checked the same way.
* **measured** — from a run record (``--save``: ``wkvlab demo --json --report`` with its command, commit,
  date, wall time, threads and the machine load before and after). The caption names all of those and
  carries a ``<!-- measured: commit=... covers=src/wkvlab -->`` marker that ``make docs-check``
  (scripts/docs_check.py) reads. ``--check`` without ``--from-json`` makes a fresh run and compares every
  number within the stated tolerance (the slow tier runs it); with ``--from-json RUN`` it checks that the
  doc is the rendering of RUN (fast: docs/runs/demo.json is committed).

The tables that use the run (``plan-demo``) read the recorded rows, so they are cheap once a record exists.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # the findings are decided again by this checkout's rule, not an installed one's
    sys.path.insert(0, str(ROOT / "src"))
if str(ROOT / "scripts") not in sys.path:  # also when a test loads this file by its path
    sys.path.insert(0, str(ROOT / "scripts"))

from findings_carry import carried_words  # noqa: E402
RUN = ROOT / "docs" / "runs" / "demo.json"
DEMO_COMMAND = ["demo"]  # the README's `make demo` grid, at its defaults
HEADER = "| weights | KV | PPL | ΔPPL | KLD mean ± se | KLD p99 | top-1 | weights MiB | KV B/token |"
# Measured tables: a relative tolerance per number (with an absolute floor for numbers near zero), except
# ΔPPL, whose tolerance is absolute: a relative one on a ΔPPL of +0.003 would demand 5 significant digits.
# The demo is deterministic on one machine; another CPU's float32 summation order may move the last digits.
TOLERANCE, FLOOR, DPPL_TOLERANCE = 0.02, 2e-5, 0.05
TOLERANCE_TEXT = f"PPL, KLD, top-1 and sizes within {TOLERANCE:.0%}, ΔPPL within ±{DPPL_TOLERANCE}"
# On another CPU the demo is not bit-identical: a quantized cache turns float-rounding differences
# (another vector ISA, another summation order) into different roundings of some values, and the
# quantized-cache rows move — measured between two machines with the same code and libraries:
# KLD means by up to 1.2%, their p99 by up to 10%, ΔPPL by up to 0.23 (of +8.9), the report's
# small cross-term interactions (differences of four KLDs) and so their verdicts by more than their
# size. So a fresh run on a CPU other than the record's is compared looser, and the interactions not at all.
CROSS_CPU = {"KLD mean ± se": 0.03, "KLD p99": 0.15, "ΔPPL": 0.05}  # relative; ΔPPL: relative, with DPPL_TOLERANCE as floor
CROSS_CPU_FLOOR = 0.002  # absolute, for the report's penalties (a difference of two KLDs of ~0.4)
CROSS_CPU_SKIPPED = ("interaction", "holm_adjusted", "verdict", "additive")
CROSS_CPU_TEXT = ("on another CPU than the record's, KLD means within 3% (se 15%), p99 within 15%, ΔPPL within 5% (at least ±0.05), "
                  "the report's penalties within 15% or ±0.002, its interactions and verdicts not compared")


def cpu() -> str:
    """This machine's CPU as the run records name it: the model and its widest vector ISA (what changes float rounding)."""
    try:
        info = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        import platform
        return platform.processor() or platform.machine() or "unknown"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "unknown")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    isa = next((name for name in ("avx512f", "avx2", "avx", "sse4_2") if name in flags), "")
    return f"{model} ({isa})" if isa else model


# ---------------------------------------------------------------- the run record

def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"], capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or "unknown") + ("+changes" if dirty else "")


def _wkvlab(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "wkvlab.cli", *args], capture_output=True, text=True, env=env, cwd=ROOT)


def run_demo() -> dict:
    """`wkvlab demo --json --report` from this checkout: the run record (rows, report.md, command, commit, load, wall)."""
    before, start, commit = os.getloadavg()[0], time.monotonic(), _commit()
    with tempfile.TemporaryDirectory() as folder:
        out, report = Path(folder) / "demo.json", Path(folder) / "report"
        done = _wkvlab([*DEMO_COMMAND, "--json", str(out), "--report", str(report)])
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            raise SystemExit(f"wkvlab demo failed: {last}")
        rows, report_md = json.loads(out.read_text()), (report / "report.md").read_text(encoding="utf-8")
    return {**record(rows, report_md, command="wkvlab demo --json demo.json --report report", commit=commit,
                     wall_s=time.monotonic() - start, load=(before, os.getloadavg()[0])), "fresh": True}


def record(rows: list[dict], report_md: str | None, *, command: str, commit: str, wall_s: float, load: tuple[float, float],
           date: str | None = None) -> dict:
    return {"command": command, "commit": commit, "date": date or f"{datetime.now(timezone.utc):%Y-%m-%d}",
            "wall_s": round(wall_s, 1), "load_before": round(load[0], 2), "load_after": round(load[1], 2),
            "threads": rows[0].get("threads") or "?" if rows else "?", "cpu": cpu(), "rows": rows, "report_md": report_md}


def load_record(path: Path) -> dict:
    """A record written by ``--save``, or a bare ``wkvlab demo --json`` file (then command, load and wall are unknown)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, list):
        return record(data, None, command=f"wkvlab demo --json {path.name}", commit="unknown", wall_s=float("nan"),
                      load=(float("nan"), float("nan")), date="unknown")
    return data


def _wall(seconds: float) -> str:
    if seconds != seconds:
        return "wall unknown"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"wall {minutes}:{secs:02d}"


def _run_words(run: dict) -> str:
    return (f"`{run['command']}` at commit {run['commit'].split('+')[0]} on {run['date']}, {_wall(run['wall_s'])}, "
            f"load {run['load_before']} before, {run['load_after']} after, {run['threads']} thread(s)"
            + (f", CPU {run['cpu']}" if run.get("cpu") else ""))  # the quantized-cache rows move across CPUs


# ---------------------------------------------------------------- the demo grid (docs/results.md)

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
    """(first column, second column) -> the row's cells, for every table row of a block."""
    rows = {}
    for line in block.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[(cells[0].strip("`"), cells[1].strip("`"))] = cells
    return rows


def _close(name: str, x: float, y: float, cross_cpu: bool = False) -> bool:
    if name == "ΔPPL":
        return abs(x - y) <= max(DPPL_TOLERANCE, CROSS_CPU["ΔPPL"] * max(abs(x), abs(y)) if cross_cpu else 0.0)
    tolerance = CROSS_CPU.get(name, TOLERANCE) if cross_cpu else TOLERANCE
    return abs(x - y) <= max(FLOOR, tolerance * max(abs(x), abs(y)))


def _close_mean_se(a: str, b: str, cross_cpu: bool) -> bool:
    """``mean ± se`` cells: the mean at the KLD tolerance, its standard error at 15% across CPUs."""
    (m1, s1), (m2, s2) = _numbers(a), _numbers(b)
    return _close("KLD mean ± se", m1, m2, cross_cpu) and (_close("", s1, s2) or (cross_cpu and _close("KLD p99", s1, s2, True)))


def differences(documented: str, fresh: str, cross_cpu: bool = False) -> list[str]:
    """Cells of ``documented`` that differ from ``fresh`` beyond the tolerance (rows missing either side too);
    ``cross_cpu``: the fresh run is on another CPU than the record's (:data:`CROSS_CPU`)."""
    old, new = table_rows(documented), table_rows(fresh)
    out = [f"{w} × {k}: only in the {'doc' if (w, k) in old else 'fresh run'}" for w, k in sorted(set(old) ^ set(new))]
    header = [h.strip() for h in HEADER.strip("|").split("|")]
    for key in [k for k in old if k in new]:
        for name, a, b in zip(header[2:], old[key][2:], new[key][2:]):
            xs, ys = _numbers(a), _numbers(b)
            if name == "KLD mean ± se" and len(xs) == len(ys) == 2:
                same = _close_mean_se(a, b, cross_cpu)
            else:
                same = len(xs) == len(ys) and all(_close(name, x, y, cross_cpu) for x, y in zip(xs, ys))
            if not same:
                out.append(f"{key[0]} × {key[1]} {name}: doc {a}, fresh {b}")
    return out


def demo_table(run: dict) -> str:
    caption = (f"Generated by `python scripts/doc_tables.py --write demo` from the run record docs/runs/demo.json: {_run_words(run)}; "
               f"`--check demo` compares a fresh run ({TOLERANCE_TEXT}; {CROSS_CPU_TEXT}). "
               f"<!-- measured: commit={run['commit'].split('+')[0]} covers=src/wkvlab -->")
    return render(run["rows"], caption)


# ---------------------------------------------------------------- the report's tables (docs/report.md)

REPORT_SECTIONS = ("## KV-cache penalty", "## Cross-terms")


def report_tables(run: dict) -> str:
    """The KV-penalty and cross-term sections of the run's report.md (heading, table, column captions), as the report wrote them."""
    if not run.get("report_md"):
        raise SystemExit("report-demo: the run record has no report.md (record it with --save)")
    lines, parts = run["report_md"].splitlines(), []
    for heading in REPORT_SECTIONS:
        a = next(i for i, line in enumerate(lines) if line.startswith(heading))
        b = next((i for i in range(a + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        parts.append("\n".join(["**" + lines[a].lstrip("# ").strip() + "**", *lines[a + 1:b]]).strip())
    caption = (f"Generated by `python scripts/doc_tables.py --write report-demo`: two sections of `report.md` from the run record "
               f"docs/runs/demo.json, {_run_words(run)}; `--check report-demo` compares every cell ({TOLERANCE:.0%} per number, "
               f"the words exactly; {CROSS_CPU_TEXT}). <!-- measured: commit={run['commit'].split('+')[0]} covers=src/wkvlab -->")
    return "\n\n".join([caption, *parts])


def cell_differences(documented: str, fresh: str, cross_cpu: bool = False) -> list[str]:
    """Table cells that differ: numbers beyond the tolerance, any other text at all (rows aligned in order).

    ``cross_cpu``: the fresh run is on another CPU than the record's — the columns in
    :data:`CROSS_CPU_SKIPPED` (interactions and their verdicts) are not compared and the other
    numbers within 15% or ±0.002 (:data:`CROSS_CPU_TEXT`)."""
    def rows(block: str) -> list[list[str]]:
        return [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()
                if line.startswith("|") and not line.startswith("|---")]
    old, new = rows(documented), rows(fresh)
    if len(old) != len(new):
        return [f"{len(old)} table rows in the doc, {len(new)} in the fresh run"]
    out, header = [], []
    skeleton = lambda text: re.sub(r"[-+]?\d[\d,]*\.?\d*", "#", text)  # noqa: E731
    for a_row, b_row in zip(old, new):
        if len(a_row) != len(b_row):
            out.append(f"{' | '.join(a_row[:2])}: {len(a_row)} cells in the doc, {len(b_row)} fresh")
            continue
        if a_row[:2] == ["weights", "kv"]:  # a table's header row: which column is which
            header = a_row
        for i, (a, b) in enumerate(zip(a_row, b_row)):
            name = header[i] if i < len(header) else ""
            if cross_cpu and name in CROSS_CPU_SKIPPED:
                continue
            xs, ys = _numbers(a), _numbers(b)
            close = (lambda x, y: abs(x - y) <= max(CROSS_CPU_FLOOR, 0.15 * max(abs(x), abs(y)))) if cross_cpu else \
                (lambda x, y: _close("", x, y))
            if skeleton(a) != skeleton(b) or len(xs) != len(ys) or not all(close(x, y) for x, y in zip(xs, ys)):
                out.append(f"{' | '.join(a_row[:2])}: doc {a}, fresh {b}")
    return out


# ---------------------------------------------------------------- the planner's tables (docs/planner.md)

_PLANS: dict[tuple, str] = {}  # one `wkvlab plan` per command line and record, shared by the blocks cut from it


def _plan_output(args: list[str], keep: Callable[[list[str]], list[str]], key: tuple) -> list[str]:
    if key not in _PLANS:
        done = _wkvlab(["plan", *args], env={"COLUMNS": "160", "NO_COLOR": "1", "TERM": "dumb"})
        if done.returncode != 0:
            raise SystemExit(f"wkvlab plan {' '.join(args)} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        _PLANS[key] = re.sub(r"\S*/site-packages/", "…/site-packages/", done.stdout)  # the install's path, not the plan's
    return keep(_PLANS[key].rstrip("\n").splitlines())


def _upto(marker: str) -> Callable[[list[str]], list[str]]:
    def keep(lines: list[str]) -> list[str]:
        end = next(i for i, line in enumerate(lines) if line.startswith(marker))
        return lines[:end + 1]
    return keep


def _paragraph(start: str) -> Callable[[list[str]], list[str]]:
    def keep(lines: list[str]) -> list[str]:
        a = next(i for i, line in enumerate(lines) if line.startswith(start))
        b = next((i for i in range(a + 1, len(lines)) if not lines[i].strip()), len(lines))
        return lines[a:b]
    return keep


def plan_block(args: list[str], keep: Callable[[list[str]], list[str]], what: str, name: str, prefix: str = "") -> Callable[[dict | None], str]:
    def make(run: dict | None) -> str:
        shown = [a if a != "RUN" else "demo.json" for a in args]
        if "RUN" in args:
            if run is None:
                raise SystemExit(f"{name}: needs the run record (--from-json, default docs/runs/demo.json)")
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "demo.json"
                path.write_text(json.dumps(run["rows"]))
                lines = _plan_output([a if a != "RUN" else str(path) for a in args], keep, (*args, json.dumps(run["rows"])))
            source = f", `demo.json` = the rows of the run record docs/runs/demo.json ({_run_words(run)})"
        else:
            lines = _plan_output(args, keep, tuple(args))
            source = ""
        caption = (f"Generated by `python scripts/doc_tables.py --write {name}`: {what} of `COLUMNS=160 wkvlab plan "
                   f"{shlex.join(shown)}`{source}; tests/test_doc_tables.py fails when today's output differs.")
        return "\n".join([caption, "", prefix + "```", *lines, "```"])
    return make


# ---------------------------------------------------------------- the findings (docs/findings.md)

FINDING_RECORDS = ROOT / "docs" / "runs"
RULE_COMMIT = "f9cc290"  # "stats: verdicts whose error rate holds at the Holm levels where they are made (issue #38)"


def _hours(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _record_wall(rec: dict) -> str:
    """A record's wall time, and the part of it the run stood paused (SIGSTOP while another measurement ran), when any."""
    paused = rec.get("paused_s") or 0.0
    return f"wall {_hours(rec['wall_s'])}" + (f" ({_hours(paused)} of it paused)" if paused else "")


def finding_block(path: Path) -> Callable[[dict | None], str]:
    """A finding's tables as `wkvlab findings` printed them, from its run record (scripts/findings_record.py)."""
    def make(_run: dict | None) -> str:
        rec = json.loads(path.read_text(encoding="utf-8"))
        name, where = path.stem, (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
        threads = re.search(r" --threads (\d+)", rec["command"])
        extra = rec["command"][threads.end():].strip() if threads else ""
        again = (f"python scripts/findings_record.py {rec['name']} --model {rec['model']} --store out/findings.db "
                 f"--out {where}" + (f" --threads {threads.group(1)}" if threads and threads.group(1) != "1" else "")
                 + (f" -- {extra}" if extra else ""))
        resumed = f", {rec['resumed']} configs already in the store" if rec.get("resumed") else ""
        if rec["data"].get("read_back"):  # depth resumes per part (a prefix length × a few documents) from the cache
            data = rec["data"]
            resumed += (f", {len(data['read_back'])} of its {data['parts']} parts (a prefix length × {data['documents_per_part']} "
                        "documents) read back from the cache (measured by an earlier run; its wall time covers the rest)")
        if rec.get("search_cache"):  # the search finding resumes from the on-disk cache, not the store
            resumed += f", search cache at the start: {rec['search_cache']}"
        if rec.get("carried"):  # measured over several machines (scripts/findings_carry.py)
            resumed += f"; the run {carried_words(rec['carried'])}"
        if rec.get("filled_by"):  # a re-analysis: the measurement is the filling run's
            by = rec["filled_by"]
            resumed += (f" — filled by `{by['command']}` at commit {by['commit'].split('+')[0]} on {by['date']}, wall {_hours(by['wall_s'])}, "
                        f"load {by['load_min']}–{by['load_max']}, {by['threads']} torch thread{'s' if by['threads'] != 1 else ''}, "
                        f"weight cache at its start: {by['weight_cache']}")
        # docs-check: the oldest commit that measured any of it is the measurement's
        measured = ((rec.get("carried") or [None])[0] or rec.get("filled_by") or rec)["commit"].split("+")[0]
        markdown, decided = finding_markdown(rec, where)
        caption = (f"Generated by `python scripts/doc_tables.py --write {name}` from the run record {where}: "
                   f"`{rec['command']}` at commit {rec['commit'].split('+')[0]} on {rec['date']}, {_record_wall(rec)}, "
                   f"load {rec['load_min']}–{rec['load_max']} (sampled every 30 s; {rec['load_before']} before, {rec['load_after']} after), "
                   f"{rec['threads']} torch thread{'s' if rec['threads'] != 1 else ''}, weight cache at the start: {rec['weight_cache']}{resumed}. "
                   f"{decided} Measured again by `{again}`. <!-- measured: commit={measured} covers=src/wkvlab -->")
        return caption + "\n\n" + markdown.strip("\n")
    return make


def _decided_before_issue_38(data) -> bool:
    """No interval of the record names its method: every one was made by the bootstrap rule before issue #38."""
    from wkvlab.findings.records import dicts_with

    return not any(x.get("method") for x in dicts_with(data, ("low", "high", "n_units")))


def finding_markdown(rec: dict, where) -> tuple[str, str]:
    """(the finding's tables, a sentence on whose rule decided them): decided again by today's rule from the
    record's per-unit values (src/wkvlab/findings/records.py) where it keeps them, else as the run printed them."""
    from wkvlab.findings.records import REDECIDED_DEPTH, REDECIDED_VERDICTS, can_redecide, redecide

    commit = rec["commit"].split("+")[0]
    if can_redecide(rec["name"], rec.get("data") or {}):
        markdown, again = redecide(rec["name"], rec["data"], where=str(where))
        margin = rec["data"].get("margin", "10%")
        if rec["name"] in REDECIDED_DEPTH:
            stated = again["margin"]
            stated = f"{stated} of the penalty at the shortest prefix" if stated.endswith("%") else f"±{stated} nats"
            return markdown, (f"Intervals and verdicts decided by the rule of src/wkvlab/stats at this doc's commit (docs/stats.md) "
                              f"from the per-document values the record keeps (each document's mean KLD of every cache and the "
                              f"reference's mean NLL, at every prefix length), margin {stated}.")
        if rec["name"] in REDECIDED_VERDICTS:
            shares = (f"**the energy shares' intervals are the bootstrap rule's before issue #38, at commit {commit}**"
                      if _decided_before_issue_38(rec["data"]) else
                      f"the energy shares' intervals are as the run printed them at commit {commit}, under issue #38's rule")
            return markdown, (f"The cross-term table's intervals and verdicts decided by the rule of src/wkvlab/stats at this doc's "
                              f"commit (docs/stats.md) from the per-window means the record keeps, margin {margin}; {shares} "
                              f"(the record keeps no per-window energies: not decided again by a later rule).")
        return markdown, (f"Intervals and verdicts decided by the rule of src/wkvlab/stats at this doc's commit (docs/stats.md) "
                          f"from the per-unit values the record keeps for every cell, margin {margin}.")
    if _decided_before_issue_38(rec.get("data")):
        return rec["markdown"], (f"**Older rule: decided by the bootstrap rule before issue #38 at commit {commit}, not by today's "
                                 f"(docs/stats.md); the record keeps intervals, not per-unit values, so these verdicts stand until "
                                 f"the finding is measured again.**")
    return rec["markdown"], (f"Verdicts as the run printed them at commit {commit} (the record keeps intervals, not per-unit values: "
                             f"a later rule does not decide them again).")


def finding_tables() -> list["Table"]:
    """One table per committed finding record, docs/runs/findings-<finding>-<model>.json."""
    return [Table(path.stem, "docs/findings.md", f"the {path.stem.split('-')[1]} finding's tables, as its run printed them",
                  finding_block(path), measured=True, needs_run=False)
            for path in sorted(FINDING_RECORDS.glob("findings-*.json"))]


def output_block(path: Path) -> Callable[[dict | None], str]:
    """A command's printed output from its run record (scripts/output_record.py), as a text block."""
    def make(_run: dict | None) -> str:
        rec = json.loads(path.read_text(encoding="utf-8"))
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        caption = (f"Generated by `python scripts/doc_tables.py --write {path.stem}` from the run record {where}: "
                   f"`{rec['command']}` (COLUMNS={rec['columns']}) at commit {rec['commit'].split('+')[0]} on {rec['date']}, "
                   f"{_record_wall(rec)}, load {rec['load_min']}–{rec['load_max']} (sampled every 30 s; "
                   f"{rec['load_before']} before, {rec['load_after']} after). {_output_decided(rec, where)}"
                   f"<!-- measured: commit={rec['commit'].split('+')[0]} covers=src/wkvlab -->")
        return "\n".join([caption, "", "```text", *[line.rstrip() for line in rec["stdout"].rstrip("\n").splitlines()], "```"])
    return make


def _output_decided(rec: dict, where) -> str:
    """For an explain record: its factorial's verdicts decided again by today's rule from the per-unit values it
    keeps, against those it printed (a change of the rule shows here, and the fast tier's check fails until the
    output is recorded again). "" for a record without them."""
    if not rec.get("units"):
        if not rec["command"].startswith("wkvlab explain"):
            return ""
        commit = rec["commit"].split("+")[0]
        older = subprocess.run(["git", "-C", str(ROOT), "merge-base", "--is-ancestor", commit, RULE_COMMIT], capture_output=True).returncode == 0
        return (f"**Older rule: printed by the rule before issue #38 (commit {commit}), not by today's (docs/stats.md); the record keeps "
                "no per-unit values, so these verdicts stand until the command is recorded again.** " if older else
                f"The record keeps no per-unit values: its verdicts are the rule's at commit {commit}. ")
    from wkvlab.findings.records import redecide_factorial

    again = redecide_factorial(rec["units"], rec.get("margin"), where=str(where))
    words = {m: (again.metric(m).verdict.word if again.metric(m).verdict is not None else None) for m in ("kld", "ppl")}
    shown = "; ".join(f"{m.upper()} {words[m]}" for m in words if words[m])
    same = all(words[m] == rec["factorial"].get(m) for m in words)
    return (f"The factorial's verdicts decided again from the per-unit values the record keeps, by the rule of src/wkvlab/stats "
            f"at this doc's commit (margin {rec.get('margin', '10%')}): {shown} — "
            + ("the same as printed. " if same else "**not what the run printed: record the output again** (scripts/output_record.py). "))


def output_tables() -> list["Table"]:
    """One block per committed command record, docs/runs/output-<name>.json, in the doc the record names."""
    return [Table(path.stem, json.loads(path.read_text(encoding="utf-8"))["doc"], "a command's printed output",
                  output_block(path), measured=True, needs_run=False)
            for path in sorted(FINDING_RECORDS.glob("output-*.json"))]


# ---------------------------------------------------------------- the engine confirmation (docs/findings.md)

FIDELITY_CHECKS = ROOT / "src" / "wkvlab" / "kv" / "fidelity_checks.json"


def _interval(pair) -> str:
    return f"[{pair[0]:.3f}, {pair[1]:.3f}]"  # as recorded: rounding them again to 2 places could round twice


def fidelity_block(path: Path = FIDELITY_CHECKS) -> Callable[[dict | None], str]:
    """The engine checks the one rule decided (those with an "outcome", written by scripts/fidelity_table.py
    --record): what every engine-checked label rests on, a row per model and cache type."""
    def make(_run: dict | None) -> str:
        checks = [c for c in json.loads(path.read_text(encoding="utf-8"))["checks"] if c.get("outcome")]
        where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        rows = ["| model | cache | ratio [95%] | Holm-adjusted → verdict | windows | commit |", "|---|---|---|---|---|---|"]
        runs: dict[str, str] = {}
        commits: list[str] = []  # docs-check: the first run's commit stamps the table
        for check in checks:
            commit = re.search(r"\(at ([0-9a-f]{7,40})", check["command"])
            commit = commit.group(1) if commit else "?"
            commits += [commit] if commit not in commits else []
            windows = check["windows"].split(" x ")[0]
            rows.append(f"| {check['model'].split(' (')[0]} | {check['preset'].split(':', 1)[1]} | {check['ratio']:.2f} "
                        f"{_interval(check['interval'])} | {_interval(check['adjusted'])} → {check['verdict']} | {windows} | {commit} |")
            runs.setdefault(check["command"], check["family"])
        made = "; ".join(f"`{command.split(' (')[0]}` ({command.split(' (', 1)[1]}" for command in runs)
        families = sorted(set(runs.values()))
        caption = (f"Generated by `python scripts/doc_tables.py --write engine-confirmation` from {where}, the checks the one rule "
                   f"decided (the only source of the engine-checked label), written by {made}. Verdicts: {'; '.join(families)}. "
                   f"<!-- measured: commit={commits[0] if commits else '?'} covers=src/wkvlab,scripts/fidelity_table.py -->")
        return caption + "\n\n" + "\n".join(rows)
    return make


# ---------------------------------------------------------------- the registry

@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    what: str
    make: Callable[[dict | None], str]
    measured: bool  # from the demo run (slow to make fresh); else cheap and compared exactly
    needs_run: bool = True


PLAN_70B = ["--model", "Llama-3-70B", "--gpu", "A100-80GB", "--batch", "16", "--context", "8192", "--gpus", "1,2,4"]
PLAN_L40S = ["--model", "Llama-3-70B", "--gpu", "L40S", "--batch", "16", "--context", "8192", "--gpus", "4", "--engine", "vllm"]
PLAN_DEMO = ["--model", "default", "--gpu", "rtx-4090", "--batch", "8", "--ctx", "8192", "--results", "RUN", "--no-probe"]

TABLES = {t.name: t for t in [
    Table("demo", "docs/results.md", "the demo grid: PPL, KLD, top-1, sizes", demo_table, measured=True),
    Table("report-demo", "docs/report.md", "the demo report's KV-penalty and cross-term tables", report_tables, measured=True),
    Table("plan-70b", "docs/planner.md", "Llama-3-70B on 1, 2, 4 A100-80GB",
          plan_block(PLAN_70B, _upto("* roofline"), "the first part", "plan-70b"), measured=False, needs_run=False),
    Table("plan-l40s", "docs/planner.md", "Llama-3-70B on 4 L40S, vLLM's recommendation",
          plan_block(PLAN_L40S, _paragraph("vllm: "), "the recommendation", "plan-l40s"), measured=False, needs_run=False),
    Table("plan-demo", "docs/planner.md", "the plan ranked by the demo run's measurements",
          plan_block(PLAN_DEMO, _upto("measured ("), "the ranking", "plan-demo"), measured=False),
    Table("plan-demo-note", "docs/planner.md", "the plan's note on measured rows no engine runs",
          plan_block(PLAN_DEMO, _paragraph("note: measured but no engine"), "the note", "plan-demo-note"), measured=False),
    Table("plan-demo-recommendation", "docs/planner.md", "the plan's vLLM recommendation from the demo run",
          plan_block(PLAN_DEMO, _paragraph("vllm: "), "the vLLM recommendation", "plan-demo-recommendation"), measured=False),
    Table("engine-confirmation", "docs/findings.md", "the engine checks behind engine-checked", fidelity_block(), measured=True,
          needs_run=False),
]}
TABLES.update({t.name: t for t in [*finding_tables(), *output_tables()]})


def _block(text: str, name: str) -> tuple[int, int]:
    start, end = f"<!-- doc-table: {name} -->", "<!-- /doc-table -->"
    if start not in text:
        raise SystemExit(f"{name}: no '{start}' marker in its doc")
    a = text.index(start) + len(start)
    return a, text.index(end, a)


def documented(table: Table) -> str:
    text = (ROOT / table.doc).read_text(encoding="utf-8")
    a, b = _block(text, table.name)
    return text[a:b].strip("\n")


def write(table: Table, fresh: str) -> None:
    path = ROOT / table.doc
    text = path.read_text(encoding="utf-8")
    a, b = _block(text, table.name)
    path.write_text(text[:a] + "\n" + fresh + "\n" + text[b:], encoding="utf-8")


def compare(table: Table, doc: str, fresh: str, cross_cpu: bool = False) -> list[str]:
    """What differs: cells beyond the tolerance for measured tables, lines for cheap ones (captions aside);
    ``cross_cpu``: a fresh demo run on another CPU than the record's (looser, :data:`CROSS_CPU_TEXT`)."""
    if table.name == "demo":
        return differences(doc, fresh, cross_cpu)
    if table.measured and not table.needs_run:  # a finding: the doc is its committed record's rendering, exactly
        return [line for line in difflib.unified_diff(doc.splitlines(), fresh.splitlines(), "doc", "record", n=0, lineterm="")
                if not line.startswith(("---", "+++"))]
    old, new = doc.splitlines()[1:], fresh.splitlines()[1:]
    if table.measured:  # report tables: the same numbers within the tolerance and the same words, cell by cell
        return cell_differences(doc, fresh, cross_cpu)
    return [line for line in difflib.unified_diff(old, new, "doc", "fresh", n=0, lineterm="") if not line.startswith(("---", "+++"))]


def _names(values: list[str]) -> list[Table]:
    out = []
    for value in values:
        if value in ("all", "cheap", "measured"):
            out += [t for t in TABLES.values() if value == "all" or t.measured == (value == "measured")]
        elif value in TABLES:
            out.append(TABLES[value])
        else:
            raise SystemExit(f"no table {value!r}: one of {', '.join(TABLES)}, or all / cheap / measured")
    return list(dict.fromkeys(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="the tables, their docs and kinds")
    parser.add_argument("--write", action="append", default=[], metavar="NAME", help="rewrite this table in its doc (repeatable; all, cheap, measured)")
    parser.add_argument("--check", action="append", default=[], metavar="NAME", help="exit 1 when this documented table differs from a fresh one (repeatable)")
    parser.add_argument("--from-json", type=Path, metavar="RUN", help="the run record (or a `wkvlab demo --json` file) instead of a fresh demo run")
    parser.add_argument("--save", type=Path, metavar="RUN", help="run the demo now and save its run record here")
    args = parser.parse_args(argv)
    if args.list:
        for t in TABLES.values():
            kind = "cheap" if not t.measured else "measured (its run record)" if not t.needs_run else "measured (the demo run)"
            print(f"{t.name:36} {t.doc:18} {kind}: {t.what}")
        return 0
    writes, checks = _names(args.write), _names(args.check)
    fresh_run = None
    if args.save is not None:
        fresh_run = run_demo()
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps({k: v for k, v in fresh_run.items() if k != "fresh"}, indent=1) + "\n", encoding="utf-8")
        print(f"saved the run record {args.save} ({_run_words(fresh_run)})")
    if fresh_run is None and args.from_json is not None:
        fresh_run = load_record(args.from_json)

    def run_for(table: Table, checking: bool) -> dict | None:
        nonlocal fresh_run
        if not table.needs_run:
            return None
        if table.measured and fresh_run is None and checking:
            fresh_run = run_demo()  # a measured table is checked against a fresh run
        if fresh_run is not None:
            return fresh_run
        if table.measured:
            raise SystemExit(f"{table.name}: give --from-json RUN or --save RUN to write it")
        return load_record(RUN)  # cheap tables over the committed record

    failed = 0
    recorded_cpu = load_record(RUN).get("cpu") if RUN.exists() else None
    for table in checks:
        run = run_for(table, True)
        # a fresh demo on a CPU other than the committed record's (or a record that does not name one)
        cross_cpu = bool(table.measured and table.needs_run and run is not None and run.get("fresh") and run.get("cpu") != recorded_cpu)
        diffs = compare(table, documented(table), table.make(run), cross_cpu)
        for line in diffs:
            print(f"  {line}")
        rule = TOLERANCE_TEXT if table.name == "demo" else f"{TOLERANCE:.0%} per number, the words exactly"
        if cross_cpu:
            rule += f"; {CROSS_CPU_TEXT}: the record names CPU {recorded_cpu or 'unknown'}, this run {run.get('cpu')}"
        print(f"{table.doc} {table.name}: {len(diffs)} difference(s)" + (f" beyond the tolerance ({rule})" if table.measured else ""))
        failed += bool(diffs)
    for table in writes:
        write(table, table.make(run_for(table, False)))
        print(f"wrote {table.name} into {table.doc}")
    if not (args.list or writes or checks or args.save):
        parser.print_usage()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
