"""The original weights of a model quantized in place, kept off its device and written back exactly.

The one-model plan (:mod:`wkvlab.eval.memory`) builds every weight config on the loaded model
itself: a second copy of an 8B model would not fit beside it on a 24 GiB GPU. Before the first
build, :class:`WeightSnapshot` keeps the values of every tensor a build may change — all of the
decoder layers' parameters (linears, fused experts, the norms AWQ and SmoothQuant fold scales
into, biases) and the embeddings / lm_head when a config quantizes them — in host memory for a
model on a GPU, or in a safetensors file under the wkvlab cache (read back through a memory map)
for a model on the CPU, where host memory *is* the model's memory (written tensor by tensor from
the model's own, :mod:`wkvlab.tensorfile`, so no second copy exists even briefly). After each config,
:meth:`WeightSnapshot.restore` removes its activation hooks, writes the originals back, and
re-ties embeddings a config untied; the restored model is bit-identical to the loaded one (tested).
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch

from wkvlab.weights.arch import layers_prefix
from wkvlab.weights.spec import WeightSpec



def _quantizes_ends(specs: Iterable[WeightSpec]) -> bool:
    return any(s.quantize_embeddings or s.quantize_lm_head for s in specs if not s.is_identity)


def _on_accelerator(model: torch.nn.Module) -> bool:
    return any(p.device.type not in ("cpu", "meta") for p in model.parameters())


class WeightSnapshot(Mapping[str, torch.Tensor]):
    """Original values by state-dict name (tied names share one entry); a read-only mapping of CPU tensors."""

    def __init__(self, model: torch.nn.Module, specs: Iterable[WeightSpec], *, where: str | None = None) -> None:
        specs = list(specs)
        ends = _quantizes_ends(specs)
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
        self.tied = head is not None and head.weight is emb.weight
        state = model.state_dict(keep_vars=True)
        end_names = {n for n, t in state.items() if t is emb.weight or (head is not None and t is head.weight)}
        prefix = layers_prefix(model)  # the language model's layers (a multimodal model's vision tower is never changed)
        self.names = [n for n in state if n.startswith(prefix) or (ends and n in end_names)]
        self.where = where or ("host" if _on_accelerator(model) else "disk")
        self._alias: dict[str, str] = {}  # name -> the name its (shared) tensor is stored under
        first: dict[int, str] = {}
        tensors: dict[str, torch.Tensor] = {}  # the model's own tensors, each once: not copies
        for name in self.names:
            tensor = state[name]
            key = id(tensor)
            self._alias[name] = first.setdefault(key, name)
            if first[key] == name:
                tensors[name] = tensor.detach()
        self.bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        self._folder: Path | None = None
        self._host: dict[str, torch.Tensor] | None = None
        if self.where == "host":
            self._host = {name: t.to("cpu", copy=True).contiguous() for name, t in tensors.items()}
        else:
            from wkvlab.models.loading import cache_dir
            from wkvlab.tensorfile import write_state

            root = cache_dir() / "restore"
            root.mkdir(parents=True, exist_ok=True)
            self._folder = Path(tempfile.mkdtemp(prefix="weights-", dir=root))
            # streamed, one tensor on the host at a time: a copy of every decoder tensor in RAM first would double a CPU model's memory
            write_state(self._folder / "originals.safetensors", tensors.items())
        del tensors

    # ---- Mapping: the original of one name, on the CPU ----------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        stored = self._alias[name]
        if self._host is not None:
            return self._host[stored]
        from safetensors import safe_open

        with safe_open(str(self._folder / "originals.safetensors"), "pt") as handle:
            return handle.get_tensor(stored)

    def __contains__(self, name) -> bool:  # without reading the tensor
        return name in self._alias

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    # ---- restore --------------------------------------------------------------------------
    @torch.no_grad()
    def restore(self, model: torch.nn.Module, hooks: Iterable = ()) -> None:
        """Undo a build: its hooks removed, every snapshot tensor written back, embeddings re-tied."""
        for handle in hooks:
            handle.remove()
        if self.tied:
            head, emb = model.get_output_embeddings(), model.get_input_embeddings()
            if head.weight is not emb.weight:
                head.weight = emb.weight
        state = model.state_dict(keep_vars=True)
        written: set[int] = set()
        for name in self.names:
            target = state[name]
            if id(target) in written:
                continue
            written.add(id(target))
            original = self[name]
            if target.shape == original.shape and target.dtype == original.dtype:
                target.data.copy_(original)
            else:  # a build replaced the tensor with one of another shape or dtype
                target.data = original.to(target.device)

    def close(self) -> None:
        """Drop the originals (the file too)."""
        self._host = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
