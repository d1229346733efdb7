"""llama.cpp block types as plain numbers: names, values and bytes per block. No torch here, so
spec parsing and ``wkvlab presets`` can use them without loading the tensor code (:mod:`.ggml`)."""
from __future__ import annotations

from wkvlab.errors import ConfigError

GGML_TYPES: tuple[str, ...] = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")

QK = 32  # values per block, the same for every type here

# bytes per block, from ggml-common.h (== gguf.constants.GGML_QUANT_SIZES)
TYPE_SIZE: dict[str, int] = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}


def check_type(type_name: object) -> str:
    if type_name not in TYPE_SIZE:
        raise ConfigError(f"unknown ggml type {type_name!r}; use one of {', '.join(GGML_TYPES)}")
    return type_name  # type: ignore[return-value]


def ggml_block_shape(type_name: str) -> tuple[int, int]:
    """``(values per block, bytes per block)``, e.g. ``(32, 18)`` for q4_0."""
    return QK, TYPE_SIZE[check_type(type_name)]


def ggml_bytes_per_element(type_name: str) -> float:
    """Storage bytes per value including block metadata, e.g. 34/32 for q8_0 (8.5 bits)."""
    return TYPE_SIZE[check_type(type_name)] / QK
