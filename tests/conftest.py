"""Shared fixtures: tiny random models built in-process, and the packaged default model."""
from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tests never touch the user's cache unless WKVLAB_CACHE is set explicitly (CI reuses one)."""
    if "WKVLAB_CACHE" not in os.environ:
        os.environ["WKVLAB_CACHE"] = str(tmp_path_factory.mktemp("wkvlab-cache"))
    yield


@pytest.fixture(autouse=True)
def _one_run_per_test():
    """A CLI command registers a listener for the memory estimates its grids announce (cliopts.start_run): it lives
    as long as the process, which is one command for a user but the whole session for in-process CLI tests, where
    it would print one test's estimates into a later test's stderr (the gpu_check test saw exactly that)."""
    yield
    from wkvlab.eval import memory

    memory._LISTENERS.clear()


def tiny_llama(seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=256, head_dim=32)
    cfg.update(overrides)
    model = LlamaForCausalLM(LlamaConfig(**cfg)).eval()
    return model


def tiny_gemma3(seed: int = 0):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=64, vocab_size=128, max_position_embeddings=256,
                           sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    return Gemma3ForCausalLM(cfg).eval()


def tiny_qwen3(seed: int = 0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=256)
    return Qwen3ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread: on the shared 2-core machine two OpenMP threads spin-wait on each other
    and tiny matmuls run ~100× slower (13 ms instead of 0.1 ms per 64×128 linear, measured).
    Request it from an autouse fixture in an area's conftest.py."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def default_model():
    """The packaged SmolLM2 model, loaded once per test session."""
    from wkvlab.models.loading import load_model

    return load_model("default")


def tiny_mistral(seed: int = 0):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    cfg = MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=32, vocab_size=128, max_position_embeddings=256, sliding_window=16)
    return MistralForCausalLM(cfg).eval()
