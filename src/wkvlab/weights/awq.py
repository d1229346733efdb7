"""AWQ (Lin et al. 2024, arXiv:2306.00978): protect the weight channels that meet large activations
by scaling them up before quantization, with the inverse scale folded into the preceding op.

Follows AutoAWQ's ``AwqQuantizer`` (the authors' implementation):

* scale search (``_search_best_scale``): per channel ``x_mean = mean|x|`` over calibration
  tokens and ``w_mean`` = mean over the balanced linears' rows of ``|w| / max|w| in its group``;
  for ``ratio = i / grid`` (grid 20) the candidate is ``s = x_mean^ratio / (w_mean^(1-ratio) + 1e-4)``
  clamped at 1e-4 and normalized by ``sqrt(max(s) · min(s))``; the linears get ``Q(W·s)/s`` and the
  candidate with the smallest MSE of the inspected module's output (the whole attention for q/k/v,
  the whole MLP for gate/up) wins. The scale is then folded (:func:`wkvlab.weights.arch.fold_scales`):
  the model computes the same function until the weights are quantized.
* clipping search (``_search_best_clip``, on every linear except q/k): per group, shrink the
  clamp ``±max|w|`` by ``i/20`` for i < 10 and keep the one with the smallest error of the
  group's partial outputs on 512 subsampled tokens.

Every layer is calibrated on the unquantized model's activations, as AutoAWQ does, captured layer by
layer as AutoAWQ's ``_get_input_feat`` does: the layer's outputs before its scales are folded are
the next layer's inputs, so one layer's hidden states are held, not every layer's.
"""
from __future__ import annotations

from contextlib import ExitStack

import torch
from torch import Tensor

from wkvlab.formats import fake_quant_affine
from wkvlab.weights.arch import Architecture, fold_scales, resolve
from wkvlab.weights.capture import advance_layer, layer_output, observe_inputs, record_calls
from wkvlab.weights.rtn import group_spans, quantize_weight
from wkvlab.weights.spec import WeightSpec

CLIP_TOKENS = 512  # AutoAWQ n_sample_token
CLIP_MAX_SHRINK = 0.5  # AutoAWQ max_shrink
_NO_CLIP = ("q_proj", "k_proj")  # AutoAWQ avoid_clipping: errors in q/k are amplified by the softmax


def weight_mean(weights: list[Tensor], group_size: int | None) -> Tensor:
    """AutoAWQ's ``w_mean``: |w| normalized by its group's max, averaged over all rows."""
    w = weights[0].new_empty((sum(x.shape[0] for x in weights), weights[0].shape[1]), dtype=torch.float32)
    row = 0
    for x in weights:  # one float32 buffer for the balanced linears, normalized in place
        w[row:row + x.shape[0]].copy_(x)
        row += x.shape[0]
    w.abs_()
    for lo, hi in group_spans(w.shape[1], group_size):
        w[:, lo:hi] /= w[:, lo:hi].amax(dim=1, keepdim=True) + 1e-6
    return w.mean(0)


def candidate_scales(x_mean: Tensor, w_mean: Tensor, ratio: float) -> Tensor:
    s = (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)).clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def scaled_fake_quant(w: Tensor, s: Tensor, spec: WeightSpec) -> Tensor:
    """``Q(W · s) / s``: what the quantized linear computes on unscaled inputs."""
    return quantize_weight(w.to(torch.float32, copy=True).mul_(s[None, :]), spec) / s[None, :]


@torch.no_grad()
def search_scales(linears: list[torch.nn.Linear], x_mean: Tensor, spec: WeightSpec, loss_of) -> tuple[Tensor, list[float]]:
    """Grid search over ``ratio``; ``loss_of()`` runs the inspected module with the linears' current weights."""
    originals = [m.weight.data for m in linears]  # each candidate replaces .data, never writes into it: no copy needed
    w_mean = weight_mean(originals, spec.group_size)
    best, best_loss, losses = None, float("inf"), []
    try:
        for i in range(spec.grid):
            s = candidate_scales(x_mean, w_mean, i / spec.grid)
            for module, w in zip(linears, originals):
                module.weight.data = scaled_fake_quant(w, s, spec).to(w.dtype)
            loss = loss_of()
            losses.append(loss)
            if loss < best_loss:
                best, best_loss = s, loss
    finally:
        for module, w in zip(linears, originals):
            module.weight.data = w
    return best, losses


@torch.no_grad()
def clip_weight(w: Tensor, x: Tensor, spec: WeightSpec, grid: int = 20) -> Tensor:
    """``w`` clamped per group to the ±max that minimizes the group's output error on inputs ``x``."""
    w = w.float()
    x = x.float()
    x = x[:: max(1, x.shape[0] // CLIP_TOKENS)]
    out = w.clone()
    for lo, hi in group_spans(w.shape[1], spec.group_size):
        wg, xg = w[:, lo:hi], x[:, lo:hi]
        reference = xg @ wg.T  # [tokens, rows]
        original_max = wg.abs().amax(dim=1, keepdim=True)
        best_max, best_err = original_max.clone(), torch.full_like(original_max, float("inf"))
        for i in range(int(CLIP_MAX_SHRINK * grid)):
            max_val = original_max * (1 - i / grid)
            clamped = torch.maximum(torch.minimum(wg, max_val), -max_val)
            q = fake_quant_affine(clamped, spec.bits, symmetric=spec.symmetric, zero_point=spec.zero_point)
            err = (xg @ q.T - reference).pow(2).mean(dim=0)[:, None]
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_max = torch.where(better, max_val, best_max)
        out[:, lo:hi] = torch.maximum(torch.minimum(wg, best_max), -best_max)
    return out


def _inspect_loss(module: torch.nn.Module, calls) -> float:
    total, count = 0.0, 0
    for args, kwargs, reference in calls:
        out = layer_output(module(*args, **kwargs))
        total += float((out.float() - reference.float()).pow(2).sum())
        count += reference.numel()
    return total / max(count, 1)


@torch.no_grad()
def awq_layer(layer: torch.nn.Module, layer_name: str, hidden: list[Tensor], kwargs: list[dict],
              specs: dict[str, WeightSpec], arch: Architecture, notes: set[str], *, last: bool = False) -> list[Tensor]:
    """Search, fold and clip the AWQ scales of one decoder layer in place (weights stay unquantized).

    Returns the layer's outputs from before its scales were folded — the next layer's inputs, as
    AutoAWQ feeds them (none when ``last``) — and consumes ``hidden`` (emptied as each chunk runs).
    """
    modules = dict(layer.named_modules())
    linears = {n: m for n, m in modules.items() if f"{layer_name}.{n}" in specs}
    if not linears:
        return advance_layer(layer, hidden, kwargs, keep=not last)
    plans = []
    for balance in arch.balances:
        found = resolve(layer, balance)
        if found is None:
            notes.add(f"AWQ: {balance.prev} → {balance.linears} skipped (widths differ, e.g. grouped KV heads), as AutoAWQ does")
            continue
        prev_name, prev, targets = found
        if all(n in linears for n, _ in targets):
            plans.append((prev, [m for _, m in targets], [n for n, _ in targets], modules[balance.inspect]))
    keep_every = max(1, sum(h.shape[0] * h.shape[1] for h in hidden) // CLIP_TOKENS)
    with ExitStack() as stack:
        entered = {id(p[3]): stack.enter_context(record_calls(p[3])) for p in plans}
        stats = stack.enter_context(observe_inputs(linears, keep_every=keep_every))
        outputs = advance_layer(layer, hidden, kwargs, keep=not last)
    inputs = {name: torch.cat(stats[name].samples) for name in linears}
    means = {name: stats[name].abs_mean for name in linears}
    del stats
    for i, (prev, targets, names, inspect) in enumerate(plans):
        spec = specs[f"{layer_name}.{names[0]}"]
        calls = entered[id(inspect)]
        scales, _ = search_scales(targets, means[names[0]], spec, lambda: _inspect_loss(inspect, calls))
        fold_scales(prev, targets, scales, arch.norm_offset)
        for name in names:
            inputs[name] = inputs[name] / scales[None, :]
        # The producer may itself be a balanced linear (v_proj, up_proj): its recorded input is unchanged.
        if all(p[3] is not inspect for p in plans[i + 1:]):
            calls.clear()  # this module's recorded inputs and outputs are not replayed again
    for name, module in linears.items():
        spec = specs[f"{layer_name}.{name}"]
        if spec.clip and not name.endswith(_NO_CLIP):
            module.weight.data = clip_weight(module.weight.data, inputs[name], spec).to(module.weight.dtype)
    return outputs
