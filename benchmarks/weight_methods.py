"""Calibration time and resulting KLD per weight method, and the calibration-domain experiment.

    # every preset on a model: weight bytes, build (calibration) seconds, KLD mean ± se, top-1
    python benchmarks/weight_methods.py table --model default --ctx 512 --tokens 1024 --calib-samples 8 --calib-len 256

    # calibrate on each domain, evaluate on each domain (the seed's "helps A, hurts B" claim)
    python benchmarks/weight_methods.py domains --weights gptq-int4-g128 --calib prose,code --eval prose,code

Writes JSON (``--json``) and prints a markdown table. Configs run in small groups so that only a
few quantized copies are held at once (Gemma-3-270M is 1.1 GB per float32 copy). llm-compressor
is compared side by side only where it installs next to this torch/transformers; the script says
when it does not.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

from wkvlab import api
from wkvlab.weights import CalibrationSpec, WeightSpec, math_text

PRESETS = [
    "bf16", "int8", "int4-g128", "gptq-int4-g128", "awq-int4-g128",
    "int8;wscale=tensor;a=int8-tensor", "int8;a=int8", "w8a8-int8", "w8a8-int8;wo", "llm-int8",
    "fp8", "fp8-wo", "fp8-static", "nvfp4", "nvfp4-wo", "nvfp4-mlp", "mxfp4", "mxfp4-wo",
]


def _row(result, build_seconds: float) -> dict:
    kld = result.kld
    return {"model": result.model, "data": result.data, "weights": result.weights, "weight_bytes": result.weight_bytes,
            "build_seconds": round(build_seconds, 1), "kld_mean": kld["mean"], "kld_se": kld.get("se", kld.get("stderr")),
            "top1": result.top1_agreement, "ppl": result.ppl, "ppl_ref": result.ppl_ref, "tokens": result.tokens,
            "eval_seconds": round(result.seconds, 1)}


def _evaluate(work, specs: list[WeightSpec], calibration: CalibrationSpec, group: int) -> list[dict]:
    rows = []
    for start in range(0, len(specs), group):
        chunk = specs[start:start + group]
        begin = time.perf_counter()
        builds: dict[str, float] = {}
        last = [begin]

        def tick(desc: str, _n: int) -> None:  # the runner ticks once after building each config
            if desc.startswith("quantized weights "):
                now = time.perf_counter()
                builds[desc[len("quantized weights "):]] = now - last[0]
                last[0] = now

        results = api.evaluate_workload(work, chunk, api.parse_kv(["fp16"]), tick, calibration)
        total = time.perf_counter() - begin
        for result in results:
            rows.append(_row(result, builds.get(result.weights, float("nan"))))
            print(f"  {result.weights:36s} bytes={result.weight_bytes:>11,d} kld={result.kld['mean']:.5f} top1={result.top1_agreement:.4f}", file=sys.stderr, flush=True)
        print(f"  group done in {total:.0f}s", file=sys.stderr, flush=True)
    return rows


def _calibration_data(name: str, folder: Path) -> str:
    """``math`` is generated text; give the evaluator a file holding it."""
    if name != "math":
        return name
    path = folder / "math.txt"
    path.write_text(math_text(), encoding="utf-8")
    return str(path)


def table(args) -> list[dict]:
    calibration = CalibrationSpec(args.calib, args.calib_samples, args.calib_len)
    work = api.prepare(args.model, args.data, ctx=args.ctx, tokens=args.tokens)
    specs = [WeightSpec.parse(w) for w in (args.weights.split("|") if args.weights else PRESETS)]
    return _evaluate(work, specs, calibration, args.group)


def domains(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for calib in args.calib.split(","):
            for data in args.eval.split(","):
                work = api.prepare(args.model, _calibration_data(data, Path(folder)), ctx=args.ctx, tokens=args.tokens)
                calibration = CalibrationSpec(calib, args.calib_samples, args.calib_len)
                print(f"calibrate on {calib}, evaluate on {data}", file=sys.stderr, flush=True)
                for row in _evaluate(work, [WeightSpec.parse(w) for w in args.weights.split("|")], calibration, 4):
                    rows.append({**row, "calib": calib, "eval": data})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["table", "domains"])
    parser.add_argument("--model", default="default")
    parser.add_argument("--data", default="default")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--weights", default=None, help="configs separated by '|' (default: every preset)")
    parser.add_argument("--calib", default="prose")
    parser.add_argument("--eval", default="prose,code")
    parser.add_argument("--calib-samples", type=int, default=8)
    parser.add_argument("--calib-len", type=int, default=256)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.mode == "domains" and not args.weights:
        args.weights = "gptq-int4-g128"
    llmc = importlib.util.find_spec("llmcompressor") is not None
    print(f"llm-compressor installed: {llmc}" + ("" if llmc else " (0.14 pins transformers<=5.17; not installed next to 5.24)"), file=sys.stderr)
    rows = table(args) if args.mode == "table" else domains(args)
    print("| model | weights | weight bytes | build s | KLD mean ± se | top-1 |")
    print("|---|---|---:|---:|---|---:|")
    for r in rows:
        label = r["weights"] + (f" (calib {r['calib']} → eval {r['eval']})" if "calib" in r else "")
        print(f"| {r['model']} | `{label}` | {r['weight_bytes']:,} | {r['build_seconds']:.0f} | {r['kld_mean']:.5f} ± {r['kld_se']:.5f} | {r['top1']:.4f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
