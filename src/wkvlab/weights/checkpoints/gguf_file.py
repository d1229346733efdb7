"""GGUF files of any weight type (F16/BF16, Q4_0 … Q8_0, K-quants, IQ types) as candidates.

Tensors are dequantized by the ``gguf`` package (``gguf.quants.dequantize``, llama.cpp's own
Python port) and renamed/undone through transformers' GGUF loader
(``transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint``): it maps llama.cpp names to
the reference architecture's parameter names and reverses what ``convert_hf_to_gguf.py`` did
(Llama's Q/K row permutation for RoPE, Gemma's ``+1`` on norm weights), exactly as when the same
file is loaded as a reference model. The tensor types are read with ``gguf.GGUFReader`` so the run
can say what the file holds. llama.cpp's CPU matmul also rounds its inputs to q8 blocks; that is
not applied here (``wkvlab engine compare`` measures it), so a GGUF candidate runs 16-bit inputs.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from wkvlab.errors import ModelError
from wkvlab.weights.checkpoints.base import CheckpointContents


def read_gguf(path: Path, model: torch.nn.Module) -> CheckpointContents:
    """The file's header, config and vocabulary now; its tensors streamed one at a time
    (:func:`wkvlab.models.gguf_convert.file_tensors`, as the conversion of a GGUF model reads them):
    transformers' loader, used before, dequantized every tensor into a dictionary first — the whole
    checkpoint in float32 beside the reference and the candidate's copy."""
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from gguf import GGUFReader

    from wkvlab.models.gguf_convert import file_tensors

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # a truncated or foreign file raises struct/value/IO errors alike
        raise ModelError(f"{path} could not be read as GGUF ({type(exc).__name__}: {str(exc)[:120]})") from None
    types = Counter(t.tensor_type.name for t in reader.tensors if t.name.endswith(".weight") and len(t.shape) > 1)
    nbytes = sum(int(t.n_bytes) for t in reader.tensors)
    del reader
    try:
        parsed = gguf_utils.load_gguf_checkpoint(str(path), return_tensors=False)
        streamed = file_tensors(path, model, torch.float32, parsed)
    except Exception as exc:  # unsupported architecture or tensor type: one line, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path} could not be dequantized ({first[:160]})") from None
    summary = ", ".join(f"{name} × {count}" for name, count in types.most_common())
    tokens = parsed.get("tokenizer", {}).get("tokens")
    return CheckpointContents(f"GGUF ({summary} matrices; dequantized with gguf, 16-bit activations)", {}, {}, nbytes,
                              dict(parsed.get("config", {})), vocabulary=list(tokens) if tokens is not None else None,
                              streamed=_one_line_errors(path, streamed))


def _one_line_errors(path: Path, streamed):
    """``streamed`` whose tensor errors (a tensor type gguf-py cannot dequantize) are one line."""
    names, produce = streamed

    def produce_checked():
        try:
            yield from produce()
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelError(f"{path} could not be dequantized ({first[:160]})") from None

    return names, produce_checked


def _rope_permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's ``LlamaModel.permute`` (convert_hf_to_gguf.py): HF's half-split RoPE rows → interleaved."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_LLAMA_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def write_llama_gguf(model: torch.nn.Module, path: Path, linear_type: str, vocabulary: list[str]) -> None:
    """A Llama-architecture GGUF whose decoder linears are ``linear_type`` blocks (``q8_0``, ``q4_0``,
    ``q4_1``, ``q5_0``, ``q5_1``, ``iq4_nl`` from :mod:`wkvlab.formats.ggml`, bit-identical with
    llama.cpp's, or ``f16``/``f32``); everything else f32 — names, metadata and the Q/K row
    permutation as llama.cpp's ``convert_hf_to_gguf.py`` writes them. For tests and small models."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    from wkvlab.formats import ggml_quantize

    cfg = model.config
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None) else 10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(vocabulary)
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    if not tied:
        writer.add_tensor("output.weight", state["lm_head.weight"].numpy())
    for i in range(cfg.num_hidden_layers):
        for hf, short in _LLAMA_NAMES.items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                w = _rope_permute(w, cfg.num_attention_heads)
            if hf == "self_attn.k_proj":
                w = _rope_permute(w, cfg.num_key_value_heads)
            name = f"blk.{i}.{short}.weight"
            if w.ndim == 1 or linear_type == "f32":
                writer.add_tensor(name, w.numpy())
            elif linear_type == "f16":
                writer.add_tensor(name, w.numpy().astype(np.float16))
            else:
                raw = ggml_quantize(w, linear_type).numpy()
                writer.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType[linear_type.upper()])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
