"""The memory estimate a command prints against the peak RSS it reaches on the CPU (issue 40).

Every command that loads a model is run as its own process, at small sizes, on the packaged models
(``default`` = SmolLM2-135M Q4_1 GGUF, ``gemma3-270m``) and on a Hugging Face folder (the packaged
SmolLM2's converted cache folder, copied without wkvlab's marker, so it loads as any folder). The
estimate is read from the command's ``memory: ... about X GiB`` header line; the peak is
``/usr/bin/time -v``'s maximum resident set size of the process (RSS: the interpreter, torch,
the tokenizer and every tensor, which is what the CPU estimate has to cover). The ratio is
measured / estimated; the target is within ±15%.

    python benchmarks/estimate_vs_peak.py [--only NAME ...] [--timeout S] [--json out.json]

Runs one command at a time, under ``nice``, with one thread, and records the load average before
and after each (a shared machine slows the runs, it does not change their peaks). The converted
copies of the packaged models must be in the cache first (a first load converts them; the
conversion is its own peak, measured in docs/scale.md).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1 << 30
ESTIMATE = re.compile(r"^memory: (?P<plan>.+?) plan, about (?P<gib>[\d.]+) GiB", re.M)
PEAK = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
SMALL = ["--ctx", "256", "--tokens", "512", "--threads", "1"]


def _cases(folder: Path, work: Path) -> list[tuple[str, list[str]]]:
    grid = ["--weights", "none,int8", "--kv", "fp16,q4_0"]
    sweep = work / "sweep.yaml"
    sweep.write_text("models: [default]\ndata: default\nctx: 256\ntokens: 512\nweights: [none, int8]\nkv: [fp16, q4_0]\n")
    cases = []
    for model in ("default", "gemma3-270m", str(folder)):
        label = "folder" if model == str(folder) else model
        cases.append((f"eval {label}", ["eval", "--model", model, *grid, *SMALL]))
    cases += [
        ("eval default 3x4 ctx512", ["eval", "--model", "default", "--weights", "none,int8,int4-g128", "--kv", "fp16,q8_0,q4_0,int4",
                                     "--ctx", "512", "--tokens", "1024", "--threads", "1"]),
        ("plan --probe default", ["plan", "--model", "default", "--kv", "q4_0", "--probe", "512", "--threads", "1"]),
        ("explain default", ["explain", "--model", "default", "--weights", "int8", "--kv", "q4_0", *SMALL]),
        ("profile default", ["profile", "--model", "default", "--weights", "none", *SMALL]),
        ("search default", ["search", "--model", "default", "--budget", "10000", *SMALL]),
        ("findings additivity default", ["findings", "additivity", "--model", "default", "--store", str(work / "f.db"),
                                         "--ctx", "256", "--tokens", "512", "--threads", "1"]),
        ("sweep default", ["sweep", str(sweep), "--store", str(work / "s.db"), "--threads", "1"]),
        ("tasks default (KLD only)", ["tasks", "--model", "default", "--weights", "none,int8", "--kv", "fp16,q4_0", "--tokens", "512",
                                      "--ctx", "256", "--store", str(work / "t.db")]),
    ]
    return cases


def _hf_folder(work: Path) -> Path:
    """The packaged SmolLM2 as a plain Hugging Face folder (its converted copy, converted first if needed)."""
    from wkvlab.models.cache import cache_dir
    from wkvlab.models.fingerprint import file_sha256
    from wkvlab.models.loading import load_model
    from wkvlab.models.packaged import packaged_gguf

    path = packaged_gguf("smollm2")
    cached = cache_dir() / "models" / f"{file_sha256(path)[:16]}-float32"
    if not (cached / "wkvlab-source.json").is_file():
        load_model("smollm2")
    folder = work / "smollm2-hf"
    shutil.copytree(cached, folder, ignore=shutil.ignore_patterns("wkvlab-source.json"))
    return folder


def run_case(name: str, argv: list[str], timeout: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = ["nice", "/usr/bin/time", "-v", sys.executable, "-m", "wkvlab.cli", *argv]
    load_before = os.getloadavg()[0]
    start = time.time()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        stderr, code = done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        stderr, code = (exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""), "timeout"
    wall = time.time() - start
    estimate = ESTIMATE.search(stderr)
    peak = PEAK.search(stderr)
    row = {"name": name, "command": "wkvlab " + " ".join(argv), "exit": code, "wall_s": round(wall, 1),
           "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
           "estimate_gib": float(estimate["gib"]) if estimate else None, "plan": estimate["plan"] if estimate else None,
           "peak_rss_gib": round(int(peak[1]) * 1024 / GIB, 3) if peak else None}
    if row["estimate_gib"] and row["peak_rss_gib"]:
        row["ratio"] = round(row["peak_rss_gib"] / row["estimate_gib"], 3)
        row["within_15pct"] = abs(row["ratio"] - 1) <= 0.15
    if code != 0:
        row["error"] = [line for line in stderr.splitlines() if line.strip() and "\t" not in line][-3:]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="run only the cases whose name starts with one of these")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import subprocess as sp

    commit = sp.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    rows = []
    with tempfile.TemporaryDirectory(prefix="estimate-vs-peak-") as tmp:
        work = Path(tmp)
        folder = _hf_folder(work)
        for name, argv in _cases(folder, work):
            if args.only and not any(name.startswith(prefix) for prefix in args.only):
                continue
            row = run_case(name, argv, args.timeout)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    out = {"benchmark": "estimate_vs_peak", "commit": commit, "cpus": os.cpu_count(), "rows": rows}
    text = json.dumps(out, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
