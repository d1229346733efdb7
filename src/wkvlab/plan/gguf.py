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
from typing import Any

from wkvlab.errors import ConfigError

# GGUFValueType: scalar struct formats; 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
# llama_ftype (general.file_type) of the files the planner can name
FILE_TYPES = {0: "fp32", 1: "fp16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1", 32: "bf16"}
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT (ggml/include/gguf.h); general.alignment overrides it
# every llama_ftype by its llama.cpp name (llama.cpp include/llama.h, enum llama_ftype): what the file *is*
FILE_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
                   12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
                   19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
                   26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16"}


class _Truncated(Exception):
    """The header asks for more bytes than the file holds; :func:`read_directory` names the file."""


class _Cursor:
    """Reads the header from a memory map: a tokenizer's 150k strings are skipped by their lengths
    without a system call each (0.05 s, where file reads took 0.5 s)."""

    def __init__(self, buf) -> None:
        self.buf, self.pos, self.length = buf, 0, len(buf)

    def read(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        if self.pos + size > self.length:
            raise _Truncated
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def skip(self, n: int) -> None:
        """Move ``n`` bytes on, refusing a length beyond the file (a fake header's 2^60-byte string)."""
        if self.pos + n > self.length:
            raise _Truncated
        self.pos += n

    def string(self, keep: bool = True) -> str | None:
        n = self.read("Q")
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start:self.pos]).decode("utf-8", errors="replace") if keep else None

    def value(self, kind: int, keep: bool) -> Any:
        if kind in _SCALARS:
            return self.read(_SCALARS[kind])
        if kind == _STRING:
            return self.string(keep)
        if kind == _ARRAY:
            item, count = self.read("I"), self.read("Q")
            if item in _SCALARS and not keep:
                self.skip(count * struct.calcsize("<" + _SCALARS[item]))
                return count
            if count > self.length:  # every item takes at least a byte
                raise _Truncated
            if item == _STRING and not keep:
                for _ in range(count):
                    self.skip(self.read("Q"))
                return count
            values = [self.value(item, keep) for _ in range(count)]
            return values if keep else count
        raise ConfigError(f"unknown GGUF value type {kind}; the file is not a GGUF this reader knows")


def read_directory(path: str | Path) -> tuple[dict[str, Any], dict[str, tuple[int, tuple[int, ...], int]], int]:
    """(metadata, tensors, data start): scalar/string metadata (arrays as their length), tensor name ->
    (type id, dims, offset in the data section), and the byte where the data section begins. Every
    refusal names the file."""
    import mmap

    path = Path(path)
    try:
        with path.open("rb") as f:
            if f.read(4) != b"GGUF":
                raise ConfigError(f"{path} is not a GGUF file (no GGUF magic); pass a .gguf, a config.json or a model name")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                c = _Cursor(buf)
                c.skip(4)
                version = c.read("I")
                if version < 2:
                    raise ConfigError(f"{path} is GGUF version {version}; convert it with a current llama.cpp")
                n_tensors, n_kv = c.read("Q"), c.read("Q")
                meta: dict[str, Any] = {}
                for _ in range(n_kv):
                    key = c.string()
                    kind = c.read("I")
                    meta[key] = c.value(kind, not key.startswith("tokenizer.ggml."))
                if n_tensors > c.length:
                    raise _Truncated
                tensors = {}
                for _ in range(n_tensors):
                    name = c.string()
                    dims = tuple(c.read("Q") for _ in range(c.read("I")))
                    tensors[name] = (c.read("I"), dims, c.read("Q"))
                alignment = int(meta.get("general.alignment") or DEFAULT_ALIGNMENT)
                start = -(-c.pos // alignment) * alignment
    except _Truncated:
        raise ConfigError(f"{path}: the GGUF header ends early; the file is truncated or not a GGUF (download it again)") from None
    except (OSError, ValueError) as exc:  # mmap of an empty file: ValueError
        raise ConfigError(f"cannot read {path} as a GGUF ({exc}); check the path") from None
    return meta, tensors, start


def read_header(path: str | Path) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...]]]]:
    """(metadata, tensors): scalar/string metadata (arrays as their length), tensor name -> (type id, dims)."""
    meta, tensors, _ = read_directory(path)
    return meta, {name: (ttype, dims) for name, (ttype, dims, _) in tensors.items()}


def tensor_bytes(name: str, ttype: int, dims: tuple[int, ...], path: str | Path) -> int:
    """Bytes a tensor's data takes in the file (ggml's block sizes, gguf-py GGML_QUANT_SIZES)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
    except (ValueError, KeyError):
        raise ConfigError(f"{path}: tensor {name} has ggml type {ttype}, which gguf {_gguf_version()} does not know; "
                          "the file is damaged or needs a newer gguf package") from None
    count = 1
    for d in dims:
        count *= d
    if count % block:
        raise ConfigError(f"{path}: tensor {name} has {count} values, not a whole number of blocks of {block}; the file is damaged")
    return count // block * size


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def check_gguf_file(path: str | Path, directory: tuple[dict, dict, int] | None = None) -> int:
    """The integrity a header can prove before any conversion: the header reads to its end, every
    tensor's type is known, and every tensor's data lies inside the file (a truncated download ends
    mid-tensor). Returns the bytes of the tensor data; refusals name the file. ``directory``:
    :func:`read_directory`'s answer when the caller has it already."""
    path = Path(path)
    meta, tensors, start = directory or read_directory(path)
    length = path.stat().st_size
    total = 0
    for name, (ttype, dims, offset) in tensors.items():
        nbytes = tensor_bytes(name, ttype, dims, path)
        end = start + offset + nbytes
        if end > length:
            raise ConfigError(f"{path} is truncated: tensor {name} ends at byte {end:,} and the file has {length:,} bytes; "
                              "download or convert it again")
        total += nbytes
    if not tensors:
        raise ConfigError(f"{path} holds no tensors; it is not a model GGUF")
    return total


def gguf_config(path: str | Path, header: tuple[dict, dict] | None = None) -> tuple[dict[str, Any], str]:
    """A Hugging Face-style config of the model in a GGUF file, and the file's weight type (or '');
    ``header``: :func:`read_header`'s answer when the caller has it already."""
    meta, tensors = header or read_header(path)
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


def tensor_bytes_by_part(path: str | Path, tensors: dict | None = None) -> dict[str, int]:
    """Bytes of the file's tensors as llama.cpp loads them, by part: ``embedding`` (token_embd), ``output`` (the output
    matrix; 0 when tied to the embedding, which llama.cpp then reads in its place), ``norm`` (1-D tensors: norms, biases)
    and ``linear`` (the rest); each tensor's blocks of its ggml type (:func:`tensor_bytes`). ``tensors``:
    :func:`read_header`'s tensor table when the caller has it already."""
    if tensors is None:
        tensors = read_header(path)[1]
    out = {"linear": 0, "embedding": 0, "output": 0, "norm": 0}
    for name, (ttype, dims) in tensors.items():
        part = ("embedding" if name.startswith("token_embd") else "output" if name.startswith("output.")
                else "norm" if len(dims) == 1 else "linear")
        out[part] += tensor_bytes(name, ttype, dims, path)
    return out
