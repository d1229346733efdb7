"""Whether a GGUF that reads whole can also be converted: its architecture and tensor types, checked from the
header before any model loads (issue #42: such a file was refused after seconds of conversion, naming its folder).

wkvlab loads a GGUF through transformers' converter (``from_pretrained(folder, gguf_file=...)``), which reads
the architectures listed in ``transformers/integrations/ggml.py``'s ``GGUF_CONFIG_MAPPING`` and dequantizes every
tensor with gguf-py (``gguf.quants.dequantize``). Both lists are read from the installed packages, so a newer
release that converts more is followed without a change here; transformers' source is parsed, not imported
(importing it takes seconds and pulls in torch — the refusals must stay under a second).
"""
from __future__ import annotations

import ast
import importlib.util
from functools import lru_cache
from pathlib import Path

from wkvlab.errors import ModelError

# The names transformers' load_gguf_checkpoint renames before looking an architecture up
# (transformers/modeling_gguf_pytorch_utils.py: "qwen2moe" -> "qwen2_moe", ...; t5encoder reads as t5).
RENAMED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2", "t5encoder": "t5"}
NOT_ARCHITECTURES = {"general", "tokenizer"}  # other sections of the same mapping


@lru_cache(maxsize=1)
def convertible_architectures() -> frozenset[str] | None:
    """The GGUF architectures the installed transformers converts; None when its source cannot be read."""
    spec = importlib.util.find_spec("transformers")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        tree = ast.parse(Path(spec.submodule_search_locations[0], "integrations", "ggml.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "GGUF_CONFIG_MAPPING" for t in node.targets):
            if isinstance(node.value, ast.Dict):
                return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant)) - NOT_ARCHITECTURES
    return None


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def check_gguf_convertible(path: Path, meta: dict, tensors: dict) -> None:
    """Refuse, naming the file and what to do, a GGUF whose architecture or tensor types the converter lacks.

    ``meta``/``tensors``: :func:`wkvlab.plan.gguf.read_directory`'s header (tensor name -> (type id, dims, offset))."""
    arch = str(meta.get("general.architecture", ""))
    known = convertible_architectures()
    if arch and known is not None and arch not in known and RENAMED.get(arch) not in known:
        raise ModelError(f"{path}: GGUF architecture '{arch}' cannot be converted: transformers {_version('transformers')} converts "
                         f"GGUF files of {', '.join(sorted(known))}; pass the model's Hugging Face folder (config.json and "
                         "safetensors) instead, or a GGUF of one of those architectures")
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import _type_traits  # the types gguf-py's dequantize implements, besides F32/F16

    readable = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_type_traits}
    unreadable = [(name, ttype) for name, (ttype, *_) in tensors.items() if ttype not in {int(t) for t in readable}]
    if unreadable:
        name, ttype = unreadable[0]
        more = f" (and {len(unreadable) - 1} more tensors)" if len(unreadable) > 1 else ""
        raise ModelError(f"{path}: tensor {name}{more} is stored as {GGMLQuantizationType(ttype).name}, which gguf "
                         f"{_version('gguf')} cannot dequantize, so the file cannot be converted; re-quantize it to another "
                         "type (llama.cpp's llama-quantize, e.g. Q8_0) or pass the model's Hugging Face folder")
