"""On-disk cache of calibrated quantized models, keyed by (model, spec, calibration).

GPTQ, AWQ and SmoothQuant take minutes on a CPU; a sweep that evaluates the same weights on
other text, contexts or KV configs must not redo them. The key hashes the model's fingerprint,
the full spec (:meth:`WeightSpec.to_dict`), the calibration tokens' key and a format version.
Only tensors that differ from the reference model are stored (safetensors, exact bytes, written and
read back one tensor at a time: :mod:`wkvlab.tensorfile`),
plus a JSON file with the activation plan, notes and byte count; reloading copies the reference,
writes those tensors back and re-attaches the activation hooks, so the result is bit-identical
(tested). Files are written to a temporary folder and renamed, so a half-written entry is never read.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import torch

from wkvlab.models.cache import mark_used
from wkvlab.models.loading import cache_dir
from wkvlab.weights.activations import ActivationQuant, attach_activation_quantizers
from wkvlab.weights.calibration import CalibrationSet
from wkvlab.weights.spec import WeightSpec
from wkvlab.tensorfile import write_state

CACHE_VERSION = 2  # 2: quantized_fraction in meta.json, fused MoE experts quantized


def cache_key(model_key: str, spec: WeightSpec, calibration: CalibrationSet) -> str:
    payload = {"version": CACHE_VERSION, "model": model_key, "spec": {**spec.to_dict(), "label": None}, "calibration": calibration.key}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def entry_dir(key: str) -> Path:
    return cache_dir() / "quantized" / key[:24]


def _changed_tensors(reference, quantized: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Tensors of ``quantized`` that differ from ``reference`` (a model, or an in-place build's
    :class:`~wkvlab.weights.restore.WeightSnapshot`: only the tensors it holds can have changed),
    as the model holds them: nothing is copied (the file is written one tensor at a time)."""
    snapshot = not isinstance(reference, torch.nn.Module)
    ref = reference if snapshot else reference.state_dict()
    changed = {}
    for k, v in quantized.state_dict().items():
        if k not in ref:
            if not snapshot:
                changed[k] = v.detach()
        elif not torch.equal(ref[k].to(v.device), v):
            changed[k] = v.detach()
    return changed


def save_entry(target: Path, reference, built, model_key: str = "") -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        emb, head = built.model.get_input_embeddings(), built.model.get_output_embeddings()
        write_state(tmp / "tensors.safetensors", _changed_tensors(reference, built.model).items())
        meta = {"weight_bytes": built.weight_bytes, "lossless": built.lossless, "notes": built.notes,
                "quantized_fraction": built.quantized_fraction,
                "activations": {k: v.to_dict() for k, v in built.activations.items()}, "calibration": built.calibration,
                "untied": head is not None and head.weight is not emb.weight and _was_tied(reference),
                "model": model_key}  # the model's fingerprint: 'wkvlab cache' lists and prunes by it
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if target.exists():
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _was_tied(reference) -> bool:
    if isinstance(reference, torch.nn.Module):
        return reference.get_output_embeddings().weight is reference.get_input_embeddings().weight
    return reference.tied  # a WeightSnapshot


def load_entry(target: Path, reference: torch.nn.Module, spec: WeightSpec, in_place: bool = False):
    from safetensors import safe_open

    from wkvlab.weights.apply import QuantizedWeights

    meta = json.loads((target / "meta.json").read_text())
    model = reference if in_place else copy.deepcopy(reference)
    if meta["untied"]:
        head = model.get_output_embeddings()
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    state = model.state_dict()
    with torch.no_grad(), safe_open(str(target / "tensors.safetensors"), "pt") as handle:
        for name in handle.keys():  # one tensor on the host at a time
            state[name].copy_(handle.get_tensor(name))
    plan = {k: ActivationQuant(**v) for k, v in meta["activations"].items()}
    hooks = attach_activation_quantizers(model, plan)
    return QuantizedWeights(spec, model, meta["weight_bytes"], meta["lossless"], list(meta["notes"]), plan, meta["calibration"], cached=True,
                            hooks=hooks, quantized_fraction=meta.get("quantized_fraction"))


def cached_quantize(model: torch.nn.Module, spec: WeightSpec, calibration: CalibrationSet, model_key: str, build: Callable,
                    originals=None):
    """Load the entry for (model, spec, calibration) or build it and store it. ``originals``: the
    build is in place, and this snapshot of the original weights is what it changed from."""
    target = entry_dir(cache_key(model_key, spec, calibration))
    if (target / "meta.json").is_file():
        mark_used(target)
        return load_entry(target, model, spec, in_place=originals is not None)
    built = build(model, spec, calibration)
    save_entry(target, originals if originals is not None else model, built, model_key)
    return built
