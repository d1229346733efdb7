"""compressed-tensors checkpoints (llm-compressor's output, vLLM's input): read and write.

Follows compressed-tensors 0.19.0 — the release llm-compressor 0.14.0.1 pins — whose files were
read from the PyPI wheel and from vllm-project/compressed-tensors at commit ac8e2ba8 (identical
``compressors/pack_quantized/helpers.py``):

* ``config.json`` → ``quantization_config``: ``quant_method: compressed-tensors``, ``format``
  (global, or per config group), ``config_groups`` of ``{targets, weights, input_activations}``
  argument dicts, ``ignore``; ``quantization_status: compressed``.
* ``pack-quantized`` (``PackedQuantizationCompressor``): ``weight_packed`` int32, element ``i``
  of a row at bits ``i·b`` (``pack_to_int32``: signed codes + ``2**(b-1)``, dense, little end
  first); ``weight_shape``; ``weight_scale`` ``[rows, groups]``; asymmetric grids add
  ``weight_zero_point`` packed the same way along dim 0; act-order ``group`` adds ``weight_g_idx``.
* ``int-quantized`` / ``naive-quantized``: int8 ``weight`` + ``weight_scale`` (+ zero point);
  ``float-quantized``: float8_e4m3fn ``weight`` + ``weight_scale``; ``dense``: plain weights.
* ``nvfp4-pack-quantized`` (``NVFP4PackedCompressor``): ``weight_packed`` uint8, two E2M1 codes
  per byte, low nibble first (``pack_fp4_to_uint8``), ``weight_scale`` float8_e4m3fn per 16,
  ``weight_global_scale`` fp32 (value = code · scale / global_scale).
* Dequantization is ``(q - zp) · scale`` in the scale's dtype (``_dequantize``), groups of
  ``group_size`` columns (``_process_group``; columns must divide), ``g_idx`` picks the group of
  each column. NVFP4 is dequantized in float32 (the library's ``decompress`` rounds the product
  to bf16; the FP4 GEMM applies the scales to its fp32 accumulator).

Activations follow the config group's ``input_activations``, as the engine runs them: INT8/FP8
``dynamic`` per token (vLLM's ``scaled_int8_quant``/``scaled_fp8_quant``: absmax / 127 or / 448 per
token), static per tensor with the stored ``input_scale``, NVFP4 blocks of 16 with the stored
``input_global_scale`` (wkvlab's tensor scale is its reciprocal).
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import Tensor

from wkvlab.errors import ModelError
from wkvlab.weights.activations import ActivationQuant
from wkvlab.weights.checkpoints.base import CheckpointContents, FP4Grid, FP8Grid, Grid, IntGrid, default_g_idx, plain_tensors, read_safetensors

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_SUFFIXES = ("weight", "weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "weight_g_idx",
             "weight_global_scale", "input_scale", "input_zero_point", "input_global_scale")
FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized", "nvfp4-pack-quantized", "dense")


def pack_int32(values: Tensor, bits: int, dim: int = 1) -> Tensor:
    """compressed-tensors' ``pack_to_int32``: unsigned ``bits``-bit values, element i at bit i·bits of its row."""
    v = values.to(torch.int64)
    if dim == 0:
        v = v.T
    rows, cols = v.shape
    words = -(-cols * bits // 32)
    out = torch.zeros(rows, words + 1, dtype=torch.int64)
    for i in range(cols):  # bit positions are the same for every row: a loop over columns only
        start = i * bits
        word, offset = divmod(start, 32)
        out[:, word] |= (v[:, i] << offset) & 0xFFFFFFFF
        if offset + bits > 32:
            out[:, word + 1] |= v[:, i] >> (32 - offset)
    packed = out[:, :words].to(torch.int64)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.T.contiguous() if dim == 0 else packed


def unpack_int32(packed: Tensor, bits: int, count: int, dim: int = 1) -> Tensor:
    """Inverse of :func:`pack_int32`: ``count`` unsigned values per row (per column with ``dim=0``)."""
    p = packed.to(torch.int64) & 0xFFFFFFFF
    if dim == 0:
        p = p.T
    p = torch.cat([p, torch.zeros(p.shape[0], 1, dtype=torch.int64)], dim=1)
    start = torch.arange(count) * bits
    word, offset = start // 32, start % 32
    joined = p[:, word] | (p[:, word + 1] << 32)  # 64 bits hold any value that straddles two words
    values = (joined >> offset) & ((1 << bits) - 1)
    return values.T.contiguous() if dim == 0 else values


def _matches(name: str, target: str) -> bool:
    if target == "Linear":
        return True
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


def _scheme_of(name: str, groups: dict) -> dict:
    for group in groups.values():
        if any(_matches(name, t) for t in group.get("targets", [])):
            return group
    raise ModelError(f"compressed-tensors: {name} is stored quantized but no config group targets it; the checkpoint's config.json is inconsistent")


def activation_rule(args: dict | None, stored: dict[str, Tensor], name: str) -> ActivationQuant | None:
    """The engine-side input quantization an ``input_activations`` dict declares."""
    if not args:
        return None
    kind, bits, strategy, dynamic = args.get("type"), args.get("num_bits"), args.get("strategy"), args.get("dynamic")
    if not args.get("symmetric", True):
        raise ModelError(f"compressed-tensors: {name} declares asymmetric input activations, which wkvlab does not simulate")
    if (kind, bits) in (("int", 8), ("float", 8)):
        prefix = "int8" if kind == "int" else "fp8"
        if dynamic is True and strategy == "token":
            return ActivationQuant(kind=f"{prefix}-token")
        if dynamic is False and strategy == "tensor":
            return ActivationQuant(kind=f"{prefix}-tensor", scale=float(stored[f"{name}.input_scale"].float().reshape(-1)[0]))
    if (kind, bits, strategy) == ("float", 4, "tensor_group") and args.get("group_size") == 16:
        glob = float(stored[f"{name}.input_global_scale"].float().reshape(-1)[0])
        return ActivationQuant(kind="nvfp4", scale=1.0 / glob)
    raise ModelError(f"compressed-tensors: input activations {kind}{bits} {strategy} dynamic={dynamic} of {name} are not simulated; "
                     "wkvlab reads int8/fp8 per token or per tensor and NVFP4 (tensor_group 16)")


def _int_grid(t: dict[str, Tensor], name: str, args: dict, fmt: str) -> IntGrid:
    bits, symmetric = int(args["num_bits"]), bool(args.get("symmetric", True))
    offset = 1 << (bits - 1)
    scale = t[f"{name}.weight_scale"]
    if fmt == "pack-quantized":
        rows, cols = (int(v) for v in t[f"{name}.weight_shape"].tolist())
        codes = unpack_int32(t[f"{name}.weight_packed"], bits, cols)
        zp = t.get(f"{name}.weight_zero_point")
        zero = unpack_int32(zp, bits, rows, dim=0) if zp is not None and zp.dtype == torch.int32 and not symmetric else None
    else:
        codes = t[f"{name}.weight"].to(torch.int64) + offset
        rows, cols = codes.shape
        zp = t.get(f"{name}.weight_zero_point")
        zero = zp.to(torch.int64) + offset if zp is not None and not symmetric else None
    scale = scale.reshape(rows, -1) if scale.numel() > 1 else scale.reshape(1, 1).expand(rows, 1)
    zero = torch.full(scale.shape, offset, dtype=torch.int64) if zero is None else zero.reshape(rows, -1)
    groups = scale.shape[1]
    group_size = None if groups == 1 else cols // groups
    if group_size is not None and cols % groups:
        raise ModelError(f"compressed-tensors: {name} has {cols} columns in {groups} groups; groups must divide the columns")
    g_idx = t.get(f"{name}.weight_g_idx")
    g_idx = default_g_idx(cols, group_size) if g_idx is None or bool((g_idx < 0).any()) else g_idx
    return IntGrid(codes.to(torch.int32), scale, zero.to(torch.int32), g_idx.to(torch.int32), bits, symmetric, group_size)


def _fp4_grid(t: dict[str, Tensor], name: str) -> FP4Grid:
    packed = t[f"{name}.weight_packed"]
    low, high = packed & 0x0F, packed >> 4
    nibbles = torch.stack((low, high), dim=-1).reshape(packed.shape[0], -1).long()
    values = E2M1_VALUES[nibbles & 7] * torch.where(nibbles & 8 > 0, -1.0, 1.0)
    return FP4Grid(values, t[f"{name}.weight_scale"], t[f"{name}.weight_global_scale"].float().reshape(()))


def grid_of(t: dict[str, Tensor], name: str, args: dict, fmt: str) -> Grid | None:
    """The stored grid of one linear (None for ``dense``: the weight is stored as it is)."""
    if fmt in ("pack-quantized", "int-quantized", "naive-quantized"):
        if args.get("type") != "int":
            raise ModelError(f"compressed-tensors: {fmt} holds integer weights but {name} declares {args.get('type')}")
        return _int_grid(t, name, args, fmt)
    if fmt == "float-quantized":
        scale = t[f"{name}.weight_scale"].float()
        return FP8Grid(t[f"{name}.weight"], scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(1))
    if fmt == "nvfp4-pack-quantized":
        return _fp4_grid(t, name)
    return None


def _describe(fmt: str, args: dict, act: ActivationQuant | None) -> str:
    kind = f"{args.get('type')}{args.get('num_bits')}"
    layout = f"group {args['group_size']}" if args.get("strategy") in ("group", "tensor_group") else str(args.get("strategy"))
    sym = "symmetric" if args.get("symmetric", True) else "asymmetric"
    order = f", act-order {args['actorder']}" if args.get("actorder") else ""
    acts = f", activations {act.kind}" if act is not None else ", 16-bit activations"
    return f"compressed-tensors {fmt} ({kind} {layout} {sym}{order}{acts})"


def read_compressed_tensors(folder: Path, config: dict) -> CheckpointContents:
    qc = config["quantization_config"]
    status = qc.get("quantization_status", "compressed")
    if status not in ("compressed", "frozen"):
        raise ModelError(f"compressed-tensors: quantization_status {status!r} is not a saved checkpoint; save it compressed")
    groups = qc.get("config_groups") or {}
    stored, nbytes = read_safetensors(folder)
    names = sorted({k.rsplit(".", 1)[0] for k in stored if k.endswith((".weight_scale", ".weight_packed"))})
    tensors = plain_tensors(stored, set(names), _SUFFIXES)
    activations: dict[str, ActivationQuant] = {}
    described: dict[str, int] = {}
    for name in names:
        scheme = _scheme_of(name, groups)
        fmt = scheme.get("format") or qc.get("format")
        if fmt not in FORMATS:
            raise ModelError(f"compressed-tensors format {fmt!r} of {name} is not read by wkvlab; it reads {', '.join(FORMATS)}")
        grid = grid_of(stored, name, scheme["weights"], fmt)
        tensors[f"{name}.weight"] = stored[f"{name}.weight"].float() if grid is None else grid.dequantize()
        act = activation_rule(scheme.get("input_activations"), stored, name)
        if act is not None:
            activations[name] = act
        text = _describe(fmt, scheme["weights"], act)
        described[text] = described.get(text, 0) + 1
    if not names:
        raise ModelError(f"{folder}: config.json says compressed-tensors but no tensor is stored quantized")
    summary = "; ".join(f"{text} × {count}" for text, count in described.items())
    return CheckpointContents(summary, tensors, activations, nbytes, config, tokenizer_dir=folder)


# ---------------------------------------------------------------- writing

def _weight_args(grid: Grid) -> dict:
    base = {"block_structure": None, "dynamic": False, "observer": "minmax", "observer_kwargs": {}, "actorder": None}
    if isinstance(grid, IntGrid):
        strategy = "channel" if grid.group_size is None else "group"
        actorder = None if grid.ordered else "group"
        return {**base, "num_bits": grid.bits, "type": "int", "symmetric": grid.symmetric, "group_size": grid.group_size,
                "strategy": strategy, "actorder": actorder}
    if isinstance(grid, FP8Grid):
        return {**base, "num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
                "strategy": "tensor" if grid.scale.numel() == 1 else "channel"}
    return {**base, "num_bits": 4, "type": "float", "symmetric": True, "group_size": 16, "strategy": "tensor_group"}


def _input_args(act: ActivationQuant | None) -> dict | None:
    if act is None or act.kind == "none":
        return None
    base = {"symmetric": True, "group_size": None, "block_structure": None, "observer": None, "observer_kwargs": {}, "actorder": None}
    table = {"int8-token": ("int", 8, "token", True), "fp8-token": ("float", 8, "token", True),
             "int8-tensor": ("int", 8, "tensor", False), "fp8-tensor": ("float", 8, "tensor", False),
             "nvfp4": ("float", 4, "tensor_group", "local")}
    if act.kind not in table:
        raise ModelError(f"compressed-tensors has no input-activation scheme for {act.kind}; export a config without it (e.g. ;wo)")
    kind, bits, strategy, dynamic = table[act.kind]
    args = {**base, "type": kind, "num_bits": bits, "strategy": strategy, "dynamic": dynamic}
    if act.kind == "nvfp4":
        args["group_size"] = 16
    return args


def _format_for(grid: Grid, act: ActivationQuant | None) -> str:
    if isinstance(grid, FP8Grid):
        return "float-quantized"
    if isinstance(grid, FP4Grid):
        return "nvfp4-pack-quantized"
    return "int-quantized" if act is not None else "pack-quantized"  # compressed-tensors' infer_compressor_format


def _stored(name: str, grid: Grid, act: ActivationQuant | None, fmt: str) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    if isinstance(grid, IntGrid):
        rows, cols = grid.codes.shape
        if grid.group_size is not None and cols % grid.group_size:
            raise ModelError(f"compressed-tensors needs the group size to divide every input width: {name} has {cols} columns, "
                             f"groups of {grid.group_size}; use a group size that divides it (e.g. 64 or 32)")
        offset = 1 << (grid.bits - 1)
        if fmt == "pack-quantized":
            out[f"{name}.weight_packed"] = pack_int32(grid.codes, grid.bits)
            out[f"{name}.weight_shape"] = torch.tensor([rows, cols], dtype=torch.int64)
            if not grid.symmetric:
                out[f"{name}.weight_zero_point"] = pack_int32(grid.zero, grid.bits, dim=0)
        else:
            out[f"{name}.weight"] = (grid.codes - offset).to(torch.int8)
            if not grid.symmetric:
                out[f"{name}.weight_zero_point"] = (grid.zero - offset).to(torch.int8)
        out[f"{name}.weight_scale"] = grid.scale
        if not grid.ordered:
            out[f"{name}.weight_g_idx"] = grid.g_idx.to(torch.int32)
    elif isinstance(grid, FP8Grid):
        out[f"{name}.weight"] = grid.codes
        out[f"{name}.weight_scale"] = grid.scale.float()
    else:
        sign = (grid.values < 0).to(torch.uint8) << 3
        index = torch.bucketize(grid.values.abs(), E2M1_VALUES).to(torch.uint8)
        nibbles = (sign | index).reshape(grid.values.shape[0], -1, 2)
        out[f"{name}.weight_packed"] = nibbles[..., 0] | (nibbles[..., 1] << 4)
        out[f"{name}.weight_scale"] = grid.block_scale
        out[f"{name}.weight_global_scale"] = grid.global_scale.float().reshape(1)
    if act is not None and act.kind in ("int8-tensor", "fp8-tensor"):
        out[f"{name}.input_scale"] = torch.tensor([act.static_scale(127.0 if act.kind == "int8-tensor" else 448.0)], dtype=torch.float32)
    if act is not None and act.kind == "nvfp4":
        out[f"{name}.input_global_scale"] = torch.tensor([1.0 / act.static_scale(6.0 * 448.0)], dtype=torch.float32)
    return out


def compressed_tensors_files(grids: dict[str, Grid], activations: dict[str, ActivationQuant], all_linears: list[str],
                             version: str = "0.19.0") -> tuple[dict[str, Tensor], dict]:
    """The quantized linears' tensors and the ``quantization_config`` that declares them."""
    tensors: dict[str, Tensor] = {}
    groups: dict[str, dict] = {}
    members: dict[str, list[str]] = {}
    for name, grid in grids.items():
        act = activations.get(name)
        fmt = _format_for(grid, act)
        tensors.update(_stored(name, grid, act, fmt))
        scheme = {"weights": _weight_args(grid), "input_activations": _input_args(act), "output_activations": None, "format": fmt}
        key = repr(sorted((k, repr(v)) for k, v in scheme.items()))
        if key not in groups:
            groups[key] = scheme
            members[key] = []
        members[key].append(name)
    single = len(groups) == 1
    config_groups = {f"group_{i}": {"targets": ["Linear"] if single else [f"re:^{re.escape(n)}$" for n in members[key]], **scheme}
                     for i, (key, scheme) in enumerate(groups.items())}
    formats = {s["format"] for s in groups.values()}
    config = {"quant_method": "compressed-tensors", "format": formats.pop() if len(formats) == 1 else "mixed-precision",
              "quantization_status": "compressed", "config_groups": config_groups, "global_compression_ratio": None,
              "ignore": [n for n in all_linears if n not in grids], "kv_cache_scheme": None, "sparsity_config": {},
              "transform_config": {}, "version": version}
    return tensors, config
