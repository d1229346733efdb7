"""Run one of the explain diagnostics (issue #5 items 2, 3, 5) on a packaged model and print JSON.

    .venv/bin/python benchmarks/explain_parts.py attention --weights int4-g128 --kv int4 --windows 1 --ctx 512
    .venv/bin/python benchmarks/explain_parts.py hidden --weights int4-g128 --kv int4
    .venv/bin/python benchmarks/explain_parts.py generation --weights int4-g128 --kv int4 --prompts 4 --new-tokens 32
    .venv/bin/python benchmarks/explain_parts.py retrieval --weights int4-g128 --kv int4 --ctx 1024 --per-depth 2
    .venv/bin/python benchmarks/explain_parts.py selfgen --weights int4-g128 --kv int4 --ctx 512 --tokens 2048

``wkvlab explain`` runs the same functions as steps of its report; this script runs one alone,
with its wall time, for the numbers in docs/explain.md.
"""
from __future__ import annotations

import argparse
import json
import time

from wkvlab import api
from wkvlab.data import tokenizer_wants_bos
from wkvlab.kv.spec import KVSpec
from wkvlab.weights.apply import quantize_model_weights
from wkvlab.weights.spec import WeightSpec


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("part", choices=["attention", "hidden", "generation", "retrieval", "selfgen"])
    parser.add_argument("--model", default="default")
    parser.add_argument("--data", default="default")
    parser.add_argument("--weights", default="int4-g128")
    parser.add_argument("--kv", default="int4")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=2048, help="selfgen: tokens to generate and evaluate")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--per-depth", type=int, default=2)
    args = parser.parse_args()

    start = time.perf_counter()
    data = f"selfgen:{args.tokens}" if args.part == "selfgen" else args.data
    work = api.prepare(args.model, data, ctx=args.ctx, tokens=max(args.ctx * args.windows, args.ctx))
    w_spec, kv = WeightSpec.parse(args.weights), KVSpec.parse(args.kv)
    reference = work.loaded.model
    candidate = quantize_model_weights(reference, w_spec, None, model_key=work.loaded.fingerprint).model
    tokenizer = work.loaded.tokenizer
    bos = tokenizer.bos_token_id if tokenizer_wants_bos(tokenizer) else None
    common = dict(weights_label=w_spec.label)
    if args.part == "attention":
        from wkvlab.explain.attention import attention_decomposition

        result = attention_decomposition(reference, candidate, kv, work.windows.tokens[: args.windows], **common)
    elif args.part == "hidden":
        from wkvlab.explain.hidden import layer_diagnostics

        result = layer_diagnostics(reference, candidate, kv, work.windows.tokens[: args.windows], **common)
    elif args.part == "generation":
        from wkvlab.explain.generation import corpus_prompts, generation_agreement

        prompts = corpus_prompts(tokenizer, work.corpus.text, args.prompts, args.prompt_tokens, bos)
        result = generation_agreement(reference, candidate, kv, prompts, new_tokens=args.new_tokens, **common)
    elif args.part == "retrieval":
        from wkvlab.explain.retrieval import build_items, retrieval_eval

        items = build_items(tokenizer, work.corpus.text, ctx=args.ctx, per_depth=args.per_depth, bos_id=bos)
        result = retrieval_eval(reference, candidate, kv, items, **common)
    else:
        work = api.prepare(work.loaded, data, ctx=args.ctx, tokens=args.tokens)
        result = api.evaluate_workload(work, [w_spec], [kv])[0]
    payload = result.to_dict()
    if hasattr(result, "lines"):
        payload["lines"] = result.lines()
    if args.part == "selfgen":
        payload.pop("arrays", None)
    print(json.dumps({"part": args.part, "model": work.loaded.name, **payload, "wall_seconds": round(time.perf_counter() - start, 1)}, indent=1))


if __name__ == "__main__":
    main()
