"""Long contexts on a CPU: memory and speed of chunked evaluation, and the stored reference's size and error.

Prints one JSON object:

* ``contexts``: for each ctx (default 2,048, 8,192 and 32,768) on Gemma-3-270M, one window run
  through the reference pass and through one KV candidate (``--kv``, default q4_0), each in its own
  process so that its peak resident memory (``ru_maxrss``) is its own: tokens/s, peak RSS in MiB,
  and the candidate/reference time ratio (goal ≤ 1.15, as at 512 on the default model). Memory
  should grow linearly in ctx — with ctx × hidden and the KV cache, not ctx × vocabulary.
* ``plain_forward``: the same model's plain forward (one call, no cache, full logits) at the
  smallest ctx, next to the chunked reference pass at that ctx: chunking should cost nothing.
* ``stored_reference`` (default model, ctx 512): bytes per token of a stored reference at the
  default k and tail samples, against llama.cpp's ``--kl-divergence-base`` (2 bytes × vocabulary),
  and KLD against it vs the in-memory KLD for a few configs (error = in-memory − stored).

Threads: ``--threads`` (default 2) for every child; the machine load at the start is printed too.
Usage: python benchmarks/scale.py [--contexts 2048,8192,32768] [--kv q4_0] [--threads 2]
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

GEMMA = "gemma3-270m"


def _child_pass(model: str, ctx: int, kv: str | None, threads: int) -> dict:
    """One window through one pass (reference if ``kv`` is None), chunked as wkvlab eval runs it."""
    import torch

    from wkvlab import api
    from wkvlab.eval.chunks import WindowPass, chunk_bounds
    from wkvlab.eval.metrics import ReferenceTokens
    from wkvlab.eval.runner import RunOptions
    from wkvlab.kv import KVSpec
    from wkvlab.kv.hook import layer_stores

    torch.set_num_threads(threads)
    work = api.prepare(model, "default", ctx=ctx, tokens=ctx)
    model_ = work.loaded.model
    specs = [KVSpec.parse(kv)] if kv else []
    chunk = RunOptions().chunk_for(model_, ctx, specs)
    window = WindowPass(model_, specs[0], layer_stores(model_, specs[0])) if kv else WindowPass(model_)
    tokens = work.windows.tokens[0]
    start = time.perf_counter()
    for lo, hi in chunk_bounds(ctx, chunk):
        logits = window.step(tokens[lo:hi])
        # what the runner does with every chunk: log-probabilities of the scored rows
        ReferenceTokens.from_logits(logits[: min(hi, ctx - 1) - lo], tokens[lo + 1 : min(hi, ctx - 1) + 1])
    seconds = time.perf_counter() - start
    return {"ctx": ctx, "kv": kv or "reference", "chunk": chunk, "seconds": seconds, "tokens_per_s": ctx / seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _child_plain(model: str, ctx: int, threads: int) -> dict:
    import torch

    from wkvlab import api
    from wkvlab.eval.runner import forward_logits

    torch.set_num_threads(threads)
    work = api.prepare(model, "default", ctx=ctx, tokens=ctx)
    start = time.perf_counter()
    logits = forward_logits(work.loaded.model, work.windows.tokens[0])
    torch.log_softmax(logits.float(), dim=-1)
    seconds = time.perf_counter() - start
    return {"ctx": ctx, "seconds": seconds, "tokens_per_s": ctx / seconds,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _child_stored(threads: int) -> dict:
    import torch

    from wkvlab import api
    from wkvlab.eval.reference import StoredReference

    torch.set_num_threads(threads)
    grid = dict(model="default", ctx=512, tokens=4096, weights=["none", "int4-g128"], kv=["q8_0", "q4_0"])
    memory = api.evaluate(**grid)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "reference.safetensors")
        stored = api.evaluate(**grid, reference=path)
        ref = StoredReference.load(path)
        size = os.path.getsize(path)
    vocab = ref.full_logprobs.shape[-1]
    rows = []
    for m, s in zip(memory, stored):
        info = s.run["reference"]
        rows.append({"config": f"{m.weights} × {m.kv}", "kld_in_memory": m.kld["mean"], "kld_stored": s.kld["mean"],
                     "difference": m.kld["mean"] - s.kld["mean"], "top_k_lower_bound": info["kld_lower_bound_mean"],
                     "measured_error": info["error"]})
    return {"tokens": ref.tokens, "k": ref.k, "tail_samples": ref.meta["samples"], "file_bytes_per_token": size / ref.tokens,
            "llamacpp_base_bytes_per_token": 2 * vocab, "configs": rows}


def _run_child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", default="2048,8192,32768")
    parser.add_argument("--kv", default="q4_0")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--skip-stored", action="store_true")
    parser.add_argument("--child", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "pass":
            ctx, kv, threads = int(rest[0]), (None if rest[1] == "-" else rest[1]), int(rest[2])
            print(json.dumps(_child_pass(GEMMA, ctx, kv, threads)))
        elif kind == "plain":
            print(json.dumps(_child_plain(GEMMA, int(rest[0]), int(rest[1]))))
        else:
            print(json.dumps(_child_stored(int(rest[0]))))
        return
    contexts = [int(c) for c in args.contexts.split(",")]
    report = {"model": GEMMA, "threads": args.threads, "load_average_at_start": os.getloadavg(), "contexts": []}
    for ctx in contexts:
        reference = _run_child(["pass", str(ctx), "-", str(args.threads)])
        candidate = _run_child(["pass", str(ctx), args.kv, str(args.threads)])
        report["contexts"].append({"ctx": ctx, "chunk": reference["chunk"], "reference": reference, "candidate": candidate,
                                   "candidate_over_reference": candidate["seconds"] / reference["seconds"]})
    report["plain_forward"] = {"plain": _run_child(["plain", str(contexts[0]), str(args.threads)]),
                               "chunked_reference": report["contexts"][0]["reference"]}
    if not args.skip_stored:
        report["stored_reference"] = _run_child(["stored", str(args.threads)])
    report["load_average_at_end"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
