"""One intra-op thread for these tests: their matrices are tiny, and on a shared 2-core machine
OpenMP threads spinning for each other made a 64×128 matmul cost milliseconds."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
