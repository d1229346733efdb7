"""wkvlab on a GPU: speed, memory and a small grid's KLD, in bfloat16 (the seeds' reference precision).

Prints one JSON object per model (the packaged ones by default, plus any ``--model`` given: a
Hugging Face folder or a .gguf file):

* ``device``, ``dtype``, the GPU's name and memory;
* ``reference_tokens_per_s`` and ``candidate_tokens_per_s``: one window of ``--ctx`` through the
  reference pass and through one KV candidate (``--kv``, default q4_0), chunked as ``wkvlab eval``
  runs it, and ``peak_memory_gib`` (torch.cuda.max_memory_allocated) for each;
* ``grid``: ``wkvlab eval`` on the GPU — weights {none, int4-g128} × KV {fp16, fp8_e4m3, q4_0} over
  ``--tokens`` tokens — KLD mean and top-1 per config, and its wall time.

It needs a CUDA device and says so in one line otherwise. It is not a test (nothing here asserts a
speed); run it whenever a GPU is at hand and keep its JSON with the commit it measured.
Usage: python benchmarks/gpu.py [--model PATH ...] [--ctx 8192] [--tokens 16384] [--kv q4_0] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def _pass_rate(work, kv: str | None) -> dict:
    import torch

    from wkvlab.eval.chunks import WindowPass, chunk_bounds
    from wkvlab.eval.runner import RunOptions
    from wkvlab.kv import KVSpec
    from wkvlab.kv.hook import layer_stores

    model = work.loaded.model
    specs = [KVSpec.parse(kv)] if kv else []
    chunk = RunOptions().chunk_for(model, work.windows.ctx, specs)
    window = WindowPass(model, specs[0], layer_stores(model, specs[0])) if kv else WindowPass(model)
    tokens = work.windows.tokens[0]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for lo, hi in chunk_bounds(work.windows.ctx, chunk):
        torch.log_softmax(window.step(tokens[lo:hi]).float(), dim=-1)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"chunk": chunk, "seconds": seconds, "tokens_per_s": work.windows.ctx / seconds,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30}


def measure(model: str, args) -> dict:
    import torch

    from wkvlab import api

    work = api.prepare(model, "default", ctx=args.ctx, tokens=args.tokens, device=args.device, dtype="bfloat16")
    out = {"model": model, "device": args.device, "dtype": "bfloat16", "ctx": args.ctx,
           "reference": _pass_rate(work, None), "candidate": {"kv": args.kv, **_pass_rate(work, args.kv)}}
    start = time.perf_counter()
    weights, kv = ["none", "int4-g128"], ["fp16", "fp8_e4m3", args.kv]
    results = api.evaluate_workload(work, api.parse_weights(weights), api.parse_kv(kv))
    out["grid"] = {"tokens": results[0].tokens, "seconds": time.perf_counter() - start,
                   "configs": [{"weights": r.weights, "kv": r.kv, "kld": r.kld["mean"], "top1": r.top1_agreement} for r in results]}
    del work
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", action="append", default=[], help="an HF folder or .gguf file (repeatable); the packaged models always run")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--kv", default="q4_0")
    parser.add_argument("--device", default="cuda", help="cuda (all visible GPUs as the model needs) or cuda:<N>")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu.py needs a CUDA device and this torch sees none; run it on a GPU machine")
    report = {"gpus": [{"name": torch.cuda.get_device_name(i), "memory_gib": torch.cuda.get_device_properties(i).total_memory / 2**30}
                       for i in range(torch.cuda.device_count())],
              "torch": torch.__version__, "models": []}
    for model in ["default", "gemma3-270m", *args.model]:
        ctx = min(args.ctx, 8192) if model == "default" else args.ctx  # SmolLM2's limit is 8,192
        report["models"].append(measure(model, argparse.Namespace(**{**vars(args), "ctx": ctx, "tokens": max(args.tokens, ctx)})))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
