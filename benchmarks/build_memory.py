"""Peak memory of a calibrated weight build, emulated on torch's ``meta`` device, against the
preflight estimate's build phase (issue #40: "calibrated builds at the floor").

    PYTHONPATH=src python benchmarks/build_memory.py                 # the three cases below, JSON
    PYTHONPATH=src python benchmarks/build_memory.py --cases llama-70b-slice:gptq-int4-g128

A model of the named shape is built on ``meta`` (no weights exist, nothing is computed) inside
:class:`tests.meta_memory.MemoryAudit`, which counts every live storage the way CUDA's
``max_memory_allocated`` does, and ``quantize_model_weights(..., in_place=True)`` runs on random
calibration tokens, as ``wkvlab eval`` builds a config in the one-model plan. The estimate is
:func:`wkvlab.eval.memory.estimate_memory`'s one-model build phase in bfloat16 on CUDA, less its
fixed ``runtime`` allowance (the CUDA context and kernel workspaces, which the allocator does not
count). Prints one JSON object: per case the peak, the estimate, their ratio, both less the
weights (what the build itself adds), and the build's peak while each decoder layer was built
(``layer_build_peaks_gib``: flat when nothing grows with depth, as AWQ's did when it held every
layer's inputs). MoE routing on ``meta`` is uniform: each expert gets
``top_k / experts`` of the tokens.

Cases (``--cases``, comma-separated ``shape:spec``): Llama-3-70B-shaped slices (hidden 8192,
intermediate 28672, 64 heads / 8 KV heads, vocabulary 128,256) of ``--layers`` decoder layers
under GPTQ and AWQ, and one Mixtral-8x7B-shaped layer (8 experts, top-2) under GPTQ, at
AutoAWQ's calibration of 128 samples × 512 tokens (``--samples``, ``--length``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.meta_memory
try:  # an installed wkvlab or PYTHONPATH wins; else this checkout's
    import wkvlab  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))

from tests.meta_memory import MemoryAudit  # noqa: E402
from wkvlab.eval.memory import RUNTIME_BYTES, GridShape, estimate_memory  # noqa: E402
from wkvlab.kv.spec import KVSpec  # noqa: E402
from wkvlab.plan.models import ModelDescription  # noqa: E402
from wkvlab.weights import quantize_model_weights  # noqa: E402
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec  # noqa: E402
from wkvlab.weights.spec import WeightSpec  # noqa: E402

GIB = 2**30
LLAMA_70B = dict(model_type="llama", hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
                 head_dim=128, vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)
MIXTRAL_8X7B = dict(model_type="mixtral", hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                    head_dim=128, vocab_size=32000, max_position_embeddings=4096, rope_theta=1e6, num_local_experts=8,
                    num_experts_per_tok=2, tie_word_embeddings=False)
QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, vocab_size=151936, max_position_embeddings=4096, rope_theta=1e6, num_experts=128,
                     num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
SHAPES = {"llama-70b-slice": LLAMA_70B, "mixtral-8x7b-layer": {**MIXTRAL_8X7B, "num_hidden_layers": 1},
          "qwen3-30b-a3b-layer": {**QWEN3_30B_A3B, "num_hidden_layers": 1}}  # small experts: GPTQ batches them
CASES = ("llama-70b-slice:gptq-int4-g128", "llama-70b-slice:awq-int4-g128", "mixtral-8x7b-layer:gptq-int4-g128",
         "qwen3-30b-a3b-layer:gptq-int4-g128")
MARGIN = 0.15  # the bound: every estimate within ±15% of what the run takes
# The widths with a small vocabulary and 8 × 512 calibration (what a build adds is most of the
# peak, and on meta a case takes seconds): the fast test tier and gpu_check's CPU part. AWQ runs 3
# layers (each layer's build peak is reported: they must not grow), 4 scale candidates and no
# clipping search (its buffers are smaller than the scale search's; the full cases run the preset).
QUICK_SHAPE = dict(vocab_size=1024, max_position_embeddings=1024)
QUICK_CASES = {"llama-gptq": ("llama-70b-slice", 1, "gptq-int4-g128"), "llama-awq": ("llama-70b-slice", 3, "awq-int4-g128;grid=4;noclip"),
               "mixtral-gptq": ("mixtral-8x7b-layer", 1, "gptq-int4-g128"), "qwen3-moe-gptq": ("qwen3-30b-a3b-layer", 1, "gptq-int4-g128")}


def estimated_build_bytes(config: dict, spec: str, samples: int, length: int) -> int:
    """The one-model plan's build phase on CUDA in bfloat16, less the fixed runtime allowance."""
    desc = ModelDescription.from_config(config, name="emulated")
    grid = GridShape((WeightSpec.parse(spec),), (KVSpec.parse("fp16"),), ctx=length, tokens=length, dtype="bfloat16",
                     device="cuda", calibration=(samples, length))
    plan = estimate_memory(desc, grid, requested="one-model").plan("one-model", 1)
    return sum(p.bytes for p in plan.build_parts if p.where == "device") - RUNTIME_BYTES


def _columns_on_meta(w, hinv, q, i1, i2, qparams, fake, group_size, params, group_of=None):
    """GPTQ's column loop as the emulation runs it: the block's copy, its errors, its groups' grids and its
    quantized columns — what :func:`wkvlab.weights.gptq.block_columns` allocates beyond ``[rows]``-long
    vectors — without the per-column ops (thousands per matrix, each ~0.5 ms on ``meta``)."""
    w1 = w[..., i1:i2].clone()
    err1 = torch.zeros_like(w1)
    for col in range(i1, i2):
        if group_of is None and group_size is not None and col % group_size == 0:  # fixed grids are found before the loop
            params.append(qparams(w[..., col:col + group_size].reshape(-1, min(group_size, w.shape[-1] - col))))
    q[..., i1:i2] = w1
    return err1


def emulate_build(config: dict, spec: str, samples: int, length: int) -> dict:
    """Build ``spec`` in place on a ``meta`` model of ``config``; the audit's peak and the estimate."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    experts = config.get("num_local_experts") or config.get("num_experts")
    fraction = config["num_experts_per_tok"] / experts if experts else 1.0
    tokens = torch.randint(0, config["vocab_size"], (samples, length), generator=torch.Generator().manual_seed(0))
    calibration = CalibrationSet(CalibrationSpec(samples=samples, length=length), tokens, "random")
    started = time.perf_counter()
    with mock.patch("wkvlab.weights.gptq.block_columns", _columns_on_meta), MemoryAudit(route_fraction=fraction) as audit:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
        weights = audit.live()
        layer_peaks: list[int] = []

        def layer_done(_what: str, _share: float) -> None:  # the build's per-layer progress: that layer's peak, then a fresh one
            layer_peaks.append(audit.peak)
            audit.reset_peak()

        quantize_model_weights(model, WeightSpec.parse(spec), calibration, in_place=True, progress=layer_done)
    peak = max([audit.peak, *layer_peaks])
    estimate = estimated_build_bytes(config, spec, samples, length)
    return {"peak_gib": round(peak / GIB, 3), "estimate_gib": round(estimate / GIB, 3), "ratio": round(peak / estimate, 3),
            "weights_gib": round(weights / GIB, 3), "build_peak_gib": round((peak - weights) / GIB, 3),
            "build_estimate_gib": round((estimate - weights) / GIB, 3),
            "build_ratio": round((peak - weights) / max(estimate - weights, 1), 3),
            # the build's peak while each decoder layer was built (the first includes capturing the
            # calibration inputs): flat when no layer's inputs or statistics outlive it
            "layer_build_peaks_gib": [round((p - weights) / GIB, 3) for p in layer_peaks],
            "seconds": round(time.perf_counter() - started, 1)}


def quick_case(name: str) -> dict:
    """One of :data:`QUICK_CASES`, emulated."""
    shape, layers, spec = QUICK_CASES[name]
    return emulate_build({**SHAPES[shape], **QUICK_SHAPE, "num_hidden_layers": layers}, spec, samples=8, length=512)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--layers", type=int, default=4, help="decoder layers of the Llama-3-70B-shaped slice")
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = {"samples": args.samples, "length": args.length, "layers": args.layers, "cases": {}}
    for case in args.cases.split(","):
        shape, spec = case.split(":", 1)
        config = {"num_hidden_layers": args.layers, **SHAPES[shape]}
        report["cases"][case] = emulate_build(config, spec, args.samples, args.length)
        print(f"{case}: {report['cases'][case]}", file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
