"""How much does wkvlab's measurement cost on top of the model's own forward passes?

Prints JSON with two ratios on the default model (CPU, float32):

* ``kv_candidate_over_reference``: one KV-only candidate evaluation (forward through the KV hook +
  log-softmax + full-vocabulary KLD/top-1/Δp against the reference) divided by the reference
  evaluation (forward + log-softmax of the reference). Goal ≤ 1.15.
* ``grid_over_plain_forwards``: the whole demo grid (3 weight configs × 4 KV configs, reference
  once, weight quantization included) divided by (configs + 1) plain forward passes over the same
  windows. Goal ≤ 1.3.

Usage: python benchmarks/eval_overhead.py [--ctx 512] [--tokens 2048] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from wkvlab import api
from wkvlab.eval.metrics import ReferenceTokens, compare_tokens
from wkvlab.eval.runner import forward_logits
from wkvlab.kv import KVSpec, kv_quantization

DEMO_WEIGHTS = ["bf16", "int8", "int4-g128"]
DEMO_KV = ["fp16", "fp8_e4m3", "int8", "int4"]


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv", default="int4")
    args = parser.parse_args()
    torch.manual_seed(0)
    work = api.prepare("default", "default", ctx=args.ctx, tokens=args.tokens)
    model, windows = work.loaded.model, work.windows
    lo, hi = windows.score_from, windows.ctx - 1
    forward_logits(model, windows.tokens[0])  # warm-up

    def plain():
        for tokens in windows.tokens:
            forward_logits(model, tokens)

    refs = []

    def reference():
        refs.clear()
        for tokens in windows.tokens:
            refs.append(ReferenceTokens.from_logits(forward_logits(model, tokens)[lo:hi], tokens[lo + 1 : hi + 1]))

    spec = KVSpec.parse(args.kv)

    def candidate():
        for tokens, ref in zip(windows.tokens, refs):
            with kv_quantization(model, spec):
                logits = forward_logits(model, tokens)[lo:hi]
            compare_tokens(ref, logits)

    t_plain = _best(plain, args.repeats)
    t_ref = _best(reference, args.repeats)
    t_cand = _best(candidate, args.repeats)
    configs = len(DEMO_WEIGHTS) * len(DEMO_KV)
    start = time.perf_counter()
    api.evaluate_workload(work, api.parse_weights(DEMO_WEIGHTS), api.parse_kv(DEMO_KV))
    t_grid = time.perf_counter() - start
    print(json.dumps({
        "model": work.loaded.name,
        "ctx": args.ctx,
        "windows": windows.n_windows,
        "kv": spec.label,
        "plain_forward_seconds": round(t_plain, 4),
        "reference_eval_seconds": round(t_ref, 4),
        "kv_candidate_eval_seconds": round(t_cand, 4),
        "kv_candidate_over_reference": round(t_cand / t_ref, 4),
        "kv_candidate_goal": 1.15,
        "grid_configs": configs,
        "grid_seconds": round(t_grid, 3),
        "grid_over_plain_forwards": round(t_grid / ((configs + 1) * t_plain), 4),
        "grid_goal": 1.3,
        "torch_threads": torch.get_num_threads(),
    }, indent=2))


if __name__ == "__main__":
    main()
