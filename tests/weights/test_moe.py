"""Fused MoE experts (transformers 5.x: 3-D gate_up_proj / down_proj): every expert quantized as its
own linear by RTN formats and GPTQ, or the config refused in one line — never left at 16 bits
under the config's label."""
import pytest
import torch

from tests.models.tiny_folders import VOCAB, tiny_gpt_oss, tiny_mixtral, tiny_qwen2_moe, tiny_qwen3_moe
from wkvlab.errors import ConfigError
from wkvlab.weights import ActivationQuant, CalibrationSet, CalibrationSpec, WeightSpec, fake_quant_activation, quantize_model_weights
from wkvlab.weights.apply import all_experts, model_weight_bytes, resolve_experts
from wkvlab.weights.experts import expert_inputs
from wkvlab.weights.restore import WeightSnapshot
from wkvlab.weights.rtn import quantize_weight
from wkvlab.weights.storage import weight_storage_bytes
from wkvlab.weights.support import check_config

MOE = [tiny_mixtral, tiny_qwen3_moe, tiny_qwen2_moe, tiny_gpt_oss]  # gpt-oss: transposed, interleaved, biased experts


def _calibration(samples=8, length=32) -> CalibrationSet:
    g = torch.Generator().manual_seed(1)
    return CalibrationSet(CalibrationSpec("prose", samples, length), torch.randint(0, VOCAB, (samples, length), generator=g), "test")


def _expert_tensors(model):
    return {n: p for n, p in model.named_parameters() if p.dim() == 3}


@pytest.mark.parametrize("make", MOE)
@pytest.mark.parametrize("config", ["int4-g128", "int8", "fp8-wo", "q4_0", "mxfp4-wo", "bf16"])
def test_every_expert_is_quantized_as_its_own_linear(make, config):
    model = make()
    spec = WeightSpec.parse(config)
    built = quantize_model_weights(model, spec)
    assert built.quantized_fraction == 1.0
    assert _expert_tensors(model), "the tiny model has fused experts"
    after = dict(all_experts(built.model))
    for name, matrix in all_experts(model):  # each expert's [out, in] matrix (transposed storage read as such), rounded on its own
        assert torch.equal(after[name].get(), quantize_weight(matrix.get(), spec)), name


@pytest.mark.parametrize("make", [tiny_mixtral, tiny_qwen3_moe])
def test_experts_bytes_and_fraction_count_the_experts(make):
    model = make()
    spec = WeightSpec.parse("int4-g32")
    experts = resolve_experts(model, spec)
    assert len(experts) == len(all_experts(model)) == 2 * 2 * 4  # layers × (gate_up, down) × experts
    shape = next(iter(experts.values()))[0].shape
    assert shape[1] == 128  # gate_up: [2·intermediate, hidden], the input last
    bf16 = model_weight_bytes(model, WeightSpec.parse("bf16"))
    int4 = model_weight_bytes(model, spec)
    saved = sum(m.numel() * 2 - weight_storage_bytes(m.shape, spec) for m, _ in experts.values())
    # experts are most of the parameters: their int4 storage must show in the bytes
    attention_only = bf16 - sum(2 * m.weight.numel() - weight_storage_bytes(tuple(m.weight.shape), spec)
                                for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n)
    assert int4 == pytest.approx(attention_only - saved, abs=2)
    skipped = quantize_model_weights(model, WeightSpec.parse("int4-g32;skip=0"))
    assert skipped.quantized_fraction == pytest.approx(0.5)
    assert any("quantized 50.0% of the decoder's linear and expert weights" in n for n in skipped.notes)


def test_skips_and_overrides_reach_the_experts():
    model = tiny_mixtral()
    built = quantize_model_weights(model, WeightSpec.parse("int4-g32;skip-re=experts\\.down_proj"))
    assert 0 < built.quantized_fraction < 1
    down = "model.layers.0.mlp.experts.down_proj"
    assert torch.equal(built.model.get_parameter(down), model.get_parameter(down))
    gate_up = "model.layers.0.mlp.experts.gate_up_proj"
    assert not torch.equal(built.model.get_parameter(gate_up), model.get_parameter(gate_up))


@pytest.mark.parametrize("make", [tiny_mixtral, tiny_qwen3_moe, tiny_gpt_oss])
def test_gptq_quantizes_each_expert_on_its_routed_tokens(make):
    model = make()
    calib = _calibration()
    gptq = quantize_model_weights(model, WeightSpec.parse("gptq-int4-g32"), calib)
    rtn = quantize_model_weights(model, WeightSpec.parse("int4-g32"))
    assert gptq.quantized_fraction == 1.0
    original = dict(all_experts(model))
    after, grid = dict(all_experts(gptq.model)), dict(all_experts(rtn.model))
    assert all(not torch.equal(after[n].get(), m.get()) for n, m in original.items())  # no expert left at 16 bits
    # GPTQ moved weights off RTN's choice (error feedback), and every value still lies on a 4-bit
    # grid of 32-column groups: at most 16 levels per row and group of the [out, in] matrix
    assert any(not torch.equal(after[n].get(), grid[n].get()) for n in original)
    for n in original:
        w = after[n].get()
        for lo in range(0, w.shape[-1], 32):
            assert all(len(torch.unique(row)) <= 16 for row in w[:, lo:lo + 32])
    # the layer's output error is smaller than RTN's on calibration data (GPTQ's objective)
    ids = calib.tokens[:4]
    with torch.no_grad():
        ref = model(input_ids=ids).logits.log_softmax(-1)
        err = {k: float((b.model(input_ids=ids).logits.log_softmax(-1) - ref).pow(2).mean()) for k, b in (("gptq", gptq), ("rtn", rtn))}
    assert err["gptq"] < err["rtn"]


def test_expert_inputs_follow_the_routing():
    model = tiny_mixtral()
    experts = model.model.layers[0].mlp.experts
    x = torch.randn(5, 128)
    top = torch.tensor([[0, 1], [1, 2], [0, 2], [1, 0], [2, 1]])
    seen = {e: (xe, inner) for e, xe, inner in expert_inputs(experts, x, top)}
    assert sorted(seen) == [0, 1, 2]  # expert 3 got no token
    assert torch.equal(seen[0][0], x[[0, 2, 3]])
    gate, up = torch.nn.functional.linear(x[[0, 2, 3]], experts.gate_up_proj[0]).chunk(2, dim=-1)
    assert torch.allclose(seen[0][1], experts.act_fn(gate) * up)


@pytest.mark.parametrize("config", ["awq-int4-g128", "w8a8-int8", "fp8-static", "nvfp4", "llm-int8"])
def test_methods_that_do_not_apply_to_experts_are_refused_before_any_change(config):
    model = tiny_mixtral()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConfigError, match="fused MoE experts") as info:
        quantize_model_weights(model, WeightSpec.parse(config), _calibration(), in_place=True)
    assert "\n" not in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_config_json_refusal_matches_the_loaded_one():
    model = tiny_qwen3_moe()
    config = model.config.to_dict()
    with pytest.raises(ConfigError, match="awq on the fused MoE experts"):
        check_config([WeightSpec.parse("awq-int4-g128")], config, "tiny")
    check_config([WeightSpec.parse(c) for c in ("int4-g128", "gptq-int4-g128", "fp8-wo")], config, "tiny")
    # an override that keeps the experts weight-only passes; attention's activations are not the experts'
    check_config([WeightSpec.parse("int4-g128;override=self_attn:fp8")], config, "tiny")


def test_in_place_build_is_restored_bit_for_bit():
    model = tiny_mixtral()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    specs = [WeightSpec.parse("int4-g32"), WeightSpec.parse("gptq-int4-g32")]
    snapshot = WeightSnapshot(model, specs)
    for spec in specs:
        built = quantize_model_weights(model, spec, _calibration(), in_place=True, originals=snapshot)
        assert built.model is model and built.quantized_fraction == 1.0
        assert not torch.equal(model.get_parameter("model.layers.1.mlp.experts.down_proj"), before["model.layers.1.mlp.experts.down_proj"])
        snapshot.restore(model, built.hooks)
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    snapshot.close()


def test_unknown_fused_tensor_is_refused():
    model = tiny_mixtral()
    layer = model.model.layers[0]
    layer.mlp.register_parameter("packed", torch.nn.Parameter(torch.zeros(2, 3, 4), requires_grad=False))
    with pytest.raises(ConfigError, match=r"model\.layers\.0\.mlp\.packed: a fused 3-D weight in MixtralSparseMoeBlock, a layout wkvlab does not know"):
        quantize_model_weights(model, WeightSpec.parse("int4-g128"))
    assert quantize_model_weights(model, WeightSpec.parse("none")).model is model  # KV-only runs are unaffected


@pytest.mark.parametrize("config, kind", [("fp8", "fp8-token"), ("int8;a=int8", "int8-token"), ("mxfp4", "mxfp4")])
def test_dynamic_activations_quantize_both_inputs_of_every_expert(config, kind):
    model = tiny_mixtral()
    built = quantize_model_weights(model, WeightSpec.parse(config))
    experts = built.model.model.layers[0].mlp.experts
    assert built.activations["model.layers.0.mlp.experts"].kind == kind
    assert built.activations["model.layers.0.mlp.experts.gated"].kind == kind
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 128, generator=g)
    index = torch.tensor([[0, 1], [1, 2], [0, 2], [3, 0], [2, 1], [3, 2]])
    weights = torch.rand(6, 2, generator=g)
    with torch.no_grad():
        out = experts(x, index, weights)
        quant = ActivationQuant(kind)
        xq = fake_quant_activation(x, quant)
        expected = torch.zeros_like(x)
        for t in range(6):
            for k in range(2):
                e = int(index[t, k])
                gate, up = torch.nn.functional.linear(xq[t:t + 1], experts.gate_up_proj[e]).chunk(2, dim=-1)
                inner = fake_quant_activation(experts.act_fn(gate) * up, quant)
                expected[t] += weights[t, k] * torch.nn.functional.linear(inner, experts.down_proj[e])[0]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_activation_hooks_on_experts_are_removed_by_restore():
    model = tiny_qwen3_moe()
    ids = torch.randint(0, VOCAB, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    spec = WeightSpec.parse("fp8")
    snapshot = WeightSnapshot(model, [spec])
    built = quantize_model_weights(model, spec, in_place=True, originals=snapshot)
    experts = model.model.layers[0].mlp.experts
    assert "_apply_gate" in experts.__dict__
    snapshot.restore(model, built.hooks)
    snapshot.close()
    assert "_apply_gate" not in experts.__dict__
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, ref)


def test_activations_on_the_eager_experts_forward_are_refused():
    model = tiny_mixtral()
    model.config._experts_implementation = "eager"
    with pytest.raises(ConfigError, match="runs the .eager. experts forward"):
        quantize_model_weights(model, WeightSpec.parse("fp8"))
    assert quantize_model_weights(model, WeightSpec.parse("fp8-wo")).quantized_fraction == 1.0
