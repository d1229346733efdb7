"""The worked examples of the measuring planner in docs/planner.md, each from a run this script does.

Sections (``--case``, comma-separated; each replaces the text between its markers in docs/planner.md with
``--write``):

* ``default`` / ``gemma3-270m``: ``wkvlab plan --model M --gpu rtx-4090 --batch 8 --context C`` with no
  other flag — what a user runs — as a subprocess (``--json`` added to read the rows back): the probe's
  lines, its cost, wall and CPU time, load average before and after, every measured row and the launch
  lines. ``default`` is planned at its own 8,192 tokens and shows the one-line refusal of 32,768;
  ``gemma3-270m`` at 32,768 (its own), so the output says what context was probed and what is extrapolated.
* ``screen``: ``--no-probe --screen`` on both packaged models (no forward pass): the outlier screen's words and spreads.
* ``outlier``: the Qwen-style case on a tiny Qwen2 with planted key outliers (tests/plan/conftest.py
  ``build_planted``): a table of KV formats × bias through ``wkvlab eval``'s path, then the default plan
  (no flags) on the bias-3000 model.

Every section names the command, the commit, the load and the thread count. Run it niced with one thread:
``OMP_NUM_THREADS=1 nice python scripts/probe_planner.py --case default --write``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "planner.md"
PLAN = ["--gpu", "rtx-4090", "--batch", "8"]
CONTEXT = {"default": 8192, "gemma3-270m": 32768}
OUTLIER_BIASES = (60.0, 3000.0, 30000.0)
OUTLIER_KV = ("int8", "int4", "vllm@0.27:fp8_e4m3", "vllm@0.27:fp8_e4m3+scales=calculate")


def commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "src"], capture_output=True, text=True,
                               cwd=ROOT).stdout.strip()
        return rev + (" + uncommitted src changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


def run_plan(args: list[str]) -> tuple[subprocess.CompletedProcess, dict | None, dict]:
    """``wkvlab plan ARGS --json tmp`` as a subprocess: its output, the JSON it wrote, and what it cost."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        before, load0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0], time.perf_counter()
        env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", "plan", *args, "--json", str(out)], capture_output=True, text=True,
                              env=env, cwd=ROOT)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cost = {"wall": time.perf_counter() - t0, "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                "load_before": load0, "load_after": os.getloadavg()[0]}
        data = json.loads(out.read_text()) if out.exists() else None
    return proc, data, cost


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s" if seconds >= 60 else f"{seconds:.0f} s"


def plan_section(model: str, args: list[str], command: str) -> list[str]:
    proc, data, cost = run_plan(args)
    if proc.returncode != 0 or data is None:
        raise SystemExit(f"{command} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    threads = data.get("probe_cost", {}) or {}
    lines = ["```", command, "```", "",
             f"Commit {commit()}, {cpu_name()}; load average {cost['load_before']:.1f} before, {cost['load_after']:.1f} after (2 cores "
             f"shared with other jobs); the whole command **{_minutes(cost['wall'])} wall, {cost['cpu']:.0f} s CPU**"
             + (f"; the probe {threads['seconds']:.0f} s on {threads['threads']} thread(s), model load included" if threads else "") + ".",
             "", "What it printed before the table (stderr, progress bars left out):", "", "```"]
    lines += [line.rstrip() for line in proc.stderr.splitlines() if line.startswith(("probe: budget", "probe: ", "wkvlab plan"))
              and "still working" not in line and "%" not in line]
    lines += ["```", "", "| # | weights | KV | engine | total GB | KLD | quality |", "|---|---|---|---|---|---|---|"]
    for row in data["rows"]:
        q = row["quality"]
        if not (q["exact"] or q["source"] == "measured"):
            continue
        interval = f" [{q['low']:.4f}, {q['high']:.4f}]" if q.get("low") is not None else ""
        top1 = f", top-1 {q['top1']:.1%}" if q.get("top1") is not None else ""
        shown = f"UNSAFE ({q['unsafe']})" if q["unsafe"] else q["label"] + interval + top1
        total = (row["gpu_weights_bytes"] + row["fit"]["kv_needed_bytes"]) / 1e9
        lines.append(f"| {row['rank'] or '—'} | {row['weights']} | {row['kv']} | {row['engine']} | {total:.2f} | {q['kld']:.4f} | {shown} |")
    priors = sum(1 for r in data["rows"] if not (r["quality"]["exact"] or r["quality"]["source"] == "measured"))
    lines += ["", f"and {priors} row(s) on a prior only (`unmeasured on this model`, never recommended).", ""]
    text = proc.stdout
    context = next((line for line in text.splitlines() if line.startswith("probed context:")), "")
    if context:
        lines += ["```", context, "```", ""]
    lines.append("Launch lines: " + "; ".join(f"{rec['engine']}: {rec['weights']} x {rec['kv']} ("
                                                f"{'measured or exact' if rec['verified'] else 'UNVERIFIED'})"
                                                for rec in data["recommendations"]) + ".")
    lines += [""] + [f"- note: {n}" for n in data["notes"] if "probe-budget" in n or "weight formats were not probed" in n] + [""]
    return lines


def refusal_section(model: str, context: int) -> list[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", "plan", "--model", model, *PLAN, "--context", str(context)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    return [f"`wkvlab plan --model {model} {' '.join(PLAN)} --context {context}` (exit {proc.returncode}, {wall:.1f} s, nothing loaded):",
            "", "```", proc.stderr.strip(), "```", ""]


def packaged(model: str) -> list[str]:
    ctx = CONTEXT[model]
    command = f"wkvlab plan --model {model} {' '.join(PLAN)} --context {ctx}"
    lines = plan_section(model, ["--model", model, *PLAN, "--context", str(ctx)], command + "   # (--json plan.json added to read the rows)")
    if model == "default":
        lines += refusal_section(model, 32768)
    return lines


def outlier() -> list[str]:
    sys.path.insert(0, str(ROOT))
    from tests.plan.conftest import build_planted
    from wkvlab import api
    from wkvlab.kv.spec import KVSpec
    from wkvlab.models.loading import load_model
    from wkvlab.weights.spec import WeightSpec

    tokenizer = load_model("default").tokenizer
    tmp = Path(tempfile.mkdtemp(prefix="planted-"))
    lines = ["`tests/plan/conftest.py build_planted(folder, tokenizer, B)`, measured through `wkvlab eval`'s path "
             "(`api.prepare(folder, 'default', ctx=64, tokens=512)`, `api.evaluate_workload` with the model's own weights); "
             "KLD, top-1 agreement:", "",
             "| B | " + " | ".join(f"`{k}`" for k in OUTLIER_KV) + " |", "|---" * (len(OUTLIER_KV) + 1) + "|"]
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    folders = {}
    for bias in OUTLIER_BIASES:
        folders[bias] = build_planted(tmp / f"planted-{bias:g}", tokenizer, bias)
        work = api.prepare(str(folders[bias]), "default", ctx=64, tokens=512, device="cpu")
        kv = [KVSpec.parse(k) for k in OUTLIER_KV]
        results = api.evaluate_workload(work, [WeightSpec.parse("none")], kv)
        cells = [f"{r.kld['mean']:.4f}, {r.top1_agreement:.1%}" for r in results]
        lines.append(f"| {bias:g} | " + " | ".join(cells) + " |")
    lines += ["", f"({len(OUTLIER_BIASES)} models x {len(OUTLIER_KV)} caches on {work.windows.n_windows} windows of 64 tokens: "
              f"{time.perf_counter() - t0:.0f} s wall, load {load0:.1f} → {os.getloadavg()[0]:.1f}, commit {commit()}.)", ""]
    folder = folders[3000.0]
    command = f"wkvlab plan --model <outlier-qwen2> {' '.join(PLAN)} --context 1024"
    lines += ["The default plan on the B = 3000 model (a folder with weights, so the weight formats are probed too):", ""]
    lines += plan_section("outlier", ["--model", str(folder), *PLAN, "--context", "1024"], command + "   # (--json plan.json added)")
    return lines


def screen() -> list[str]:
    """``--screen`` without the probe on both packaged models: the key-channel spreads read from the weights (no forward pass)."""
    lines = []
    for model in CONTEXT:
        command = f"wkvlab plan --model {model} {' '.join(PLAN)} --context 8192 --no-probe --screen"
        proc, data, cost = run_plan(["--model", model, *PLAN, "--context", "8192", "--no-probe", "--screen"])
        if proc.returncode != 0 or data is None:
            raise SystemExit(f"{command} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        summary = next(line for line in proc.stdout.splitlines() if line.startswith("outlier screen"))
        spreads = ", ".join(f"{layer['spread']:.1f}" for layer in data["screen"]["layers"])
        lines += ["```", command, "```", "", f"{_minutes(cost['wall'])} wall, {cost['cpu']:.0f} s CPU, load {cost['load_before']:.1f} → "
                  f"{cost['load_after']:.1f}, commit {commit()}:", "", f"> {summary}", "", f"Per-layer spread: {spreads}.", ""]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", default="default,gemma3-270m,screen,outlier")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    for case in args.case.split(","):
        body = outlier() if case == "outlier" else screen() if case == "screen" else packaged(case)
        begin, end = f"<!-- scripts/probe_planner.py {case}: begin -->", f"<!-- scripts/probe_planner.py {case}: end -->"
        text = "\n".join([begin, "", *body, end])
        print(text, flush=True)
        if args.write:
            doc = DOC.read_text()
            if begin not in doc or end not in doc:
                raise SystemExit(f"{DOC} has no {begin} ... {end} markers")
            DOC.write_text(doc[: doc.index(begin)] + text + doc[doc.index(end) + len(end):])


if __name__ == "__main__":
    main()
