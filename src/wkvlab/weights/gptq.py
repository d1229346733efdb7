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

Where the group grids come from is where the two GPTQs people run differ as algorithms
(``grid``, spec option ``+grid-from=``; their integer grids are the formats' business —
compressed-tensors' symmetric scale is ``amax / 7.5``, wkvlab's ``amax / 7``, docs/weights.md):

* ``"updated"`` — IST-DASLab/gptq ``fasterquant`` (and AutoGPTQ without ``static_groups``): a
  group's grid is found when its first column is reached, on the weights as the errors of all
  earlier lazy blocks have moved them (the outer ``W``: with groups aligned to blocks, 128 and
  128, every earlier column's error).
* ``"original"`` — llm-compressor 0.14 (``GPTQModifier``): every grid is fixed from the ORIGINAL
  weights before the column loop. Its ``on_sequential_epoch_end`` runs the weight observer
  (``observe(modules, base_name="weight")``, min-max per group) on the module's weight, then
  ``compress_module_list`` hands ``weight_observer.get_qparams()`` to ``quantize_weight``, which
  only looks each column's group up (``column_scale_window`` by ``g_idx``) — llmcompressor
  0.14.0.1 (PyPI wheel) ``llmcompressor/modifiers/gptq/base.py`` lines 231-238, 313-348,
  ``gptq_quantize.py`` lines 72-93, 157-176, ``helpers.py`` lines 343-423; the same rule, one
  module at a time, at vllm-project/llm-compressor@ab1ba3ef
  ``src/llmcompressor/modifiers/gptq/gptq_quantize.py`` lines 91-139 and 200-215. The observer
  sees the weight before dead inputs are zeroed (``factorize_hessian`` zeroes them later), and
  with act-order (``static``, its default, an alias of ``weight``) the groups stay those of the
  original column positions (``g_idx = g_idx[perm]``, lines 88-89), so a checkpoint needs no
  ``g_idx``. IST-DASLab's own ``static_groups=True`` is the same rule except that it observes
  after the dead columns are zeroed.

Both rules share every other line (damping, Cholesky, block updates, the fake-quant step).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from wkvlab.formats import affine_dequantize, affine_qparams, affine_quantize
from wkvlab.weights.capture import observe_inputs, run_layer
from wkvlab.weights.experts import expert_matrices, is_fused_experts, observe_expert_inputs
from wkvlab.weights.rtn import quantize_weight
from wkvlab.weights.spec import WeightSpec

GRIDS = ("updated", "original")  # see the module docstring
QParams = Callable[[Tensor], tuple[Tensor, Tensor]]  # weights [rows, cols] -> (scale, zero) per row
FakeQuant = Callable[[Tensor, Tensor, Tensor], Tensor]  # (column [rows], scale, zero) -> column


def affine_quantizer(spec: WeightSpec) -> tuple[QParams, FakeQuant]:
    """The integer affine grid of ``spec`` as the two callables GPTQ needs (wkvlab.formats.affine).

    ``fake`` runs once per column, so it repeats :func:`wkvlab.formats.affine_quantize` /
    ``affine_dequantize``'s arithmetic on ``[rows]`` vectors without their argument checks and
    reshapes (the same operations in the same order: bit-identical, tested).
    """
    kw = dict(symmetric=spec.symmetric, zero_point=spec.zero_point)
    half, levels = 2 ** (spec.bits - 1), 2 ** spec.bits - 1

    def qparams(w: Tensor) -> tuple[Tensor, Tensor]:
        scale, zero = affine_qparams(w, spec.bits, **kw)  # one group per row: [rows, 1, 1]
        return scale.reshape(-1, 1), zero.reshape(-1, 1)

    def fake(column: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
        s, z = scale[:, 0], zero[:, 0]
        safe = torch.where(s == 0, torch.ones_like(s), s)
        if spec.symmetric:
            return torch.round(column / safe).clamp_(-half, half - 1) * s
        if spec.zero_point == "float":
            return torch.round((column - z) / safe).clamp_(0, levels) * s + z
        return ((torch.round(column / safe) + z).clamp_(0, levels) - z) * s

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
    grid: str = "updated",
    record: dict | None = None,
) -> Tensor:
    """GPTQ-quantized copy of ``weight`` (``[out, in]``) for inputs whose Hessian is ``hessian``.

    ``grid`` says where group grids come from (``"updated"``: IST-DASLab, ``"original"``:
    llm-compressor; module docstring). With ``record`` (a dict), the grid is kept for writing a
    checkpoint: ``record["params"]`` lists each group's ``(scale, zero)`` in group-index order,
    ``record["g_idx"]`` the group of each input column, ``record["perm"]`` the act-order permutation.
    """
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
    w = weight.detach().float().clone()
    h = hessian.detach().float().clone()
    columns = w.shape[1]
    # Grids found before the column loop see the weight as it came, dead inputs included: per row,
    # as IST-DASLab's find_params(W) before its dead-column line; per group with grid="original",
    # as llm-compressor's observer.
    fixed = _fixed_grids(w, qparams, group_size, grid)
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = None
    if act_order:
        perm = torch.argsort(torch.diag(h), descending=True)
        w, h = w[:, perm], h[perm][:, perm]
    h += damp * torch.mean(torch.diag(h)) * torch.eye(columns, dtype=h.dtype, device=h.device)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.zeros_like(w)
    params = fixed if fixed is not None else []
    # group of each column in processing order: fixed grids keep the original column's group
    # (llm-compressor's g_idx[perm]); updated grids number groups as the loop meets them
    position = torch.arange(columns) if perm is None else perm.cpu()
    group_of = (position if fixed is not None else torch.arange(columns)) // (group_size or columns)
    scale, zero = params[0] if fixed is not None else (None, None)
    for i1 in range(0, columns, block_size):
        i2 = min(i1 + block_size, columns)
        w1, hinv1 = w[:, i1:i2].clone(), hinv[i1:i2, i1:i2]
        err1 = torch.zeros_like(w1)
        for i in range(i2 - i1):
            col = i1 + i
            if fixed is not None:
                scale, zero = params[int(group_of[col])]
            elif col % group_size == 0:
                scale, zero = qparams(w[:, col:col + group_size])  # outer w, as the reference does
                params.append((scale, zero))
            qcol = fake(w1[:, i], scale, zero)
            q[:, col] = qcol
            e = (w1[:, i] - qcol) / hinv1[i, i]
            w1[:, i:] -= e[:, None] @ hinv1[i, i:][None, :]
            err1[:, i] = e
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]
    if perm is not None:
        q = q[:, torch.argsort(perm)]
        group_of = group_of[torch.argsort(perm.cpu())]
    if record is not None:
        record.update(params=params, perm=perm, g_idx=group_of)
    return q.to(weight.dtype)


def _fixed_grids(w: Tensor, qparams: QParams, group_size: int | None, grid: str) -> list[tuple[Tensor, Tensor]] | None:
    """The grids found before the column loop, one per group in column order (a ragged last group
    is shorter), or None when each group's grid is found as the loop reaches it."""
    if group_size is None:
        return [qparams(w)]
    if grid == "updated":
        return None
    return [qparams(w[:, lo:lo + group_size]) for lo in range(0, w.shape[1], group_size)]


def _method_key(spec: WeightSpec) -> tuple:
    return (spec.bits, spec.group_size, spec.symmetric, spec.zero_point, spec.block_size, spec.damp, spec.act_order,
            spec.grid_from)


def shared_input_groups(names: list[str], hessians: dict[str, Tensor], specs: dict[str, WeightSpec]) -> list[list[str]]:
    """Linears that saw the same inputs (equal Hessians: q/k/v, gate/up) and share a spec, in order.

    GPTQ treats the rows of a weight independently given the Hessian, so such linears can be
    quantized as one matrix stacked along the rows: one column loop instead of one per linear.
    """
    groups: list[list[str]] = []
    for name in names:
        for group in groups:
            first = group[0]
            if _method_key(specs[first]) == _method_key(specs[name]) and torch.equal(hessians[first], hessians[name]):
                group.append(name)
                break
        else:
            groups.append([name])
    return groups


def _split_record(record: dict, names: list[str], rows: list[int], kept: dict) -> None:
    """Give each stacked linear its own rows of the recorded per-group parameters."""
    start = 0
    for name, count in zip(names, rows):
        params = [(s[start:start + count], z[start:start + count]) for s, z in kept["params"]]
        record[name] = {"method": "gptq", "params": params, "perm": kept["perm"], "g_idx": kept["g_idx"]}
        start += count


def _gptq_experts(matrices: dict, hessians: dict, specs: dict[str, WeightSpec]) -> int:
    """GPTQ of each expert matrix on the Hessian of the tokens routed to it; an expert no
    calibration token reached has no Hessian (GPTQ would zero it) and is rounded to nearest.
    Returns how many were rounded."""
    rounded = 0
    for name, matrix in matrices.items():
        spec = specs[name]
        if name not in hessians:
            matrix.set(quantize_weight(matrix.get(), spec))
            rounded += 1
            continue
        qparams, fake = affine_quantizer(spec)
        matrix.set(gptq_quantize(matrix.get(), hessians[name][0], qparams, fake, group_size=spec.group_size,
                                 block_size=spec.block_size, damp=spec.damp, act_order=spec.act_order, grid=spec.grid_from))
    return rounded


@torch.no_grad()
def gptq_layers(model: torch.nn.Module, layers: list[tuple[str, torch.nn.Module]], calls, specs: dict[str, WeightSpec],
                record: dict | None = None, on_layer: Callable[[int], None] | None = None, notes: list[str] | None = None) -> None:
    """Quantize, in place and layer by layer, every linear named in ``specs`` (full module names)
    and every fused expert matrix named there (``<experts>.<param>.<expert>``, :mod:`wkvlab.weights.experts`).

    ``calls`` is :func:`capture_layer_inputs` output with layer 0's inputs; each layer is run once
    to accumulate Hessians and once more, quantized, to feed the next layer. Linears with the same
    inputs and spec are quantized stacked (:func:`shared_input_groups`). ``on_layer(index)`` is
    called as each layer is done (progress); ``notes`` hears of experts no calibration token reached.
    """
    hidden = calls.hidden[0]
    rounded = 0
    for index, (layer_name, layer) in enumerate(layers):
        kwargs = calls.kwargs[index]
        targets = {f"{layer_name}.{n}": m for n, m in layer.named_modules() if f"{layer_name}.{n}" in specs}
        experts = {f"{layer_name}.{n}": m for n, m in layer.named_modules() if is_fused_experts(m)}
        matrices = {k: v for name, module in experts.items() for k, v in expert_matrices(name, module) if k in specs}
        if targets or matrices:
            with observe_inputs(targets, hessian=True) as stats, observe_expert_inputs(experts if matrices else {}) as expert_stats:
                run_layer(layer, hidden, kwargs)
            rounded += _gptq_experts(matrices, expert_stats, specs)
            del expert_stats
            hessians = {n: stats[n].hessian for n in targets}
            for names in shared_input_groups(list(targets), hessians, specs):
                spec = specs[names[0]]
                qparams, fake = affine_quantizer(spec)
                weights = [targets[n].weight.data for n in names]
                kept = None if record is None else {}
                stacked = gptq_quantize(torch.cat(weights), hessians[names[0]], qparams, fake,
                                        group_size=spec.group_size, block_size=spec.block_size,
                                        damp=spec.damp, act_order=spec.act_order, grid=spec.grid_from, record=kept)
                rows = [w.shape[0] for w in weights]
                for n, part in zip(names, torch.split(stacked, rows)):
                    targets[n].weight.data = part.contiguous()
                if kept is not None:
                    _split_record(record, names, rows, kept)
            del stats, hessians
        if index + 1 < len(layers):
            hidden = run_layer(layer, hidden, kwargs)
        if on_layer is not None:
            on_layer(index)
    if rounded and notes is not None:
        notes.append(f"GPTQ: {rounded} expert matrices saw no calibration token and were rounded to nearest instead "
                     "(GPTQ zeroes the columns of inputs it never saw); more --calib-samples reach more experts")
