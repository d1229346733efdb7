"""Formats on the device (a GPU stood in for by ``meta``): no CPU tensor meets the data, and their
constants (Hadamard matrices, vLLM's RHT signs, the iq4_nl codebook and LUTs, SGLang's E2M1 grid)
reach the device once, not on every call (each copy from the host is a synchronization on a GPU)."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo  # noqa: F401 - a nested dispatch mode imports it lazily, which fails while fake_accelerator swaps torch.Generator
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.fake_device import META, fake_accelerator
from wkvlab.formats import fake_quant_ggml
from wkvlab.formats.hadamard import rotate
from wkvlab.kv.formats import KV_FORMATS, get_kv_format

FORMATS = [name for name in KV_FORMATS if not get_kv_format(name).is_identity] + ["exl3_4", "int2-c4", "int4-g32"]


class _HostCopies(TorchDispatchMode):
    """Counts copies from the CPU to another device, as the dispatcher sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        target = kwargs.get("device")
        if func is torch.ops.aten._to_copy.default and tensors[0].device.type == "cpu" and target is not None and torch.device(target).type != "cpu":
            self.copies += 1
        if func is torch.ops.aten.copy_.default and tensors[0].device.type != "cpu" and tensors[1].device.type == "cpu" and tensors[1].dim() > 0:
            self.copies += 1
        return func(*args, **kwargs)


def _host_copies(monkeypatch, fn) -> int:
    """Host-to-device copies of one call: dispatcher copies plus ``torch.tensor(data, device=...)``
    (built on the host and copied, below the dispatcher)."""
    made = []
    real = torch.tensor

    def tensor(data, *args, **kwargs):
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type != "cpu":
            made.append(1)
        return real(data, *args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    with _HostCopies() as mode:
        fn()
    monkeypatch.setattr(torch, "tensor", real)
    return mode.copies + len(made)


@pytest.mark.parametrize("name", FORMATS)
def test_every_kv_format_runs_on_the_device_and_copies_its_constants_once(name, monkeypatch):
    fmt = get_kv_format(name)
    x = torch.randn(1, 2, 8, 64).to(META)
    with fake_accelerator():  # any op mixing a CPU tensor with the data raises here
        fmt.quantize(x)
        assert _host_copies(monkeypatch, lambda: fmt.quantize(x)) == 0


def test_the_rotation_and_iq4_nl_copy_nothing_after_the_first_call(monkeypatch):
    x = torch.randn(4, 128).to(META)
    with fake_accelerator():
        rotate(x, 64)
        fake_quant_ggml(x, "iq4_nl")
        assert _host_copies(monkeypatch, lambda: (rotate(x, 64), rotate(x, 64, inverse=True), fake_quant_ggml(x, "iq4_nl"))) == 0


def test_the_counter_sees_a_constant_built_per_call(monkeypatch):
    # the same measure on the old code's pattern: a CPU-cached matrix moved on every call
    h = torch.ones(64, 64)
    x = torch.randn(4, 64).to(META)
    with fake_accelerator():
        assert _host_copies(monkeypatch, lambda: x @ h.to(x.device)) == 1
        assert _host_copies(monkeypatch, lambda: torch.tensor([1.0, 2.0], device=x.device)) == 1
