"""Wall time from process start to answer for the commands a newcomer types first: help, the
listings, the planner and bad inputs (none of which may load torch). Prints JSON.

    python benchmarks/cli_start.py [--repeats 5]

Each command runs as its own process (``python -m wkvlab.cli ...``), as a user would; the median
of the repeats is reported next to the 1-minute load average seen before the run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "--help": ["--help"],
    "eval --help": ["eval", "--help"],
    "presets": ["presets"],
    "plan": ["plan", "--model", "llama-3-8b", "--gpu", "a100-80gb", "--batch", "8", "--ctx", "8192"],
    "eval (no configs)": ["eval"],
    "eval --ctx abc": ["eval", "--ctx", "abc", "--kv", "int4"],
    "eval --kv int9": ["eval", "--kv", "int9"],
    "eval --kv int4-g48 (head_dim from the GGUF)": ["eval", "--kv", "int4-g48"],
    "eval --json into a missing folder": ["eval", "--kv", "q4_0", "--json", "/no/such/folder/x.json"],
    "search --budget 10": ["search", "--budget", "10"],
    "explain --max-ctx 16": ["explain", "--weights", "int4", "--kv", "int4", "--max-ctx", "16"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for name, argv in COMMANDS.items():
        load = os.getloadavg()[0]
        times, codes = [], set()
        for _ in range(args.repeats):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", *argv], capture_output=True, text=True)
            times.append(time.perf_counter() - start)
            codes.add(proc.returncode)
        rows.append({"command": name, "median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3),
                     "exit": sorted(codes), "load_before": round(load, 2)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
