"""Apply a weight spec to a model: a quantized copy plus a report of what changed.

The reference model is never modified: each weight config gets its own deep copy, built once and
reused for every KV config it is evaluated with. Activation quantization (W8A8) is a forward
pre-hook on each quantized linear of that copy, so it dies with the copy.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import torch

from wkvlab.formats import fake_quant_fp8, fp8_absmax_scale
from wkvlab.weights.rtn import quantize_weight, ragged_group_note, weight_storage_bytes
from wkvlab.weights.spec import WeightSpec

# Linear layers inside decoder blocks; embeddings and lm_head stay at 16 bits, as engines keep them.
DECODER_LINEAR = re.compile(r"(^|\.)layers\.\d+\.")


def decoder_linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and DECODER_LINEAR.search(n)]


@dataclass
class QuantizedWeights:
    """A weight-quantized copy of a model and the facts about it."""

    spec: WeightSpec
    model: torch.nn.Module
    weight_bytes: int
    lossless: bool  # every quantized weight came back unchanged: the checkpoint already sits on this grid
    notes: list[str] = field(default_factory=list)


def _fp8_token_activations(module: torch.nn.Module, args: tuple) -> tuple:
    """Dynamic per-token FP8 E4M3 activation scales, as vLLM's FP8 W8A8 path computes them."""
    (x, *rest) = args
    scale = fp8_absmax_scale(x.float(), "e4m3", dim=-1)
    return (fake_quant_fp8(x.float(), "e4m3", scale).to(x.dtype), *rest)


def model_weight_bytes(model: torch.nn.Module, spec: WeightSpec) -> int:
    """Bytes of all weights as an engine would hold them under ``spec``.

    Quantized linears count their codes, scales and zero points; every other parameter counts at
    16 bits (4 for the untouched float32 reference); tied tensors count once.
    """
    linear_ids = {id(m.weight): m for _, m in decoder_linears(model)} if not spec.is_identity else {}
    other = 4.0 if spec.is_identity else 2.0
    seen: set[int] = set()
    total = 0.0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        module = linear_ids.get(id(param))
        total += weight_storage_bytes(tuple(param.shape), spec) if module is not None else param.numel() * other
    return int(round(total))


@torch.no_grad()
def quantize_model_weights(model: torch.nn.Module, spec: WeightSpec) -> QuantizedWeights:
    """Return a quantized copy of ``model`` (the identity spec returns the model itself)."""
    if spec.is_identity:
        return QuantizedWeights(spec, model, model_weight_bytes(model, spec), lossless=True)
    quantized = copy.deepcopy(model)
    linears = decoder_linears(quantized)
    unchanged = True
    for _, module in linears:
        new = quantize_weight(module.weight.data, spec)
        unchanged = unchanged and torch.equal(new, module.weight.data)
        module.weight.data.copy_(new)
        if spec.activations == "fp8-token":
            module.register_forward_pre_hook(_fp8_token_activations)
    notes = []
    ragged = ragged_group_note([tuple(m.weight.shape) for _, m in linears], spec)
    if ragged:
        notes.append(ragged)
    if unchanged and spec.activations == "none":
        notes.append(
            f"{spec.label} is lossless on this model: every linear weight already lies on its grid "
            "(the checkpoint was dequantized from this format), so its KLD is 0 by construction"
        )
    return QuantizedWeights(spec, quantized, model_weight_bytes(quantized, spec), lossless=unchanged, notes=notes)
