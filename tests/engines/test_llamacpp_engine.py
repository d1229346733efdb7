"""llama.cpp in-process on the default model's GGUF (slow: needs llama-cpp-python, which make test-all installs)."""
import numpy as np
import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed; make test-all installs the llamacpp extra")

from wkvlab.engines.bridge import compare_window  # noqa: E402
from wkvlab.engines.llamacpp import LlamaCppEngine  # noqa: E402
from wkvlab.eval.runner import forward_logits  # noqa: E402
from wkvlab.models.packaged import packaged_gguf  # noqa: E402

CTX = 64


@pytest.fixture(scope="module")
def window(default_model):
    from wkvlab.data import load_corpus, tokenize

    ids = tokenize(default_model.tokenizer, load_corpus("default").text)
    return ids[: 2 * CTX].view(2, CTX)


@pytest.mark.slow
def test_f16_engine_matches_transformers_within_the_noise_floor_and_resets_between_windows(default_model, window):
    engine = LlamaCppEngine(packaged_gguf("default"), "f16", ctx=CTX)
    try:
        first = engine.score_window(window[0], 0)
        engine.score_window(window[1], 0)  # a different window in between must leave no trace
        again = engine.score_window(window[0], 0)
    finally:
        engine.close()
    assert first.logits.shape == (CTX - 1, default_model.model.config.vocab_size)
    torch.testing.assert_close(first.logits, again.logits, rtol=0, atol=0)
    got = compare_window(forward_logits(default_model.model, window[0]), window[0], first).metrics
    # two correct implementations of the same Q4_1 checkpoint: close, not equal (llama.cpp
    # quantizes activations to 8 bits for its Q4_1 matmuls and keeps an f16 cache)
    assert 0 < got.kld.mean() < 0.05
    assert got.top1_agree.mean() > 0.85


@pytest.mark.slow
def test_quantized_caches_cost_more_the_fewer_bits(default_model, window):
    logits = {}
    for kv in ("f16", "q8_0", "q4_0"):
        engine = LlamaCppEngine(packaged_gguf("default"), kv, ctx=CTX, flash_attn="on")
        try:
            logits[kv] = engine.score_window(window[0], 0)
        finally:
            engine.close()
    ref = logits["f16"].logits
    full = torch.zeros(CTX, ref.shape[-1])
    full[:-1] = ref
    kld = {kv: compare_window(full, window[0], logits[kv]).metrics.kld.mean() for kv in ("q8_0", "q4_0")}
    assert 0 < kld["q8_0"] < kld["q4_0"]
