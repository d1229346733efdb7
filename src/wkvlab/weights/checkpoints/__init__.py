"""Quantized checkpoints on disk as weight candidates (``--weights checkpoint:<path>``), and writers.

:func:`load_checkpoint` detects the format of a folder or file — compressed-tensors
(:mod:`.compressed_tensors`), GPTQ / AutoAWQ (:mod:`.gptq_awq`), GGUF (:mod:`.gguf_file`) — checks
that it is the reference model quantized (:mod:`.compat`), and returns the same
:class:`~wkvlab.weights.apply.QuantizedWeights` that :func:`~wkvlab.weights.apply.quantize_model_weights`
builds: a copy of the reference with the checkpoint's (dequantized) tensors loaded and the
activation quantizers the checkpoint declares attached, so the runner treats it like any other
weight config. :mod:`.export` writes the project's own quantized weights in those formats.
"""
from __future__ import annotations

import copy
from pathlib import Path

import torch

from wkvlab.errors import ModelError
from wkvlab.weights.activations import attach_activation_quantizers
from wkvlab.weights.checkpoints.base import CheckpointContents
from wkvlab.weights.checkpoints.compat import check_architecture, check_shape, check_tensors, check_tokenizer, reference_tokenizer
from wkvlab.weights.spec import WeightSpec

DETECTED = ("compressed-tensors", "gptq", "awq", "gguf")


def read_checkpoint(path: Path, model: torch.nn.Module) -> CheckpointContents:
    """Detect the format of ``path`` and read it (tensors under the reference's parameter names)."""
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(f"{path} is a file but not .gguf; pass a checkpoint folder (config.json + safetensors) or a .gguf file")
        from wkvlab.weights.checkpoints.gguf_file import read_gguf

        return read_gguf(path, model)
    from wkvlab.weights.checkpoints.base import read_config

    config = read_config(path)
    qc = config.get("quantization_config")
    if qc is None and (path / "quantize_config.json").is_file():  # AutoGPTQ's older side file
        import json

        qc = json.loads((path / "quantize_config.json").read_text(encoding="utf-8"))
        qc.setdefault("quant_method", "gptq")
    method = (qc or {}).get("quant_method")
    if method == "compressed-tensors":
        from wkvlab.weights.checkpoints.compressed_tensors import read_compressed_tensors

        return read_compressed_tensors(path, config)
    if method in ("gptq", "awq"):
        from wkvlab.weights.checkpoints.gptq_awq import read_gptq_awq

        return read_gptq_awq(path, config, qc)
    found = f"quant_method {method!r}" if method else "no quantization_config"
    raise ModelError(f"{path}: config.json has {found}; wkvlab reads compressed-tensors, GPTQ and AWQ folders and .gguf files")


def _tied(model: torch.nn.Module) -> bool:
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    return head is not None and head.weight is emb.weight


@torch.no_grad()
def load_checkpoint(model: torch.nn.Module, spec: WeightSpec, tokenizer=None):
    """The candidate for ``checkpoint:<path>``: a copy of ``model`` holding the checkpoint's weights.

    ``tokenizer`` is the reference's; without it, the tokenizer saved next to the reference
    model (its ``name_or_path`` folder) is used when there is one.
    """
    from wkvlab.weights.apply import QuantizedWeights

    label = spec.label if spec.label != "none" else f"checkpoint:{spec.checkpoint}"
    path = Path(str(spec.checkpoint))
    if not path.exists():
        raise ModelError(f"checkpoint not found: {path}")
    contents = read_checkpoint(path, model)
    check_architecture(label, model.config.to_dict(), contents.config)
    note = check_tokenizer(label, contents, tokenizer if tokenizer is not None else reference_tokenizer(model))
    candidate = copy.deepcopy(model)
    names = contents.names()
    check_tensors(label, candidate, names, _tied(candidate))
    head_name, embedding_name = "lm_head.weight", "model.embed_tokens.weight"
    own_head = _tied(candidate) and head_name in names
    if own_head:  # the checkpoint stores a head: untied until it is known to equal the embedding
        head = candidate.get_output_embeddings()
        head.weight = torch.nn.Parameter(torch.empty_like(head.weight), requires_grad=False)
    state = candidate.state_dict()
    # one tensor at a time (a GGUF is dequantized as it is read): the candidate plus one tensor
    for name, value in contents.items():
        if name in state:
            check_shape(label, name, value, state[name])
            state[name].copy_(value)
        del value
    if own_head and embedding_name in names and torch.equal(head.weight, candidate.get_input_embeddings().weight):
        head.weight = candidate.get_input_embeddings().weight  # the same values: tied again, as the reference is
    reference = model.state_dict()
    lossless = all(torch.equal(reference[n], v) for n, v in candidate.state_dict().items() if n in reference) and not contents.activations
    attach_activation_quantizers(candidate, contents.activations)
    notes = [f"{label}: {contents.format}"] + contents.notes + ([note] if note else [])
    return QuantizedWeights(spec, candidate, contents.stored_bytes, lossless=lossless, notes=notes, activations=dict(contents.activations))


__all__ = ["DETECTED", "read_checkpoint", "load_checkpoint", "CheckpointContents"]
