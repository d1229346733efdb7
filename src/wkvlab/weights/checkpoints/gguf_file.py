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

import os
from collections import Counter
from pathlib import Path

import torch

from wkvlab.errors import ModelError
from wkvlab.weights.checkpoints.base import CheckpointContents


def read_gguf(path: Path, model: torch.nn.Module) -> CheckpointContents:
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # a truncated or foreign file raises struct/value/IO errors alike
        raise ModelError(f"{path} could not be read as GGUF ({type(exc).__name__}: {str(exc)[:120]})") from None
    types = Counter(t.tensor_type.name for t in reader.tensors if t.name.endswith(".weight") and len(t.shape) > 1)
    nbytes = sum(int(t.n_bytes) for t in reader.tensors)
    del reader
    previous = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"  # transformers' converter draws its own bar
    try:
        parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    except Exception as exc:  # unsupported architecture or tensor type: one line, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path} could not be dequantized ({first[:160]})") from None
    finally:
        if previous is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = previous
    tensors = {name: t.float() for name, t in parsed["tensors"].items()}
    summary = ", ".join(f"{name} × {count}" for name, count in types.most_common())
    tokens = parsed.get("tokenizer", {}).get("tokens")
    return CheckpointContents(f"GGUF ({summary} matrices; dequantized with gguf, 16-bit activations)", tensors, {}, nbytes,
                              dict(parsed.get("config", {})), vocabulary=list(tokens) if tokens is not None else None)
