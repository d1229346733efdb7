"""What the user named with ``--model``, and what each engine's launch line must load.

``--model`` may be a built-in name (``Llama-3-70B``: its Hub id from the table), a Hugging Face
folder or its ``config.json`` (the folder, when it holds weights), another config file (shapes
only: engines need ``--model-id``), a ``.gguf`` file or a packaged model (``default``: described
from its GGUF header; llama.cpp loads the file itself). ``--model-id`` names the checkpoint the
engines should load when it is not the one described (a quantized checkpoint, a local copy).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from wkvlab.plan._serde import JsonMixin
from wkvlab.plan.models import ModelDescription

_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True)
class ModelSource(JsonMixin):
    given: str  # what --model said
    kind: str  # builtin | folder | config | gguf | packaged | description
    hub_id: str = ""  # Hugging Face repository, when known
    folder: str = ""  # a local folder with config.json and weights
    gguf: str = ""  # a GGUF file llama.cpp can load
    gguf_type: str = ""  # that file's weight type (general.file_type), '' if none the planner names
    gguf_type_name: str = ""  # the file's type as llama.cpp names it (Q4_K_M), '' if the header does not say
    gguf_bytes: int = 0  # the file's tensor bytes as llama.cpp loads them (plan/gguf.py tensor_bytes_by_part)
    gguf_parts: tuple[tuple[str, int], ...] = ()  # those bytes by part: linear, embedding, output, norm
    note: str = ""
    aliases: tuple[str, ...] = ()  # other names results of this model carry (wkvlab eval names a packaged model 'smollm2')

    @property
    def file_bits(self) -> int:
        """Bits per weight the GGUF's type is named after (Q4_K_M: 4; F16/BF16: 16; 0 when not a GGUF or unknown)."""
        import re as _re

        found = _re.match(r"I?Q(\d)|B?F(\d+)", self.gguf_type_name.upper())
        return 0 if found is None else int(found.group(1) or found.group(2))

    @property
    def quantized_file(self) -> bool:
        return 0 < self.file_bits < 16

    @property
    def served(self) -> str:
        """What vLLM/SGLang load: a local folder first, else the Hub id ('' when neither is known)."""
        return self.folder or self.hub_id


def resolve_source(spec: str | Path | ModelDescription) -> tuple[ModelDescription, ModelSource]:
    """The description of ``spec`` and where its checkpoint is."""
    if isinstance(spec, ModelDescription):
        return spec, ModelSource(spec.name, "description", hub_id=spec.hf_id if _HUB_ID.fullmatch(spec.hf_id or "") else "")
    text = str(spec)
    from wkvlab.models.packaged import canonical_name

    packaged = canonical_name(text)
    if packaged is not None:
        return _from_gguf(text, _packaged_path(packaged), kind="packaged")
    path = Path(text).expanduser()
    if path.suffix.lower() == ".gguf":
        return _from_gguf(text, path, kind="gguf")
    if path.suffix.lower() == ".json" or path.exists():
        desc = ModelDescription.from_config(path)
        folder = path if path.is_dir() else path.parent
        has_weights = any(next(folder.glob(p), None) for p in _WEIGHT_FILES)
        hub = desc.hf_id if _HUB_ID.fullmatch(desc.hf_id or "") and not Path(desc.hf_id).exists() else ""
        if has_weights and (path.is_dir() or path.name == "config.json"):
            return desc, ModelSource(text, "folder", hub_id=hub, folder=str(folder))
        note = (f"{text} is a config file without weights next to it: engines need the checkpoint — "
                + (f"the Hub id {hub} from its _name_or_path is used" if hub else "pass --model-id <Hub id or folder>"))
        return desc, ModelSource(text, "config", hub_id=hub, note=note)
    cached = _cached_snapshot(text) if _HUB_ID.fullmatch(text) else None
    if cached is not None:  # a Hub id whose checkpoint is in the local Hugging Face cache: loadable here
        return ModelDescription.from_config(cached), ModelSource(text, "folder", hub_id=text, folder=str(cached))
    desc = ModelDescription.from_name(text)
    return desc, ModelSource(text, "builtin", hub_id=desc.hf_id)


def _cached_snapshot(repo_id: str) -> Path | None:
    """The local Hugging Face cache's snapshot of ``repo_id`` when it holds config.json and weights (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(found, str):
        return None
    folder = Path(found).parent
    return folder if any(next(folder.glob(p), None) for p in _WEIGHT_FILES) else None


def _packaged_path(name: str) -> Path:
    from wkvlab.models.packaged import packaged_gguf

    return packaged_gguf(name)


def _from_gguf(given: str, path: Path, kind: str) -> tuple[ModelDescription, ModelSource]:
    from wkvlab.models.packaged import canonical_name
    from wkvlab.plan.gguf import file_type_name, gguf_config, read_header, tensor_bytes_by_part

    header = read_header(path)  # once: a tokenizer's 150k strings make each read cost
    config, file_type = gguf_config(path, header)
    parts = tensor_bytes_by_part(path, header[1])
    type_name, file_bytes = file_type_name(header[0]), sum(parts.values())
    hub = ""
    if kind == "packaged":
        from wkvlab.models.packaged import PACKAGED_MODELS

        hub = PACKAGED_MODELS[canonical_name(given) or ""].hub_id
    packaged = canonical_name(given) if kind == "packaged" else None
    desc = ModelDescription.from_config(config, name=packaged or path.stem, hf_id=hub)
    desc = ModelDescription(**{**desc.__dict__, "source": f"GGUF header of {path}"})
    return desc, ModelSource(given, kind, hub_id=hub, gguf=str(path), gguf_type=file_type, aliases=(path.stem, given),
                             gguf_type_name=type_name, gguf_bytes=file_bytes, gguf_parts=tuple(parts.items()))
