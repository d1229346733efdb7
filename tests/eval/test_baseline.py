"""The evaluation baseline: llama.cpp's activation path on every pass for llamacpp: presets on a GGUF."""
import pytest
import torch

from tests.conftest import tiny_llama
from wkvlab.errors import ConfigError
from wkvlab.eval.baseline import FLOAT_BASELINE, Baseline, choose_baseline, llamacpp_baseline
from wkvlab.eval.runner import forward_logits
from wkvlab.kv import KVSpec
from wkvlab.models.packaged import packaged_gguf
from wkvlab.weights.activations import ActivationQuant
from wkvlab.weights.spec import WeightSpec

NONE = [WeightSpec()]


def test_attached_rounds_inputs_only_inside_the_block():
    model = tiny_llama()
    ids = torch.randint(0, 128, (16,))
    plain = forward_logits(model, ids)
    baseline = Baseline("engine", "test", "llamacpp", (("model.layers.0.mlp.down_proj", ActivationQuant(kind="ggml-q8")),))
    with baseline.attached(model):
        rounded = forward_logits(model, ids)
    assert not torch.equal(rounded, plain)
    assert torch.equal(forward_logits(model, ids), plain)  # hooks removed
    with FLOAT_BASELINE.attached(model):
        assert torch.equal(forward_logits(model, ids), plain)


def test_choice_rules_and_refusals(tmp_path):
    from gguf import GGMLQuantizationType as Q

    from tests.engines.test_ggml_acts import _tiny_gguf

    model, gguf = tiny_llama(), str(tmp_path / "tiny.gguf")
    _tiny_gguf(gguf, {"token_embd.weight": Q.Q8_0, "blk.0.attn_q.weight": Q.Q4_1, "blk.1.ffn_down.weight": Q.Q4_K})
    presets = [KVSpec.parse("llamacpp:q8_0"), KVSpec.parse("llamacpp:q4_0"), KVSpec.parse("fp16")]
    chosen, notes = choose_baseline("auto", model=model, source=gguf, weights=NONE, kv=presets)
    assert chosen.kind == "engine" and chosen.description == "ggml-q8 on 2 linears, ggml-q8k on 1 linear" and "llama.cpp" in notes[0]
    mixed, notes = choose_baseline("auto", model=model, source=gguf, weights=NONE, kv=presets + [KVSpec.parse("int4")])
    assert mixed is FLOAT_BASELINE and "--baseline engine" in notes[0]
    assert choose_baseline("auto", model=model, source=gguf, weights=NONE, kv=[KVSpec.parse("int4")]) == (FLOAT_BASELINE, [])
    assert choose_baseline("float", model=model, source=gguf, weights=NONE, kv=presets) == (FLOAT_BASELINE, [])
    with pytest.raises(ConfigError, match="own weights"):
        choose_baseline("engine", model=model, source=gguf, weights=[WeightSpec.parse("int8")], kv=presets)
    with pytest.raises(ConfigError, match="not a llamacpp: preset"):
        choose_baseline("engine", model=model, source=gguf, weights=NONE, kv=[KVSpec.parse("kivi2")])
    with pytest.raises(ConfigError, match="not a GGUF"):
        choose_baseline("engine", model=model, source="/some/hf/folder", weights=NONE, kv=presets)
    with pytest.raises(ConfigError, match="unknown --baseline"):
        choose_baseline("llama", model=model, source=gguf, weights=NONE, kv=presets)


@pytest.mark.slow
def test_engine_baseline_on_the_default_model(default_model):
    """The engine's 16-bit cache against itself is exactly 0; a q8_0 cache costs far more than the cache alone."""
    from wkvlab import api

    work = api.prepare(default_model, "default", ctx=96, tokens=96)
    kv = api.parse_kv(["llamacpp:f16", "llamacpp:q8_0"])
    engine = api.evaluate_workload(work, NONE, kv, baseline="auto")
    floats = api.evaluate_workload(work, NONE, kv, baseline="float")
    assert engine[0].kld["mean"] == 0.0 and floats[0].kld["mean"] == 0.0
    assert engine[1].fidelity["baseline"]["kind"] == "engine" and floats[1].fidelity["baseline"]["kind"] == "float"
    assert engine[1].fidelity["label"] == "engine-checked"
    # measured on 1024-token windows: 0.0003 (cache alone) vs 0.004 (llama.cpp's own); a short window keeps the order
    assert engine[1].kld["mean"] > 5 * floats[1].kld["mean"]
    assert engine[1].to_dict()["fidelity"]["baseline"]["activations"] == "ggml-q8 on 211 linears"
    plan = llamacpp_baseline(default_model.model, packaged_gguf("default"))
    assert dict(plan.activations)["lm_head"] == ActivationQuant(kind="ggml-q8")
