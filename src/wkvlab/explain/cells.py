"""The passes of the attention-level 2×2: what each cell's attention read, recorded once and reused.

The attention decomposition and the cross-term intervention (:mod:`wkvlab.explain.intervention`)
compare four runs of the same window: the reference R (unquantized weights, 16-bit cache), W
(quantized weights, 16-bit cache), C (unquantized weights, quantized cache) and W+C. Each pass is a
whole forward pass of its own (so W's keys at layer 10 come from W's own hidden states, not from
the W+C run's), recorded by :func:`record_pass` as

* ``raw[layer] = (query, key)``: the post-RoPE Q and K the layer's attention receives (a 16-bit
  cache stores exactly these), for the passes without a cache (R, W);
* ``seen[layer] = (query, key_full, key_stored)``: Q, K and the dequantized K the attention reads
  through the cache, in the cache's space (smoothed, rotated: :class:`~wkvlab.kv.store.LayerStore`),
  for the passes with one (C);
* ``logits``: the float32 next-token logits of the window, for the output KLD of every cell.

R and C depend on the cache only, not on the weight config, and the findings run every weight
config against them: :class:`Spill` keeps them on disk (``torch.save`` in a temporary folder), so
the reference pass runs once per window and memory holds one pass at a time.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from wkvlab.kv.hook import kv_quantization, layer_stores
from wkvlab.kv.override import attention_inputs, attention_override
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore
from wkvlab.runtime import input_device


@dataclass
class PassRecord:
    """One cell's pass over one window (see the module docstring)."""

    kv: str
    raw: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    seen: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    logits: torch.Tensor | None = None  # [tokens, vocab] float32, on the CPU


def _cpu(x: torch.Tensor) -> torch.Tensor:
    return x.detach().to("cpu")


@torch.no_grad()
def record_pass(model: torch.nn.Module, kv: KVSpec, ids: torch.Tensor, stores: list[LayerStore] | None = None,
                *, logits: bool = True) -> PassRecord:
    """Run ``model`` on one window ``ids`` ``[1, tokens]`` under ``kv`` and record what every layer's
    attention received (``raw``, 16-bit cache) or read (``seen``, quantized cache), and the logits."""
    from wkvlab.eval.logits import model_logits

    record = PassRecord(kv.label)
    identity = kv.is_identity
    stores = None if identity else (stores if stores is not None else layer_stores(model, kv))
    with attention_inputs(model) as inputs:
        def capture(backend, module, query, key, value, attention_mask, **kwargs):
            layer = module.layer_idx
            if identity:
                record.raw[layer] = (_cpu(query), _cpu(key))
            else:
                got = inputs.get(layer, {})
                q, k_full, k_stored, _, _ = stores[layer].apply(query, key, value, got.get("position_embeddings"), got.get("residual"))
                record.seen[layer] = (_cpu(q), _cpu(k_full), _cpu(k_stored))
            return backend(module, query, key, value, attention_mask, **kwargs)

        ids = ids.to(input_device(model))
        if identity:
            with attention_override(model, capture):
                out = model_logits(model, ids) if logits else model(input_ids=ids, use_cache=False)
        else:
            with kv_quantization(model, kv, stores=stores), attention_override(model, capture):
                out = model_logits(model, ids) if logits else model(input_ids=ids, use_cache=False)
    if logits:
        record.logits = _cpu(out)
    return record


class Spill:
    """Pass records kept on disk by key (a temporary folder, removed by :meth:`close` or on exit)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="wkvlab-cells-")
        self._names: dict[tuple, Path] = {}

    def put(self, key: tuple, record: PassRecord) -> None:
        path = Path(self._dir.name) / f"{len(self._names)}.pt"
        torch.save(record, path)
        self._names[key] = path

    def get(self, key: tuple) -> PassRecord:
        return torch.load(self._names[key], weights_only=False)

    def __contains__(self, key: tuple) -> bool:
        return key in self._names

    def close(self) -> None:
        self._dir.cleanup()

    def __enter__(self) -> "Spill":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["PassRecord", "Spill", "record_pass"]
