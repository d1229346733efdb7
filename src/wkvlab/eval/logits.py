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


def head_in_float32(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """``head(hidden)`` in float32, ``hidden`` ``[..., H]`` float32; the weight upcast a block of rows at a time."""
    for hook in head._forward_pre_hooks.values():
        changed = hook(head, (hidden,))
        if changed is not None:
            hidden = (changed[0] if isinstance(changed, tuple) else changed).float()
    weight, bias = head.weight, getattr(head, "bias", None)
    vocab, width = weight.shape
    rows = max(1, HEAD_BLOCK_BYTES // (4 * width))
    out = torch.empty(*hidden.shape[:-1], vocab, dtype=torch.float32, device=hidden.device)
    for start in range(0, vocab, rows):
        block = slice(start, min(start + rows, vocab))
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
