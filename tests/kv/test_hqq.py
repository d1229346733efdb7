"""HQQ's QuantizedCache backend (hf-hqq:*): kernel, flush chain and spec rules against values worked
out by hand from hqq 0.2.8.post1's formulas (mobiusml/hqq@e0b1d00e hqq/core/quantize.py, optimize.py)
and transformers 5.24's QuantizedLayer.update. The replay against the real hqq is
tests/kv/test_hqq_cache_replay.py (slow: it pip-installs hqq into its own venv)."""
import math

import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama
from tests.kv.test_streaming import test_streaming_equals_teacher_forced_llama
from wkvlab.errors import ConfigError
from wkvlab.eval.chunks import WindowPass, chunk_bounds
from wkvlab.formats.hqq import fake_quant_hqq
from wkvlab.kv import KVSpec, kv_quantization
from wkvlab.kv.hook import layer_stores
from wkvlab.kv.requant import FlushChain, flush_points
from wkvlab.kv.tokens import TokenPolicy


def test_axis0_groups_are_columns_of_the_flattened_cache():
    # [1 head, 2 tokens, 64] flattened and reshaped to [64, 2]: group 0 = the even flat positions,
    # group 1 = the odd ones, each spread over both tokens. Each group is an exact 4-bit grid
    # (0.25·k, and -2 + 0.5·k, k = 0..15 with both ends present): scale 4 resp. 2, zero 0 resp. 4,
    # zero error at the first step, so the solver stops with zero unchanged and the cache comes back exact.
    k = torch.tensor([0, 15] + [(3 * i) % 16 for i in range(62)], dtype=torch.float32)
    flat = torch.empty(128)
    flat[0::2], flat[1::2] = 0.25 * k, -2 + 0.5 * k.flip(0)
    x = flat.reshape(1, 1, 2, 64)
    assert torch.equal(fake_quant_hqq(x, 4, 64), x)
    # per-token groups of 64 (quanto's, or HQQ's axis 1) mix both grids: one range -2..5.5, step 0.5, not exact
    assert not torch.equal(fake_quant_hqq(x, 4, 64, axis=1), x)
    assert (KVSpec.parse("int4-g64-asym").k_format.quantize(x) - x).abs().max() > 0.1


def _shrink(v: float) -> float:  # hqq shrink_lp_op with beta 10, lp_norm 0.7
    return math.copysign(max(abs(v) - 0.1 * abs(v) ** -0.3, 0.0), v) if v else 0.0


def test_one_bit_solver_by_hand():
    # one group [0, 0.3, 0.6, 1], 1 bit: scale = 1/(1 - 0) = 1, zero = 0. Step 0: W_q = [0, 0, 1, 1],
    # error 0.175; zero_1 = mean(W_q - (W - shrink(W - W_r))). Step 1 (zero_1): error 0.17648 is worse,
    # so the solver stops — keeping the zero_2 it computed in that step (legacy solver), not zero_1.
    W = [0.0, 0.3, 0.6, 1.0]
    zero, best, zeros = 0.0, math.inf, []
    for _ in range(20):
        q = [min(max(round(w + zero), 0), 1) for w in W]
        r = [c - zero for c in q]
        error = sum(abs(w - v) for w, v in zip(W, r)) / 4
        zero = sum(c - (w - _shrink(w - v)) for c, w, v in zip(q, W, r)) / 4
        zeros.append(zero)
        if error < best:
            best = error
        else:
            break
    assert len(zeros) == 2 and zeros[1] == pytest.approx(-0.0046296, abs=1e-7)
    expected = torch.tensor([min(max(round(w + zeros[1]), 0), 1) - zeros[1] for w in W])  # (W_q - zero) * 1/scale
    got = fake_quant_hqq(torch.tensor(W).reshape(1, 1, 1, 4), 1, 4).flatten()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert abs(got[0] - (-zeros[0])) > 1e-3  # the best step's zero (0.00297) would be a different cache


def test_each_sequence_is_its_own_tensor():
    x = torch.randn(3, 2, 7, 64)
    alone = torch.cat([fake_quant_hqq(x[i : i + 1], 4) for i in range(3)])
    assert torch.equal(fake_quant_hqq(x, 4), alone)


def test_flush_chain_requantizes_the_dequantized_cache():
    # QuantizedLayer.update with residual_length 4 after a 5-token prompt: the prompt is quantized at
    # the first update; flushes at 5 + 4m quantize cat(dequantized cache, the 4 new tokens)
    assert flush_points(TokenPolicy(residual=4, prefill=5), 18) == [5, 9, 13, 17]
    assert flush_points(TokenPolicy(residual=4), 13) == [4, 8, 12]
    calls = []

    def spy(x):
        calls.append(x.clone())
        return x + 1000.0  # marks what was quantized, and how often

    raw = torch.arange(18.0).reshape(1, 1, 18, 1)
    chain = FlushChain(spy, TokenPolicy(residual=4, prefill=5))
    assert torch.equal(chain.seen_by(4, raw), raw) and not calls  # the prompt attends unquantized
    assert chain.seen_by(12, raw).flatten().tolist() == [2000.0, 2001, 2002, 2003, 2004, 1005, 1006, 1007, 1008, *range(9, 18)]
    assert [c.shape[-2] for c in calls] == [5, 9]
    assert torch.equal(calls[1].flatten(), torch.tensor([1000.0, 1001, 1002, 1003, 1004, 5, 6, 7, 8]))
    chain.seen_by(12, raw)  # the same flush again: nothing re-quantized
    assert len(calls) == 2
    with pytest.raises(ValueError):
        chain.seen_by(7, raw)


@pytest.mark.parametrize("text", ["hf-hqq:int4+residual=4+prefill=5", "hf-hqq:int3+residual=4", "hqq2-g32/int4+residual=6"])
def test_streaming_equals_teacher_forced(text):
    test_streaming_equals_teacher_forced_llama(text)


@pytest.mark.parametrize("chunk", [7, 16])
def test_chunked_equals_teacher_forced(chunk):
    model = tiny_llama(head_dim=64, num_attention_heads=2, num_key_value_heads=1, hidden_size=128)
    ids = torch.randint(0, 128, (48,))
    spec = KVSpec.parse("hf-hqq:int4+residual=8+prefill=5")
    with torch.no_grad(), kv_quantization(model, spec):
        whole = model(input_ids=ids[None], use_cache=False).logits[0]
    window = WindowPass(model, spec, layer_stores(model, spec))
    chunked = torch.cat([window.step(ids[start:end]) for start, end in chunk_bounds(ids.numel(), chunk)])
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        ref = model(input_ids=ids[None], use_cache=False).logits[0]
    # the prompt attends unquantized (float32 attention here, the model's sdpa there: not bit for bit)
    torch.testing.assert_close(whole[:5], ref[:5], rtol=0, atol=1e-5)
    assert (whole[5:] - ref[5:]).abs().max() > 1e-3


def test_spec_rules():
    spec = KVSpec.parse("hf-hqq:int4")
    assert (spec.k, spec.v, spec.residual, spec.prefill) == ("hqq4-g64", "hqq4-g64", 128, 1)
    # b bits per value (3-bit: 10 codes per int32) + a 2-byte scale and zero per 64 values
    shape = dict(layers=30, kv_heads=3, head_dim=64)
    assert spec.bytes_per_token(**shape, context=None) == 2 * 30 * 3 * (32 + 4)
    assert KVSpec.parse("hf-hqq:int3").bytes_per_token(**shape) == pytest.approx(2 * 30 * 3 * (64 * 3.2 / 8 + 4))
    for bad in ("hqq4", "hqq4+window=4", "hqq4+residual=4+pastonly", "hf-hqq:int4+sinks=2", "hqq5", "hqq4-g0", "hf-hqq:int5"):
        with pytest.raises(ConfigError):
            KVSpec.parse(bad)
    with pytest.raises(ConfigError, match="divide head_dim 32"):
        layer_stores(tiny_llama(), spec)  # head_dim 32: groups of 64 would straddle tokens at some lengths
    with pytest.raises(ConfigError, match="full-attention"):
        layer_stores(tiny_gemma3(), spec)  # QuantizedCache refuses models with sliding layers
    layer_stores(tiny_gemma3(), KVSpec.parse("hf-hqq:int4+skip=sliding_window"))
    from wkvlab.kv.presets import fidelity_of

    # QuantizedCache's own settings keep the label; anything else is no longer QuantizedCache
    assert fidelity_of(KVSpec.parse("hf-hqq:int4+residual=64+prefill=512"))["label"] == "source-faithful"
    assert fidelity_of(KVSpec.parse("hf-hqq:int4+skip=sliding_window"))["label"] == "approximate"


def test_sliding_models_refused_before_loading(tmp_path):
    import json

    from wkvlab.models.facts import ModelFacts, model_facts
    from wkvlab.preflight import check_kv_for_model

    spec = KVSpec.parse("hf-hqq:int4")
    with pytest.raises(ConfigError, match="full-attention"):
        check_kv_for_model([spec], ModelFacts(18, 1, 256, 32768, sliding=True))
    check_kv_for_model([KVSpec.parse("hf-hqq:int4+skip=sliding_window"), KVSpec.parse("int4")], ModelFacts(18, 1, 256, 32768, sliding=True))
    check_kv_for_model([spec], ModelFacts(30, 3, 64, 8192))
    base = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 128, "max_position_embeddings": 256}
    for extra, sliding in (({"layer_types": ["sliding_attention", "full_attention"]}, True), ({"layer_types": ["full_attention"] * 2}, False),
                           ({"sliding_window": 4096}, True), ({"sliding_window": 4096, "use_sliding_window": False}, False), ({}, False)):
        folder = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({**base, **extra}))
        assert model_facts(str(folder)).sliding is sliding, extra
