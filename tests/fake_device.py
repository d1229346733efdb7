"""A stand-in for a GPU on a CPU-only machine: torch's ``meta`` device plus a strict device audit.

On CUDA, an op that mixes a CPU tensor with a device tensor fails ("Expected all tensors to be on
the same device"); ``meta`` refuses some such mixes (add, where, stack) but not all (matmul,
indexing and gather pass). Inside :func:`fake_accelerator`, every aten op is checked: all its
tensor arguments must share one device (0-dim CPU scalars excepted, as CUDA allows them), except
the explicit copies (``.to``, ``copy_``). Values on ``meta`` do not exist, so the few places that
must leave the device get placeholders: a copy from ``meta`` to the CPU gives zeros, ``.item()``
gives 0, data-dependent shapes (``nonzero``) are empty, ``torch.equal`` is False and random
generators on ``meta`` are CPU generators. A whole evaluation path can so run "on the device":
the numbers are meaningless, but every tensor a function creates on the CPU and then mixes with
the data fails the test exactly where it would crash on a GPU.

The audit also counts what would make the host wait for the device on a GPU (``syncs``, each
kind in ``sync_kinds``, and where it came from in ``sync_sites``): ``.item()`` and every other
read of a device scalar, boolean-mask indexing and ``nonzero`` (their result's shape depends on
the data), copies from the device to the host, and copies from the host to the device
(``.to(device)`` of a CPU tensor, ``torch.tensor(data, device=...)``: from pageable memory a
blocking copy). A test divides them by what ran (chunks, passes) to hold a path to its budget.

A model may also be split between the CPU and ``meta`` (``split_model``), the two-device
placement accelerate makes with ``device_map``: hidden states move between them through
accelerate's own hooks.
"""
from __future__ import annotations

import traceback
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
META = torch.device("meta")
_COPIES = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default,
           aten.to.dtype_layout, aten.to.device, aten.to.dtype, aten.lift_fresh.default, aten.lift_fresh_copy.default}
_DATA_DEPENDENT = {aten.nonzero.default}
_SRC = "/src/wkvlab/"


class CrossDeviceOp(AssertionError):
    """An op received tensors on two devices: it would fail on a GPU."""


class _Audit(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.host_copies = 0  # copies from meta to the CPU (what a GPU run would synchronize on)
        self.sync_kinds: Counter[str] = Counter()  # what would make the host wait for a GPU, by kind
        self.sync_sites: Counter[str] = Counter()  # ... by the wkvlab line that asked for it

    @property
    def syncs(self) -> int:
        return sum(self.sync_kinds.values())

    def sync(self, kind: str) -> None:
        self.sync_kinds[kind] += 1
        frames = [f for f in traceback.extract_stack()[:-2] if _SRC in f.filename.replace("\\", "/")]
        where = f"{frames[-1].filename.split(_SRC)[-1]}:{frames[-1].lineno}" if frames else "outside wkvlab"
        self.sync_sites[f"{kind} at {where}"] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        self.ops += 1
        if func in _COPIES:
            return self._copy(func, args, kwargs, tensors)
        if func is aten._local_scalar_dense.default and tensors and tensors[0].is_meta:
            self.host_copies += 1
            self.sync("item")
            return False if tensors[0].dtype == torch.bool else 0
        if func is aten.equal.default and any(t.is_meta for t in tensors):
            self._check(func, tensors)
            self.sync("item")  # torch.equal answers a Python bool
            return False
        if func in _DATA_DEPENDENT and tensors[0].is_meta:
            self.sync("data-dependent shape")
            return torch.empty((0, tensors[0].dim()), dtype=torch.long, device=META)
        if func is aten.index.Tensor and tensors[0].is_meta and any(i is not None and i.dtype == torch.bool for i in args[1]):
            self._check(func, tensors)  # a boolean mask selects a data-dependent count: all of it, on meta
            self.sync("boolean mask")
            every = lambda mask: torch.arange(mask.shape[0], device=META)  # noqa: E731 - 1-D masks only
            return func(args[0], [every(i) if i is not None and i.dtype == torch.bool else i for i in args[1]])
        self._check(func, tensors)
        return func(*args, **kwargs)

    @staticmethod
    def _check(func, tensors) -> None:
        devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
        if len(devices) > 1:
            raise CrossDeviceOp(f"{func} mixes devices {sorted(str(d) for d in devices)}")

    def _copy(self, func, args, kwargs, tensors):
        if func is aten.copy_.default:
            dst, src = tensors[0], tensors[1]
            if src.is_meta and not dst.is_meta:
                self.host_copies += 1
                self.sync("device to host")
                return dst.zero_()
            if dst.is_meta and not src.is_meta:
                self.sync("host to device")
            return func(*args, **kwargs)
        src = tensors[0]
        target = kwargs.get("device")
        if src.is_meta and target is not None and torch.device(target).type != "meta":
            self.host_copies += 1
            self.sync("device to host")
            return torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype, device=target)
        if not src.is_meta and target is not None and torch.device(target).type == "meta":
            self.sync("host to device")
        return func(*args, **kwargs)


@contextmanager
def fake_accelerator() -> Iterator[_Audit]:
    """Within the block, cross-device ops raise :class:`CrossDeviceOp`; ``meta`` tensors can be read back (as zeros)."""
    real_generator, real_tensor = torch.Generator, torch.tensor
    audit = _Audit()

    def generator(device="cpu"):
        return real_generator("cpu" if torch.device(device).type == "meta" else device)

    def tensor(data, *args, **kwargs):  # built on the host and copied below the dispatcher: count it here
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "meta":
            audit.sync("host to device")
        return real_tensor(data, *args, **kwargs)

    torch.Generator = generator  # torch has no generator on meta; CUDA has one
    torch.tensor = tensor
    try:
        with audit:
            yield audit
    finally:
        torch.Generator, torch.tensor = real_generator, real_tensor


def on_meta(model: torch.nn.Module) -> torch.nn.Module:
    """The model with every parameter and buffer on ``meta`` (values are lost: use for device checks only)."""
    return model.to(META)


def split_model(model: torch.nn.Module, meta_layers: set[int], *, head_on_meta: bool = False) -> torch.nn.Module:
    """Decoder layers ``meta_layers`` (and the final norm and lm_head with ``head_on_meta``) on
    ``meta``, the rest on the CPU, with accelerate's device-alignment hooks moving the inputs of
    each placed module to its device — what ``device_map`` does across two GPUs."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    cpu = torch.device("cpu")
    placed = [(layer, META if index in meta_layers else cpu) for index, layer in enumerate(model.model.layers)]
    placed += [(module, META if head_on_meta else cpu) for module in (model.model.norm, model.lm_head)]
    for module, device in placed:
        module.to(device)
        add_hook_to_module(module, AlignDevicesHook(execution_device=device, io_same_device=False))
    return model
