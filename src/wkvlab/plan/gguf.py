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
    name = str(meta.get("general.basename") or meta.get("general.name") or Path(path).stem)
    return config, FILE_TYPES.get(int(meta.get("general.file_type", -1)), "")
