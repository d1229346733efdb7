"""The worked examples of ``wkvlab plan --probe`` in docs/planner.md, measured on both packaged models.

Runs, for each model, what ``wkvlab plan --model M --gpu rtx-4090 --batch 8 --context 8192 --probe
[TOKENS] --screen`` runs (the same :func:`wkvlab.plan.plan` with a :class:`~wkvlab.plan.probe.Probe`),
and prints a Markdown section: the command, commit, machine load and thread count, the probe's cost,
every probed row with its interval and the guard's verdict, the ranking's head, and the outlier screen.
``--write`` replaces the section between the markers in docs/planner.md.

Usage: python scripts/probe_planner.py [--tokens 1024] [--models default,gemma3-270m] [--section NAME] [--write]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from wkvlab.plan import plan
from wkvlab.plan.guard import thresholds
from wkvlab.plan.probe import DEFAULT_TOKENS, Probe

DOC = Path(__file__).resolve().parents[1] / "docs" / "planner.md"


def commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=DOC.parent, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=DOC.parent).stdout.strip()
        return rev + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def section(model: str, tokens: int) -> list[str]:
    load_before = os.getloadavg()[0]
    probe = Probe(tokens, say=lambda line: print(line, file=sys.stderr))
    began, cpu = time.perf_counter(), time.process_time()
    result = plan(model, "RTX-4090", 8, 8192, probe=probe, screen=True)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    load_after = os.getloadavg()[0]
    cost = probe.cost
    lines = [f"#### `{model}` ({result.model.name}: {result.model.num_layers} layers, {result.model.num_kv_heads} KV heads x "
             f"{result.model.head_dim})", "",
             "```", f"wkvlab plan --model {model} --gpu rtx-4090 --batch 8 --context 8192 --probe {tokens} --screen", "```", "",
             f"Probe cost: {cost.configs} configurations on {cost.windows} windows x {cost.ctx} tokens, "
             f"{cost.passes} window passes (references included), **{cost.seconds:.0f} s** on {cost.threads} CPU thread(s) "
             f"(model load included; the whole plan {wall:.0f} s wall, {cpu:.0f} s CPU); load average {load_before:.1f} before, {load_after:.1f} after, "
             f"commit {commit()}.", "",
             "| # | weights | KV | engine | KLD | 95% interval | top-1 | verdict |", "|---|---|---|---|---|---|---|---|"]
    for row in result.rows:
        q = row.quality
        if not q.label.startswith("measured (probe"):
            continue
        verdict = f"unsafe: {q.unsafe}" if q.unsafe else ("no engine" if row.engine == "none" else "safe")
        interval = q.interval or "none (fewer than 8 windows)"
        lines.append(f"| {row.rank or '—'} | {row.weights} | {row.kv} | {row.engine} | {q.kld:.4f} | {interval} | "
                     f"{q.top1:.1%} | {verdict} |")
    head = [r for r in result.rows if r.rank][:5]
    lines += ["", "Ranking's head: " + "; ".join(f"#{r.rank} {r.weights} x {r.kv} ({r.quality.label})" for r in head) + ".", "",
              "Recommended: " + "; ".join(f"{rec.engine}: {rec.weights} x {rec.kv}" for rec in result.recommendations) + ".", ""]
    dropped = [r for r in result.rows if r.quality.unsafe and r.fits]
    if dropped:
        lines += [f"Dropped by the guard ({thresholds()}): " + ", ".join(f"{r.weights} x {r.kv}" for r in dropped) + ".", ""]
    if result.screen is not None:
        spreads = ", ".join(f"{s.spread:.1f}" for s in result.screen.layers)
        lines += [f"Screen: {result.screen.summary()}. Per-layer spread: {spreads}.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS)
    parser.add_argument("--models", default="default,gemma3-270m")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--section", default="", help="marker name: several runs (token counts) keep their own sections")
    args = parser.parse_args()
    tag = f"scripts/probe_planner.py{' ' + args.section if args.section else ''}"
    BEGIN, END = f"<!-- {tag}: begin -->", f"<!-- {tag}: end -->"
    body = [BEGIN, ""]
    for model in args.models.split(","):
        body += section(model, args.tokens)
    body += [END]
    text = "\n".join(body)
    print(text)
    if args.write:
        doc = DOC.read_text()
        if BEGIN in doc and END in doc:
            doc = doc[: doc.index(BEGIN)] + text + doc[doc.index(END) + len(END):]
        else:
            raise SystemExit(f"{DOC} has no {BEGIN} ... {END} markers")
        DOC.write_text(doc)


if __name__ == "__main__":
    main()
