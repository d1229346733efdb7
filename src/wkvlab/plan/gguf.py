"""A GGUF file's header as a config.json, read without loading tensors (or torch).

Only the metadata key/values and the tensor directory are read (strings and arrays are skipped by
their lengths), so describing the packaged SmolLM2 takes milliseconds, where ``gguf.GGUFReader``
maps the whole file and decodes every tokenizer string. Layout: magic ``GGUF``, version, tensor
count, key/value count, then typed key/values (gguf-py ``GGUFValueType``), then per tensor its name,
dimensions, ggml type and offset — the GGUF specification, ggml-org/ggml docs/gguf.md.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from wkvlab.errors import ConfigError

# GGUFValueType: scalar struct formats; 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# llama_ftype (general.file_type) of the files the planner can name
FILE_TYPES = {0: "fp32", 1: "fp16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1", 32: "bf16"}
# every llama_ftype by its llama.cpp name (llama.cpp include/llama.h, enum llama_ftype): what the file *is*
FILE_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
                   12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
                   19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
                   26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16"}
# ggml_type -> (values per block, bytes per block): ggml/src/ggml.c type_traits (blck_size, type_size)
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
               10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
               16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 110), 20: (32, 18), 21: (256, 110), 22: (256, 82),
               23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2),
               34: (256, 54), 35: (256, 66), 39: (32, 17)}


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) != size:
        raise ConfigError("GGUF header ends early; the file is truncated or not a GGUF")
    return struct.unpack("<" + fmt, data)[0]


def _string(f: BinaryIO) -> str:
    n = _read(f, "Q")
    return f.read(n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int, keep: bool) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        if keep:
            return _string(f)
        f.seek(_read(f, "Q"), 1)
        return None
    if kind == _ARRAY:
        item, count = _read(f, "I"), _read(f, "Q")
        if item in _SCALARS and not keep:
            f.seek(count * struct.calcsize("<" + _SCALARS[item]), 1)
            return count
        values = [_value(f, item, keep) for _ in range(count)]
        return values if keep else count
    raise ConfigError(f"unknown GGUF value type {kind}; the file is not a GGUF this reader knows")


def read_header(path: str | Path) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]]:
    """(metadata, tensors): scalar/string metadata (arrays as their length), tensor name -> (type id, dims)."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ConfigError(f"{path} is not a GGUF file (no GGUF magic); pass a .gguf, a config.json or a model name")
            version = _read(f, "I")
            if version < 2:
                raise ConfigError(f"{path} is GGUF version {version}; convert it with a current llama.cpp")
            n_tensors, n_kv = _read(f, "Q"), _read(f, "Q")
            meta: dict[str, Any] = {}
            for _ in range(n_kv):
                key = _string(f)
                kind = _read(f, "I")
                meta[key] = _value(f, kind, keep=not key.startswith("tokenizer.ggml."))
            tensors = {}
            for _ in range(n_tensors):
                name = _string(f)
                dims = tuple(_read(f, "Q") for _ in range(_read(f, "I")))
                ttype = _read(f, "I")
                _read(f, "Q")  # offset
                tensors[name] = (ttype, dims)
    except OSError as exc:
        raise ConfigError(f"cannot read {path} ({exc}); check the path") from None
    return meta, tensors


def gguf_config(path: str | Path) -> tuple[dict[str, Any], str]:
    """A Hugging Face-style config of the model in a GGUF file, and the file's weight type (or '')."""
    meta, tensors = read_header(path)
    arch = str(meta.get("general.architecture", ""))
    if not arch:
        raise ConfigError(f"{path} has no general.architecture; it is not a model GGUF")

    def key(name: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{name}", default)

    heads = key("attention.head_count")
    if not key("block_count") or not key("embedding_length") or not heads:
        raise ConfigError(f"{path}: missing {arch}.block_count/embedding_length/attention.head_count; not a decoder GGUF")
    hidden = int(key("embedding_length"))
    vocab = key("vocab_size") or meta.get("tokenizer.ggml.tokens")
    config: dict[str, Any] = {
        "model_type": {"gemma3": "gemma3_text"}.get(arch, arch),
        "num_hidden_layers": int(key("block_count")),
        "hidden_size": hidden,
        "num_attention_heads": int(heads),
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // int(heads))),
        "intermediate_size": int(key("feed_forward_length", 4 * hidden)),
        "vocab_size": int(vocab) if vocab else int(tensors["token_embd.weight"][1][-1]),
        "max_position_embeddings": int(key("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "bfloat16",
    }
    window = key("attention.sliding_window")
    if window:
        config["sliding_window"] = int(window)
        if arch == "gemma3":
            config["sliding_window_pattern"] = 6  # llama.cpp's LLM_ARCH_GEMMA3: five local layers, then one global
    return config, FILE_TYPES.get(int(meta.get("general.file_type", -1)), "")


def file_type_name(meta: dict[str, Any]) -> str:
    """The file's llama.cpp type name (``Q4_K_M``), '' when the header does not say."""
    return FILE_TYPE_NAMES.get(int(meta.get("general.file_type", -1)), "")


def tensor_bytes(path: str | Path) -> dict[str, int]:
    """Bytes of the file's tensors as llama.cpp loads them, by part: ``embedding`` (token_embd), ``output`` (the output
    matrix; 0 when tied to the embedding, which llama.cpp then reads in its place), ``norm`` (1-D tensors: norms, biases)
    and ``linear`` (the rest); each tensor ceil(values / block) blocks of its ggml type."""
    _, tensors = read_header(path)
    out = {"linear": 0, "embedding": 0, "output": 0, "norm": 0}
    for name, (ttype, dims) in tensors.items():
        if ttype not in GGML_BLOCKS:
            raise ConfigError(f"{path}: tensor {name} has ggml type {ttype}, which this planner does not size; "
                              "pass --model-id with a file of a known type")
        block, size = GGML_BLOCKS[ttype]
        n = 1
        for d in dims:
            n *= d
        part = ("embedding" if name.startswith("token_embd") else "output" if name.startswith("output.")
                else "norm" if len(dims) == 1 else "linear")
        out[part] += -(-n // block) * size
    return out
