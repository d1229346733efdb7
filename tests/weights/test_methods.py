"""Methods on tiny random Llama / Gemma 3 / Qwen3 models built in-process."""
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama, tiny_qwen3
from tests.models.tiny_folders import tiny_gemma2, tiny_gemma3_multimodal
from wkvlab.errors import ConfigError, DataError
from wkvlab.weights import ActivationQuant, CalibrationSet, CalibrationSpec, WeightSpec, fake_quant_activation, quantize_model_weights, resolve_linears
from wkvlab.weights.arch import architecture_of, decoder_layers, fold_scales, resolve
from wkvlab.weights.awq import awq_layer
from wkvlab.weights.calibration import calibration_set, math_text
from wkvlab.weights.capture import capture_layer_inputs
from wkvlab.weights.smoothquant import smooth_model, smooth_scales

# Gemma 2 shares Gemma 3's layer layout; the multimodal Gemma 3's language layers come after its vision tower's
MODELS = [tiny_llama, tiny_gemma3, tiny_qwen3, tiny_gemma2, tiny_gemma3_multimodal]


def _calibration(samples=4, length=32, seed=1) -> CalibrationSet:
    g = torch.Generator().manual_seed(seed)
    return CalibrationSet(CalibrationSpec("prose", samples, length), torch.randint(0, 128, (samples, length), generator=g), "test")


def _logits(model, seed=2):
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(input_ids=ids).logits


def _kld(ref, out):
    p = ref.log_softmax(-1)
    return float((p.exp() * (p - out.log_softmax(-1))).sum(-1).mean())


@pytest.mark.parametrize("make", MODELS)
def test_folded_random_scales_leave_logits_allclose(make):
    model = make()
    ref = _logits(model)
    arch = architecture_of(model)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, layer in decoder_layers(model):
            for balance in arch.balances:
                found = resolve(layer, balance)
                if found:
                    width = found[1].weight.shape[0]
                    fold_scales(found[1], [m for _, m in found[2]], torch.exp(torch.randn(width, generator=g)), arch.norm_offset)
    torch.testing.assert_close(_logits(model), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("make", MODELS)
def test_awq_search_without_quantization_leaves_logits_allclose(make):
    model = make()
    ref = _logits(model)
    spec = WeightSpec.parse("awq-int4-g32;noclip;grid=4")
    specs = {n: s for n, (_, s) in resolve_linears(model, spec).items()}
    calls = capture_layer_inputs(model, _calibration().tokens)
    notes: set[str] = set()
    hidden = calls.hidden[0]
    for index, (name, layer) in enumerate(decoder_layers(model)):
        hidden = awq_layer(layer, name, hidden, calls.kwargs[index], specs, architecture_of(model), notes)
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), make().state_dict().values()))
    torch.testing.assert_close(_logits(model), ref, atol=1e-4, rtol=1e-4)


def test_smoothquant_scales_and_folding():
    act, w = torch.tensor([4.0, 1.0]), [torch.tensor([[1.0, 4.0], [0.5, 1.0]])]
    assert torch.allclose(smooth_scales(act, w, 0.5), torch.tensor([2.0, 0.5]))
    model = tiny_llama()
    ref = _logits(model)
    specs = {n: 0.5 for n in resolve_linears(model, WeightSpec.parse("w8a8-int8"))}
    assert smooth_model(model, decoder_layers(model), _calibration().tokens, specs, architecture_of(model)) == 4
    torch.testing.assert_close(_logits(model), ref, atol=1e-4, rtol=1e-4)


def test_llm_int8_keeps_outlier_columns_and_quantizes_the_rest():
    x = torch.randn(5, 16) * 0.5
    x[2, 3] = 9.0
    y = fake_quant_activation(x, ActivationQuant("llm-int8", threshold=6.0))
    assert torch.equal(y[:, 3], x[:, 3])
    assert not torch.equal(y[:, :3], x[:, :3]) and (y - x).abs().max() < 0.5 / 127 * 1.01


@pytest.mark.parametrize("make", MODELS)
def test_every_preset_builds_and_weight_only_is_not_worse(make):
    model, cal = make(), _calibration()
    ref = _logits(model)
    kld = {}
    for text in ("int4-g32", "gptq-int4-g32", "gptq-int4-g32+grid-from=original+actorder", "awq-int4-g32;grid=4", "w8a8-int8", "w8a8-int8;wo", "llm-int8", "fp8", "fp8-wo",
                 "nvfp4", "nvfp4-wo", "nvfp4-mlp", "mxfp4", "mxfp4-wo", "int8;wscale=tensor;a=int8-tensor"):
        built = quantize_model_weights(model, WeightSpec.parse(text), cal)
        kld[text] = _kld(ref, _logits(built.model))
        assert 0 < kld[text] < 0.05, (text, kld[text])
    for w_a, w_o in (("fp8", "fp8-wo"), ("nvfp4", "nvfp4-wo"), ("mxfp4", "mxfp4-wo"), ("w8a8-int8", "w8a8-int8;wo")):
        assert kld[w_o] <= kld[w_a] * 1.05, (w_a, kld)
    torch.testing.assert_close(_logits(model), ref)  # the reference is untouched


def test_overrides_skips_and_bytes():
    model = tiny_llama()
    targets = resolve_linears(model, WeightSpec.parse("nvfp4-mlp;skip=1"))
    assert {n.split(".")[2] for n in targets} == {"0"}
    assert targets["model.layers.0.self_attn.q_proj"][1].format == "fp8_e4m3"
    assert targets["model.layers.0.mlp.up_proj"][1].format == "nvfp4"
    with pytest.raises(ConfigError, match="layer 9 does not exist: the model has layers 0..1"):
        resolve_linears(model, WeightSpec.parse("int4;skip=9"))
    first_last = resolve_linears(model, WeightSpec.parse("int4;skip-first=1"))
    assert all(".layers.1." in n for n in first_last)


def test_calibrated_methods_need_calibration():
    with pytest.raises(ConfigError, match="--calib"):
        quantize_model_weights(tiny_llama(), WeightSpec.parse("gptq-int4-g32"))


def test_cache_reloads_bit_identically(tmp_path, monkeypatch):
    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path))
    model, cal = tiny_gemma3(), _calibration()
    for text in ("gptq-int4-g32", "nvfp4-mlp", "w8a8-int8"):
        spec = WeightSpec.parse(text)
        first = quantize_model_weights(model, spec, cal, model_key="tiny")
        again = quantize_model_weights(model, spec, cal, model_key="tiny")
        assert not first.cached and again.cached and again.weight_bytes == first.weight_bytes
        assert again.activations == first.activations
        for (k, a), b in zip(first.model.state_dict().items(), again.model.state_dict().values()):
            assert torch.equal(a, b), k
        assert torch.equal(_logits(first.model), _logits(again.model))
    other = quantize_model_weights(model, WeightSpec.parse("gptq-int4-g32"), _calibration(seed=5), model_key="tiny")
    assert not other.cached  # a different calibration is a different entry


class _Tok:
    bos_token_id = None

    def __call__(self, text, add_special_tokens=True):
        class Out:
            input_ids = [ord(c) % 128 for c in text]

        return Out()


def test_calibration_comes_from_the_end_and_never_overlaps_evaluation():
    from wkvlab.data import Corpus

    corpus = Corpus("t", "".join(chr(97 + i % 26) for i in range(1000)))
    cal = calibration_set(CalibrationSpec("t", 4, 50), _Tok(), corpus=corpus, reserved_tokens=800)
    ids = torch.tensor(_Tok()(corpus.text).input_ids)
    assert torch.equal(cal.tokens.reshape(-1), ids[-200:])
    with pytest.raises(DataError, match="calib"):
        calibration_set(CalibrationSpec("t", 4, 50), _Tok(), corpus=corpus, reserved_tokens=801)
    assert math_text(2000) == math_text(2000) and "=" in math_text(2000)


def test_calibration_draws_on_unscored_remainders_only_when_the_tail_is_too_short():
    from wkvlab.data import Corpus

    corpus = Corpus("t", "".join(chr(97 + i % 26) for i in range(1000)))
    ids = torch.tensor(_Tok()(corpus.text).input_ids)
    spare = torch.arange(1000, 1150)
    # the 200 tokens after the reserved 800 are enough: the spare tokens change nothing
    same = calibration_set(CalibrationSpec("t", 4, 50), _Tok(), corpus=corpus, reserved_tokens=800, spare=spare)
    assert torch.equal(same.tokens.reshape(-1), ids[-200:])
    # 100 after the reserved 900: the last 100 spare tokens come first, then the tail
    short = calibration_set(CalibrationSpec("t", 4, 50), _Tok(), corpus=corpus, reserved_tokens=900, spare=spare)
    assert short.tokens.reshape(-1).tolist() == list(range(1050, 1150)) + ids[-100:].tolist()
    with pytest.raises(DataError, match="only 250 are left outside the evaluation windows"):
        calibration_set(CalibrationSpec("t", 6, 50), _Tok(), corpus=corpus, reserved_tokens=900, spare=spare)


def test_the_default_findings_windows_leave_prose_to_calibrate_on(default_model):
    """SmolLM2's additivity finding (32 windows of 512 spread over the prose topics) reaches the 78th of
    79 topics: calibration used to fail with 181 tokens left after the windows' text."""
    from wkvlab.api import prepare, prepare_calibration
    from wkvlab.weights.spec import WeightSpec

    work = prepare(default_model, ctx=512, tokens=16384)
    body = work.windows.ctx - int(work.windows.bos)
    cal = prepare_calibration(work, [WeightSpec.parse("gptq-int4-g128")])
    assert cal.tokens.shape == (16, 512)
    # none of its token runs is a window's: calibration never sees a scored token
    scored = {tuple(row[int(work.windows.bos):][i:i + 64].tolist()) for row in work.windows.tokens for i in range(0, body - 64, 64)}
    assert not any(tuple(row[1:][i:i + 64].tolist()) in scored for row in cal.tokens for i in range(0, 511 - 64, 64))


def test_calibration_replicates_are_disjoint_samples_of_the_same_size():
    """Replicate r of a calibrated build (issue #38 item 3) calibrates on the r-th block before the end: same size,
    no token shared with replicate 0 or the evaluation text; too little text is one error naming --replicates."""
    from wkvlab.data import Corpus

    corpus = Corpus("t", "".join(chr(97 + i % 26) for i in range(1000)))
    ids = torch.tensor(_Tok()(corpus.text).input_ids)
    first = calibration_set(CalibrationSpec("t", 4, 50), _Tok(), corpus=corpus, reserved_tokens=500)
    second = calibration_set(CalibrationSpec("t", 4, 50), _Tok(), corpus=corpus, reserved_tokens=500, replicate=1)
    assert torch.equal(first.tokens.reshape(-1), ids[-200:]) and torch.equal(second.tokens.reshape(-1), ids[-400:-200])
    assert first.key != second.key
    with pytest.raises(DataError, match="--replicates"):
        calibration_set(CalibrationSpec("t", 4, 50), _Tok(), corpus=corpus, reserved_tokens=500, replicate=2)
