"""The streamed safetensors writer: read back by safetensors itself, one tensor held at a time."""
import gc
import weakref

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from wkvlab.tensorfile import write_state, write_tensors


def test_safetensors_reads_back_every_dtype_and_shape(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.randn(7).bfloat16(), "c": torch.arange(6, dtype=torch.int64).reshape(2, 3),
               "d": torch.tensor([True, False, True]), "e": torch.tensor(2.5, dtype=torch.float16), "f": torch.zeros(0, 4),
               "g": torch.randn(4, 6)[:, ::2]}  # not contiguous
    write_state(tmp_path / "x.safetensors", tensors.items(), {"k": "v"})
    back = load_file(str(tmp_path / "x.safetensors"))
    assert set(back) == set(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
    with safe_open(str(tmp_path / "x.safetensors"), "pt") as handle:
        assert handle.metadata() == {"k": "v"}


def test_one_fetched_tensor_is_alive_at_a_time(tmp_path):
    alive: list[weakref.ref] = []
    most = 0

    def fetch(name):
        nonlocal most
        gc.collect()
        most = max(most, sum(r() is not None for r in alive))
        value = torch.full((64,), float(int(name)))
        alive.append(weakref.ref(value))
        return value

    write_tensors(tmp_path / "y.safetensors", {str(i): ((64,), torch.float32) for i in range(5)}, fetch)
    assert most == 0  # the previous tensor was released before the next was fetched
    assert load_file(str(tmp_path / "y.safetensors"))["3"][0].item() == 3.0


def test_a_tensor_unlike_its_header_is_refused(tmp_path):
    with pytest.raises(ValueError, match="header says"):
        write_tensors(tmp_path / "z.safetensors", {"a": ((2,), torch.float32)}, lambda _n: torch.zeros(3))
