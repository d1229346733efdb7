"""Write the project's own quantized weights as a real checkpoint: compressed-tensors, GPTQ or AWQ.

The model is quantized once more with :func:`~wkvlab.weights.apply.build_quantized` recording,
per linear, what fixes its grid: the weight just before round-to-nearest (RTN, AWQ, SmoothQuant:
scales and codes are recomputed from it with the same functions), or GPTQ's per-group scales and
zero points and its act-order permutation. Each grid is checked to dequantize bit-exactly to the
weights the simulation uses before anything is written, so an exported checkpoint read back with
``checkpoint:<folder>`` is the simulated configuration (scales are stored in the model's float32;
NVFP4 stores the reciprocal of the tensor scale, one float32 rounding away).
Files go to a temporary folder renamed at the end: an interrupted export leaves no half folder.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from wkvlab.errors import ConfigError
from wkvlab.formats import affine_qparams, affine_quantize, fp8_absmax_scale, fp8_dtype, nvfp4_global_scale, round_e2m1
from wkvlab.weights.checkpoints.base import FP4Grid, FP8Grid, Grid, IntGrid, default_g_idx, write_safetensors
from wkvlab.weights.spec import WeightSpec

EXPORT_FORMATS = ("compressed-tensors", "gptq", "awq")


@dataclass
class Exported:
    folder: Path
    format: str
    linears: int
    bytes: int
    notes: list[str]


def _int_grid_rtn(w: Tensor, spec: WeightSpec) -> IntGrid:
    if spec.zero_point == "float":
        raise ConfigError(f"{spec.label}: a float minimum (-fmin, llama.cpp style) has no place in these formats; use an integer zero point")
    rows, cols = w.shape
    group = None if spec.per_tensor or spec.group_size is None or spec.group_size >= cols else spec.group_size
    kw = dict(symmetric=spec.symmetric, zero_point="int")
    spans = [(0, cols)] if group is None or cols % group == 0 else [(0, cols - cols % group), (cols - cols % group, cols)]
    codes, scales, zeros = [], [], []
    for lo, hi in spans:
        part = w[:, lo:hi].float()
        g = group if (group is not None and (hi - lo) % group == 0) else None
        scale, zero = affine_qparams(part, spec.bits, group_size=g, per_tensor=spec.per_tensor, **kw)
        codes.append(affine_quantize(part, scale, zero, spec.bits, group_size=g, per_tensor=spec.per_tensor, **kw))
        scales.append(scale.reshape(-1, 1).expand(rows, -1) if spec.per_tensor else scale.reshape(rows, -1))
        zeros.append(zero.reshape(-1, 1).expand(rows, -1) if spec.per_tensor else zero.reshape(rows, -1))
    return _unsigned(torch.cat(codes, 1), torch.cat(scales, 1), torch.cat(zeros, 1), default_g_idx(cols, group), spec, group)


def _unsigned(codes: Tensor, scale: Tensor, zero: Tensor, g_idx: Tensor, spec: WeightSpec, group: int | None) -> IntGrid:
    offset = 1 << (spec.bits - 1)
    if spec.symmetric:  # signed codes, zero 0 -> unsigned codes around the zero point 2**(bits-1)
        codes, zero = codes + offset, torch.full_like(zero, offset)
    return IntGrid(codes.to(torch.int32), scale.contiguous(), zero.round().to(torch.int32), g_idx.to(torch.int32),
                   spec.bits, spec.symmetric, group)


def _int_grid_gptq(final: Tensor, kept: dict, spec: WeightSpec) -> IntGrid:
    rows, cols = final.shape
    group = spec.group_size if spec.group_size is not None and spec.group_size < cols else None
    scale = torch.cat([s.reshape(rows, 1) for s, _ in kept["params"]], dim=1)
    zero = torch.cat([z.reshape(rows, 1) for _, z in kept["params"]], dim=1)
    g_idx = kept["g_idx"].to(final.device)  # each input column's group, as gptq_quantize kept it
    s, z = scale[:, g_idx], zero[:, g_idx]
    q = torch.round(final.float() / torch.where(s == 0, torch.ones_like(s), s))
    if not spec.symmetric:
        q = q + z
    return _unsigned(q, scale, zero, g_idx, spec, group)


def _fp8_grid(w: Tensor, spec: WeightSpec) -> FP8Grid:
    scale = fp8_absmax_scale(w.float(), "e4m3", dim=None if spec.per_tensor else 1)
    codes = (w.float() / scale).clamp(-448.0, 448.0).to(fp8_dtype("e4m3"))
    return FP8Grid(codes, scale.reshape(-1, 1) if not spec.per_tensor else scale.reshape(1))


def _fp4_grid(w: Tensor) -> FP4Grid:
    blocks = w.float().reshape(w.shape[0], -1, 16)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    g = nvfp4_global_scale(blocks.abs().amax())
    block_scale = (amax / 6.0 / g).clamp(-448.0, 448.0).to(fp8_dtype("e4m3"))  # fake_quant_fp8 at scale 1
    block = block_scale.float() * g
    values = round_e2m1(blocks / torch.where(block > 0, block, torch.ones_like(block)))
    # compressed-tensors divides by a global scale 1 / g: one reciprocal rounding away from the simulation
    return FP4Grid(values.reshape(w.shape), block_scale.reshape(w.shape[0], -1), 1.0 / g)


def grid_for(kept: dict, final: Tensor, spec: WeightSpec, name: str) -> Grid:
    """The stored grid of one linear; raises unless it dequantizes exactly to ``final``."""
    if spec.format == "int":
        grid: Grid = _int_grid_gptq(final, kept, spec) if kept["method"] == "gptq" else _int_grid_rtn(kept["weight"], spec)
    elif spec.format == "fp8_e4m3":
        grid = _fp8_grid(kept["weight"], spec)
    elif spec.format == "nvfp4":
        grid = _fp4_grid(kept["weight"])
    else:
        raise ConfigError(f"{spec.label}: {spec.format} weights are not exported; export int, fp8 or nvfp4 configs")
    exact = torch.equal if not isinstance(grid, FP4Grid) else lambda a, b: torch.allclose(a, b, rtol=2e-7, atol=0)
    if not exact(grid.dequantize(), final.float()):
        raise ConfigError(f"{name}: the recovered {spec.format} grid does not reproduce the simulated weights; please report this")
    return grid


def export_grids(model: torch.nn.Module, spec: WeightSpec, calibration=None):
    """Quantize a copy of ``model`` and return (QuantizedWeights, {linear name: grid})."""
    from wkvlab.weights.apply import build_quantized, resolve_linears

    if spec.is_identity or spec.is_checkpoint or spec.method in ("cast", "llm-int8"):
        raise ConfigError(f"{spec.label} has nothing to export as a quantized checkpoint; use e.g. gptq-int4-g64, int8;a=int8, fp8 or nvfp4")
    if spec.quantize_embeddings or spec.quantize_lm_head:
        raise ConfigError("exported checkpoints keep embeddings and lm_head at model precision; drop ;emb / ;head")
    record: dict = {}
    built = build_quantized(model, spec, calibration, record=record)
    targets = resolve_linears(built.model, spec)
    grids = {name: grid_for(record[name], module.weight.data, sub, name) for name, (module, sub) in targets.items()}
    return built, grids


def _plain(model: torch.nn.Module, grids: dict[str, Grid]) -> dict[str, Tensor]:
    head, emb = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and head.weight is emb.weight
    skip = {f"{n}.weight" for n in grids} | ({"lm_head.weight"} if tied else set())
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k not in skip}


def write_checkpoint(model: torch.nn.Module, tokenizer, spec: WeightSpec, fmt: str, out: Path, calibration=None) -> Exported:
    """Quantize ``model`` with ``spec`` and write it to ``out`` as ``fmt`` (one of :data:`EXPORT_FORMATS`)."""
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"unknown checkpoint format {fmt!r}; use one of {', '.join(EXPORT_FORMATS)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out} exists and is not empty; choose a new folder for the checkpoint")
    built, grids = export_grids(model, spec, calibration)
    if fmt == "compressed-tensors":
        from wkvlab.weights.checkpoints.compressed_tensors import compressed_tensors_files

        linears = [n for n, m in built.model.named_modules() if isinstance(m, torch.nn.Linear)]
        tensors, qc = compressed_tensors_files(grids, built.activations, linears)
    else:
        if built.activations or any(not isinstance(g, IntGrid) for g in grids.values()):
            raise ConfigError(f"{fmt} checkpoints hold integer weights with 16-bit activations; {spec.label} is not one (use compressed-tensors)")
        from wkvlab.weights.checkpoints.gptq_awq import awq_files, gptq_files

        tensors, qc = (gptq_files if fmt == "gptq" else awq_files)(grids)  # type: ignore[arg-type]
    config = {k: v for k, v in built.model.config.to_dict().items() if k != "quantization_config"}
    config["quantization_config"] = qc
    tensors = {**_plain(built.model, grids), **tensors}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        write_safetensors(tmp, tensors, config)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return Exported(out, fmt, len(grids), nbytes, list(built.notes))
