"""One thread for torch in these tests: on a shared 2-core machine two OpenMP threads spin-wait on
each other and tiny matmuls run ~100x slower (measured: 13 ms vs 0.07 ms per 32x64 linear)."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
