"""Rotation, sinks, skips, query quantization and residual windows on tiny models."""
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama, tiny_qwen3
from wkvlab.kv import KVSpec, kv_quantization
from wkvlab.kv import formats as kv_formats
from wkvlab.kv.attention import mixed_attention, residual_selection


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


@pytest.fixture
def lossless_format(monkeypatch):
    """A 'quantizer' that changes nothing but is not the identity: exercises every code path."""
    fmt = kv_formats.KVFormat("lossless", "test only", lambda x: x.clone(), lambda d: 2.0 * d)
    monkeypatch.setitem(kv_formats.KV_FORMATS, "lossless", fmt)
    return "lossless"


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen3, tiny_gemma3])
def test_rotation_without_quantization_leaves_logits_unchanged(build, lossless_format):
    model = build()
    ids = torch.randint(0, 128, (1, 40))
    ref = _logits(model, ids)
    for rot in ("+rot=32", "+rot=full"):
        with kv_quantization(model, KVSpec.parse(lossless_format + rot)):
            torch.testing.assert_close(_logits(model, ids), ref, rtol=1e-4, atol=1e-4)


def test_rotation_reduces_error_with_an_outlier_channel():
    torch.manual_seed(0)
    k = torch.randn(1, 1, 64, 64)
    k[..., 3] *= 30  # one outlier channel, as real keys have
    from wkvlab.formats import fake_quant_ggml
    from wkvlab.formats.hadamard import rotate

    plain = (fake_quant_ggml(k, "q4_0") - k).pow(2).mean()
    rotated = (rotate(fake_quant_ggml(rotate(k, 64), "q4_0"), 64, inverse=True) - k).pow(2).mean()
    assert rotated < plain / 2


def test_all_layers_skipped_equals_fp16_exactly():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 32))
    ref = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("llamacpp:q4_0+skip=0,1")):
        assert torch.equal(_logits(model, ids), ref)


def test_sinks_covering_the_window_equal_fp16_exactly():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 24))
    ref = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("int2+sinks=24")):
        assert torch.equal(_logits(model, ids), ref)
    with kv_quantization(model, KVSpec.parse("int2+sinks=4")):
        partial = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("int2")):
        full = _logits(model, ids)
    # the first positions only attend to sinks: identical to the reference there
    assert torch.equal(partial[0, :4], ref[0, :4]) and not torch.equal(full[0, :4], ref[0, :4])


def test_query_quantization_changes_logits_only_where_k_is_quantized():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 32))
    with kv_quantization(model, KVSpec.parse("q8_0")):
        plain = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("q8_0+q=q8_0")):
        with_q = _logits(model, ids)
    assert not torch.equal(plain, with_q)
    ref = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("fp16+q=q8_0")):
        assert torch.equal(_logits(model, ids), ref)


def test_mixed_attention_matches_eager_at_both_extremes():
    torch.manual_seed(0)
    q, k, kq, v, vq = (torch.randn(1, h, 20, 16) for h in (4, 2, 2, 2, 2))

    def eager(keys, values):
        keys, values = keys.repeat_interleave(2, 1), values.repeat_interleave(2, 1)
        s = q @ keys.transpose(-1, -2) * 0.25
        s = s.masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), float("-inf"))
        return (torch.softmax(s, -1) @ values).transpose(1, 2)

    all_q = mixed_attention(q, k, kq, v, vq, None, scaling=0.25, selection=residual_selection(0), chunk=7)
    none_q = mixed_attention(q, k, kq, v, vq, None, scaling=0.25, selection=residual_selection(100), chunk=7)
    torch.testing.assert_close(all_q, eager(kq, vq))
    torch.testing.assert_close(none_q, eager(k, v))


def test_residual_window_keeps_recent_tokens_exact():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 30))
    ref = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("int2+residual=30")):
        torch.testing.assert_close(_logits(model, ids), ref, rtol=1e-4, atol=1e-4)
    with kv_quantization(model, KVSpec.parse("int2+residual=8")):
        windowed = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("int2")):
        full = _logits(model, ids)
    # positions < 8 see only residual tokens; later ones see quantized old tokens
    torch.testing.assert_close(windowed[0, :8], ref[0, :8], rtol=1e-4, atol=1e-4)
    err_w, err_f = (windowed - ref).abs().mean(), (full - ref).abs().mean()
    assert 0 < err_w < err_f


def test_residual_window_respects_sliding_masks():
    model = tiny_gemma3()
    ids = torch.randint(0, 128, (1, 32))
    with kv_quantization(model, KVSpec.parse("int4+residual=4")):
        out = _logits(model, ids)
    assert torch.isfinite(out).all()
