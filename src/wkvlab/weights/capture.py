"""Run calibration tokens through a model one decoder layer at a time, and observe linear inputs.

The layer-by-layer pipeline is GPTQ's (IST-DASLab/gptq ``llama_sequential``): capture what the
first decoder layer receives, then for each layer gather statistics of its linears' inputs, let
the method change the layer, and run the layer again to produce the next layer's input — so each
layer is calibrated on what the already-quantized layers below it produce. AWQ runs the same way
but feeds the next layer what the layer produced *before* it was changed (AutoAWQ's
``_get_input_feat`` updates ``self.inps`` before scaling), so every layer sees the unquantized
model's activations while only one layer's inputs and outputs are held.

Capturing uses forward pre-hooks on every decoder layer during one forward of the *base* model
(``model.model``: no lm_head, so Gemma's 262k-entry logits are never built). The hooks record the
keyword arguments each layer gets (position embeddings, masks — Gemma's sliding and full layers
get different ones), so layers can later be called on their own; only the first layer's hidden
states are kept.

Memory (issue #40): a Hessian is accumulated in place in one float32 buffer, linears that read the
same tensor (q/k/v, gate/up) share one (:func:`input_groups`), and a pass that only needs one
linear's input stops the layer's forward there (:func:`run_until`).
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

    hidden: list[list[Tensor] | None]  # [layer][chunk] input hidden states (the first layer's only)
    kwargs: list[list[dict]]  # [layer][chunk] keyword arguments


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "model", model)


@torch.no_grad()
def capture_layer_inputs(model: torch.nn.Module, tokens: Tensor, *, chunk: int = 4) -> LayerCalls:
    """One forward over ``tokens`` (``[samples, length]``) recording every layer's keyword
    arguments and the first layer's hidden states (each later layer's come from the one below)."""
    layers = [m for _, m in decoder_layers(model)]
    calls = LayerCalls(hidden=[[] if i == 0 else None for i in range(len(layers))], kwargs=[[] for _ in layers])

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
def advance_layer(layer: torch.nn.Module, hidden: list[Tensor], kwargs: list[dict], *, keep: bool = True) -> list[Tensor]:
    """The layer's outputs (the next layer's inputs), consuming ``hidden``: each chunk's input is
    dropped from the list once it has run, so one layer's hidden states, not two, are held.
    ``keep=False`` runs the layer for its hooks only (the last layer: nothing reads its outputs)."""
    out = []
    for i, kw in enumerate(kwargs[:len(hidden)]):
        x, hidden[i] = hidden[i], None
        y = layer_output(layer(x, **kw))
        del x
        if keep:
            out.append(y)
    hidden.clear()
    return out


def accumulate_hessian(hessian: Tensor, count: int, x: Tensor) -> tuple[Tensor, int]:
    """Running ``H = 2/N · Σ xᵀx`` over ``N`` input rows (GPTQ's ``add_batch``), updated in place:
    ``hessian`` (float32) is scaled by ``count / N`` and the new rows' product added into it, so the
    only other buffer is one float32 copy of the rows. Returns ``(hessian, N)``."""
    rows = x.reshape(-1, x.shape[-1])
    total = count + rows.shape[0]
    scaled = rows.to(torch.float32, copy=True).mul_((2.0 / total) ** 0.5)
    hessian.mul_(count / total).addmm_(scaled.T, scaled)
    return hessian, total


def new_hessian(x: Tensor) -> Tensor:
    """A zero float32 Hessian for inputs like ``x``, on their device."""
    return x.new_zeros(x.shape[-1], x.shape[-1], dtype=torch.float32)


@dataclass
class InputStats:
    """Statistics of one linear's inputs: per-channel mean and max |x| (AWQ, SmoothQuant)."""

    count: int = 0
    abs_sum: Tensor | None = None
    abs_max: Tensor | None = None
    samples: list[Tensor] = field(default_factory=list)  # kept inputs (AWQ clipping), rows subsampled

    def add(self, x: Tensor, *, keep_every: int) -> None:
        rows = x.reshape(-1, x.shape[-1])
        a = rows.abs().float()
        self.abs_sum = a.sum(0) if self.abs_sum is None else self.abs_sum + a.sum(0)
        self.abs_max = a.amax(0) if self.abs_max is None else torch.maximum(self.abs_max, a.amax(0))
        self.count += rows.shape[0]
        if keep_every:
            self.samples.append(rows[::keep_every].to(torch.float32, copy=True))  # a copy: a view pins the whole input

    @property
    def abs_mean(self) -> Tensor:
        return self.abs_sum / max(self.count, 1)


@contextmanager
def observe_inputs(modules: dict[str, torch.nn.Module], *, keep_every: int = 0) -> Iterator[dict[str, InputStats]]:
    """Accumulate :class:`InputStats` for each module's first input while the block runs."""
    stats = {name: InputStats() for name in modules}
    handles = []
    for name, module in modules.items():
        def hook(_module, args, name=name):
            stats[name].add(args[0].detach(), keep_every=keep_every)

        handles.append(module.register_forward_pre_hook(hook))
    try:
        yield stats
    finally:
        for handle in handles:
            handle.remove()


class _Enough(Exception):
    """Raised by :func:`run_until`'s hook: the rest of the layer's forward is not needed."""


@torch.no_grad()
def run_until(layer: torch.nn.Module, hidden: list[Tensor], kwargs: list[dict], module: torch.nn.Module, see) -> None:
    """Run ``layer`` on every chunk only as far as ``module``: ``see(args, kwargs)`` gets its input
    and the chunk's forward stops there (the Hessian of a linear needs nothing after it)."""
    def pre(_module, args, kw):
        see(args, kw)
        raise _Enough

    handle = module.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        for x, kw in zip(hidden, kwargs):
            try:
                layer(x, **kw)
            except _Enough:
                pass
    finally:
        handle.remove()


def _same_tensor(x: Tensor) -> tuple:
    return x.untyped_storage()._cdata, x.storage_offset(), tuple(x.shape), tuple(x.stride()), x.dtype


@torch.no_grad()
def input_groups(layer: torch.nn.Module, modules: dict[str, torch.nn.Module], x: Tensor, kwargs: dict) -> list[list[str]]:
    """``modules`` grouped by the tensor they read in one forward of ``layer`` on ``x`` — q/k/v read
    the same normed hidden state, gate/up another —, groups in the order they are first called
    (each group's input depends only on modules called before it). Modules not called come last,
    one per group."""
    seen: dict[tuple, tuple[Tensor, list[str]]] = {}  # the tensors are held so that their keys stay unique

    def hook(name: str):
        def pre(_module, args):
            key = _same_tensor(args[0])
            if key not in seen:
                seen[key] = (args[0], [])
            if name not in seen[key][1]:
                seen[key][1].append(name)

        return pre

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in modules.items()]
    try:
        layer(x, **kwargs)
    finally:
        for handle in handles:
            handle.remove()
    groups = [names for _, names in seen.values()]
    called = {n for g in groups for n in g}
    return groups + [[n] for n in modules if n not in called]


@torch.no_grad()
def hessian_of(layer: torch.nn.Module, hidden: list[Tensor], kwargs: list[dict], module: torch.nn.Module) -> Tensor | None:
    """The Hessian of ``module``'s inputs over every chunk (one float32 buffer), running each chunk
    only as far as ``module``; None when it never ran."""
    state: list = [None, 0]

    def see(args, kw):
        x = args[0].detach()
        h = state[0] if state[0] is not None else new_hessian(x)
        state[0], state[1] = accumulate_hessian(h, state[1], x)

    run_until(layer, hidden, kwargs, module, see)
    return state[0]


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
