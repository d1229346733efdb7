"""The memory estimate a command prints against the peak RSS it reaches on the CPU (issue 40).

Every command that loads a model is run as its own process, at small sizes, on the packaged models
(``default`` = SmolLM2-135M Q4_1 GGUF, ``gemma3-270m``) and on a Hugging Face folder (the packaged
SmolLM2's converted cache folder, copied without wkvlab's marker, so it loads as any folder). The
estimate is read from the command's ``memory: ... about X GiB`` header line; the peak is
``/usr/bin/time -v``'s maximum resident set size of the process (RSS: the interpreter, torch,
the tokenizer and every tensor, which is what the CPU estimate has to cover). The ratio is
measured / estimated; the target is within ±15%.

    python benchmarks/estimate_vs_peak.py [--only NAME ...] [--timeout S] [--json out.json]

``findings`` is measured on its ``depth`` finding (``--ctx 81 --tokens 16``: 32 documents, each a
KV-only grid per prefix length, one estimate printed per distinct grid): the additivity and methods
findings build GPTQ, AWQ and SmoothQuant weights and calibrate KVQuant before their grid, which takes
over 20 minutes even at ``--ctx 128 --tokens 256`` on 2 shared cores (stopped after 6 minutes at
1.74 GiB RSS against its largest printed estimate, 1.6 GiB). ``profile`` and ``search`` run one K
and one V format (``--formats fp16,K4V4``) at ctx 128 with int4-g128 weights, each in a cache folder
of its own (a cached profile would skip what is measured).

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
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GIB = 1 << 30
ESTIMATE = re.compile(r"^memory: (?P<plan>.+?) plan, about (?P<gib>[\d.]+) GiB", re.M)
PEAK = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
SMALL = ["--ctx", "256", "--tokens", "512", "--threads", "1"]
LOCAL_TASKS = Path(__file__).resolve().parents[1] / "tests" / "tasks" / "lmeval"  # a local lm-eval task: no download


def _cases(folder: Path, work: Path) -> list[tuple[str, list[str]]]:
    grid = ["--weights", "none,int8", "--kv", "fp16,q4_0"]
    sweep = work / "sweep.yaml"
    sweep.write_text("models: [default]\ndata: default\nctx: 256\ntokens: 512\nweights: [none, int8]\nkv: [fp16, q4_0]\n")
    cases = []
    for model in ("default", "gemma3-270m", str(folder)):
        label = "folder" if model == str(folder) else model
        cases.append((f"eval {label} 2x2", ["eval", "--model", model, *grid, *SMALL]))
    cases += [
        ("plan --probe default", ["plan", "--model", "default", "--gpu", "RTX-4090", "--batch", "1", "--ctx", "512", "--kv", "q4_0",
                                  "--probe", "512", "--threads", "1"]),
        ("explain default (factorial)", ["explain", "--model", "default", "--weights", "int8", "--kv", "q4_0", *SMALL, "--skip",
                                         "noise,attention,hidden,context,mitigations,generation,retrieval,selfgen"]),
        ("sweep default", ["sweep", str(sweep), "--store", str(work / "s.db"), "--threads", "1"]),
        ("tasks default", ["tasks", "--tasks", "wkvlab_facts", "--include-path", str(LOCAL_TASKS), "--model", "default", "--weights",
                           "none,int8", "--kv", "fp16,q4_0", "--tokens", "512", "--ctx", "256", "--store", str(work / "t.db")]),
        # depth: a KV-only grid per prefix length (no weight builds); additivity/methods build GPTQ, AWQ and
        # SmoothQuant and calibrate KVQuant first, over 20 minutes even at --ctx 128 --tokens 256 on 2 shared cores
        ("findings depth default", ["findings", "depth", "--model", "default", "--store", str(work / "f.db"),
                                    "--ctx", "81", "--tokens", "16", "--threads", "1", "--cache-dir", str(_cache(work, "findings"))]),
        # one K and one V format (60 per-layer passes, not 180) at ctx 128: the weight profile's swap copy is the peak either way
        ("profile default", ["profile", "--model", "default", "--weights", "int4-g128", "--formats", "fp16,K4V4", "--ctx", "128",
                             "--tokens", "128", "--threads", "1", "--cache-dir", str(_cache(work, "profile"))]),
        ("search default", ["search", "--model", "default", "--weights", "int4-g128", "--formats", "fp16,K4V4", "--budget", "12000",
                            "--ctx", "128", "--profile-tokens", "128", "--heldout-tokens", "1024", "--random", "1", "--threads", "1",
                            "--cache-dir", str(_cache(work, "search"))]),
        # the calibrated builds (GPTQ, AWQ, SmoothQuant W8A8 on 16 x 512 calibration tokens, written to a cache of its
        # own): the "a GPTQ grid estimated 8.5 GiB peaked at 12.37" was this path on a 0.5B model
        ("eval default calibrated builds", ["eval", "--model", "default", "--weights", "none,gptq-int4-g128,awq-int4-g128,w8a8-int8",
                                            "--kv", "fp16,q4_0", *SMALL, "--cache-dir", str(_cache(work, "builds"))]),
        ("eval default 3x4 ctx512", ["eval", "--model", "default", "--weights", "none,int8,int4-g128", "--kv", "fp16,q8_0,q4_0,int4",
                                     "--ctx", "512", "--tokens", "1024", "--threads", "1"]),
    ]
    return cases


# The parts of a CPU run's RSS the estimate counts as measured constants (wkvlab.eval.memory
# CPU_PROCESS_BYTES, TOKENIZER_BYTES_PER_ENTRY), measured in a fresh process per model folder.
_COMPONENTS = """
import sys, json
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS'):
            return int(line.split()[1]) * 1024
import torch, transformers, wkvlab.api, wkvlab.cli
from transformers import AutoModelForCausalLM, AutoTokenizer
imported = rss()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
with_tokenizer = rss()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
with torch.no_grad():
    model(torch.zeros(1, 8, dtype=torch.long))
print(json.dumps({"imports_bytes": imported, "tokenizer_bytes": with_tokenizer - imported, "vocabulary": len(tokenizer),
                  "weights_touched_bytes": rss() - with_tokenizer, "parameter_bytes": sum(p.numel() * 4 for p in model.parameters())}))
"""


def components(folders: dict[str, Path]) -> dict:
    """RSS after the imports, the tokenizer's share (per vocabulary entry) and the weights' once a forward touched them."""
    out = {}
    for name, folder in folders.items():
        done = subprocess.run(["nice", sys.executable, "-c", _COMPONENTS, str(folder)], capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        row["tokenizer_bytes_per_entry"] = round(row["tokenizer_bytes"] / row["vocabulary"])
        out[name] = row
    return out


def _converted(name: str) -> Path:
    """The cache folder holding packaged model ``name`` converted to float32 (converted first if needed)."""
    from wkvlab.models.cache import cache_dir
    from wkvlab.models.fingerprint import file_sha256
    from wkvlab.models.loading import load_model
    from wkvlab.models.packaged import packaged_gguf

    cached = cache_dir() / "models" / f"{file_sha256(packaged_gguf(name))[:16]}-float32"
    if not (cached / "wkvlab-source.json").is_file():
        load_model(name)
    return cached


def _cache(work: Path, name: str) -> Path:
    """A cache folder of its own for one case, sharing only the converted models: a profile, K/V
    statistics or a calibrated build cached by an earlier case or run would skip what is measured."""
    from wkvlab.models.cache import cache_dir

    folder = work / f"cache-{name}"
    if not folder.exists():
        folder.mkdir()
        (folder / "models").symlink_to(cache_dir() / "models")
    return folder


def _hf_folder(work: Path) -> Path:
    """The packaged SmolLM2 as a plain Hugging Face folder (its converted copy, without wkvlab's marker)."""
    folder = work / "smollm2-hf"
    shutil.copytree(_converted("smollm2"), folder, ignore=shutil.ignore_patterns("wkvlab-source.json"))
    return folder


def run_case(name: str, argv: list[str], timeout: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = ["nice", "/usr/bin/time", "-v", sys.executable, "-m", "wkvlab.cli", *argv]
    load_before = os.getloadavg()[0]
    start = time.time()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        # stop the command, not /usr/bin/time: it then prints the peak so far (a lower bound, marked partial)
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()
        for child in children:
            os.kill(int(child), signal.SIGTERM)
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
        code = "timeout"
    wall = time.time() - start
    # a command running several grids prints one line per distinct estimate: its peak is the largest
    estimates = sorted(ESTIMATE.finditer(stderr), key=lambda m: float(m["gib"]))
    estimate = estimates[-1] if estimates else None
    peak = PEAK.search(stderr)
    row = {"name": name, "command": "wkvlab " + " ".join(argv), "exit": code, "wall_s": round(wall, 1),
           "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
           "estimate_gib": float(estimate["gib"]) if estimate else None, "plan": estimate["plan"] if estimate else None,
           "estimates_printed": len(estimates), "peak_rss_gib": round(int(peak[1]) * 1024 / GIB, 3) if peak else None}
    if code == "timeout":
        row["peak_is_partial"] = True  # the peak until the timeout
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
    parser.add_argument("--components", action="store_true", help="only measure the constant parts (imports, tokenizer) per packaged model")
    args = parser.parse_args()
    if args.components:
        print(json.dumps(components({name: _converted(name) for name in ("smollm2", "gemma3-270m")}), indent=1))
        return
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
