"""GPTQ (Frantar et al. 2023, arXiv:2210.17323): quantize a weight column by column and push each
column's error onto the columns not yet quantized, weighted by the inverse Hessian of the layer's
inputs, so the layer's *output* error on calibration data is small rather than the weight error.

:func:`gptq_quantize` is the algorithm on one matrix, following IST-DASLab/gptq ``fasterquant``
line by line: dead inputs (zero Hessian diagonal) are zeroed, damping ``damp · mean(diag H)``
(default 0.01) is added, the upper Cholesky factor of ``H⁻¹`` drives the updates, blocks of 128
columns are updated lazily, ``act_order`` processes columns by decreasing ``diag H``. With groups,
a group's scale and zero point are computed from the (already error-updated) weights when the
first column of the group is reached — so with act-order the groups follow the permuted order, as
the reference's ``g_idx`` does. A ragged last group (576 columns in groups of 128) is shorter, as
in the reference. The format is passed in as qparams/fake-quant callables (gpt-fast's design), so
the algorithm never knows which format it produces.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from wkvlab.formats import affine_dequantize, affine_qparams, affine_quantize
from wkvlab.weights.capture import observe_inputs, run_layer
from wkvlab.weights.spec import WeightSpec

QParams = Callable[[Tensor], tuple[Tensor, Tensor]]  # weights [rows, cols] -> (scale, zero) per row
FakeQuant = Callable[[Tensor, Tensor, Tensor], Tensor]  # (column [rows], scale, zero) -> column


def affine_quantizer(spec: WeightSpec) -> tuple[QParams, FakeQuant]:
    """The integer affine grid of ``spec`` as the two callables GPTQ needs (wkvlab.formats.affine)."""
    kw = dict(symmetric=spec.symmetric, zero_point=spec.zero_point)

    def qparams(w: Tensor) -> tuple[Tensor, Tensor]:
        scale, zero = affine_qparams(w, spec.bits, **kw)  # one group per row: [rows, 1, 1]
        return scale.reshape(-1, 1), zero.reshape(-1, 1)

    def fake(column: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
        x = column[:, None]
        s, z = scale[:, :, None], zero[:, :, None]
        q = affine_quantize(x, s, z, spec.bits, **kw)
        return affine_dequantize(q, s, z, **kw)[:, 0]

    return qparams, fake


@torch.no_grad()
def gptq_quantize(
    weight: Tensor,
    hessian: Tensor,
    qparams: QParams,
    fake: FakeQuant,
    *,
    group_size: int | None = None,
    block_size: int = 128,
    damp: float = 0.01,
    act_order: bool = False,
) -> Tensor:
    """GPTQ-quantized copy of ``weight`` (``[out, in]``) for inputs whose Hessian is ``hessian``."""
    w = weight.detach().float().clone()
    h = hessian.detach().float().clone()
    columns = w.shape[1]
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(h), descending=True)
        w, h = w[:, perm], h[perm][:, perm]
    h += damp * torch.mean(torch.diag(h)) * torch.eye(columns, dtype=h.dtype)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.zeros_like(w)
    scale, zero = qparams(w) if group_size is None else (None, None)
    for i1 in range(0, columns, block_size):
        i2 = min(i1 + block_size, columns)
        w1, hinv1 = w[:, i1:i2].clone(), hinv[i1:i2, i1:i2]
        err1 = torch.zeros_like(w1)
        for i in range(i2 - i1):
            col = i1 + i
            if group_size is not None and col % group_size == 0:
                scale, zero = qparams(w[:, col:col + group_size])  # outer w, as the reference does
            qcol = fake(w1[:, i], scale, zero)
            q[:, col] = qcol
            e = (w1[:, i] - qcol) / hinv1[i, i]
            w1[:, i:] -= e[:, None] @ hinv1[i, i:][None, :]
            err1[:, i] = e
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    if perm is not None:
        q = q[:, torch.argsort(perm)]
    return q.to(weight.dtype)


@torch.no_grad()
def gptq_layers(model: torch.nn.Module, layers: list[tuple[str, torch.nn.Module]], calls, specs: dict[str, WeightSpec],
                on_layer: Callable[[int], None] | None = None) -> None:
    """Quantize, in place and layer by layer, every linear named in ``specs`` (full module names).

    ``calls`` is :func:`capture_layer_inputs` output with layer 0's inputs; each layer is run once
    to accumulate Hessians and once more, quantized, to feed the next layer. ``on_layer(index)``
    is called as each layer is done (progress).
    """
    hidden = calls.hidden[0]
    for index, (layer_name, layer) in enumerate(layers):
        kwargs = calls.kwargs[index]
        targets = {n: m for n, m in layer.named_modules() if f"{layer_name}.{n}" in specs}
        if targets:
            with observe_inputs(targets, hessian=True) as stats:
                run_layer(layer, hidden, kwargs)
            for name, module in targets.items():
                spec = specs[f"{layer_name}.{name}"]
                qparams, fake = affine_quantizer(spec)
                module.weight.data = gptq_quantize(module.weight.data, stats[name].hessian, qparams, fake,
                                                   group_size=spec.group_size, block_size=spec.block_size,
                                                   damp=spec.damp, act_order=spec.act_order)
            del stats
        if index + 1 < len(layers):
            hidden = run_layer(layer, hidden, kwargs)
        if on_layer is not None:
            on_layer(index)
