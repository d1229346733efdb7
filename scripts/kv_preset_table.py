"""Measure every KV preset on a model and print the Markdown table used in docs/kv.md.

Every row is measured against the float reference (the cache alone; ``--baseline float``): the grid
mixes engines, and llama.cpp's own activation rounding belongs to llama.cpp's rows only — its
engine-baseline numbers are in docs/engines.md (scripts/fidelity_table.py).

Usage: python scripts/kv_preset_table.py [--model default] [--ctx 512] [--tokens 4096] [--json out.json] [--only a,b,...]

``--only`` measures the listed specs alone (fp16 first, for the "vs fp16" column) on the same windows:
rows that a full run would print, for adding new presets without re-running the grid.
"""
from __future__ import annotations

import argparse
import json

from wkvlab import api
from wkvlab.kv import KVSpec
from wkvlab.weights.spec import WeightSpec

SPECS = [
    "fp16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "int2", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl",
    "llamacpp:q8_0", "llamacpp:q5_1", "llamacpp:q5_0", "llamacpp:q4_1", "llamacpp:q4_0", "llamacpp:iq4_nl",
    "llamacpp:q8_0/q4_0", "llamacpp:q4_0+norot", "llamacpp-x86:q8_0", "llamacpp:f16/q4_0",
    "vllm:fp8_e4m3", "vllm:fp8_e5m2", "vllm:int8_per_token_head", "vllm@0.23:int8_per_token_head", "int8_pth-round", "vllm:fp8_per_token_head", "vllm:int4_per_token_head",
    "exl3:k8v8", "exl3:k6v6", "exl3:k4v4", "exl3:k4v2", "exl3:k3v3", "exl3:k2v2", "exl3-fa:k4v4", "exl3-fa:k2v2",
    "vllm:fp8_e4m3+scales=amax448", "vllm:fp8_e4m3+scales=amax448-head", "vllm@0.27:fp8_e4m3+scales=calculate", "vllm-fa3:fp8_e4m3",
    "sglang:fp4_e2m1", "nvfp4-fp8read", "nvfp4-fp8read-sm100", "vllm:nvfp4", "vllm:nvfp4_4over6",  # +recipe=nvfp4 is vllm:nvfp4
    "kivi4", "kivi2", "kvquant:4", "kvquant:4-1%", "kvquant:3", "kvquant:3-1%", "kvquant:2-1%",
    "qserve:kv4", "hf-quanto:int4", "hf-quanto:int2", "hf-hqq:int8", "hf-hqq:int4", "hf-hqq:int2",
    "int4+rot", "int4+sinks=4", "int4+sinks=auto", "int4+residual=128", "int4+window=128", "int4+pastonly", "int4+skip=0,29",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="default")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--json")
    parser.add_argument("--only", help="comma-separated specs to measure instead of the whole list (fp16 is always first)")
    args = parser.parse_args()
    chosen = SPECS
    if args.only:
        from wkvlab.kv.spec import split_kv_list

        chosen = ["fp16"] + [s for s in split_kv_list(args.only) if s != "fp16"]
    work = api.prepare(args.model, "default", ctx=args.ctx, tokens=args.tokens)
    last = work.loaded.model.config.num_hidden_layers - 1
    specs = [KVSpec.parse(s.replace("skip=0,29", f"skip=0,{last}")) for s in chosen]  # first and last layer
    results = api.evaluate_workload(work, [WeightSpec()], specs, baseline="float")
    fp16 = results[0].kv_bytes_per_token
    print(f"{work.loaded.name}, {results[0].tokens} scored tokens of prose, ctx {args.ctx}; float32 weights; "
          f"calibrated configs use 16 x 512 tokens from the end of the same corpus\n")
    print("| KV config | fidelity | bytes/token | vs fp16 | KLD mean ± se | KLD p99 | top-1 | ΔPPL |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        k = r.kld
        label = r.fidelity.get("label", "")
        print(f"| `{r.kv}` | {'' if label == 'no preset' else label} | {r.kv_bytes_per_token:,.0f} | {r.kv_bytes_per_token / fp16:.3f} | {k['mean']:.5f} ± {k['se']:.5f} | {k['p99']:.4f} | {100 * r.top1_agreement:.2f}% | {r.ppl - r.ppl_ref:+.3f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([r.to_dict() for r in results], handle, indent=1)


if __name__ == "__main__":
    main()
