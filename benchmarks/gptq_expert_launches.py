"""GPTQ's Python column loop and kernel launches per MoE layer, counted on torch's ``meta`` device
(issue #40, "Speed on a GPU": GPTQ on MoE ran a per-column Python loop per expert).

    PYTHONPATH=src python benchmarks/gptq_expert_launches.py              # this tree's wkvlab
    PYTHONPATH=<older tree>/src python benchmarks/gptq_expert_launches.py  # the same count for another

A Qwen3-30B-A3B-shaped experts module (128 experts, hidden 2048, moe_intermediate 768, bfloat16):
each expert's gate/up ``[1536, 2048]`` and down ``[2048, 768]`` matrix quantized with GPTQ int4-g128
(``--spec`` for another). Inside :func:`tests.fake_device.fake_accelerator` nothing is computed;
every aten op is counted (``ops``), and those that are not views (``launches``: what would start a
kernel on a GPU), and every call of the format's per-column fake-quant function
(``column_iterations``: one per pass of the Python column loop). One expert at a time is
:func:`wkvlab.weights.gptq.gptq_quantize` on one ``[out, in]`` matrix, the same count for each of
the 128 experts (meta has no values to make them differ), so it is counted once per shape and
multiplied; batched is one call per batch that :func:`wkvlab.weights.gptq_batch.experts_per_batch`
makes (a tree without it has no batches: only the per-expert numbers are printed).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fake_device
try:  # an installed wkvlab or PYTHONPATH wins; else this checkout's
    import wkvlab  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))

import torch._dynamo  # noqa: E402,F401 - its first import reads torch.Generator, which the fake accelerator replaces

from benchmarks.attention_launches import _Launches  # noqa: E402
from tests.fake_device import fake_accelerator  # noqa: E402
from wkvlab.weights.gptq import affine_quantizer, gptq_quantize  # noqa: E402
from wkvlab.weights.spec import WeightSpec  # noqa: E402

EXPERTS, HIDDEN, MOE_INTERMEDIATE = 128, 2048, 768
SHAPES = {"gate_up_proj": (2 * MOE_INTERMEDIATE, HIDDEN), "down_proj": (HIDDEN, MOE_INTERMEDIATE)}


def count(spec: WeightSpec, shape: tuple[int, ...]) -> dict:
    """Ops and column-loop iterations of one GPTQ call on a ``meta`` weight of ``shape``."""
    qparams, fake = affine_quantizer(spec)
    calls = [0]

    def counted(*args):
        calls[0] += 1
        return fake(*args)

    w = torch.empty(*shape, device="meta", dtype=torch.bfloat16)
    h = torch.empty(*shape[:-2], shape[-1], shape[-1], device="meta")
    with fake_accelerator(), _Launches() as launched:
        gptq_quantize(w, h, qparams, counted, group_size=spec.group_size, block_size=spec.block_size, damp=spec.damp,
                      act_order=spec.act_order, grid=spec.grid_from)
    return {"ops": launched.ops, "launches": launched.launches, "column_iterations": calls[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="gptq-int4-g128")
    spec = WeightSpec.parse(parser.parse_args(argv).spec)
    try:
        from wkvlab.weights.gptq_batch import experts_per_batch
    except ImportError:
        experts_per_batch = None
    out: dict = {"experts": EXPERTS, "hidden": HIDDEN, "moe_intermediate": MOE_INTERMEDIATE, "spec": spec.label, "wkvlab": str(Path(wkvlab.__file__).resolve().parents[1])}
    per_layer = {"one_expert_at_a_time": {"ops": 0, "launches": 0, "column_iterations": 0, "calls": 0}}
    if experts_per_batch is not None:
        per_layer["batched"] = {"ops": 0, "launches": 0, "column_iterations": 0, "calls": 0}
    for name, (n_out, n_in) in SHAPES.items():
        one = count(spec, (n_out, n_in))
        row = {"one_expert": one}
        for key in ("ops", "launches", "column_iterations"):
            per_layer["one_expert_at_a_time"][key] += EXPERTS * one[key]
        per_layer["one_expert_at_a_time"]["calls"] += EXPERTS
        if experts_per_batch is not None:
            size = experts_per_batch(n_in, n_out, EXPERTS, 2)
            sizes = [min(size, EXPERTS - lo) for lo in range(0, EXPERTS, size)]
            row["batch_sizes"] = sizes
            for b in sizes:
                got = count(spec, (b, n_out, n_in))
                for key in ("ops", "launches", "column_iterations"):
                    per_layer["batched"][key] += got[key]
                per_layer["batched"]["calls"] += 1
        out[name] = row
    out["per_layer"] = per_layer
    if "batched" in per_layer:
        out["fewer"] = {k: round(per_layer["one_expert_at_a_time"][k] / per_layer["batched"][k], 1) for k in ("ops", "launches", "column_iterations", "calls")}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
