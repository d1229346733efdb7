"""Which linears llama.cpp runs with quantized inputs, read from the GGUF it runs.

ggml-cpu multiplies a weight by first converting the input rows to the weight type's
``vec_dot_type`` (``type_traits_cpu`` in ``ggml/src/ggml-cpu/ggml-cpu.c`` of the llama.cpp that
llama-cpp-python 0.3.36 vendors, ggml-org/llama.cpp@0c1e57098):

* q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4 weights and q8_1 for Q4_1/Q5_1 — both the ``ggml-q8`` kind;
* q8_K (blocks of 256, float32 scale) for the K-quants Q2_K..Q6_K, IQ4_XS and the other IQ types
  — the ``ggml-q8k`` kind (Q4_K_M files such as the packaged Gemma-3-270M mix Q4_K, Q6_K, Q5_0 and
  Q8_0 matrices);
* fp16 / bf16 for F16 / BF16 weights (``ggml-f16`` / ``ggml-bf16``); F32 weights keep float inputs.

Activations too: ggml-cpu computes GELU (tanh form, Gemma's MLP) through a table indexed by the
fp16 input holding fp16 results (``GGML_GELU_FP16`` is defined in ``ggml/src/ggml-cpu/vec.h``;
``ggml_vec_gelu_f32``/``ggml_vec_geglu_f32``: inputs ≤ −10 give 0, ≥ 10 pass through) — the
``ggml-gelu-f16`` replacement of :func:`ggml_output_plan`. SiLU is computed in float32.

Those roundings amplify any upstream perturbation — a q8_0 cache costs the engine ~14× the KLD a
float-activation simulation shows — so a faithful simulation of "llama.cpp with cache X vs
llama.cpp with f16" puts them on every such linear (:mod:`wkvlab.eval.baseline` does so for
``wkvlab eval`` too).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
from pathlib import Path

import torch

from wkvlab.errors import ModelError
from wkvlab.weights.activations import ActivationQuant

Q8_BLOCK_WEIGHTS = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4"})
Q8_K_WEIGHTS = frozenset({"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S",
                          "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0"})
# weight type → the input rounding its vec_dot_type implies (absent: float inputs)
INPUT_KIND = {**{t: "ggml-q8" for t in Q8_BLOCK_WEIGHTS}, **{t: "ggml-q8k" for t in Q8_K_WEIGHTS},
              "F16": "ggml-f16", "BF16": "ggml-bf16"}

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
    """The input roundings llama.cpp's CPU backend applies to ``model``'s linears (``model`` loaded from the GGUF)."""
    modules = dict(model.named_modules())
    plan: dict[str, ActivationQuant] = {}
    for name, weight_type in gguf_linear_types(gguf_path).items():
        if name not in modules:
            raise ModelError(f"{gguf_path}: the model has no module {name}; pass the model the GGUF was loaded into")
        if weight_type in INPUT_KIND:
            plan[name] = ActivationQuant(kind=INPUT_KIND[weight_type])
        elif weight_type != "F32":
            raise ModelError(f"{gguf_path}: {name} is {weight_type}, whose llama.cpp input rounding is not simulated; "
                             "use a GGUF with Q4_0..Q8_0, K-quant, F16 or F32 weights")
    return plan


GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu_fast", "gelu_python_tanh")
_SQRT_2_OVER_PI = 0.79788456080286535587989211986876
_GELU_COEF_A = 0.044715


@functools.lru_cache(maxsize=1)
def _gelu_table() -> torch.Tensor:
    """``ggml_table_gelu_f16`` as ``ggml_cpu_init`` builds it: for every fp16 bit pattern,
    ``fp16(ggml_gelu_f32(x))`` with C's ``tanhf`` (glibc, through ctypes, when available)."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    inner = (_SQRT_2_OVER_PI * x * (1.0 + _GELU_COEF_A * x * x)).numpy()
    try:
        tanhf = ctypes.CDLL(ctypes.util.find_library("m")).tanhf
        tanhf.restype, tanhf.argtypes = ctypes.c_float, [ctypes.c_float]
        th = torch.tensor([tanhf(float(v)) for v in inner], dtype=torch.float32)
    except (OSError, AttributeError, TypeError):  # no C math library: torch's tanh differs by an ulp now and then
        th = torch.tanh(torch.from_numpy(inner))
    return (0.5 * x * (1.0 + th)).to(torch.float16)


def ggml_gelu_f16(x: torch.Tensor) -> torch.Tensor:
    """ggml-cpu's GELU: ``ggml_table_gelu_f16[fp16(x)]``, 0 at or below −10, ``x`` from 10 up."""
    xf = x.float()
    index = xf.to(torch.float16).view(torch.int16).long() + 2**15  # bit pattern as the table's offset
    table = _gelu_table()[index.clamp(0, 2**16 - 1)].float()
    return torch.where(xf <= -10.0, torch.zeros_like(xf), torch.where(xf >= 10.0, xf, table)).to(x.dtype)


OUTPUT_KINDS = {"ggml-gelu-f16": ggml_gelu_f16}


def ggml_output_plan(model: torch.nn.Module) -> dict[str, str]:
    """``{module name: kind}`` of activation functions whose output ggml-cpu computes differently:
    every ``mlp.act_fn`` of a model whose hidden activation is the tanh GELU."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if act not in GELU_TANH:
        return {}
    return {name: "ggml-gelu-f16" for name, _ in model.named_modules() if name.endswith("mlp.act_fn")}


def attach_output_replacements(model: torch.nn.Module, plan: dict[str, str]) -> list:
    """Forward hooks that recompute each planned module's output from its input; returns the handles."""
    modules = dict(model.named_modules())
    return [modules[name].register_forward_hook(lambda _m, args, _out, fn=OUTPUT_KINDS[kind]: fn(args[0]))
            for name, kind in plan.items()]


def describe_plan(plan: dict[str, ActivationQuant]) -> str:
    """E.g. ``ggml-q8 on 210 linears, ggml-q8k on 27`` (what a report says the simulation did)."""
    counts: dict[str, int] = {}
    for quant in plan.values():
        counts[quant.kind] = counts.get(quant.kind, 0) + 1
    return ", ".join(f"{kind} on {n} linear{'s' * (n != 1)}" for kind, n in sorted(counts.items())) or "float inputs"
