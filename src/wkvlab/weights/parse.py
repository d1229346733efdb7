"""The short string form of a weight config (``--weights``), presets included.

``<base>[+option]...`` where ``<base>`` is a preset or ``[<method>-]<format>``:

* presets: ``gptq-int4-g128``, ``awq-int4-g128``, ``w8a8-int8`` (SmoothQuant), ``llm-int8``,
  ``fp8`` (W8A8, dynamic per-token activations), ``fp8-wo``, ``fp8-static``, ``nvfp4``,
  ``nvfp4-wo``, ``nvfp4-mlp`` (NVIDIA checkpoint layout: MLP in NVFP4 W4A4, attention in FP8
  W8A8), ``mxfp4``, ``mxfp4-wo``; llama.cpp blocks ``q8_0``, ``q4_0``, ``q4_1``, ``q5_0``,
  ``q5_1``; ``none``/``fp32``, ``bf16``, ``fp16``;
* formats: ``int<b>[-g<G>][-sym|-asym][-fmin]`` (round to nearest; 8-bit defaults to symmetric,
  fewer bits to asymmetric with an integer zero point), with an optional method prefix
  ``rtn-``, ``gptq-`` or ``awq-`` (``gptq-int3-g64``), or a ``.json``/``.yaml`` spec file;
* ``checkpoint:<path>``: a quantized checkpoint on disk (a compressed-tensors, GPTQ or AWQ folder,
  or a ``.gguf`` file), decompressed with the activation rules it declares
  (:mod:`wkvlab.weights.checkpoints`). The path keeps its case and takes no options.

Options follow ``+`` — the separator ``--kv`` uses too, and one a shell leaves alone (``;`` is
still read as an alias, for specs written before the two grammars shared a separator):
``a=<act>`` activations (``none``, ``int8`` = per-token dynamic, ``int8-tensor``/``fp8-tensor`` =
static per-tensor, ``fp8`` = per-token, ``nvfp4``, ``mxfp4``); ``wo`` weight-only execution
(activations not quantized: the Marlin-style rerun); ``wscale=tensor`` one weight scale per
matrix; ``skip=0,1,5-7`` decoder layers kept at 16 bits; ``skip-first=N``, ``skip-last=N``,
``skip-re=<regex>``; ``emb``/``head`` quantize the embeddings / lm_head too;
``override=<regex>:<config>`` (repeatable); method parameters ``damp=``, ``block=``, ``actorder``,
``grid-from=original|updated`` (GPTQ: group grids from the weights before the column loop, as
llm-compressor does, or from the error-updated weights, as IST-DASLab does — the default),
``alpha=``, ``grid=`` (AWQ's scale-search points), ``noclip``, ``threshold=``. A ``+`` inside a regex stays part of it unless
an option name follows it.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from wkvlab.errors import ConfigError
from wkvlab.weights.spec import GGML_FORMATS, WeightSpec

_INT = re.compile(r"(?:(rtn|gptq|awq)-)?int([2-8])(?:-g(\d+))?((?:-(?:sym|asym|fmin))*)")
_ACT_ALIASES = {"none": "none", "int8": "int8-token", "int8-token": "int8-token", "int8-tensor": "int8-tensor",
                "fp8": "fp8-token", "fp8-token": "fp8-token", "fp8-tensor": "fp8-tensor", "nvfp4": "nvfp4", "mxfp4": "mxfp4"}
_HELP = ("use a preset (" + ", ".join(("gptq-int4-g128", "awq-int4-g128", "w8a8-int8", "llm-int8", "fp8", "fp8-wo", "nvfp4", "nvfp4-mlp", "mxfp4"))
         + "), none, bf16, fp16, q8_0, q4_0, q4_1, q5_0, q5_1, [gptq-|awq-]int<b>[-g<G>][-sym|-asym][-fmin], or a .json/.yaml spec file")
_OPTION_NAMES = ("a", "wo", "wscale", "skip", "skip-first", "skip-last", "skip-re", "emb", "head", "override", "damp", "block",
                 "actorder", "grid-from", "alpha", "grid", "noclip", "threshold")
# "+" starts an option only where an option name follows (a regex value may contain "+"); ";" always does.
_SEPARATOR = re.compile(r";|\+(?=(?:" + "|".join(sorted(map(re.escape, _OPTION_NAMES), key=len, reverse=True)) + r")(?:=|\+|;|$))")


def _fp8(act: str) -> WeightSpec:
    return WeightSpec(method="rtn", format="fp8_e4m3", bits=8, activations=act)


def _fp4(fmt: str, act: str) -> WeightSpec:
    return WeightSpec(method="rtn", format=fmt, bits=4, group_size=16 if fmt == "nvfp4" else 32, activations=act)


_INT8_SYM = dict(format="int", bits=8, symmetric=True)
PRESETS: dict[str, WeightSpec] = {
    "gptq-int4-g128": WeightSpec(method="gptq", format="int", bits=4, group_size=128, symmetric=False),
    "awq-int4-g128": WeightSpec(method="awq", format="int", bits=4, group_size=128, symmetric=False),
    # SmoothQuant W8A8: per-channel INT8 weights, dynamic per-token INT8 activations (vLLM's
    # compressed-tensors W8A8 INT8 path; llm-compressor's SmoothQuant + W8A8 recipe).
    "w8a8-int8": WeightSpec(method="smoothquant", activations="int8-token", **_INT8_SYM),
    # LLM.int8(): vector-wise INT8 weights (one absmax per row), outlier input columns at 16 bits.
    "llm-int8": WeightSpec(method="llm-int8", activations="int8-token", **_INT8_SYM),
    "fp8": _fp8("fp8-token"),
    "fp8-wo": _fp8("none"),
    "fp8-static": _fp8("fp8-tensor"),
    "nvfp4": _fp4("nvfp4", "nvfp4"),
    "nvfp4-wo": _fp4("nvfp4", "none"),
    # NVIDIA's NVFP4 checkpoint layout: MLP in NVFP4 W4A4, attention projections in FP8 W8A8.
    "nvfp4-mlp": replace(_fp4("nvfp4", "nvfp4"), overrides=((r"self_attn\.", "fp8"),)),
    "mxfp4": _fp4("mxfp4", "mxfp4"),
    "mxfp4-wo": _fp4("mxfp4", "none"),
}


def preset_names() -> tuple[str, ...]:
    return tuple(PRESETS)


def _base(key: str, text: str) -> WeightSpec:
    if key in ("none", "fp32", "ref", "reference"):
        return WeightSpec()
    if key in ("bf16", "fp16"):
        return WeightSpec(method="cast", format=key, bits=16)
    if key in GGML_FORMATS:
        # llama.cpp's *_0 types are symmetric (a scale per block), *_1 keep a minimum too
        bits = 8 if key == "q8_0" else int(key[1])
        return WeightSpec(method="rtn", format=key, bits=bits, group_size=32, symmetric=key.endswith("_0"),
                          zero_point="int" if key.endswith("_0") else "float")
    if key in PRESETS:
        return PRESETS[key]
    match = _INT.fullmatch(key)
    if not match:
        raise ConfigError(f"unknown weight config {text!r}; {_HELP}")
    method, bits = match.group(1) or "rtn", int(match.group(2))
    group = int(match.group(3)) if match.group(3) else None
    if group is not None and group < 1:
        raise ConfigError(f"group size must be positive in {text!r}")
    flags = set(filter(None, match.group(4).split("-")))
    if {"sym", "asym"} <= flags:
        raise ConfigError(f"{text!r} asks for both -sym and -asym; pick one")
    symmetric = "sym" in flags or (bits == 8 and "asym" not in flags and "fmin" not in flags)
    if "fmin" in flags and symmetric:
        raise ConfigError(f"{text!r}: -fmin (float minimum) only applies to asymmetric weights")
    return WeightSpec(method=method, format="int", bits=bits, group_size=group, symmetric=symmetric,
                      zero_point="float" if "fmin" in flags else "int")


def _layers(value: str, text: str) -> tuple[int, ...]:
    out: set[int] = set()
    for item in filter(None, (v.strip() for v in value.split(","))):
        try:
            lo, _, hi = item.partition("-")
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ConfigError(f"cannot read layers {value!r} in {text!r}; write them like skip=0,1,5-7") from None
        if last < first or first < 0:
            raise ConfigError(f"bad layer range {item!r} in {text!r}; layers count from 0, ranges go low-high")
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def _number(kind, key: str, value: str, text: str):
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{key}= needs a number in {text!r}, got {value!r}") from None


def _apply_option(spec: WeightSpec, item: str, text: str) -> WeightSpec:
    key, eq, value = (part.strip() for part in item.partition("="))
    flags = {"wo": dict(activations="none"), "actorder": dict(act_order=True), "noclip": dict(clip=False),
             "emb": dict(quantize_embeddings=True), "head": dict(quantize_lm_head=True)}
    if not eq and key in flags:
        return replace(spec, **flags[key])
    if key == "a" and value in _ACT_ALIASES:
        return replace(spec, activations=_ACT_ALIASES[value])
    if key == "wscale" and value in ("tensor", "channel"):
        return replace(spec, per_tensor=value == "tensor")
    if key == "skip":
        return replace(spec, skip_layers=tuple(sorted(set(spec.skip_layers) | set(_layers(value, text)))))
    if key in ("skip-first", "skip-last"):
        return replace(spec, **{key.replace("-", "_"): _number(int, key, value, text)})
    if key == "grid-from" and value in ("original", "updated"):
        return replace(spec, grid_from=value)
    if key == "skip-re" and value:
        return replace(spec, skip_regex=value)
    if key == "override" and ":" in value:
        pattern, _, config = value.rpartition(":")
        parse_weight_spec(config)  # fail now on a bad nested config
        return replace(spec, overrides=spec.overrides + ((pattern, config.strip().lower()),))
    numeric = {"damp": ("damp", float), "block": ("block_size", int), "alpha": ("alpha", float),
               "grid": ("grid", int), "threshold": ("threshold", float)}
    if key in numeric and eq:
        field, kind = numeric[key]
        return replace(spec, **{field: _number(kind, key, value, text)})
    raise ConfigError(
        f"cannot read option {item!r} in {text!r}; use a=<act>, wo, wscale=tensor, skip=0,1, skip-first=N, skip-last=N, "
        "skip-re=<regex>, emb, head, override=<regex>:<config>, damp=, block=, actorder, grid-from=original|updated, alpha=, grid=, "
        "noclip, threshold="
    )


CHECKPOINT_PREFIX = "checkpoint:"


def _checkpoint(raw: str) -> WeightSpec:
    path = raw[len(CHECKPOINT_PREFIX):].strip()
    if not path:
        raise ConfigError("checkpoint: needs a path; write checkpoint:<folder> or checkpoint:<file>.gguf")
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise ConfigError(f"checkpoint not found: {path}; give a quantized model folder or a .gguf file")
    return WeightSpec(method="checkpoint", checkpoint=str(resolved.resolve()), label=raw)


def parse_weight_spec(text: str) -> WeightSpec:
    """Parse the CLI string form (see the module docstring) into a :class:`WeightSpec`."""
    raw = text.strip()
    if raw.lower().startswith(CHECKPOINT_PREFIX):
        return _checkpoint(raw)
    if raw.lower().endswith((".json", ".yaml", ".yml")) and not _SEPARATOR.search(raw.lower()):
        return WeightSpec.from_file(Path(raw).expanduser())
    key = raw.lower()
    base, *options = [part.strip() for part in _SEPARATOR.split(key)]
    options = [o for o in options if o]
    spec = _base(base, text)
    for item in options:
        spec = _apply_option(spec, item, text)
    if spec.method in ("none", "cast") and options:
        raise ConfigError(f"{text!r}: options apply to quantized configs only; drop them or quantize")
    # the label is written with "+" whichever separator was typed, so equal configs label alike
    return replace(spec, label="+".join([base, *options]))


def split_weight_list(value: str) -> list[str]:
    """Split a comma-separated ``--weights`` value; ``skip=0,1,5-7`` keeps its commas.

    No weight config starts with a digit, so a piece that does continues the previous one's
    layer list.
    """
    out: list[str] = []
    for piece in (p.strip() for p in value.split(",")):
        if out and piece[:1].isdigit():
            out[-1] += "," + piece
        elif piece:
            out.append(piece)
    return out
