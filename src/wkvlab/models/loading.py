"""Load a causal LM and its tokenizer: a packaged name, a GGUF file or a Hugging Face folder.

A GGUF file is converted once, tensor by tensor, into a safetensors folder in the cache, keyed by
the GGUF's SHA-256 (:mod:`wkvlab.models.gguf_convert`: the values transformers' GGUF loader gives,
without holding the model two or three times while converting), and every load reads that folder,
in a fraction of a second.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import torch

from wkvlab.errors import ModelError
from wkvlab.models.cache import cache_dir, mark_used  # noqa: F401  (cache_dir: imported from here by the caches)
from wkvlab.models.facts import check_model_source
from wkvlab.models.fingerprint import file_sha256, folder_fingerprint
from wkvlab.models.packaged import canonical_name, packaged_gguf
from wkvlab.runtime import use_expandable_segments

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPES = ("auto", *_DTYPES)


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a CUDA device is visible, else ``cpu``; ``cuda`` / ``cuda:N`` checked.

    ``cuda`` puts the model on one GPU when it holds it, else across the visible GPUs
    (:mod:`wkvlab.models.placement`; never offloaded); ``cuda:N`` puts all of it on GPU N.
    """
    key = device.strip().lower()
    if key == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if key == "cpu":
        return key
    if key == "cuda" or (key.startswith("cuda:") and key[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ModelError(f"--device {device}: no CUDA device is visible to this torch build; use --device cpu (or auto)")
        if ":" in key and int(key[5:]) >= torch.cuda.device_count():
            raise ModelError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible; use cuda:0..cuda:{torch.cuda.device_count() - 1}")
        return key
    raise ModelError(f"unknown --device {device!r}; use auto, cpu, cuda or cuda:<N>")


def resolve_dtype(dtype: str, device: str) -> str:
    """``auto`` → bfloat16 on a GPU (the precision checkpoints ship in), float32 on the CPU."""
    key = dtype.strip().lower()
    if key == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    if key not in _DTYPES:
        raise ModelError(f"unknown --dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return key


@dataclass
class LoadedModel:
    """A model ready to evaluate, with what identifies it."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    source: str  # the GGUF or folder it came from
    fingerprint: str  # SHA-256 of the GGUF, or over the folder's files' names and contents (wkvlab.models.fingerprint)
    device: str = "cpu"
    dtype: str = "float32"
    spec: str = ""  # what load_model was given (a packaged name, or the path)
    device_map: str = "auto"  # how a --device cuda run spreads over the GPUs (wkvlab.models.placement)
    attn: str | None = None  # the attention implementation asked for (None: transformers' default)

    def reload(self) -> torch.nn.Module:
        """A fresh copy of the same weights on the same device (after an in-place quantization)."""
        return load_model(self.spec or self.source, dtype=self.dtype, device=self.device, device_map=self.device_map, attn=self.attn).model

    @property
    def placement(self) -> str:
        """Where the weights are: ``cpu``, ``cuda:0``, or each GPU with its share of the modules."""
        from wkvlab.models.placement import describe_device_map

        mapping = getattr(self.model, "hf_device_map", None)
        if mapping:
            return describe_device_map(mapping)
        return str(next(self.model.parameters()).device)

    @property
    def config(self):
        return self.model.config

    @property
    def max_context(self) -> int:
        cfg = self.model.config.get_text_config()  # a multimodal model's language part
        return int(getattr(cfg, "max_position_embeddings", 0) or 0) or 1 << 30


# Content fingerprints (wkvlab.models.fingerprint); the names are the ones sweeps and engines import.
_sha256 = file_sha256
_folder_fingerprint = folder_fingerprint


def model_class(config):
    """The auto class that loads ``config``'s architecture with its language-model head.

    A text model is a causal LM. A vision-language checkpoint whose transformers class is not one
    (Qwen2-VL, Qwen2.5-VL, Mistral 3: ``*ForConditionalGeneration``, registered for image-text-to-text
    only) loads whole through AutoModelForImageTextToText; given token ids alone it runs its text
    decoder, which is what wkvlab quantizes and measures (:func:`wkvlab.weights.arch.decoder_layers`
    finds ``model.language_model.layers``; the vision tower is never run). Llama 4 and Gemma 3 are
    causal LMs to transformers (Llama4ForCausalLM loads the text part of the checkpoint alone).
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    kind = getattr(config, "model_type", "")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and kind in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def _meta_model(cls, config, dtype: torch.dtype) -> torch.nn.Module:
    """The architecture with no weights (on ``meta``): enough to plan where its weights go."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        model = cls.from_config(config, dtype=dtype)
    model.tie_weights()  # from_config leaves a tied head as its own tensor: counted twice, SmolLM2 read 0.61 GiB for 0.50
    return model


def _from_pretrained(folder: Path, dtype: torch.dtype, *, device: str = "cpu", device_map: str = "auto", attn: str | None = None,
                     name: str = "the model", **kwargs):
    """Tokenizer and model from ``folder``; on a GPU the weights go straight where
    :mod:`wkvlab.models.placement` plans (no full copy on the CPU first, no offloading)."""
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    # transformers' own progress bars and notices would interleave with ours.
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **kwargs)
        config = AutoConfig.from_pretrained(str(folder), **kwargs)
        cls = model_class(config)
        if device != "cpu":
            from wkvlab.models.placement import gpu_budgets, plan_device_map

            kwargs["device_map"] = plan_device_map(_meta_model(cls, config, dtype), gpu_budgets(device), device_map, name=name)
        if attn is not None:
            kwargs["attn_implementation"] = attn
        model = cls.from_pretrained(str(folder), dtype=dtype, **kwargs)
    except ModelError:
        raise
    except Exception as exc:  # a corrupt GGUF raises struct/IO/Value errors alike: all mean "cannot load"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        source = folder / kwargs["gguf_file"] if kwargs.get("gguf_file") else folder  # the file, not its folder (issue #42)
        raise ModelError(f"{source} could not be loaded as a causal language model ({first[:160]}); check that transformers "
                         "supports its architecture, or pass the model's Hugging Face folder") from None
    model.eval()
    return model, tokenizer


def _convert_copy(path: Path, dtype: torch.dtype, target: Path | None) -> Path:
    """Convert ``path`` tensor by tensor (:mod:`wkvlab.models.gguf_convert`) into a new folder, moved
    atomically to ``target`` (a half-written cache must never be read back); without a target the
    folder is a temporary one in the cache root, which the caller removes after loading."""
    from wkvlab.models.gguf_convert import convert_gguf

    parent = target.parent if target is not None else cache_dir() / "models"
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=(target.name if target is not None else "convert") + ".", dir=parent))
    try:  # transformers' tokenizer conversion draws its own tqdm bar; ours (or the CLI status) says enough
        with mock.patch.dict(os.environ, {"TQDM_DISABLE": "1"}):
            convert_gguf(path, tmp, dtype)
        if target is None:
            return tmp
        os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)
        return target
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, ModelError) or not isinstance(exc, Exception):
            raise
        # a corrupt GGUF raises struct/IO/Value errors alike: all mean "cannot load"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{path} could not be loaded as a causal language model ({first[:160]})") from None


def load_gguf(path: Path, *, dtype: str = "float32", use_cache: bool = True, device: str = "cpu", device_map: str = "auto",
              attn: str | None = None) -> LoadedModel:
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    torch_dtype = _DTYPES[dtype]
    fingerprint = _sha256(path)
    cached = cache_dir() / "models" / f"{fingerprint[:16]}-{dtype}"
    if use_cache and (cached / "wkvlab-source.json").is_file():
        mark_used(cached)  # the last use 'wkvlab cache' lists and prune orders by
        model, tokenizer = _from_pretrained(cached, torch_dtype, device=device, device_map=device_map, attn=attn, name=path.name)
    else:
        if device != "cpu":  # a model the GPUs cannot hold is refused before the conversion, from the header's shapes
            from transformers import AutoConfig

            from wkvlab.models.placement import gpu_budgets, plan_device_map

            try:
                config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
            except Exception:  # a corrupt header: the conversion below refuses it in its own words
                config = None
            if config is not None:
                plan_device_map(_meta_model(model_class(config), config, torch_dtype), gpu_budgets(device), device_map, name=path.name)
        folder = _convert_copy(path, torch_dtype, cached if use_cache else None)
        try:  # loaded from the converted file (the weights go straight to their device), never converted in memory
            model, tokenizer = _from_pretrained(folder, torch_dtype, device=device, device_map=device_map, attn=attn, name=path.name)
        finally:
            if not use_cache:
                shutil.rmtree(folder, ignore_errors=True)
    # the model's own weights as stored: what --weights none reports (weights/apply.py model_weight_bytes), not float32
    model.wkvlab_stored_bytes = path.stat().st_size
    return LoadedModel(name=path.stem, model=model, tokenizer=tokenizer, source=str(path), fingerprint=fingerprint,
                       device=device, dtype=dtype, device_map=device_map, attn=attn)


def load_model(spec: str, *, dtype: str = "float32", use_cache: bool = True, device: str = "cpu", device_map: str = "auto",
               attn: str | None = None) -> LoadedModel:
    """Load ``spec``: a packaged name (``default``, ``smollm2``, ``gemma3-270m``), a .gguf file, or an HF folder.

    ``device``: ``cpu``, ``cuda`` (one GPU when it holds the weights, else all visible GPUs),
    ``cuda:N`` or ``auto``; ``device_map``: how ``cuda`` uses the GPUs (``auto``, ``balanced``,
    ``sequential``: :mod:`wkvlab.models.placement`; never offloaded); ``dtype``: ``float32``,
    ``bfloat16``, ``float16`` or ``auto`` (bfloat16 on a GPU, float32 on the CPU) — the precision of
    the reference everything is compared with; ``attn``: ``sdpa``, ``eager``, ``flash_attention_2``
    or None (transformers' default; :mod:`wkvlab.models.attn`).
    """
    from wkvlab.models.placement import check_device_map

    device = resolve_device(device)
    use_expandable_segments(device)  # before the weights reach the GPU (wkvlab.runtime)
    dtype = resolve_dtype(dtype, device)
    device_map = check_device_map(device_map)
    check_model_source(spec)
    packaged = canonical_name(spec)
    if packaged is not None:
        loaded = load_gguf(packaged_gguf(packaged), dtype=dtype, use_cache=use_cache, device=device, device_map=device_map, attn=attn)
        loaded.name = loaded.spec = packaged
        return loaded
    from wkvlab.models.hub import is_hub_id, resolve_hub_model

    hub_id = spec.strip() if is_hub_id(spec) else None
    path = resolve_hub_model(hub_id) if hub_id else Path(spec).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelError(f"{path} is not a .gguf file; pass a GGUF file or a folder with config.json")
        return load_gguf(path, dtype=dtype, use_cache=use_cache, device=device, device_map=device_map, attn=attn)
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} has no config.json; pass a Hugging Face model folder or a .gguf file")
    model, tokenizer = _from_pretrained(path, _DTYPES[dtype], device=device, device_map=device_map, attn=attn, name=hub_id or path.name)
    return LoadedModel(name=hub_id or path.name, model=model, tokenizer=tokenizer, source=str(path), fingerprint=_folder_fingerprint(path),
                       device=device, dtype=dtype, device_map=device_map, attn=attn)
