"""Rotation, sinks, skips, query quantization and residual windows on tiny models."""
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama, tiny_qwen3
from tests.kv.test_streaming import assert_streams_as_forced
from wkvlab.kv import KVSpec, kv_quantization
from wkvlab.kv import formats as kv_formats
from wkvlab.kv.attention import mixed_attention, sliding_selection


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

    all_q = mixed_attention(q, k, kq, v, vq, None, scaling=0.25, selection=sliding_selection(0), chunk=7)
    none_q = mixed_attention(q, k, kq, v, vq, None, scaling=0.25, selection=sliding_selection(100), chunk=7)
    torch.testing.assert_close(all_q, eager(kq, vq))
    torch.testing.assert_close(none_q, eager(k, v))


def test_sliding_window_keeps_recent_tokens_exact():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 30))
    ref = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("int2+window=30")):
        torch.testing.assert_close(_logits(model, ids), ref, rtol=1e-4, atol=1e-4)
    with kv_quantization(model, KVSpec.parse("int2+window=8")):
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
    for text in ("int4+window=4", "int2-c4/int2-g32-asym+k_residual=8+v_window=9"):  # KIVI's rule, windows < 32 tokens
        with kv_quantization(model, KVSpec.parse(text)):
            assert torch.isfinite(_logits(model, ids)).all()


def test_flush_selection_follows_kivi_decoding():
    from wkvlab.kv.attention import flush_selection

    sel = flush_selection(4)(torch.arange(10), 10)
    # query 3: nothing flushed yet; query 4..7: tokens 0..3 quantized; query 8, 9: tokens 0..7
    assert sel[3].sum() == 0 and sel[4].tolist()[:5] == [True] * 4 + [False] and sel[9].sum() == 8


def test_per_channel_groups_never_leak_future_tokens():
    # Changing token 20's key must not change what queries < 20 see, even with per-channel groups
    # whose statistics span tokens: groups are used only once closed.
    model = tiny_llama(head_dim=32)
    ids = torch.randint(0, 128, (1, 24))
    other = ids.clone()
    other[0, 20] = (ids[0, 20] + 1) % 128
    spec = KVSpec.parse("int2-c4/int2+residual=8")
    with kv_quantization(model, spec):
        a, b = _logits(model, ids), _logits(model, other)
    torch.testing.assert_close(a[0, :20], b[0, :20], rtol=0, atol=0)
    assert not torch.equal(a[0, 20:], b[0, 20:])


def test_kivi_preset_shape():
    spec = KVSpec.parse("kivi2")
    assert (spec.k, spec.v, spec.k_residual, spec.v_window, spec.residual, spec.window) == ("int2-c32-asym", "int2-g32-asym", 128, 129, 0, 0)
    with pytest.raises(Exception, match="multiple of the token group"):
        KVSpec.parse("int2-c32+residual=48")


def _stats(model):
    from wkvlab.kv.calibrate import collect_kv_stats

    return collect_kv_stats(model, torch.randint(0, 128, (4, 32)))


def test_smooth_attention_without_quantization_leaves_logits_unchanged(lossless_format):
    for build in (tiny_llama, tiny_qwen3, tiny_gemma3):
        model = build()
        stats = _stats(model)
        ids = torch.randint(0, 128, (1, 40))
        ref = _logits(model, ids)
        with kv_quantization(model, KVSpec.parse(lossless_format + "+smooth=0.5"), stats=stats):
            torch.testing.assert_close(_logits(model, ids), ref, rtol=1e-4, atol=1e-4)


def test_smooth_attention_and_calibrated_fp8_need_stats_and_stream_exactly(tmp_path):
    from wkvlab.errors import ConfigError
    from wkvlab.kv.calibrate import KVStats

    model = tiny_llama(head_dim=64, num_attention_heads=2, num_key_value_heads=1, hidden_size=128)
    stats = _stats(model)
    stats.save(tmp_path / "s.safetensors")
    again = KVStats.load(tmp_path / "s.safetensors")
    assert all(torch.equal(getattr(stats, n), getattr(again, n)) for n in ("k_absmax", "v_absmax", "k_pair_absmax"))
    ids = torch.randint(0, 128, (16,))
    for text in ("qserve:kv4", "vllm:fp8_e4m3+scales=tensor", "fp8_e5m2+scales=head"):
        spec = KVSpec.parse(text)
        with pytest.raises(ConfigError, match="calibration"):
            with kv_quantization(model, spec):
                pass
        assert_streams_as_forced(model, spec, ids, stats=again)  # float64: see tests/kv/test_streaming.py


def test_calibrated_fp8_scale_avoids_clipping():
    model = tiny_llama()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.mul_(2000)  # keys far beyond e4m3's 448: scale 1.0 clips them
    stats = _stats(model)
    ids = torch.randint(0, 128, (1, 24))
    ref = _logits(model, ids)
    with kv_quantization(model, KVSpec.parse("fp8_e4m3")):
        static = (_logits(model, ids) - ref).abs().mean()
    with kv_quantization(model, KVSpec.parse("fp8_e4m3+scales=tensor"), stats=stats):
        calibrated = (_logits(model, ids) - ref).abs().mean()
    assert calibrated < static / 2


def test_prerope_without_quantization_leaves_logits_unchanged(lossless_format):
    for build in (tiny_llama, tiny_qwen3, tiny_gemma3):
        model = build()
        ids = torch.randint(0, 128, (1, 30))
        ref = _logits(model, ids)
        with kv_quantization(model, KVSpec.parse(lossless_format + "+prerope")):
            torch.testing.assert_close(_logits(model, ids), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("text", ["kvquant:4", "kvquant:3-1%", "kvquant:2-1%", "int4-c4/int4+residual=4+prerope"])
def test_kvquant_and_prerope_stream_exactly(text):

    model = tiny_llama(head_dim=64, num_attention_heads=2, num_key_value_heads=1, hidden_size=128)
    stats = _stats(model)
    spec = KVSpec.parse(text)
    ids = torch.randint(0, 128, (16,))
    assert_streams_as_forced(model, spec, ids, stats=stats)  # float64: see tests/kv/test_streaming.py


def test_kvquant_codebook_and_outliers():
    from wkvlab.kv.kvquant import fit_codebook, quantize_per_token

    torch.manual_seed(0)
    x = torch.randn(20000).clamp(-3, 3) / 3
    book = fit_codebook(x, 2)
    assert book.shape == (4,) and torch.all(book[1:] > book[:-1])
    # non-uniform: inner centroids closer to 0 than a uniform 4-level grid's ±1/3... for bell-shaped data
    assert book[2] < 1 / 3
    v = torch.randn(1, 1, 3, 64)
    v[0, 0, 1, 5] = 50.0  # an outlier survives exactly with 1% outliers
    out = quantize_per_token(v, fit_codebook(torch.rand(1000) * 2 - 1, 3), 0.01)
    assert out[0, 0, 1, 5] == 50.0
    assert KVSpec.parse("kvquant:3-1%").bytes_per_token(layers=1, kv_heads=1, head_dim=64) == 64 * 3 / 8 * 2 + 4 + 0.01 * 64 * 4 * 2


def test_detected_sinks_stay_exact_and_stream():
    from wkvlab.kv.store import LayerStore

    model = tiny_llama(head_dim=64, num_attention_heads=2, num_key_value_heads=1, hidden_size=128)
    stats = _stats(model)
    # every token far above 0.01x the median peak: all detected, so the cache equals fp16
    ids = torch.randint(0, 128, (12,))
    ref = _logits(model, ids[None])[0]
    everything = KVSpec.parse("int2+sinkratio=0.01")
    with torch.no_grad(), kv_quantization(model, everything, stats=stats):
        torch.testing.assert_close(model(input_ids=ids[None], use_cache=False).logits[0], ref, rtol=0, atol=0)
    spec = KVSpec.parse("int4+sinks=auto")
    assert spec.sink_ratio == 8.0 and KVSpec.parse(spec.label) == spec
    assert_streams_as_forced(model, spec, ids, stats=stats)  # float64: see tests/kv/test_streaming.py
    store = LayerStore(spec, 0, *spec.formats_for(0), 64, stats)
    residual = torch.zeros(1, 3, 128)
    residual[0, 1, 7] = 1e6
    assert store.kept_tokens(3, residual).tolist() == [[False, True, False]]
