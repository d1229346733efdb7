"""What every checkpoint reader returns, the stored grids every writer takes, and shared file I/O.

A reader turns a quantized checkpoint into :class:`CheckpointContents`: float32 tensors under the
reference model's parameter names (quantized linears dequantized, everything else as stored, e.g.
bf16 norms), the activation rule of each linear the checkpoint declares, and what it detected.
A writer takes, per linear, the grid the weights are stored on — :class:`IntGrid` (integer codes,
scales, zero points, ``g_idx``), :class:`FP8Grid` or :class:`FP4Grid` — and packs it the way the
format's own tools do; :func:`IntGrid.dequantize` is the one definition of what those numbers mean.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import Tensor

from wkvlab.errors import ModelError
from wkvlab.weights.activations import ActivationQuant


@dataclass
class CheckpointContents:
    """A checkpoint read back: dequantized tensors, activation rules and facts about it."""

    format: str  # what was detected, e.g. "compressed-tensors pack-quantized (int4, group 64, symmetric)"
    tensors: dict[str, Tensor]  # parameter name -> float32 tensor (empty when ``streamed``)
    activations: dict[str, ActivationQuant] = field(default_factory=dict)  # linear name -> input quantization
    stored_bytes: int = 0  # bytes of all tensors as stored in the checkpoint
    config: dict = field(default_factory=dict)  # the architecture fields it declares (config.json)
    vocabulary: list[str] | None = None  # GGUF: the token strings it carries
    tokenizer_dir: Path | None = None  # a folder with tokenizer files, when it ships them
    notes: list[str] = field(default_factory=list)
    # instead of ``tensors``: their names, and a function yielding ``(name, tensor)`` one at a time
    # (a GGUF: each dequantized when it is read, so the whole checkpoint is never in memory at once)
    streamed: tuple[list[str], Callable[[], Iterator[tuple[str, Tensor]]]] | None = None

    def names(self) -> set[str]:
        return set(self.streamed[0]) if self.streamed is not None else set(self.tensors)

    def items(self) -> Iterator[tuple[str, Tensor]]:
        return self.streamed[1]() if self.streamed is not None else iter(self.tensors.items())


@dataclass
class IntGrid:
    """Integer weights as stored: ``w[:, i] = (codes[:, i] - zero[:, g_idx[i]]) * scale[:, g_idx[i]]``.

    ``codes`` and ``zero`` are unsigned (``0 .. 2**bits - 1``; a symmetric grid has zero
    ``2**(bits-1)``), ``scale`` is ``[rows, groups]`` in the dtype it is stored in, ``g_idx`` the
    group of each input column (``i // group_size`` unless act-order permuted the columns).
    """

    codes: Tensor  # int32 [rows, cols]
    scale: Tensor  # [rows, groups]
    zero: Tensor  # int32 [rows, groups]
    g_idx: Tensor  # int32 [cols]
    bits: int
    symmetric: bool
    group_size: int | None  # None: one group per row

    def dequantize(self) -> Tensor:
        """Computed in the scale's dtype, as compressed-tensors' ``_dequantize`` and AutoGPTQ do; float32 out."""
        index = self.g_idx.long()
        scale = self.scale[:, index]
        zero = self.zero[:, index].to(scale.dtype)
        return ((self.codes.to(scale.dtype) - zero) * scale).float()

    @property
    def ordered(self) -> bool:
        """True when ``g_idx`` is the plain ``i // group_size`` (no act-order permutation)."""
        return torch.equal(self.g_idx.long(), default_g_idx(self.codes.shape[1], self.group_size))


@dataclass
class FP8Grid:
    """FP8 E4M3 weights: ``w = codes.float() * scale`` (scale ``[rows, 1]`` or ``[1]``)."""

    codes: Tensor  # float8_e4m3fn [rows, cols]
    scale: Tensor  # float32

    def dequantize(self) -> Tensor:
        return self.codes.float() * self.scale.float()


@dataclass
class FP4Grid:
    """NVFP4 weights: E2M1 ``values``, E4M3 ``block_scale`` per 16 columns, fp32 ``global_scale``.

    ``w = values · (block_scale / global_scale)``, compressed-tensors' ``_dequantize`` with its
    ``weight_global_scale`` (``6 · 448 / amax``: wkvlab's and modelopt's tensor scale inverted).
    """

    values: Tensor  # float32 E2M1 values [rows, cols]
    block_scale: Tensor  # float8_e4m3fn [rows, cols / 16]
    global_scale: Tensor  # float32 scalar

    def dequantize(self) -> Tensor:
        per_column = self.block_scale.float().repeat_interleave(16, dim=1) / self.global_scale.float()
        return self.values.float() * per_column


Grid = IntGrid | FP8Grid | FP4Grid


def default_g_idx(columns: int, group_size: int | None) -> Tensor:
    step = columns if group_size is None else group_size
    return torch.arange(columns) // step


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelError(f"{folder} has no config.json; a checkpoint folder needs the model's config next to its weights")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno})") from None


def read_safetensors(folder: Path) -> tuple[dict[str, Tensor], int]:
    """Every tensor of every ``*.safetensors`` file in ``folder`` (shards included) and their stored bytes."""
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{folder} holds no .safetensors file; wkvlab reads safetensors checkpoints (or a .gguf file)")
    tensors: dict[str, Tensor] = {}
    for path in files:
        try:
            tensors.update(load_file(str(path)))
        except Exception as exc:  # safetensors raises its own error types for truncated or foreign files
            raise ModelError(f"{path} could not be read as safetensors ({type(exc).__name__}: {str(exc)[:120]})") from None
    return tensors, sum(t.numel() * t.element_size() for t in tensors.values())


def write_safetensors(folder: Path, tensors: dict[str, Tensor], config: dict) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def plain_tensors(tensors: dict[str, Tensor], quantized: set[str], suffixes: tuple[str, ...]) -> dict[str, Tensor]:
    """Tensors that belong to no quantized linear, converted to float32."""
    out = {}
    for name, value in tensors.items():
        owner, _, leaf = name.rpartition(".")
        if owner in quantized and leaf in suffixes:
            continue
        if value.is_floating_point():
            out[name] = value.float()
    return out
