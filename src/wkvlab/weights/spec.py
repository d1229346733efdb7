"""The weight configuration as data, with the short string form the CLI accepts.

String forms (case-insensitive):

* ``none`` / ``fp32`` — the reference weights untouched (identity).
* ``bf16`` / ``fp16`` — linear weights rounded to 16 bits (what an engine serves unquantized).
* ``int<b>[-g<G>][-sym|-asym][-fmin]`` — round-to-nearest integer weights, ``b`` in 2..8, groups
  of ``G`` input columns (default: one group per output row, i.e. per channel). Defaults: 8-bit is
  symmetric, fewer bits asymmetric with an integer zero point (AWQ/GPTQ checkpoints); ``-fmin``
  stores a float minimum instead of an integer zero point (llama.cpp Q4_1 style).
  ``int8`` = per-channel symmetric INT8; ``int4-g128`` = W4A16 with group 128.
* ``fp8`` — FP8 E4M3 W8A8: per-channel weight scales, dynamic per-token activation scales.
  ``fp8-wo`` — the same weights executed weight-only (activations stay at model precision).

Only the linear layers inside decoder blocks are quantized; embeddings and ``lm_head`` stay at
16 bits, as engines do.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

from wkvlab.errors import ConfigError

METHODS = ("none", "cast", "rtn")
FORMATS = ("fp32", "bf16", "fp16", "int", "fp8_e4m3")
ACTIVATIONS = ("none", "fp8-token")


@dataclass(frozen=True)
class WeightSpec:
    method: str = "none"
    format: str = "fp32"
    bits: int = 32
    group_size: int | None = None  # None: per output channel
    symmetric: bool = True
    zero_point: str = "int"  # "int" (engine checkpoints) or "float" (llama.cpp q4_1 style minimum)
    activations: str = "none"
    label: str = "none"

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown weight method {self.method!r}; use one of {', '.join(METHODS)}")
        if self.format not in FORMATS:
            raise ConfigError(f"unknown weight format {self.format!r}; use one of {', '.join(FORMATS)}")
        if self.format == "int" and not 2 <= self.bits <= 8:
            raise ConfigError(f"integer weights need 2..8 bits, got {self.bits}")
        if self.group_size is not None and self.group_size < 1:
            raise ConfigError(f"group size must be positive, got {self.group_size}")
        if self.activations not in ACTIVATIONS:
            raise ConfigError(f"unknown activation quantization {self.activations!r}; use one of {', '.join(ACTIVATIONS)}")
        if self.zero_point not in ("int", "float"):
            raise ConfigError(f"zero_point must be 'int' or 'float', got {self.zero_point!r}")

    @property
    def is_identity(self) -> bool:
        return self.method == "none"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "WeightSpec":
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown weight spec field(s) {sorted(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**data)

    @classmethod
    def parse(cls, text: str) -> "WeightSpec":
        key = text.strip().lower()
        if key in ("none", "fp32", "ref", "reference"):
            return cls(label="none")
        if key in ("bf16", "fp16"):
            return cls(method="cast", format=key, bits=16, label=key)
        if key in ("fp8", "fp8-wo"):
            return cls(method="rtn", format="fp8_e4m3", bits=8, activations="none" if key == "fp8-wo" else "fp8-token", label=key)
        match = re.fullmatch(r"int([2-8])(?:-g(\d+))?((?:-(?:sym|asym|fmin))*)", key)
        if not match:
            raise ConfigError(
                f"unknown weight config {text!r}; use none, bf16, fp16, int8, int4-g128, int<b>[-g<G>][-sym|-asym][-fmin], fp8 or fp8-wo"
            )
        bits = int(match.group(1))
        group = int(match.group(2)) if match.group(2) else None
        if group is not None and group < 1:
            raise ConfigError(f"group size must be positive in {text!r}")
        flags = set(filter(None, match.group(3).split("-")))
        if {"sym", "asym"} <= flags:
            raise ConfigError(f"{text!r} asks for both -sym and -asym; pick one")
        symmetric = "sym" in flags or (bits == 8 and "asym" not in flags and "fmin" not in flags)
        if "fmin" in flags and symmetric:
            raise ConfigError(f"{text!r}: -fmin (float minimum) only applies to asymmetric weights")
        return cls(
            method="rtn", format="int", bits=bits, group_size=group, symmetric=symmetric,
            zero_point="float" if "fmin" in flags else "int", label=key,
        )
