"""Gemma-3-270M: BOS at every window, sliding-window layers, one KV head, head_dim 256."""
import pytest

from wkvlab import api
from wkvlab.models.loading import load_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m")


def test_gemma_windows_start_with_bos_and_identity_is_exact(gemma):
    cfg = gemma.model.config
    assert (cfg.num_key_value_heads, cfg.head_dim) == (1, 256)
    assert "sliding_attention" in cfg.layer_types
    work = api.prepare(gemma, "default", ctx=64, tokens=128)
    assert work.windows.bos and (work.windows.tokens[:, 0] == gemma.tokenizer.bos_token_id).all()
    ident, q8 = api.evaluate_workload(work, api.parse_weights(["none"]), api.parse_kv(["fp16", "q8_0"]))
    assert ident.kld["max"] == 0.0
    assert 0 < q8.kld["mean"] < ident.ppl_ref  # finite, positive, and not absurd
    assert q8.kv_bytes_per_token == cfg.num_hidden_layers * 1 * 2 * (256 // 32) * 34
