"""Host allocations a loader makes, as tracemalloc sees them: numpy's (a dequantized GGUF tensor), not torch's."""
from __future__ import annotations

import tracemalloc
from typing import Callable

import torch

from tests.conftest import tiny_llama


def wide_llama() -> torch.nn.Module:
    """A tiny Llama whose largest tensor is under a thirtieth of the model: "one tensor" and "the model" differ."""
    model = tiny_llama(vocab_size=128, hidden_size=256, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
                       num_key_value_heads=4)
    assert sum(p.numel() for p in model.parameters()) > 30 * max(p.numel() for p in model.parameters())
    return model


def assert_loads_a_few_tensors_at_a_time(model: torch.nn.Module, load: Callable[[], torch.nn.Module]) -> None:
    """``load()`` (``model`` written as a q8_0 GGUF, read back) peaks at a few of its tensors in host
    allocations — one dequantized, gguf-py's block arithmetic on it, a processed copy —, under a fifth
    of the model; the tensors q8_0 leaves exact (embedding, norms) come back bit for bit."""
    total = sum(p.numel() * 4 for p in model.parameters())
    largest = max(p.numel() * 4 for p in model.parameters())
    tracemalloc.start()
    try:
        loaded = load()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * largest < total / 5, (peak, largest, total)
    for name, value in model.state_dict().items():
        if ".layers." not in name or value.ndim == 1:  # the q8_0 linears differ by their rounding; the rest is exact
            assert torch.equal(loaded.state_dict()[name], value), name
