"""Which linears llama.cpp runs with quantized inputs, read from the GGUF it runs.

ggml-cpu multiplies a quantized weight by first converting the input rows to the weight type's
``vec_dot_type`` (ggml-cpu's type traits): q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL weights and q8_1 for
Q4_1/Q5_1, both the ``ggml-q8`` activation kind. Those roundings amplify any upstream
perturbation — a q8_0 cache costs the engine ~14× the KLD a float-activation simulation shows — so
a faithful simulation of "llama.cpp with cache X vs llama.cpp with f16" puts them on every such
linear. K-quant weights use q8_K (blocks of 256, float32 scale), not modelled here: refused.
16/32-bit weights keep float inputs (F16 weights round inputs to fp16, far below these effects).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch

from wkvlab.errors import ModelError
from wkvlab.weights.activations import ActivationQuant

Q8_BLOCK_WEIGHTS = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"})
FLOAT_WEIGHTS = frozenset({"F32", "F16", "BF16"})

# GGUF tensor name (llama-style architectures) → transformers module name
_LAYER_LINEARS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def gguf_linear_types(gguf_path: str | Path) -> dict[str, str]:
    """``{transformers module name: GGUF weight type}`` for every matmul weight of the GGUF.

    The output head is ``output.weight`` when present, else the tied ``token_embd.weight``.
    """
    from gguf import GGUFReader

    tensors = {t.name: t.tensor_type.name for t in GGUFReader(str(gguf_path)).tensors if len(t.shape) == 2}
    types: dict[str, str] = {}
    for name, kind in tensors.items():
        match = _BLOCK.fullmatch(name)
        if match and match.group(2) in _LAYER_LINEARS:
            types[f"model.layers.{match.group(1)}.{_LAYER_LINEARS[match.group(2)]}"] = kind
        elif match:
            raise ModelError(f"{gguf_path}: matrix {name} has no known transformers module; llama.cpp activation simulation covers llama-style GGUFs")
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if head:
        types["lm_head"] = head
    return types


def ggml_activation_plan(model: torch.nn.Module, gguf_path: str | Path) -> dict[str, ActivationQuant]:
    """The ``ggml-q8`` activation plan llama.cpp's CPU backend applies to ``model`` (loaded from the GGUF)."""
    modules = dict(model.named_modules())
    plan: dict[str, ActivationQuant] = {}
    for name, kind in gguf_linear_types(gguf_path).items():
        if name not in modules:
            raise ModelError(f"{gguf_path}: the model has no module {name}; pass the model the GGUF was loaded into")
        if kind in Q8_BLOCK_WEIGHTS:
            plan[name] = ActivationQuant(kind="ggml-q8")
        elif kind not in FLOAT_WEIGHTS:
            raise ModelError(f"{gguf_path}: {name} is {kind}, whose llama.cpp input rounding (q8_K) is not simulated; "
                             "use a GGUF with Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights")
    return plan
