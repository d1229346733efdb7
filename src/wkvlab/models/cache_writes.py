"""What a run is about to add to the disk cache, from sizes known before loading (no torch).

The two writes that cost gigabytes: the float copy of a GGUF (transformers dequantizes it; the copy
makes the next load take a second, at the model's size in the reference dtype: a 491 MB Q8 GGUF
becomes 2.4 GiB in float32), and a calibrated weight build (GPTQ, AWQ, SmoothQuant, static scales:
the tensors it changed — at most every decoder linear — in the reference dtype). The run header
states both with their sizes (:func:`planned_writes`), so a user sees the cost before paying it.
"""
from __future__ import annotations

from pathlib import Path

from wkvlab.models.cache import cache_dir, gib, weight_cache_enabled

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def _gguf_parameters(path: Path) -> int:
    from wkvlab.plan.gguf import read_header

    total = 0
    for _ttype, dims in read_header(path)[1].values():
        count = 1
        for d in dims:
            count *= d
        total += count
    return total


def _pending_gguf(model: str, dtype: str) -> Path | None:
    """The model's GGUF when its float copy is not cached yet (None: a folder, or already cached)."""
    from wkvlab.models.facts import _existing_file
    from wkvlab.models.fingerprint import file_sha256

    source = _existing_file(model)
    if source is None or source.is_dir() or source.suffix.lower() != ".gguf":
        return None
    if (cache_dir() / "models" / f"{file_sha256(source)[:16]}-{dtype}" / "wkvlab-source.json").is_file():
        return None
    return source


def copy_pending(model: str, dtype: str) -> bool:
    """Whether loading ``model`` first converts its GGUF (no float copy cached): what a dry run prices as a conversion."""
    return _pending_gguf(model, dtype) is not None


def _copy_write(model: str, dtype: str) -> str | None:
    """The GGUF copy's size when it is not cached yet (None: a folder, or already cached)."""
    source = _pending_gguf(model, dtype)
    if source is None:
        return None
    return f"a {dtype} copy of {source.name} {gib(_gguf_parameters(source) * _DTYPE_BYTES[dtype])} (models/)"


def _build_bytes(model: str, dtype: str) -> int | None:
    """Upper bound of one calibrated build: every decoder linear in ``dtype`` (None: shapes unknown)."""
    from wkvlab.errors import WkvlabError
    from wkvlab.plan.params import linear_inventory
    from wkvlab.plan.source import resolve_source

    try:
        desc = resolve_source(model)[0]
    except WkvlabError:
        return None
    return sum(x.params for x in linear_inventory(desc)) * _DTYPE_BYTES[dtype]


def planned_writes(model: str | list[str], weight_specs, dtype: str | None) -> str:
    """``may write a float32 copy of m.gguf 513 MiB (models/), 2 calibrated build(s) ≤ 405 MiB each
    unless cached (quantized/)`` — or ``writes nothing large to the cache``. ``model``: one, or a
    sweep's several (builds counted per model); ``dtype``: the reference's, None when only torch can
    tell (the larger, float32, is stated)."""
    where = dtype or "float32"
    parts = []
    builds = [w for w in weight_specs if w.needs_calibration and not w.is_checkpoint]
    for name in [model] if isinstance(model, str) else model:
        copy = _copy_write(name, where)
        if copy is not None:
            parts.append(copy)
        if builds and weight_cache_enabled():
            size = _build_bytes(name, where)
            each = f" ≤ {gib(size)} each" if size else ""
            of = f" of {Path(name).name}" if not isinstance(model, str) else ""
            parts.append(f"{len(builds)} calibrated build(s){of}{each} unless cached (quantized/)")
    return ("may write " + ", ".join(parts)) if parts else "writes nothing large to the cache"
