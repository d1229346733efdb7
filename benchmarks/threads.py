"""Wall time of the heavy steps with 1 vs 2 intra-op threads, on an idle machine and next to a
second CPU-bound process (a Python busy loop). Prints JSON; docs/threads.md has measured figures.

    python benchmarks/threads.py                          # all workloads, threads 1 and 2, idle and loaded
    python benchmarks/threads.py --workloads eval,gptq --repeats 2 --threads 1,2

Each measurement is a fresh child process (``--child WORKLOAD``) that loads the default model
untimed, sets its threads through ``wkvlab.threads`` (as ``--threads`` does), then times only the
workload:

* ``eval``: the evaluation loop of ``wkvlab eval`` (reference + one candidate per window, weights
  none, KV int4) on 2 windows of 512 tokens;
* ``gptq`` / ``awq``: building ``gptq-int4-g128`` / ``awq-int4-g128`` on ``--calib-samples``
  calibration samples of ``--calib-len`` tokens (default 4 × 256; no disk cache);
* ``llamacpp``: llama.cpp (llama-cpp-python) scoring 2 windows of 512 tokens with a q8_0 cache,
  its ``n_threads`` set to the same count.

"loaded" starts one busy-loop process before the child and stops it after. The 1-minute load
average is recorded before each child (other users of a shared machine show up there).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

WORKLOADS = ("eval", "gptq", "awq", "llamacpp")
CTX, WINDOWS = 512, 2


def _child(workload: str, threads: int, calib: tuple[int, int] = (4, 256)) -> dict:
    from wkvlab.threads import apply_threads, choose_threads

    choice = apply_threads(choose_threads(threads))
    from wkvlab import api

    work = api.prepare("default", "default", ctx=CTX, tokens=CTX * WINDOWS)
    start = time.perf_counter()
    if workload == "eval":
        api.evaluate_workload(work, api.parse_weights(["none"]), api.parse_kv(["int4"]))
    elif workload in ("gptq", "awq"):
        from wkvlab.weights import CalibrationSpec, quantize_model_weights

        spec = api.parse_weights([f"{workload}-int4-g128"])[0]
        calibration = api.prepare_calibration(work, [spec], CalibrationSpec("prose", *calib))
        start = time.perf_counter()
        quantize_model_weights(work.loaded.model, spec, calibration)  # no model_key: never the disk cache
    elif workload == "llamacpp":
        from wkvlab.engines.api import resolve_gguf
        from wkvlab.engines.llamacpp import LlamaCppEngine

        engine = LlamaCppEngine(resolve_gguf("default"), "q8_0", ctx=CTX, threads=threads)
        start = time.perf_counter()
        for w in range(WINDOWS):
            engine.score_window(work.windows.tokens[w], 0)
        engine.close()
    else:
        raise SystemExit(f"unknown workload {workload!r}; use one of {', '.join(WORKLOADS)}")
    return {"workload": workload, "threads": choice.threads, "seconds": round(time.perf_counter() - start, 2)}


def _measure(workload: str, threads: int, loaded: bool, calib: tuple[int, int]) -> dict:
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if loaded else None
    try:
        if burner is not None:
            time.sleep(1.0)  # let it take its core before the child starts
        load = os.getloadavg()[0]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.run([sys.executable, __file__, "--child", workload, "--threads", str(threads),
                               "--calib-samples", str(calib[0]), "--calib-len", str(calib[1])],
                              capture_output=True, text=True, env=env)
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    if proc.returncode != 0:
        return {"workload": workload, "threads": threads, "loaded": loaded, "error": proc.stderr.strip().splitlines()[-1:]}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**row, "loaded": loaded, "load_before": round(load, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--calib-samples", type=int, default=4)
    parser.add_argument("--calib-len", type=int, default=256)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    calib = (args.calib_samples, args.calib_len)
    if args.child:
        print(json.dumps(_child(args.child, int(args.threads), calib)))
        return
    rows = []
    for workload in args.workloads.split(","):
        for _ in range(args.repeats):
            for loaded in (False, True):
                for threads in (int(t) for t in args.threads.split(",")):
                    row = _measure(workload, threads, loaded, calib)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    rows.append(row)
    print(json.dumps({"cores": os.cpu_count(), "ctx": CTX, "windows": WINDOWS, "calibration": calib, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
