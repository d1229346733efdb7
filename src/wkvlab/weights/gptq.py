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
from wkvlab.weights.capture import advance_layer, hessian_of, input_groups
from wkvlab.weights.gptq_batch import EXPERT_BATCH_BYTES, experts_per_batch
from wkvlab.weights.experts import expert_hessian, expert_matrices, is_fused_experts, record_expert_inputs
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


def block_columns(w: Tensor, hinv: Tensor, q: Tensor, i1: int, i2: int, qparams: QParams, fake: FakeQuant,
                  group_size: int | None, params: list, group_of=None) -> Tensor:
    """Columns ``i1:i2`` of one lazy-update block of ``[experts, rows, columns]`` weights (``hinv``
    ``[experts, columns, columns]``), one column of every expert at a time: each is quantized into
    ``q`` and its error pushed onto the block's later columns; returns the block's errors
    ``[experts, rows, i2 - i1]`` (what updates the columns after the block). The format callables
    see the experts' rows as one ``[experts · rows]`` column: they work row by row, so this is one
    call per expert's column, bit for bit. With groups, a group's grid is computed from ``w`` as its
    first column is reached and appended to ``params``. With ``group_of`` (column -> its grid,
    :func:`_grid_lookup`), ``params`` holds every grid already, found before the loop (fixed grids,
    and the one per-row grid without groups)."""
    experts, rows, columns = w.shape
    w1, hinv1 = w[..., i1:i2].clone(), hinv[:, i1:i2, i1:i2]
    err1 = torch.zeros_like(w1)
    scale, zero = params[-1] if params else (None, None)
    for i in range(i2 - i1):
        col = i1 + i
        if group_of is not None:
            scale, zero = group_of(col)
        elif group_size is not None and col % group_size == 0:  # outer w, as the reference does
            scale, zero = qparams(w[..., col:col + group_size].reshape(experts * rows, -1))
            params.append((scale, zero))
        qcol = fake(w1[..., i].reshape(-1), scale, zero).reshape(experts, rows)
        q[..., col] = qcol
        e = (w1[..., i] - qcol) / hinv1[:, i, i, None]
        w1[..., i:] -= e[..., None] * hinv1[:, i, None, i:]  # the outer product: one product per element, exact
        err1[..., i] = e
    return err1


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
    consume: bool = False,
) -> Tensor:
    """GPTQ-quantized copy of ``weight`` (``[out, in]``) for inputs whose Hessian is ``hessian``.

    ``weight`` may carry a leading batch dimension, ``[experts, out, in]`` with ``hessian``
    ``[experts, in, in]``: the matrices (MoE experts of one shape and spec) then go through one
    column loop together, each with its own Hessian, dead inputs, act-order permutation and grids —
    the Python loop runs once for all of them instead of once per matrix (bit-identical to one call
    per matrix on the CPU, tested).

    ``grid`` says where group grids come from (``"updated"``: IST-DASLab, ``"original"``:
    llm-compressor; module docstring). With ``record`` (a dict; unbatched only), the grid is kept
    for writing a checkpoint: ``record["params"]`` lists each group's ``(scale, zero)`` in
    group-index order, ``record["g_idx"]`` the group of each input column, ``record["perm"]`` the
    act-order permutation. ``consume=True`` works in the float32 ``hessian`` itself, as the
    reference does (``H = self.H; del self.H``), instead of a copy: the caller passes its only
    reference (``held.pop()``), so at most two Hessian-sized buffers are alive (one while each
    Cholesky step writes the next).
    """
    if grid not in GRIDS:
        raise ValueError(f"grid must be one of {GRIDS}, got {grid!r}")
    batched = weight.dim() == 3
    if batched and record is not None:
        raise ValueError("record is kept for one matrix at a time; pass an unbatched [out, in] weight")
    w = weight.detach().to(torch.float32, memory_format=torch.contiguous_format, copy=True)
    h = hessian.detach().float() if consume else hessian.detach().to(torch.float32, copy=True)
    del hessian
    if not batched:
        w, h = w[None], h[None]
    experts, rows, columns = w.shape
    # Grids found before the column loop see the weight as it came, dead inputs included: per row,
    # as IST-DASLab's find_params(W) before its dead-column line; per group with grid="original",
    # as llm-compressor's observer.
    fixed = _fixed_grids(w.reshape(experts * rows, columns), qparams, group_size, grid)
    diag = torch.diagonal(h, dim1=-2, dim2=-1)
    dead = diag == 0
    diag.masked_fill_(dead, 1)  # the reference's H[dead, dead] = 1
    w.masked_fill_(dead[:, None, :], 0)
    perm = None
    if act_order:
        perm = torch.argsort(torch.diagonal(h, dim1=-2, dim2=-1).contiguous(), dim=-1, descending=True)
        w = w.take_along_dim(perm[:, None, :], dim=2)
        h = h.take_along_dim(perm[:, :, None], dim=1)
        h = h.take_along_dim(perm[:, None, :], dim=2)
    diag = torch.diagonal(h, dim1=-2, dim2=-1)  # the reference's H[diag, diag] += damp, no identity matrix
    diag.add_(damp * torch.mean(diag.contiguous(), dim=-1, keepdim=True))
    del diag
    h = torch.linalg.cholesky(h)
    h = torch.cholesky_inverse(h)
    hinv = torch.linalg.cholesky(h, upper=True)
    del h
    q = torch.zeros_like(w)
    params = fixed if fixed is not None else []
    # group of each column in processing order: fixed grids keep the original column's group
    # (llm-compressor's g_idx[perm]); updated grids number groups as the loop meets them
    order = torch.arange(columns).expand(experts, columns)
    position = order if perm is None else perm.cpu()
    group_of = (position if fixed is not None else order) // (group_size or columns)
    lookup = _grid_lookup(params, group_of, experts, w.device) if fixed is not None else None
    for i1 in range(0, columns, block_size):
        i2 = min(i1 + block_size, columns)
        err1 = block_columns(w, hinv, q, i1, i2, qparams, fake, group_size, params, group_of=lookup)
        w[..., i2:] -= err1 @ hinv[:, i1:i2, i2:]
    del w, hinv
    if perm is not None:
        q = q.take_along_dim(torch.argsort(perm, dim=-1)[:, None, :], dim=2)
        group_of = group_of.gather(1, torch.argsort(perm.cpu(), dim=-1))
    if record is not None:
        record.update(params=params, perm=None if perm is None else perm[0], g_idx=group_of[0])
    return (q if batched else q[0]).to(weight.dtype)


def _grid_lookup(params: list[tuple[Tensor, Tensor]], group_of: Tensor, experts: int, device: torch.device):
    """``column -> (scale, zero)`` of fixed grids (``params``, one per group, each ``[experts · rows, 1]``).

    Where every expert's column falls in the same group (no act-order, or one group) that group's
    grid is taken whole, found on the host; where act-order permuted the experts' columns apart,
    each expert's rows are gathered from its own group by an index moved to the device once."""
    if bool((group_of == group_of[0]).all()):
        shared = group_of[0].tolist()
        return lambda col: params[shared[col]]
    scales = torch.stack([s for s, _ in params]).unflatten(1, (experts, -1))  # [groups, experts, rows, 1]
    zeros = torch.stack([z for _, z in params]).unflatten(1, (experts, -1))
    index, every = group_of.to(device), torch.arange(experts, device=device)

    def pick(col: int) -> tuple[Tensor, Tensor]:
        return scales[index[:, col], every].flatten(0, 1), zeros[index[:, col], every].flatten(0, 1)

    return pick


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


def same_spec_groups(names: list[str], specs: dict[str, WeightSpec]) -> list[list[str]]:
    """Linears that read the same input (one Hessian: q/k/v, gate/up) split by spec, in order.

    GPTQ treats the rows of a weight independently given the Hessian, so linears with one input
    and one spec can be quantized as one matrix stacked along the rows: one column loop instead
    of one per linear (bit-identical, tested).
    """
    groups: dict[tuple, list[str]] = {}
    for name in names:
        groups.setdefault(_method_key(specs[name]), []).append(name)
    return list(groups.values())


def _split_record(record: dict, names: list[str], rows: list[int], kept: dict) -> None:
    """Give each stacked linear its own rows of the recorded per-group parameters."""
    start = 0
    for name, count in zip(names, rows):
        params = [(s[start:start + count], z[start:start + count]) for s, z in kept["params"]]
        record[name] = {"method": "gptq", "params": params, "perm": kept["perm"], "g_idx": kept["g_idx"]}
        start += count


def _quantize_linears(targets: dict[str, torch.nn.Module], names: list[str], held: list[Tensor], specs: dict[str, WeightSpec],
                      record: dict | None, *, last: bool) -> None:
    """GPTQ of ``names`` stacked on the Hessian in ``held`` (popped, and so freed, by the ``last`` user)."""
    spec = specs[names[0]]
    qparams, fake = affine_quantizer(spec)
    weights = [targets[n].weight.data for n in names]
    kept = None if record is None else {}
    stacked = gptq_quantize(torch.cat(weights) if len(weights) > 1 else weights[0], held.pop() if last else held[0], qparams, fake,
                            group_size=spec.group_size, block_size=spec.block_size, damp=spec.damp, act_order=spec.act_order,
                            grid=spec.grid_from, record=kept, consume=last)
    rows = [w.shape[0] for w in weights]
    del weights
    for n, part in zip(names, torch.split(stacked, rows)):
        targets[n].weight.data = part.contiguous()
    if kept is not None:
        _split_record(record, names, rows, kept)


def _gptq_expert_batch(module: torch.nn.Module, inputs: list[tuple[Tensor, Tensor]], matrices: list, spec: WeightSpec) -> int:
    """GPTQ of same-shaped expert ``matrices`` through one column loop, each on the Hessian of the
    inputs it sees, accumulated one expert at a time into one ``[experts, in, in]`` buffer; an expert
    no calibration token reached has none (GPTQ would zero it) and is rounded to nearest instead.
    Returns how many were."""
    live, held, rounded = [], None, 0
    for matrix in matrices:
        hessian = expert_hessian(module, inputs, matrix.expert, gated=matrix.param == "down_proj")
        if hessian is None:
            matrix.set(quantize_weight(matrix.get(), spec))
            rounded += 1
            continue
        if held is None:
            held = hessian.new_empty(len(matrices), *hessian.shape)
        held[len(live)].copy_(hessian)
        live.append(matrix)
        del hessian
    if not live:
        return rounded
    # one expert's weights are read in place; several are stacked (the estimate counts the copy)
    weights = live[0].get()[None] if len(live) == 1 else torch.stack([m.get() for m in live])
    qparams, fake = affine_quantizer(spec)
    hessians = held[:len(live)]
    del held
    quantized = gptq_quantize(weights, hessians, qparams, fake, group_size=spec.group_size, block_size=spec.block_size,
                              damp=spec.damp, act_order=spec.act_order, grid=spec.grid_from, consume=True)
    del weights
    for matrix, q in zip(live, quantized):
        matrix.set(q)
    return rounded


def _gptq_experts(layer: torch.nn.Module, hidden: list[Tensor], kwargs: list[dict], name: str, module: torch.nn.Module,
                  specs: dict[str, WeightSpec], budget: int = EXPERT_BATCH_BYTES) -> int:
    """GPTQ of the expert matrices of one experts module on the Hessians of the tokens routed to
    each: the module's inputs are recorded once, then the matrices of one parameter and spec go
    through GPTQ's column loop in batches (:func:`wkvlab.weights.gptq_batch.experts_per_batch`
    under ``budget`` bytes), their Hessians accumulated, used and freed batch by batch. Every
    down_proj goes first: its input is computed with the experts' unquantized gate/up weights.
    Returns how many matrices were rounded instead."""
    inputs = record_expert_inputs(layer, hidden, kwargs, module)
    batches: dict[tuple, list] = {}
    for key, matrix in expert_matrices(name, module):
        if key in specs:
            batches.setdefault((matrix.param != "down_proj", matrix.param, _method_key(specs[key])), []).append((key, matrix))
    rounded = 0
    for _, chosen in sorted(batches.items(), key=lambda kv: kv[0][:2]):
        spec = specs[chosen[0][0]]
        n_out, n_in = chosen[0][1].shape
        size = experts_per_batch(n_in, n_out, len(chosen), chosen[0][1].tensor.element_size(), budget)
        for lo in range(0, len(chosen), size):
            rounded += _gptq_expert_batch(module, inputs, [m for _, m in chosen[lo:lo + size]], spec)
    return rounded


def _gptq_input_group(layer: torch.nn.Module, hidden: list[Tensor], kwargs: list[dict], names: list[str],
                      targets: dict[str, torch.nn.Module], specs: dict[str, WeightSpec], record: dict | None) -> int:
    """GPTQ of the linears ``names`` that read one input, on its one Hessian; a linear the layer
    never calls on calibration data has none and is rounded to nearest. Returns how many were."""
    if not names:
        return 0
    held = [hessian_of(layer, hidden, kwargs, targets[names[0]])]
    if held[0] is None:
        for name in names:
            if record is not None:
                record[name] = {"method": "rtn", "weight": targets[name].weight.detach().clone()}
            targets[name].weight.data = quantize_weight(targets[name].weight.data, specs[name])
        return len(names)
    groups = same_spec_groups(names, specs)
    for i, group in enumerate(groups):
        _quantize_linears(targets, group, held, specs, record, last=i == len(groups) - 1)
    return 0


@torch.no_grad()
def gptq_layers(model: torch.nn.Module, layers: list[tuple[str, torch.nn.Module]], calls, specs: dict[str, WeightSpec],
                record: dict | None = None, on_layer: Callable[[int], None] | None = None, notes: list[str] | None = None) -> None:
    """Quantize, in place and layer by layer, every linear named in ``specs`` (full module names)
    and every fused expert matrix named there (``<experts>.<param>.<expert>``, :mod:`wkvlab.weights.experts`).

    ``calls`` is :func:`capture_layer_inputs` output with layer 0's inputs. In each layer the
    linears are grouped by the tensor they read (:func:`wkvlab.weights.capture.input_groups`), and
    the groups are done last-called first: a group's input depends only on the groups called
    before it, still unquantized then, so every Hessian is the unquantized layer's, as in the
    reference's ``llama_sequential`` — but only one group's Hessian is alive at a time, accumulated
    by a pass that stops at the group. Linears of one group and spec are quantized stacked
    (:func:`same_spec_groups`). The quantized layer then runs once more to feed the next layer.
    ``on_layer(index)`` is called as each layer is done (progress); ``notes`` hears of experts no
    calibration token reached.
    """
    hidden = calls.hidden[0]
    rounded = 0
    for index, (layer_name, layer) in enumerate(layers):
        kwargs = calls.kwargs[index]
        targets = {f"{layer_name}.{n}": m for n, m in layer.named_modules() if f"{layer_name}.{n}" in specs}
        experts = {f"{layer_name}.{n}": m for n, m in layer.named_modules()
                   if is_fused_experts(m) and any(k in specs for k, _ in expert_matrices(f"{layer_name}.{n}", m))}
        if (targets or experts) and hidden:
            for names in reversed(input_groups(layer, {**targets, **experts}, hidden[0], kwargs[0])):
                rounded += sum(_gptq_experts(layer, hidden, kwargs, n, experts[n], specs) for n in names if n in experts)
                rounded += _gptq_input_group(layer, hidden, kwargs, [n for n in names if n in targets], targets, specs, record)
        if index + 1 < len(layers):
            hidden = advance_layer(layer, hidden, kwargs)
        if on_layer is not None:
            on_layer(index)
    if rounded and notes is not None:
        notes.append(f"GPTQ: {rounded} expert matrices (or linears) saw no calibration token and were rounded to nearest instead "
                     "(GPTQ zeroes the columns of inputs it never saw); more --calib-samples reach more experts")
