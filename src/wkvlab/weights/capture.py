"""Run calibration tokens through a model one decoder layer at a time, and observe linear inputs.

The layer-by-layer pipeline is GPTQ's (IST-DASLab/gptq ``llama_sequential``): capture what the
first decoder layer receives, then for each layer gather statistics of its linears' inputs, let
the method change the layer, and run the layer again to produce the next layer's input — so each
layer is calibrated on what the already-quantized layers below it produce. AWQ instead calibrates
every layer on the unquantized model's activations (AutoAWQ), which one forward captures.

Capturing uses forward pre-hooks on every decoder layer during one forward of the *base* model
(``model.model``: no lm_head, so Gemma's 262k-entry logits are never built). The hooks record the
keyword arguments each layer gets (position embeddings, masks — Gemma's sliding and full layers
get different ones), so layers can later be called on their own.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import Tensor

from wkvlab.runtime import input_device
from wkvlab.weights.arch import decoder_layers


@dataclass
class LayerCalls:
    """What each decoder layer received, per chunk of calibration samples."""

    hidden: list[list[Tensor] | None]  # [layer][chunk] input hidden states (None where not kept)
    kwargs: list[list[dict]]  # [layer][chunk] keyword arguments


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "model", model)


@torch.no_grad()
def capture_layer_inputs(model: torch.nn.Module, tokens: Tensor, *, all_layers: bool, chunk: int = 4) -> LayerCalls:
    """One forward over ``tokens`` (``[samples, length]``) recording every layer's call."""
    layers = [m for _, m in decoder_layers(model)]
    calls = LayerCalls(hidden=[[] if all_layers or i == 0 else None for i in range(len(layers))], kwargs=[[] for _ in layers])

    def make_hook(index: int):
        def hook(_module, args, kwargs):
            kw = dict(kwargs)
            x = args[0] if args else kw.pop("hidden_states")
            store = calls.hidden[index]
            if store is not None:
                store.append(x.detach())
            calls.kwargs[index].append(kw)

        return hook

    handles = [layer.register_forward_pre_hook(make_hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    try:
        for start in range(0, tokens.shape[0], chunk):
            _base_model(model)(input_ids=tokens[start:start + chunk].to(input_device(model)), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def layer_output(out) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def run_layer(layer: torch.nn.Module, hidden: list[Tensor], kwargs: list[dict]) -> list[Tensor]:
    return [layer_output(layer(x, **kw)) for x, kw in zip(hidden, kwargs)]


def accumulate_hessian(hessian: Tensor, count: int, x: Tensor) -> tuple[Tensor, int]:
    """Running ``H = 2/N · Σ xᵀx`` over ``N`` input rows (GPTQ's ``add_batch``), as a pure function."""
    rows = x.reshape(-1, x.shape[-1]).float()
    total = count + rows.shape[0]
    scaled = rows * (2.0 / total) ** 0.5
    return hessian * (count / total) + scaled.T @ scaled, total


@dataclass
class InputStats:
    """Statistics of one linear's inputs: Hessian (GPTQ), per-channel mean and max |x| (AWQ, SmoothQuant)."""

    hessian: Tensor | None = None
    count: int = 0
    abs_sum: Tensor | None = None
    abs_max: Tensor | None = None
    samples: list[Tensor] = field(default_factory=list)  # kept inputs (AWQ clipping), rows subsampled

    def add(self, x: Tensor, *, hessian: bool, keep_every: int) -> None:
        rows = x.reshape(-1, x.shape[-1]).float()
        if hessian:
            h = self.hessian if self.hessian is not None else rows.new_zeros(rows.shape[1], rows.shape[1])
            self.hessian, _ = accumulate_hessian(h, self.count, rows)
        a = rows.abs()
        self.abs_sum = a.sum(0) if self.abs_sum is None else self.abs_sum + a.sum(0)
        self.abs_max = a.amax(0) if self.abs_max is None else torch.maximum(self.abs_max, a.amax(0))
        self.count += rows.shape[0]
        if keep_every:
            self.samples.append(rows[::keep_every])

    @property
    def abs_mean(self) -> Tensor:
        return self.abs_sum / max(self.count, 1)


@contextmanager
def observe_inputs(modules: dict[str, torch.nn.Module], *, hessian: bool = False, keep_every: int = 0) -> Iterator[dict[str, InputStats]]:
    """Accumulate :class:`InputStats` for each module's first input while the block runs."""
    stats = {name: InputStats() for name in modules}
    handles = []
    for name, module in modules.items():
        def hook(_module, args, name=name):
            stats[name].add(args[0].detach(), hessian=hessian, keep_every=keep_every)

        handles.append(module.register_forward_pre_hook(hook))
    try:
        yield stats
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def record_calls(module: torch.nn.Module) -> Iterator[list[tuple[tuple, dict, Tensor]]]:
    """Record ``(args, kwargs, output)`` of every call of ``module`` (AWQ replays them)."""
    calls: list[tuple[tuple, dict, Tensor]] = []
    pending: list[tuple[tuple, dict]] = []

    def pre(_module, args, kwargs):
        pending.append((args, dict(kwargs)))

    def post(_module, _args, _kwargs, output):
        args, kwargs = pending.pop()
        calls.append((args, kwargs, layer_output(output).detach()))

    handles = [module.register_forward_pre_hook(pre, with_kwargs=True), module.register_forward_hook(post, with_kwargs=True)]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()
