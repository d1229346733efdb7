"""GPTQ (AutoGPTQ / GPTQModel) and AutoAWQ checkpoints: read and write ``qweight/qzeros/scales/g_idx``.

GPTQ, as AutoGPTQ's ``QuantLinear.pack`` (auto_gptq/nn_modules/qlinear/qlinear_cuda_old.py at
AutoGPTQ/AutoGPTQ c80855e2) lays it out:

* ``qweight`` int32 ``[in · bits / 32, out]``: input rows ``8r .. 8r+7`` (4-bit) of the transposed
  codes in word ``r``, row ``j`` at bits ``bits · (j − 8r)``;
* ``qzeros`` int32 ``[groups, out · bits / 32]``: zero points packed the same way along the output
  axis; ``scales`` fp16 ``[groups, out]``; ``g_idx`` int32 ``[in]``, the group of each input column
  (``i // group_size``, or permuted groups with ``desc_act``); ``w[o, i] = scales[g, o] · (q − z)``.
* The zero-point convention: ``checkpoint_format: gptq`` (v1, AutoGPTQ and most published files)
  stores ``z − 1`` (``pack`` subtracts 1, the kernels add it back — the "+1" of older AutoGPTQ);
  GPTQModel's ``gptq_v2`` stores ``z``. Reading v1 adds 1 per nibble, masked to ``bits``, as
  AutoGPTQ's torch path does (GPTQModel's ``convert_gptq_v1_to_v2_format_module`` adds
  ``0x11111111`` to the whole word, which differs only for a stored nibble of 15 — a zero point
  of 0 that v1 cannot store without corrupting its neighbours; the writer switches to v2 then).
  Symmetric GPTQ stores the zero point ``2**(bits-1)``.

AWQ, as AutoAWQ's GEMM layout (awq/utils/packing_utils.py at casper-hansen/AutoAWQ 958d6048):
``qweight`` int32 ``[in, out · bits / 32]`` and ``qzeros`` ``[groups, out · bits / 32]`` packed
along the output axis in the interleaved order ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``, no zero
offset; ``scales`` fp16 ``[groups, out]``; ``w[o, i] = (q − z) · s``. Only ``version: gemm``.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from wkvlab.errors import ModelError
from wkvlab.weights.checkpoints.base import CheckpointContents, IntGrid, default_g_idx, plain_tensors, read_safetensors

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
_SUFFIXES = ("qweight", "qzeros", "scales", "g_idx")


def _pack_rows(values: Tensor, bits: int) -> Tensor:
    """Pack ``[n, m]`` unsigned values along dim 0, ``32 // bits`` per int32 word (AutoGPTQ's qweight)."""
    per = 32 // bits
    v = values.to(torch.int64).reshape(-1, per, values.shape[1])
    shifts = (torch.arange(per) * bits)[None, :, None]
    word = (v << shifts).sum(dim=1)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)


def _unpack_rows(packed: Tensor, bits: int) -> Tensor:
    per = 32 // bits
    shifts = (torch.arange(per) * bits)[None, :, None]
    v = ((packed.to(torch.int64) & 0xFFFFFFFF)[:, None, :] >> shifts) & ((1 << bits) - 1)
    return v.reshape(-1, packed.shape[1])


def _pack_cols(values: Tensor, bits: int) -> Tensor:
    return _pack_rows(values.T.contiguous(), bits).T.contiguous()


def _unpack_cols(packed: Tensor, bits: int) -> Tensor:
    return _unpack_rows(packed.T.contiguous(), bits).T.contiguous()


def _check_bits(bits: int, what: str) -> None:
    if bits not in (2, 4, 8):
        raise ModelError(f"{what}: {bits}-bit packing is not read by wkvlab (2, 4 and 8 bits are; 3-bit GPTQ straddles words)")


def gptq_grid(t: dict[str, Tensor], name: str, bits: int, v1: bool, symmetric: bool) -> IntGrid:
    codes = _unpack_rows(t[f"{name}.qweight"], bits).T  # [out, in]
    zeros = _unpack_cols(t[f"{name}.qzeros"], bits)  # [groups, out]
    if v1:
        zeros = (zeros + 1) & ((1 << bits) - 1)
    scales = t[f"{name}.scales"]
    columns = codes.shape[1]
    g_idx = t.get(f"{name}.g_idx")
    groups = scales.shape[0]
    group_size = None if groups == 1 else -(-columns // groups)
    g_idx = default_g_idx(columns, group_size) if g_idx is None else g_idx
    return IntGrid(codes.to(torch.int32), scales.T, zeros.T.to(torch.int32), g_idx.to(torch.int32), bits, symmetric, group_size)


def awq_grid(t: dict[str, Tensor], name: str, bits: int) -> IntGrid:
    per = 32 // bits
    order = torch.tensor(AWQ_ORDER[:per]) if per == 8 else torch.arange(per)
    inverse = torch.argsort(order)

    def unpack(packed: Tensor) -> Tensor:
        v = _unpack_cols(packed, bits)  # position k of each word holds output column order[k]
        return v.reshape(v.shape[0], -1, per)[:, :, inverse].reshape(v.shape[0], -1)

    codes = unpack(t[f"{name}.qweight"]).T  # [out, in]
    zeros = unpack(t[f"{name}.qzeros"])  # [groups, out]
    scales = t[f"{name}.scales"]
    columns, groups = codes.shape[1], scales.shape[0]
    group_size = None if groups == 1 else columns // groups
    return IntGrid(codes.to(torch.int32), scales.T, zeros.T.to(torch.int32), default_g_idx(columns, group_size).to(torch.int32),
                   bits, False, group_size)


def read_gptq_awq(folder: Path, config: dict, qc: dict) -> CheckpointContents:
    method = qc.get("quant_method")
    bits = int(qc.get("bits", qc.get("w_bit", 4)))
    _check_bits(bits, method)
    stored, nbytes = read_safetensors(folder)
    names = sorted(k[: -len(".qweight")] for k in stored if k.endswith(".qweight"))
    if not names:
        raise ModelError(f"{folder}: config.json says {method} but no tensor is named *.qweight")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise ModelError(f"AWQ version {version!r} is not read by wkvlab; it reads AutoAWQ's GEMM layout")
        grids = {n: awq_grid(stored, n, bits) for n in names}
        text = f"AutoAWQ GEMM (int{bits}, group {qc.get('group_size', qc.get('q_group_size'))}, zero point)"
    else:
        fmt = str(qc.get("checkpoint_format", "gptq"))
        if fmt not in ("gptq", "gptq_v2"):
            raise ModelError(f"GPTQ checkpoint_format {fmt!r} is not read by wkvlab; it reads gptq (v1) and gptq_v2")
        symmetric = bool(qc.get("sym", True))
        grids = {n: gptq_grid(stored, n, bits, fmt == "gptq", symmetric) for n in names}
        text = (f"GPTQ {fmt} (int{bits}, group {qc.get('group_size')}, {'symmetric' if symmetric else 'asymmetric'}, "
                f"desc_act {bool(qc.get('desc_act', False))})")
    tensors = plain_tensors(stored, set(names), _SUFFIXES)
    for name, grid in grids.items():
        tensors[f"{name}.weight"] = grid.dequantize()
    return CheckpointContents(f"{text} × {len(names)}", tensors, {}, nbytes, config, tokenizer_dir=folder)


def gptq_files(grids: dict[str, IntGrid]) -> tuple[dict[str, Tensor], dict]:
    """AutoGPTQ tensors (v1 unless a zero point is 0, then GPTQModel's v2) and their quantization_config."""
    first = next(iter(grids.values()))
    v1 = all(bool((g.zero > 0).all()) for g in grids.values())
    tensors: dict[str, Tensor] = {}
    for name, grid in grids.items():
        _check_bits(grid.bits, "GPTQ")
        if grid.codes.shape[1] % (32 // grid.bits):
            raise ModelError(f"GPTQ packs {32 // grid.bits} input columns per word; {name} has {grid.codes.shape[1]}")
        zeros = grid.zero.T - (1 if v1 else 0)
        tensors[f"{name}.qweight"] = _pack_rows(grid.codes.T, grid.bits)
        tensors[f"{name}.qzeros"] = _pack_cols(zeros, grid.bits)
        tensors[f"{name}.scales"] = grid.scale.T.contiguous()
        tensors[f"{name}.g_idx"] = grid.g_idx.to(torch.int32)
    config = {"quant_method": "gptq", "bits": first.bits, "group_size": first.group_size or -1,
              "desc_act": not all(g.ordered for g in grids.values()), "sym": first.symmetric, "static_groups": False,
              "true_sequential": True, "checkpoint_format": "gptq" if v1 else "gptq_v2", "damp_percent": 0.01}
    return tensors, config


def awq_files(grids: dict[str, IntGrid]) -> tuple[dict[str, Tensor], dict]:
    """AutoAWQ GEMM tensors and their quantization_config."""
    first = next(iter(grids.values()))
    tensors: dict[str, Tensor] = {}
    for name, grid in grids.items():
        if grid.bits != 4:
            raise ModelError("AutoAWQ's GEMM layout holds 4-bit weights only")
        columns = grid.codes.shape[1]
        if not grid.ordered or (grid.group_size and columns % grid.group_size):
            raise ModelError(f"AutoAWQ needs groups that divide the input width in order: {name} has {columns} columns, "
                             f"groups of {grid.group_size}; use a group size that divides it (e.g. 64 or 32)")
        order = torch.tensor(AWQ_ORDER)

        def pack(values: Tensor) -> Tensor:  # values [n, out]: word k holds output columns order[k]
            v = values.reshape(values.shape[0], -1, 8)[:, :, order].reshape(values.shape[0], -1)
            return _pack_cols(v, 4)

        tensors[f"{name}.qweight"] = pack(grid.codes.T)
        tensors[f"{name}.qzeros"] = pack(grid.zero.T)
        tensors[f"{name}.scales"] = grid.scale.T.contiguous()
    config = {"quant_method": "awq", "bits": 4, "group_size": first.group_size or -1, "zero_point": True, "version": "gemm",
              "modules_to_not_convert": None}
    return tensors, config
