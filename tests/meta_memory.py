"""What a GPU's allocator would have held, counted on torch's ``meta`` device.

:class:`MemoryAudit` is :mod:`tests.fake_device`'s device audit that also keeps every storage an
op returns on ``meta`` (weakly: a storage no tensor refers to any more is dead) and records the
peak of their sum, as ``torch.cuda.max_memory_allocated`` does on CUDA: each storage counted once
however many views share it, rounded up to the caching allocator's 512-byte blocks, at the moment
an op returns it (its inputs still alive). Nothing is computed, so a Llama-3-70B-shaped build runs
on a CPU in seconds per layer; what it cannot see is a kernel's private workspace (cuBLAS, cuSOLVER)
and the allocator's fragmentation, which the estimate's fixed ``runtime`` allowance is for.

Values on ``meta`` do not exist, so data-dependent decisions get stated stand-ins: a boolean
``.item()`` is True (an MoE expert is reached), and a boolean mask keeps ``route_fraction`` of its
rows (``top_k / experts`` for uniform routing; the device audit keeps all of them).

The sum is kept lazily: freed storages are only noticed when the running total could pass the
peak by more than ``slack`` bytes, so the peak is exact to within ``slack`` (1 MiB by default)
and the audit costs no sweep per op.
"""
from __future__ import annotations

import math

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._pytree import tree_flatten

from tests.fake_device import META, _Audit

aten = torch.ops.aten
BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes


class MemoryAudit(_Audit):
    """The device audit plus a count of live ``meta`` storages (``peak``, ``live()`` in bytes)."""

    def __init__(self, *, route_fraction: float = 1.0, slack: int = 1 << 20) -> None:
        super().__init__()
        self.route_fraction = route_fraction
        self.slack = slack
        self.peak = 0
        self._counted = 0  # an upper bound on live bytes: dead storages leave it only at a sweep
        self._storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default and args[0].is_meta and args[0].dtype == torch.bool:
            self.host_copies += 1
            return True
        if func is aten.index.Tensor and args[0].is_meta and any(i is not None and i.dtype == torch.bool for i in args[1]):
            keep = lambda mask: torch.arange(math.ceil(mask.shape[0] * self.route_fraction), device=META)  # noqa: E731
            args = (args[0], [keep(i) if i is not None and i.dtype == torch.bool else i for i in args[1]])
        out = super().__torch_dispatch__(func, types, args, kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.is_meta:
                self._hold(t.untyped_storage())
        return out

    def hold(self, *tensors: torch.Tensor) -> None:
        """Count tensors made before the audit began (a model built outside it)."""
        for t in tensors:
            self._hold(t.untyped_storage())

    def _hold(self, storage) -> None:
        size = -(-storage.nbytes() // BLOCK) * BLOCK
        key = storage._cdata
        known = self._storages.get(key)
        if known is not None and not known[0].expired():
            if size <= known[1]:
                return
            self._counted += size - known[1]  # resized in place
        else:
            self._counted += size
        self._storages[key] = (StorageWeakRef(storage), size)
        if self._counted > self.peak + self.slack:
            self._sweep()
            self.peak = max(self.peak, self._counted)

    def _sweep(self) -> None:
        self._storages = {k: v for k, v in self._storages.items() if not v[0].expired()}
        self._counted = sum(size for _, size in self._storages.values())

    def live(self) -> int:
        """Bytes of the storages alive now."""
        self._sweep()
        return self._counted

    def reset_peak(self) -> None:
        """``torch.cuda.reset_peak_memory_stats``: the peak restarts from what is alive now."""
        self.peak = self.live()
