"""Storage sizes of the block formats, without torch.

Byte counts are facts about a format, not about tensors: the planner, the spec parsers and the
``presets`` listing need them on machines (and in commands) that never load torch. The numeric
kernels in :mod:`.ggml` and :mod:`.fp4` take their block shapes from here.
"""
from __future__ import annotations

from typing import Literal

from wkvlab.errors import ConfigError

GGML_TYPES: tuple[str, ...] = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")

QK = 32  # values per block, the same for every ggml type here

# bytes per block, from ggml-common.h (== gguf.constants.GGML_QUANT_SIZES)
GGML_TYPE_SIZE: dict[str, int] = {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "iq4_nl": 18}

FP4Format = Literal["nvfp4", "mxfp4"]
FP4_BLOCK = {"nvfp4": 16, "mxfp4": 32}


def check_ggml_type(type_name: object) -> str:
    if type_name not in GGML_TYPE_SIZE:
        raise ConfigError(f"unknown ggml type {type_name!r}; use one of {', '.join(GGML_TYPES)}")
    return type_name  # type: ignore[return-value]


def ggml_block_shape(type_name: str) -> tuple[int, int]:
    """``(values per block, bytes per block)``, e.g. ``(32, 18)`` for q4_0."""
    return QK, GGML_TYPE_SIZE[check_ggml_type(type_name)]


def ggml_bytes_per_element(type_name: str) -> float:
    """Storage bytes per value including block metadata, e.g. 34/32 for q8_0 (8.5 bits)."""
    return GGML_TYPE_SIZE[check_ggml_type(type_name)] / QK


def fp4_bytes(rows: int, columns: int, fmt: FP4Format) -> int:
    """Bytes of an ``[rows, columns]`` matrix: packed nibbles, one scale byte per block, and for
    NVFP4 two fp32 per-tensor scales (weight and input, as modelopt checkpoints store them)."""
    block = FP4_BLOCK[fmt]
    blocks = rows * -(-columns // block)
    return -(-rows * columns // 2) + blocks + (8 if fmt == "nvfp4" else 0)


# ExLlamaV3's cache (exllamav3_ext/cache/q_cache_kernels.cuh): groups of 32 values, fp16 scale each
EXL3_GROUP = 32


def exl3_bytes_per_vector(head_dim: int, bits: int) -> float:
    """``bits`` bits per value plus an fp16 scale per 32 values."""
    return head_dim * bits / 8 + 2.0 * head_dim / EXL3_GROUP


def vllm_int4_bytes_per_vector(head_dim: int) -> float:
    """vLLM int4_per_token_head: packed nibbles plus one fp32 holding the scale and the zero point."""
    return head_dim / 2 + 4.0


NVFP4_KV_BLOCK = 16  # values per E4M3 block scale in the engines' NVFP4 KV caches


def nvfp4_kv_bytes_per_vector(head_dim: int) -> float:
    """vLLM nvfp4 / SGLang's nvfp4 recipe per (token, head, side): packed E2M1 nibbles plus one E4M3
    scale per 16 values — ``full_dim = head_size/2 + head_size/16`` in vLLM's
    ``reshape_and_cache_nvfp4_dispatch`` (vllm-project/vllm@0cd789b3). The fp32 k_scale/v_scale is per
    layer, not per token."""
    return head_dim / 2 + head_dim / NVFP4_KV_BLOCK
