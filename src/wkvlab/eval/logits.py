"""Logits in float32 whatever the model's dtype: the final norm and the head recomputed per chunk.

A bf16 model's logits leave ``lm_head`` rounded to bf16 (8 significant bits: a logit of 20 is
known to ±0.06), and upcasting them afterwards does not bring the bits back. That rounding lies
under every KLD a bf16 run measures; on SmolLM2 it lifted a q8_0 cache's KLD 2.8× (docs/scale.md).
The decoder stack stays in the model's dtype — that is the model being measured — but its last
hidden state is normalized and projected in float32 here:

* a forward hook on the final norm recomputes it on the float32 input (RMSNorm and Gemma's norm
  compute in float32 and only cast at the end; with a float32 input nothing is cast);
* the head runs in float32 in blocks of vocabulary rows, so no float32 copy of the whole head
  matrix exists (Llama-3's 128k × 4096 head would be 2 GiB), and the model itself is asked for
  the last position's logits only (``logits_to_keep=1``), so bf16 logits are not made twice;
* what the model does after its head is redone in float32: Gemma's final soft-capping, Cohere's
  ``logit_scale``, Granite's ``logits_scaling``; pre-hooks on ``lm_head`` (an engine baseline's
  input rounding) are applied to the head's input as the module call would.

On a GPU the float32 head is a true FP32 GEMM, ~16× slower than a bf16 one on tensor cores
(~+70% per pass on an 8B model, paid by the reference and every candidate). There the head runs as
bf16 GEMMs with float32 accumulation and output instead (:func:`split_product`): the float32
hidden state is split into three bf16 pieces that sum to it exactly (3 × 8 significant bits =
float32's 24), a bf16 head is exact as it is and an fp16 head splits into two bf16 pieces exactly
(11 bits), and each product of two bf16 values is exact in float32. So the split head computes
the same sum as the float32 head from the same exact terms; only the order and grouping of the
float32 additions differ, within the rounding bound that the float32 head already has
(tests/eval/test_logits.py states it). On the CPU, which has no fast bf16 GEMM with a float32
output, the head stays a float32 GEMM.

A float32 model takes none of this: its own logits are already full precision (and the numbers
of every float32 run stay bit-identical).
"""
from __future__ import annotations

import inspect

import torch

from wkvlab.errors import ModelError

HEAD_BLOCK_BYTES = 64 << 20  # float32 head rows upcast at a time


def _final_norm(model: torch.nn.Module) -> torch.nn.Module:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    norm = getattr(decoder, "norm", None) or getattr(decoder, "final_layernorm", None)
    if norm is None:
        raise ModelError(f"{type(model).__name__} has no final norm wkvlab can find for float32 logits; run it with --dtype float32")
    return norm


def _norm_in_float32(norm: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    if isinstance(norm, torch.nn.LayerNorm):
        weight = norm.weight.float() if norm.weight is not None else None
        bias = norm.bias.float() if norm.bias is not None else None
        return torch.nn.functional.layer_norm(hidden.float(), norm.normalized_shape, weight, bias, norm.eps)
    out = norm.forward(hidden.float())  # forward, not __call__: this runs inside the norm's own hook
    if out.dtype != torch.float32:
        raise ModelError(f"{type(norm).__name__} casts its output to {out.dtype}; wkvlab cannot compute float32 logits for it, run with --dtype float32")
    return out


SPLIT_TERMS = 3  # bf16 pieces of a float32 hidden state: 3 × 8 significant bits = float32's 24, so they sum to it exactly
_SPLIT_DTYPES = (torch.bfloat16, torch.float16)


def split_bf16(x: torch.Tensor, terms: int) -> list[torch.Tensor]:
    """``x`` as ``terms`` bf16 tensors, largest first, each the rounding of what the ones before left;
    the remainder is exact in float32 (a float minus its own rounding), so enough terms sum to ``x``."""
    parts, rest = [], x.float()
    for i in range(terms):
        parts.append(rest.to(torch.bfloat16))
        if i + 1 < terms:
            rest = rest - parts[-1].float()
    return parts


def _product_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b.T`` of two bf16 matrices with float32 accumulation and a float32 result: cuBLAS's bf16
    GEMM on a GPU (``out_dtype``); on the CPU, which has none, the float32 GEMM of the same values
    (the products are exact either way, only the accumulation order may differ)."""
    if a.device.type == "cpu":
        return a.float() @ b.float().T
    return torch.mm(a, b.T, out_dtype=torch.float32)


def split_product(pieces: list[torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
    """``hidden @ weight.T`` in float32 from ``pieces`` (:func:`split_bf16` of a ``[tokens, H]`` hidden
    state) and a bf16 or fp16 ``weight`` ``[rows, H]``, as bf16 GEMMs. Piece products whose size is
    below float32's last bit (2^-24 of the leading product) are left out; the rest are added smallest first."""
    w_pieces = [weight] if weight.dtype == torch.bfloat16 else split_bf16(weight, 2)  # fp16: 11 bits = 8 + 3, exact
    pairs = sorted(((i, j) for i in range(len(pieces)) for j in range(len(w_pieces)) if i + j < SPLIT_TERMS), key=lambda p: -sum(p))
    out = None
    for i, j in pairs:
        term = _product_f32(pieces[i], w_pieces[j])
        out = term if out is None else out.add_(term)
    return out


def splits_head(weight: torch.Tensor, device: torch.device) -> bool:
    """Whether the head runs as split bf16 GEMMs: a 16-bit head off the CPU (a GPU, or ``meta`` standing in for one)."""
    return weight.dtype in _SPLIT_DTYPES and device.type != "cpu"


def head_in_float32(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``head(hidden)`` in float32, ``hidden`` ``[..., H]`` float32: on the CPU the weight upcast a block of
    rows at a time, on a GPU a 16-bit head as split bf16 GEMMs (:func:`split_product`), block by block too."""
    for hook in head._forward_pre_hooks.values():
        changed = hook(head, (hidden,))
        if changed is not None:
            hidden = (changed[0] if isinstance(changed, tuple) else changed).float()
    weight, bias = head.weight, getattr(head, "bias", None)
    vocab, width = weight.shape
    rows = max(1, HEAD_BLOCK_BYTES // (4 * width))
    out = torch.empty(*hidden.shape[:-1], vocab, dtype=torch.float32, device=hidden.device)
    pieces = split_bf16(hidden.reshape(-1, width), SPLIT_TERMS) if splits_head(weight, hidden.device) else None
    for start in range(0, vocab, rows):
        block = slice(start, min(start + rows, vocab))
        if pieces is not None:
            out[..., block] = split_product(pieces, weight[block]).reshape(*hidden.shape[:-1], -1)
        else:
            torch.matmul(hidden, weight[block].float().T, out=out[..., block])
        if bias is not None:
            out[..., block] += bias[block].float()
    return out


def _after_head(model: torch.nn.Module, logits: torch.Tensor) -> torch.Tensor:
    cfg = model.config.get_text_config()
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    scale = (getattr(model, "logit_scale", None) or getattr(cfg, "logit_scale", None)) if cfg.model_type == "cohere" else None
    if scale:
        logits = logits * scale
    scaling = getattr(cfg, "logits_scaling", None) if "granite" in cfg.model_type else None
    if scaling:
        logits = logits / scaling
    return logits


def _takes_logits_to_keep(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def model_logits(model: torch.nn.Module, input_ids: torch.Tensor, rows: slice | None = None, **kwargs) -> torch.Tensor:
    """Float32 logits ``[tokens, vocab]`` of one sequence (``input_ids`` ``[1, tokens]``; ``kwargs``
    go to the model: a cache). The model's own logits when it is float32.

    ``rows``: only those positions' logits. An empty slice runs the decoder (the cache fills) but not
    the head: a chunk of a long prefix no position of which is scored. Gemma-3's 262k-row head costs
    more than its whole decoder per token (168M of its 268M parameters). A non-empty slice
    is cut from the full chunk's logits, so every scored number stays bit-identical to before."""
    head = model.get_output_embeddings()
    if rows is not None and rows.start >= rows.stop and head is not None and _takes_logits_to_keep(model):
        model(input_ids=input_ids, **kwargs, logits_to_keep=torch.empty(0, dtype=torch.long, device=input_ids.device))
        return torch.empty(0, head.weight.shape[0], dtype=torch.float32, device=head.weight.device)
    logits = _all_logits(model, head, input_ids, **kwargs)
    return logits if rows is None else logits[rows]


def _all_logits(model: torch.nn.Module, head: torch.nn.Module | None, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
    if head is None or head.weight.dtype == torch.float32:
        return model(input_ids=input_ids, **kwargs).logits[0].float()
    norm = _final_norm(model)
    captured: list[torch.Tensor] = []

    def keep_float32(module, args, output):
        captured.append(_norm_in_float32(module, args[0]))

    handle = norm.register_forward_hook(keep_float32)
    try:
        keep = {"logits_to_keep": 1} if _takes_logits_to_keep(model) else {}
        model(input_ids=input_ids, **kwargs, **keep)
    finally:
        handle.remove()
    if len(captured) != 1:
        raise ModelError(f"the final norm of {type(model).__name__} ran {len(captured)} times in one forward; run it with --dtype float32")
    hidden = captured[0][0]
    return _after_head(model, head_in_float32(head, hidden.to(head.weight.device)))
