"""A run on a GPU asks torch's CUDA allocator for expandable segments before CUDA starts (wkvlab.runtime);
checked on the CPU by the environment the run hands to torch."""
import os

import pytest
import torch

from wkvlab.runtime import EXPANDABLE_SEGMENTS, available_memory, use_expandable_segments


@pytest.mark.parametrize("device", ["cuda", "cuda:1", " CUDA "])
def test_a_gpu_run_gets_expandable_segments(device):
    environ = {"PATH": "/bin"}
    assert use_expandable_segments(device, environ) is True
    assert environ == {"PATH": "/bin", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_a_cpu_run_and_a_users_own_setting_are_left_alone():
    assert use_expandable_segments("cpu", environ := {}) is False and environ == {}
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        environ = {name: "max_split_size_mb:128"}
        assert use_expandable_segments("cuda", environ) is False
        assert environ == {name: "max_split_size_mb:128"}


def test_the_gpu_preflight_sets_it_before_asking_cuda_for_free_memory(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    seen = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr("wkvlab.runtime.device_memory_bytes", lambda device: seen.append(os.environ.get("PYTORCH_CUDA_ALLOC_CONF")) or 7)
    assert available_memory("cuda") == 7
    assert seen == [EXPANDABLE_SEGMENTS]


def test_loading_a_model_for_a_gpu_sets_it_first(monkeypatch):
    from wkvlab.models import loading

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setattr(loading, "resolve_device", lambda device: "cuda")

    class Stop(Exception):
        pass

    def resolve_dtype(dtype, device):  # the step after: stop here, with what the environment holds then
        raise Stop(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))

    monkeypatch.setattr(loading, "resolve_dtype", resolve_dtype)
    with pytest.raises(Stop, match="expandable_segments:True"):
        loading.load_model("default", device="cuda")
