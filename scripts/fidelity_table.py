"""Regenerate the fidelity tables of docs/engines.md: llama.cpp's own KLD against `wkvlab eval`'s.

For each llama.cpp cache type, on the same token windows:

* engine: llama.cpp with that cache against llama.cpp with its f16 cache (``wkvlab engine compare``);
* eval: ``wkvlab eval --kv llamacpp:<t>`` as a user runs it (the engine baseline is chosen
  automatically for llamacpp: presets on a GGUF), and the same with ``--baseline float`` (the
  cache alone, what the presets measured before);
* ratio = eval / engine on mean KLD.

Usage (heavy: run under the shared lock):
    flock /tmp/wkvlab-heavy.lock python scripts/fidelity_table.py --model default --ctx 1024 --tokens 4096 --json fidelity.json
    ... --preset llamacpp-x86 --kv q8_0,q8_0/q4_0    # the simulated side with the x86 q8_0 writer
"""
from __future__ import annotations

import argparse
import json
import time

from wkvlab import api
from wkvlab.engines.api import fidelity

DEFAULT_TYPES = "q8_0,q4_0,q4_1,q5_0,q8_0/q4_0"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="default", help="packaged model name or .gguf path (the GGUF llama.cpp runs)")
    parser.add_argument("--kv", default=DEFAULT_TYPES, help="llama.cpp cache types, comma-separated")
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-float", action="store_true", help="skip the --baseline float column")
    parser.add_argument("--preset", default="llamacpp", choices=("llamacpp", "llamacpp-x86"),
                        help="the simulated presets: llama.cpp's reference q8_0 writer or its x86 AVX/AVX2 one")
    parser.add_argument("--json")
    args = parser.parse_args()
    types = [t for t in args.kv.split(",") if t]
    presets = [f"{args.preset}:{t}" for t in types]

    started = time.perf_counter()
    report = fidelity(args.model, types, ctx=args.ctx, tokens=args.tokens, threads=args.threads)
    engine_seconds = time.perf_counter() - started
    work = api.prepare(args.model, "default", ctx=args.ctx, tokens=args.tokens)
    evals = api.evaluate_workload(work, api.parse_weights(["none"]), api.parse_kv(presets), baseline="auto")
    floats = [] if args.no_float else api.evaluate_workload(work, api.parse_weights(["none"]), api.parse_kv(presets), baseline="float")

    print(f"{report.model}, {report.tokens} scored tokens ({args.tokens // args.ctx} windows of {args.ctx}), default text; "
          f"llama-cpp-python {report.engine.get('version')}, {args.threads} threads; "
          f"noise floor (transformers fp32 vs llama.cpp f16) {report.noise_floor['mean']:.6f} ± {report.noise_floor['se']:.6f}; "
          f"engine baseline: {evals[0].fidelity['baseline']['activations']}\n")
    header = "| KV | llama.cpp KLD (vs its f16) | `wkvlab eval` KLD (engine baseline) | ratio |"
    if floats:
        header += " `--baseline float` KLD | ratio |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    rows = []
    for i, row in enumerate(report.rows):
        engine, sim = row.engine_kld, evals[i].kld
        line = f"| {row.kv} | {engine['mean']:.6f} ± {engine['se']:.6f} | {sim['mean']:.6f} ± {sim['se']:.6f} | **{sim['mean'] / engine['mean']:.2f}** |"
        entry = {"kv": row.kv, "engine_kld": engine, "eval_kld": sim, "ratio": sim["mean"] / engine["mean"],
                 "compare_sim_kld": row.sim_kld, "engine_top1": row.engine_top1, "eval_top1": evals[i].top1_agreement}
        if floats:
            flt = floats[i].kld
            line += f" {flt['mean']:.6f} ± {flt['se']:.6f} | {flt['mean'] / engine['mean']:.2f} |"
            entry.update(float_kld=flt, float_ratio=flt["mean"] / engine["mean"])
        print(line)
        rows.append(entry)
    print(f"\n{time.perf_counter() - started:.0f} s in all ({engine_seconds:.0f} s for engine compare)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"compare": report.to_dict(), "rows": rows, "ctx": args.ctx, "tokens": args.tokens}, handle, indent=1)


if __name__ == "__main__":
    main()
