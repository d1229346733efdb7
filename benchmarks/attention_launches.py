"""Kernel launches of the mixed-precision attention (residual / window / past-only KV specs) per
evaluation chunk, counted on torch's ``meta`` device (issue #40 item 4: "mixed_attention without
per-block Python loops or n_rep copies; measure kernel launches per chunk before and after").

    PYTHONPATH=src python benchmarks/attention_launches.py              # this tree's wkvlab
    PYTHONPATH=<older tree>/src python benchmarks/attention_launches.py  # the same count for another

One :func:`wkvlab.kv.attention.mixed_attention` call is what one attention layer runs for one chunk
of queries against the keys the cache holds: a Llama-3-8B-shaped layer (32 heads, 8 KV heads, head
dim 128, bfloat16), a 512-query chunk at the end of the context, KIVI's 128-token residual. Inside
:func:`tests.fake_device.fake_accelerator` nothing is computed; every aten op is counted (``ops``),
and those that are not views (``launches``: what would start a kernel or allocate on a GPU), and
the widest K/V head count any matmul reads (``kv_heads_read``: 32 means K or V was repeated per
query head). Per chunk = per layer × 32 layers; per pass = per chunk × context / 512.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fake_device
try:  # an installed wkvlab or PYTHONPATH wins; else this checkout's
    import wkvlab  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "src"))

import torch._dynamo  # noqa: E402,F401 - its first import reads torch.Generator, which the fake accelerator replaces

from tests.fake_device import fake_accelerator  # noqa: E402
from wkvlab.kv import attention as A  # noqa: E402

aten = torch.ops.aten
LAYERS, HEADS, KV_HEADS, HEAD_DIM, CHUNK, RESIDUAL = 32, 32, 8, 128, 512, 128


class _Launches(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = self.launches = self.widest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        self.launches += not func.is_view
        if func in (aten.bmm.default, aten.mm.default) and args[0].dim() == 3:
            self.widest = max(self.widest, args[0].shape[0])  # batch × heads of the product
        return func(*args, **(kwargs or {}))


def one_layer(n_keys: int) -> dict:
    q = torch.empty(1, HEADS, CHUNK, HEAD_DIM, dtype=torch.bfloat16, device="meta")
    k, kq, v, vq = (torch.empty(1, KV_HEADS, n_keys, HEAD_DIM, dtype=torch.bfloat16, device="meta") for _ in range(4))
    with fake_accelerator() as audit, _Launches() as count:
        A.mixed_attention(q, k, kq, v, vq, None, scaling=HEAD_DIM ** -0.5, selection=A.flush_selection(RESIDUAL),
                          query_offset=n_keys - CHUNK)
    return {"ops": count.ops, "launches": count.launches, "kv_heads_read": count.widest, "syncs": audit.syncs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="4096,32768,131072")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = {"wkvlab": str(Path(A.__file__).resolve().parents[2]), "shape": "Llama-3-8B layer, bf16, 512-query chunk, residual 128",
              "contexts": {}}
    for n in map(int, args.contexts.split(",")):
        layer = one_layer(n)
        report["contexts"][n] = {"per_layer": layer, "launches_per_chunk": layer["launches"] * LAYERS,
                                 "launches_per_pass": layer["launches"] * LAYERS * (n // CHUNK)}
        print(f"{n}: {report['contexts'][n]}", file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
