"""SmoothQuant (Xiao et al. 2023, arXiv:2211.10438): migrate activation outliers into the weights.

Per input channel ``j`` of the linears a norm feeds, ``s_j = max|X_j|^α / max|W_·j|^(1−α)``
(clamped at 1e-5), ``X`` divided by ``s`` (folded into the norm) and ``W``'s columns multiplied by
it, so activations become easier to quantize per token and weights stay easy per channel. ``α``
defaults to 0.5. ``max|X_j|`` comes from one forward of the unquantized model over calibration
text, as the reference's ``get_act_scales``; only norm → linear pairs are smoothed, as in its
``smooth_lm`` for Llama-like models (mit-han-lab/smoothquant ``smooth.py``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from wkvlab.runtime import input_device
from wkvlab.weights.arch import Architecture, fold_scales, resolve
from wkvlab.weights.capture import observe_inputs


def smooth_scales(act_absmax: Tensor, weights: list[Tensor], alpha: float) -> Tensor:
    """The SmoothQuant factor per input channel (pure)."""
    w_absmax = torch.stack([w.float().abs().amax(dim=0) for w in weights]).amax(dim=0).clamp(min=1e-5)
    return (act_absmax.float().clamp(min=1e-5).pow(alpha) / w_absmax.pow(1 - alpha)).clamp(min=1e-5)


@torch.no_grad()
def observe_model(model: torch.nn.Module, tokens: Tensor, modules: dict[str, torch.nn.Module], chunk: int = 4):
    """Input statistics of ``modules`` over one forward of the base model (no lm_head)."""
    base = getattr(model, "model", model)
    with observe_inputs(modules) as stats:
        for start in range(0, tokens.shape[0], chunk):
            base(input_ids=tokens[start:start + chunk].to(input_device(model)), use_cache=False)
    return stats


@torch.no_grad()
def smooth_model(model: torch.nn.Module, layers, tokens: Tensor, alpha_of: dict[str, float], arch: Architecture) -> int:
    """Fold SmoothQuant scales into every smoothed pair whose linears are in ``alpha_of``; returns pairs smoothed."""
    pairs = []
    for layer_name, layer in layers:
        for balance in arch.balances:
            found = balance.smooth and resolve(layer, balance)
            if found and all(f"{layer_name}.{n}" in alpha_of for n, _ in found[2]):
                pairs.append((f"{layer_name}.{found[2][0][0]}", found))
    stats = observe_model(model, tokens, {key: found[2][0][1] for key, found in pairs})
    for key, (_, prev, linears) in pairs:
        mods = [m for _, m in linears]
        scales = smooth_scales(stats[key].abs_max, [m.weight.data for m in mods], alpha_of[key])
        fold_scales(prev, mods, scales, arch.norm_offset)
    return len(pairs)
