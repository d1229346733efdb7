"""The search tests run tiny models: one torch thread (see ``one_torch_thread`` in tests/conftest.py)."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    yield
