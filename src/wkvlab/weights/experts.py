"""Mixture-of-experts weights stored as fused 3-D tensors, one expert's matrix at a time.

transformers 5.x keeps the experts of Mixtral, Qwen2-MoE, Qwen3-MoE (and the other MoE models
decorated with ``use_experts_implementation``, transformers ``integrations/moe.py``) in one
module holding ``gate_up_proj`` ``[experts, 2·intermediate, hidden]`` and ``down_proj``
``[experts, hidden, intermediate]`` parameters (or ``up_proj`` without a gate; transposed
``[experts, in, out]`` when the module says ``is_transposed``, as Llama 4 and gpt-oss do). They
are not ``nn.Linear`` modules, so a search for linears finds only attention — about 3% of
Mixtral-8x7B's parameters. Here each expert's slice is an :class:`ExpertMatrix`: an ``[out, in]``
matrix read and written like a linear's weight, so every round-to-nearest format and GPTQ
quantize it as its own linear. Gate and up of one expert stay one ``[2·intermediate, hidden]``
matrix, as vLLM's fused-MoE kernels hold them (``w13``): per-row and per-group scales are the
same either way; a per-tensor scale is one for both, as vLLM's FP8 MoE takes the max of the two.

Routers (``mlp.gate``) and biases stay at 16 bits, as vLLM and llama.cpp keep them.

Dynamic activation quantization (``int8-token``, ``fp8-token``, ``mxfp4``: scales from each token
alone) runs at both inputs of each expert: the experts module's input (every expert's gate/up
reads the same token, quantized the same way) and the gated activations, the output of the
module's ``_apply_gate`` (``act_fn`` without a gate) that transformers' ``batched_mm`` and
``grouped_mm`` experts forwards feed to ``down_proj`` — wrapped per module instance
(:func:`wrap_gated`). The eager forward computes the gate inline, so there it is refused.

For GPTQ, :func:`observe_expert_inputs` gives each expert matrix the Hessian of the inputs it
sees: the tokens routed to that expert (``top_k_index``) for ``gate_up_proj``, and the gated
activations of those tokens, computed with the expert's own (unquantized) gate/up weights, for
``down_proj`` — the computation of transformers' ``batched_mm_experts_forward``.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

from wkvlab.weights.capture import accumulate_hessian

EXPERT_PARAMS = ("gate_up_proj", "up_proj", "down_proj")
GATED = ".gated"  # an activation-plan name: ``<experts module>.gated`` quantizes down_proj's input


@dataclass(frozen=True, eq=False)
class ExpertMatrix:
    """One expert's ``[out, in]`` matrix inside a fused 3-D parameter of an experts module."""

    module: torch.nn.Module
    param: str  # gate_up_proj, up_proj or down_proj
    expert: int

    @property
    def tensor(self) -> torch.nn.Parameter:
        return getattr(self.module, self.param)

    @property
    def transposed(self) -> bool:
        return bool(getattr(self.module, "is_transposed", False))

    def get(self) -> Tensor:
        w = self.tensor.data[self.expert]
        return w.T if self.transposed else w

    def set(self, value: Tensor) -> None:
        self.tensor.data[self.expert].copy_(value.T if self.transposed else value)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.get().shape)  # type: ignore[return-value]

    def numel(self) -> int:
        return self.tensor[self.expert].numel()


def is_fused_experts(module: torch.nn.Module) -> bool:
    """An experts module whose layout transformers declares (``is_transposed`` is set by its decorator)."""
    return hasattr(module, "is_transposed") and any(
        isinstance(getattr(module, p, None), torch.nn.Parameter) and getattr(module, p).dim() == 3 for p in EXPERT_PARAMS)


def fused_experts(model: torch.nn.Module, prefix: str) -> list[tuple[str, torch.nn.Module]]:
    """Experts modules inside the decoder layers (names start with ``prefix``)."""
    return [(n, m) for n, m in model.named_modules() if n.startswith(prefix) and is_fused_experts(m)]


def expert_matrices(name: str, module: torch.nn.Module) -> list[tuple[str, ExpertMatrix]]:
    """``(<module>.<param>.<expert>, matrix)`` for every expert of every fused parameter."""
    out = []
    for param in EXPERT_PARAMS:
        tensor = getattr(module, param, None)
        if isinstance(tensor, torch.nn.Parameter) and tensor.dim() == 3:
            out += [(f"{name}.{param}.{e}", ExpertMatrix(module, param, e)) for e in range(tensor.shape[0])]
    return out


def unknown_fused(model: torch.nn.Module, prefix: str) -> list[str]:
    """Decoder parameters of 3 or more dimensions that no known experts layout explains."""
    known = {id(getattr(m, p)) for _, m in fused_experts(model, prefix) for p in EXPERT_PARAMS if hasattr(m, p)}
    return [n for n, p in model.named_parameters() if n.startswith(prefix) and p.dim() >= 3 and id(p) not in known]


def _linear(x: Tensor, w: Tensor, transposed: bool) -> Tensor:
    return x @ w if transposed else torch.nn.functional.linear(x, w)


def expert_inputs(module: torch.nn.Module, hidden: Tensor, top_k_index: Tensor) -> Iterator[tuple[int, Tensor, Tensor]]:
    """``(expert, input of its gate/up matrix, input of its down matrix)`` for each expert that got tokens."""
    x = hidden.reshape(-1, hidden.shape[-1])
    index = top_k_index.reshape(x.shape[0], -1)
    transposed = bool(getattr(module, "is_transposed", False))
    has_gate = bool(getattr(module, "has_gate", True))
    first = module.gate_up_proj if has_gate else module.up_proj
    bias = getattr(module, "gate_up_proj_bias" if has_gate else "up_proj_bias", None) if getattr(module, "has_bias", False) else None
    for e in range(first.shape[0]):
        rows = (index == e).any(dim=1)
        if not bool(rows.any()):
            continue
        xe = x[rows]
        up = _linear(xe, first[e].to(xe.dtype), transposed)
        if bias is not None:
            up = up + bias[e]
        inner = module._apply_gate(up) if has_gate else module.act_fn(up)
        yield e, xe, inner


@contextmanager
def observe_expert_inputs(modules: dict[str, torch.nn.Module]) -> Iterator[dict[str, tuple[Tensor, int]]]:
    """Hessians ``(H, rows)`` of every expert matrix's inputs while the layer runs, by matrix name
    (``<module>.<param>.<expert>``); experts that no token reached are absent."""
    stats: dict[str, tuple[Tensor, int]] = {}

    def add(key: str, x: Tensor) -> None:
        h, n = stats.get(key, (x.new_zeros(x.shape[-1], x.shape[-1], dtype=torch.float32), 0))
        stats[key] = accumulate_hessian(h, n, x)

    handles = []
    for name, module in modules.items():
        first = "gate_up_proj" if getattr(module, "has_gate", True) else "up_proj"

        def hook(mod, args, kwargs, name=name, first=first):
            hidden = args[0] if args else kwargs["hidden_states"]
            top_k = args[1] if len(args) > 1 else kwargs["top_k_index"]
            with torch.no_grad():
                for e, xe, inner in expert_inputs(mod, hidden.detach(), top_k):
                    add(f"{name}.{first}.{e}", xe)
                    add(f"{name}.down_proj.{e}", inner)

        handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        yield stats
    finally:
        for handle in handles:
            handle.remove()


_MISSING = object()


class _Unwrap:
    """A hook handle: ``remove()`` puts the module's own gate function back."""

    def __init__(self, module: torch.nn.Module, attr: str, previous) -> None:
        self.module, self.attr, self.previous = module, attr, previous

    def remove(self) -> None:
        if self.previous is _MISSING:
            self.module.__dict__.pop(self.attr, None)
        else:
            self.module.__dict__[self.attr] = self.previous


def wrap_gated(module: torch.nn.Module, fn) -> _Unwrap:
    """Apply ``fn`` to what the experts' gate produces (down_proj's input), for this module only:
    an instance attribute shadows the class's ``_apply_gate`` (or the ``act_fn`` submodule)."""
    attr = "_apply_gate" if getattr(module, "has_gate", True) else "act_fn"
    inner = getattr(module, attr)
    previous = module.__dict__.get(attr, _MISSING)
    module.__dict__[attr] = lambda x: fn(inner(x))
    return _Unwrap(module, attr, previous)


def gated_hookable(module: torch.nn.Module) -> bool:
    """Whether the module's forward reaches down_proj's input through ``_apply_gate`` / ``act_fn``
    (transformers' batched_mm / grouped_mm experts forwards do; the eager one inlines it)."""
    config = getattr(module, "config", None)
    return getattr(config, "_experts_implementation", None) in ("batched_mm", "grouped_mm")  # transformers integrations/moe.py
