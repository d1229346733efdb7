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

For GPTQ, :func:`expert_hessian` gives each expert matrix the Hessian of the inputs it sees: the
tokens routed to that expert (``top_k_index``) for ``gate_up_proj``, and the gated activations of
those tokens, computed with the expert's own (unquantized) gate/up weights, for ``down_proj`` —
the computation of transformers' ``batched_mm_experts_forward``. The module's inputs are recorded
once per layer (:func:`record_expert_inputs`) and each Hessian is built from them when its matrix
is quantized: only the Hessians of the experts GPTQ quantizes together are alive at once (a batch
bounded in bytes, wkvlab.weights.gptq_batch), not every expert's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor

from wkvlab.weights.capture import accumulate_hessian, new_hessian, run_until

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


def _routed(hidden: Tensor, top_k_index: Tensor, expert: int) -> Tensor | None:
    """The tokens of ``hidden`` routed to ``expert`` (None when there are none)."""
    x = hidden.reshape(-1, hidden.shape[-1])
    rows = (top_k_index.reshape(x.shape[0], -1) == expert).any(dim=1)
    return x[rows] if bool(rows.any()) else None


def _gated(module: torch.nn.Module, xe: Tensor, expert: int) -> Tensor:
    """What the expert's down matrix reads for tokens ``xe``: its gate/up output through the gate."""
    has_gate = bool(getattr(module, "has_gate", True))
    first = module.gate_up_proj if has_gate else module.up_proj
    bias = getattr(module, "gate_up_proj_bias" if has_gate else "up_proj_bias", None) if getattr(module, "has_bias", False) else None
    up = _linear(xe, first[expert].to(xe.dtype), bool(getattr(module, "is_transposed", False)))
    if bias is not None:
        up = up + bias[expert]
    return module._apply_gate(up) if has_gate else module.act_fn(up)


def expert_inputs(module: torch.nn.Module, hidden: Tensor, top_k_index: Tensor) -> Iterator[tuple[int, Tensor, Tensor]]:
    """``(expert, input of its gate/up matrix, input of its down matrix)`` for each expert that got tokens."""
    first = module.gate_up_proj if getattr(module, "has_gate", True) else module.up_proj
    for e in range(first.shape[0]):
        xe = _routed(hidden, top_k_index, e)
        if xe is not None:
            yield e, xe, _gated(module, xe, e)


@torch.no_grad()
def record_expert_inputs(layer: torch.nn.Module, hidden: list[Tensor], kwargs: list[dict],
                         module: torch.nn.Module) -> list[tuple[Tensor, Tensor]]:
    """``(hidden states, top_k_index)`` the experts module receives on every chunk, running each
    chunk of ``layer`` only as far as the module: the one copy of its inputs the per-expert
    Hessians are accumulated from (as large as one layer's hidden states)."""
    inputs: list[tuple[Tensor, Tensor]] = []

    def see(args, kwargs):
        hidden_states = args[0] if args else kwargs["hidden_states"]
        inputs.append((hidden_states.detach(), args[1] if len(args) > 1 else kwargs["top_k_index"]))

    run_until(layer, hidden, kwargs, module, see)
    return inputs


@torch.no_grad()
def expert_hessian(module: torch.nn.Module, inputs: list[tuple[Tensor, Tensor]], expert: int, *, gated: bool) -> Tensor | None:
    """The Hessian of one expert matrix's inputs over the recorded chunks: the tokens routed to
    ``expert`` (its gate/up matrix) or, ``gated``, their gated activations computed with its
    unquantized gate/up weights (its down matrix). None when no token reached it."""
    hessian, count = None, 0
    for hidden, top_k in inputs:
        x = _routed(hidden, top_k, expert)
        if x is None:
            continue
        if gated:
            x = _gated(module, x, expert)
        hessian, count = accumulate_hessian(hessian if hessian is not None else new_hessian(x), count, x)
    return hessian


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
