"""Integration on the packaged SmolLM2: loading, the safetensors cache, and exact identity."""
import pytest
import torch

from wkvlab import api
from wkvlab.errors import ConfigError, ModelError
from wkvlab.models.loading import load_model
from wkvlab.weights import WeightSpec, quantize_model_weights

pytestmark = pytest.mark.slow


def test_cached_reload_is_bit_identical(default_model):
    again = load_model("default")  # second load comes from the safetensors copy
    a, b = default_model.model.state_dict(), again.model.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert default_model.fingerprint == again.fingerprint
    assert default_model.max_context == 8192


def test_identity_config_gives_exactly_zero_kld(default_model):
    [result] = api.evaluate(default_model, "default", ctx=128, tokens=256, weights=["none"], kv=["fp16"])
    assert result.tokens == 2 * 127
    assert result.kld["mean"] == 0.0 and result.kld["max"] == 0.0
    assert result.top1_agreement == 1.0 and result.ppl == result.ppl_ref


def test_q4_1_grid_is_reproduced_exactly(default_model):
    # The checkpoint is a dequantized Q4_1 GGUF: asymmetric 4-bit, groups of 32, float minimum.
    lossless = quantize_model_weights(default_model.model, WeightSpec.parse("int4-g32-fmin"))
    assert lossless.lossless and any("lossless" in n for n in lossless.notes)
    lossy = quantize_model_weights(default_model.model, WeightSpec.parse("int4-g128"))
    assert not lossy.lossless and any("not multiples of 128" in n for n in lossy.notes)


def test_grid_shares_reference_and_orders_results(default_model):
    results = api.evaluate(default_model, "default", ctx=128, tokens=128, weights=["none", "int4-g128"], kv=["fp16", "q4_0"])
    assert [(r.weights, r.kv) for r in results] == [("none", "fp16"), ("none", "q4_0"), ("int4-g128", "fp16"), ("int4-g128", "q4_0")]
    ppl_ref = {r.ppl_ref for r in results}
    assert len(ppl_ref) == 1
    kld = {(r.weights, r.kv): r.kld["mean"] for r in results}
    assert kld[("none", "fp16")] == 0.0
    assert 0 < kld[("none", "q4_0")] and 0 < kld[("int4-g128", "fp16")]
    d = results[3].to_dict()
    for key in ("model", "data", "tokens", "weights", "kv", "ppl", "ppl_ref", "kld", "top1_agreement", "delta_p",
                "by_position", "weight_bytes", "kv_bytes_per_token", "seconds", "versions"):
        assert key in d
    assert set(d["kld"]) == {"mean", "se", "median", "p90", "p99", "p999", "max"}
    assert d["kv_bytes_per_token"] == 30 * 3 * 2 * 18 * 2


def test_context_longer_than_model_is_refused(default_model):
    with pytest.raises(ConfigError, match="maximum context 8192"):
        api.prepare(default_model, "default", ctx=9000, tokens=9000)


def test_bad_model_paths(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        load_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ModelError, match="not a .gguf"):
        load_model(str(tmp_path / "notes.txt"))
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 10}')
    with pytest.raises(ModelError, match="causal language model"):
        load_model(str(tmp_path / "bert"))
