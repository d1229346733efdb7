"""Engine against engine: how tight is the served top-k bound, against the exact full-vocabulary KLD?

Two real llama-cpp-python servers on loopback run the packaged default GGUF, the reference with an
f16 cache and the candidate with ``--cache`` (q4_0 by default, flash attention on); ``wkvlab``
scores both sides' top-k log-probs on the same tokens (``api.evaluate_engines``) for each ``--topk``.
The same llama.cpp in-process gives both caches' full logits on the same windows: the exact KLD the
bound is a lower bound of. Prints JSON: per k the bound, its ratio to the exact KLD, the reference's
tail mass outside the shared tokens, PPL and top-1 (which need no bound) and the wall time.

Usage: python benchmarks/engine_pair.py [--ctx 128] [--tokens 512] [--topk 20,200] [--cache q4_0]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from wkvlab.engines import api
from wkvlab.engines.llamacpp import LlamaCppEngine
from wkvlab.engines.local_server import llama_cpp_server
from wkvlab.engines.pair import compare_pair
from wkvlab.engines.tokens import token_workload
from wkvlab.models.packaged import packaged_gguf


def exact_in_process(gguf: Path, cache: str, ctx: int, tokens: int) -> dict:
    """Both caches' full logits from llama.cpp in-process, with the servers' settings (n_ctx = 2 ctx)."""
    work = token_workload("default", "default", ctx=ctx, tokens=tokens, bos=True)
    ref = LlamaCppEngine(gguf, "f16", ctx=2 * ctx, flash_attn="off")
    cand = LlamaCppEngine(gguf, cache, ctx=2 * ctx, flash_attn="auto")
    try:
        parts = [compare_pair(ref.score_window(w, 1), cand.score_window(w, 1), w).metrics for w in work.windows.tokens]
    finally:
        ref.close()
        cand.close()
    kld = np.concatenate([p.kld for p in parts])
    return {"kld": float(kld.mean()), "kld_se": float(kld.std(ddof=1) / np.sqrt(kld.size)), "tokens": int(kld.size),
            "ppl": float(np.exp(np.concatenate([p.nll for p in parts]).mean())),
            "top1": float(np.concatenate([p.top1_agree for p in parts]).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--topk", default="20,200")
    parser.add_argument("--cache", default="q4_0")
    args = parser.parse_args()
    torch.set_num_threads(1)
    gguf = packaged_gguf("default")
    exact = exact_in_process(gguf, args.cache, args.ctx, args.tokens)
    out = {"model": "default", "reference_cache": "f16", "candidate_cache": args.cache, "ctx": args.ctx, "exact": exact, "served": []}
    with tempfile.TemporaryDirectory() as logs, \
         llama_cpp_server(gguf, n_ctx=2 * args.ctx, log=Path(logs) / "ref.log") as ref_url, \
         llama_cpp_server(gguf, n_ctx=2 * args.ctx, cache=args.cache, log=Path(logs) / "cand.log") as cand_url:
        for k in (int(x) for x in args.topk.split(",")):
            spec = lambda url: api.ServerSpec(url=url, model="smollm2", flavor="llama-cpp-python", topk=k, timeout=600)  # noqa: E731
            start = time.perf_counter()
            result = api.evaluate_engines(spec(ref_url), servers=[spec(cand_url)], ctx=args.ctx, tokens=args.tokens)[0]
            out["served"].append({"topk": k, "kld_bound": result.kld["mean"], "bound_over_exact": result.kld["mean"] / exact["kld"],
                                  "tail_mass": result.tail_mass, "tokens": result.tokens, "ppl": result.ppl, "top1": result.top1_agreement,
                                  "seconds": time.perf_counter() - start})
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
