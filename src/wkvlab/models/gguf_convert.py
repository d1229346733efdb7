"""A GGUF file converted to a safetensors model folder one tensor at a time.

transformers' GGUF loader dequantizes every tensor into a dictionary, builds the model and copies
the dictionary into it, and ``save_pretrained`` then writes the model: the whole model two or
three times in float32 at once, plus gguf-py's block arithmetic over a whole tensor (the Q4_K /
Q6_K kernels make several float32 arrays of the tensor's size; Gemma 3's 262k × 640 embedding is
168M values). SmolLM2-135M peaked at 1.20 GiB RSS for 0.50 GiB of weights, Gemma-3-270M at
14.8 GiB for 1.1 GiB (issue 40).

Here the names, shapes and order come first, from the architecture built on ``meta`` and
transformers' own GGUF → Hugging Face name map and tensor processors (the same values as its
loader: tested bit for bit). Then each tensor is read from the memory-mapped file, dequantized in
row slices into one float32 array, processed, written (:func:`wkvlab.tensorfile.write_tensors`)
and dropped. What is alive beyond the interpreter is one tensor, its processed copy and one
slice's intermediates; the model is loaded afterwards from the written file.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from wkvlab.errors import ModelError
from wkvlab.tensorfile import write_tensors

SLICE_BYTES = 32 << 20  # float32 output dequantized per gguf-py call: its block arithmetic holds a few arrays this size


def dequantize_rows(tensor) -> np.ndarray:
    """A GGUF tensor as float32 (its numpy shape: rows last), dequantized ``SLICE_BYTES`` of rows at a time."""
    from gguf import GGMLQuantizationType, dequantize
    from gguf.constants import GGML_QUANT_SIZES

    qtype, data = tensor.tensor_type, tensor.data
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16):
        return np.array(dequantize(data, qtype), dtype=np.float32)  # a writable copy, not the file's mapping
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    rows = data.reshape(-1, data.shape[-1])
    columns = rows.shape[1] // block_bytes * block
    out = np.empty((rows.shape[0], columns), dtype=np.float32)
    step = max(1, SLICE_BYTES // (columns * 4))
    for start in range(0, rows.shape[0], step):
        out[start:start + step] = dequantize(rows[start:start + step], qtype)
    return out.reshape(*data.shape[:-1], columns)


def _processor(path: Path, parsed: dict | None = None):
    """transformers' tensor processor for this file's architecture, given the config its loader parses
    (``parsed``: what ``load_gguf_checkpoint(return_tensors=False)`` gave, if the caller has it)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, load_gguf_checkpoint

    parsed = parsed if parsed is not None else load_gguf_checkpoint(str(path), return_tensors=False)
    from gguf import GGUFReader

    architecture = GGUFReader(str(path)).fields["general.architecture"]
    architecture = bytes(architecture.parts[architecture.data[0]]).decode()
    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])


def file_tensors(path: Path, model: torch.nn.Module, dtype: torch.dtype, parsed: dict | None = None
                 ) -> tuple[list[str], Callable[[], Iterator[tuple[str, torch.Tensor]]]]:
    """The names of ``model``'s tensors the file fills (in file order), and a function that yields
    them as ``(name, tensor)`` one at a time — transformers' names and values, each dequantized,
    processed and handed over before the next is read (a GGUF used as a weight checkpoint)."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    processor = _processor(path, parsed)
    mapping = get_gguf_hf_weights_map(model, processor)
    names = list(_targets(GGUFReader(str(path)), mapping))
    return names, lambda: _converted(GGUFReader(str(path)), processor, mapping, dtype)


def _targets(reader, mapping: dict[str, str]) -> dict[str, list[int]]:
    """Each Hugging Face tensor the file fills, in the order its last source tensor comes, with the
    indices of the file's tensors that fill it (two for an MoE gate/up pair, else one)."""
    sources: dict[str, list[int]] = {}
    for index, tensor in enumerate(reader.tensors):
        stem = re.sub(r"\.(weight|bias)$", "", tensor.name)
        target = mapping.get(tensor.name) or mapping.get(stem)
        if target is not None:
            sources.setdefault(target, []).append(index)
    return dict(sorted(sources.items(), key=lambda item: item[1][-1]))


def _converted(reader, processor, mapping: dict[str, str], dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` as the file's tensors are read: what transformers' loader puts in its state
    dict (processor first; an MoE processor's merged tensor once its last part is in)."""
    targets = _targets(reader, mapping)
    last = {indices[-1]: name for name, indices in targets.items()}
    state: dict = {"tensors": {}}
    for index, tensor in enumerate(reader.tensors):
        result = processor.process(weights=dequantize_rows(tensor), name=tensor.name, tensor_key_mapping=mapping, parsed_parameters=state)
        if result.name is not None and result.name in mapping:
            yield mapping[result.name], torch.from_numpy(np.ascontiguousarray(result.weights)).to(dtype)
        del result
        if index in last and last[index] in state["tensors"]:
            yield last[index], state["tensors"].pop(last[index]).to(dtype)


def _stream(produced: Iterator[tuple[str, torch.Tensor]]) -> Callable[[str], torch.Tensor]:
    """``tensor(name)`` for :func:`write_tensors`, pulling from ``produced`` in its order."""
    waiting: dict[str, torch.Tensor] = {}

    def tensor(name: str) -> torch.Tensor:
        while name not in waiting:
            try:
                key, value = next(produced)
            except StopIteration:
                raise ModelError(f"the GGUF file has no tensor for {name}") from None
            waiting[key] = value
        return waiting.pop(name)

    return tensor


def convert_gguf(path: Path, target: Path, dtype: torch.dtype) -> None:
    """Write ``path`` as a Hugging Face folder in ``target`` (config, generation config, tokenizer,
    ``model.safetensors`` in ``dtype``), holding one tensor at a time."""
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    from wkvlab.models.loading import _meta_model, model_class

    folder, name = str(path.parent), path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    meta = _meta_model(model_class(config), config, dtype)
    processor = _processor(path)
    mapping = get_gguf_hf_weights_map(meta, processor)
    reader = GGUFReader(str(path))
    expected = meta.state_dict()
    shapes = {}
    for hf_name in _targets(reader, mapping):
        if hf_name not in expected:
            raise ModelError(f"{path.name}: tensor {hf_name} is not part of {type(meta).__name__}")
        shapes[hf_name] = (tuple(expected[hf_name].shape), dtype)
    target.mkdir(parents=True, exist_ok=True)
    try:
        write_tensors(target / "model.safetensors", shapes, _stream(_converted(reader, processor, mapping, dtype)), {"format": "pt"})
    except ValueError as exc:  # a processed tensor whose shape is not the architecture's
        raise ModelError(f"{path.name} could not be converted ({exc})") from None
    del reader
    config.architectures = [type(meta).__name__]
    config.dtype = dtype
    config.save_pretrained(str(target))
    if meta.can_generate():
        GenerationConfig.from_model_config(config).save_pretrained(str(target))
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(str(target))
    (target / "wkvlab-source.json").write_text(json.dumps({"complete": True}))
