"""Quantized checkpoints as candidates: writers and readers round-trip bit-exactly, packing matches the
formats' own layouts (hand-computed words), mismatches are refused in one line."""
import json

import pytest
import torch

from tests.conftest import tiny_llama
from wkvlab.data.windows import make_windows
from wkvlab.errors import ConfigError, ModelError
from wkvlab.eval.runner import run_grid
from wkvlab.kv.spec import KVSpec
from wkvlab.weights import CalibrationSet, CalibrationSpec, WeightSpec, quantize_model_weights
from wkvlab.weights.apply import build_quantized
from wkvlab.weights.checkpoints.base import read_safetensors
from wkvlab.weights.checkpoints.compressed_tensors import E2M1_VALUES, pack_int32, unpack_int32
from wkvlab.weights.checkpoints.export import write_checkpoint
from wkvlab.weights.checkpoints.gptq_awq import awq_grid, gptq_grid


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


def _calibration() -> CalibrationSet:
    g = torch.Generator().manual_seed(1)
    return CalibrationSet(CalibrationSpec("prose", 4, 32), torch.randint(0, 128, (4, 32), generator=g), "test")


def _export(model, text, fmt, folder, tokenizer=None):
    spec = WeightSpec.parse(text)
    calibration = _calibration() if spec.needs_calibration else None
    simulated = build_quantized(model, spec, calibration)
    write_checkpoint(model, tokenizer, spec, fmt, folder, calibration)
    return simulated, quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{folder}"))


def _rules(plan):
    """Kind and static scale of each activation rule; checkpoints store the scale in float32, as engines use it."""
    return {k: (v.kind, float(torch.tensor(v.static_scale(127.0 if "int8" in v.kind else 448.0), dtype=torch.float32)))
            for k, v in plan.items()}


ROUND_TRIPS = [
    ("int4-g16", "compressed-tensors", "pack-quantized"),
    ("int4-g16-sym", "compressed-tensors", "pack-quantized"),
    ("int4", "compressed-tensors", "pack-quantized"),
    ("gptq-int4-g16;actorder", "compressed-tensors", "pack-quantized"),
    ("int8;a=int8", "compressed-tensors", "int-quantized"),
    ("int8;a=int8-tensor", "compressed-tensors", "int-quantized"),
    ("fp8", "compressed-tensors", "float-quantized"),
    ("fp8-static", "compressed-tensors", "float-quantized"),
    ("gptq-int4-g16", "gptq", "GPTQ"),
    ("gptq-int4-g16;actorder", "gptq", "desc_act True"),
    # llm-compressor's rule: groups keep the original columns' grids, so act-order needs no g_idx
    ("gptq-int4-g16+grid-from=original+actorder", "compressed-tensors", "pack-quantized"),
    ("gptq-int4-g16+grid-from=original+actorder", "gptq", "GPTQ"),
    ("int4-g16-sym", "gptq", "symmetric"),
    ("awq-int4-g16", "awq", "AutoAWQ GEMM"),
]


@pytest.mark.parametrize("text,fmt,detected", ROUND_TRIPS)
def test_round_trip_is_bit_exact(model, tmp_path, text, fmt, detected):
    simulated, loaded = _export(model, text, fmt, tmp_path / "ck")
    ref, got = simulated.model.state_dict(), loaded.model.state_dict()
    assert ref.keys() == got.keys()
    for name in ref:
        assert torch.equal(ref[name], got[name]), name
    assert _rules(loaded.activations) == _rules(simulated.activations)
    assert detected in loaded.notes[0] and loaded.spec.is_checkpoint


def test_nvfp4_reads_as_compressed_tensors_defines_it(model, tmp_path):
    simulated, loaded = _export(model, "nvfp4", "compressed-tensors", tmp_path / "ck")
    stored, _ = read_safetensors(tmp_path / "ck")
    name = "model.layers.1.mlp.up_proj"
    packed, scale, glob = stored[f"{name}.weight_packed"], stored[f"{name}.weight_scale"], stored[f"{name}.weight_global_scale"]
    # by hand: low nibble first, bit 3 the sign, bits 0-2 index E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}; value · scale / global
    expected = torch.empty(packed.shape[0], packed.shape[1] * 2)
    for r in range(packed.shape[0]):
        for c in range(packed.shape[1] * 2):
            nibble = (int(packed[r, c // 2]) >> (4 * (c % 2))) & 15
            value = float(E2M1_VALUES[nibble & 7]) * (-1.0 if nibble & 8 else 1.0)
            expected[r, c] = value * (scale[r, c // 16].float() / glob.float()[0])
    got = loaded.model.state_dict()[f"{name}.weight"]
    assert torch.equal(got, expected)
    # the stored global scale is 1 / wkvlab's tensor scale, one float32 rounding from the simulation
    torch.testing.assert_close(got, simulated.model.state_dict()[f"{name}.weight"], rtol=2e-7, atol=0)
    assert loaded.activations[name].kind == "nvfp4"


def test_compressed_tensors_layout(model, tmp_path):
    _export(model, "int4-g16", "compressed-tensors", tmp_path / "ck")
    config = json.loads((tmp_path / "ck" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "pack-quantized"
    group = config["config_groups"]["group_0"]
    assert group["targets"] == ["Linear"] and config["ignore"] == ["lm_head"]
    assert group["weights"] | {} == group["weights"] and group["weights"]["strategy"] == "group" and group["weights"]["group_size"] == 16
    stored, _ = read_safetensors(tmp_path / "ck")
    name = "model.layers.0.mlp.down_proj"  # [64, 128]
    assert stored[f"{name}.weight_packed"].dtype == torch.int32 and stored[f"{name}.weight_packed"].shape == (64, 16)
    assert stored[f"{name}.weight_shape"].tolist() == [64, 128]
    assert stored[f"{name}.weight_scale"].shape == (64, 8)
    assert stored[f"{name}.weight_zero_point"].shape == (8, 8)  # packed along the rows: 64 · 4 bits / 32
    assert f"{name}.weight" not in stored


def test_int32_packing_matches_hand_computed_words():
    # element i at bit i·bits, little end first (compressed-tensors pack_to_int32); 8 nibbles 1..8 -> 0x87654321
    word = pack_int32(torch.arange(1, 9)[None], 4)
    assert word.tolist() == [[0x87654321 - 2**32]]
    # 3 bits straddle words: 11 values of 7 fill 33 bits -> word 0 all ones, word 1 holds bit 32
    three = pack_int32(torch.full((1, 11), 7), 3)
    assert three.tolist() == [[-1, 1]]
    values = torch.randint(0, 8, (5, 37))
    assert torch.equal(unpack_int32(pack_int32(values, 3), 3, 37), values)
    assert torch.equal(unpack_int32(pack_int32(values, 3, dim=0), 3, 5, dim=0), values)


def _one_linear(qweight, qzeros, scales, g_idx=None):
    t = {"m.qweight": qweight, "m.qzeros": qzeros, "m.scales": scales}
    if g_idx is not None:
        t["m.g_idx"] = g_idx
    return t


def test_gptq_zero_point_conventions_by_hand():
    # 8 outputs, 8 inputs, one group; input row j of output o holds code (o + j) % 16
    codes = torch.tensor([[(o + j) % 16 for o in range(8)] for j in range(8)])  # [in, out]
    qweight = torch.tensor([[sum(int(codes[j, o]) << (4 * j) for j in range(8)) for o in range(8)]], dtype=torch.int64)
    qweight = torch.where(qweight >= 2**31, qweight - 2**32, qweight).to(torch.int32)
    stored_zeros = torch.tensor([[sum(k << (4 * k) for k in range(8))]], dtype=torch.int32)  # nibbles 0..7
    scales = torch.full((1, 8), 0.5)
    v1 = gptq_grid(_one_linear(qweight, stored_zeros, scales), "m", 4, v1=True, symmetric=False)
    v2 = gptq_grid(_one_linear(qweight, stored_zeros, scales), "m", 4, v1=False, symmetric=False)
    assert v1.zero[:, 0].tolist() == list(range(1, 9))  # AutoGPTQ v1 stores z - 1
    assert v2.zero[:, 0].tolist() == list(range(8))
    expected = torch.tensor([[0.5 * ((o + j) % 16 - (o + 1)) for j in range(8)] for o in range(8)])
    assert torch.equal(v1.dequantize(), expected)
    # desc_act: g_idx sends columns to groups out of order; each column uses its own group's scale
    scales2 = torch.tensor([[1.0] * 8, [2.0] * 8])
    zeros2 = torch.cat([stored_zeros, stored_zeros])
    g_idx = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0], dtype=torch.int32)
    grid = gptq_grid(_one_linear(qweight, zeros2, scales2, g_idx), "m", 4, v1=False, symmetric=False)
    assert torch.equal(grid.dequantize(), torch.tensor([[(2.0 if j % 2 == 0 else 1.0) * ((o + j) % 16 - o) for j in range(8)] for o in range(8)]))


def test_awq_interleaved_order_by_hand():
    # one input row, outputs 0..7 with codes 0..7: word position k holds output AWQ_ORDER[k] -> 0x75316420
    qweight = torch.tensor([[0x75316420]], dtype=torch.int32)
    qzeros = torch.tensor([[0x11111111]], dtype=torch.int32)
    grid = awq_grid({"m.qweight": qweight, "m.qzeros": qzeros, "m.scales": torch.full((1, 8), 2.0)}, "m", 4)
    assert grid.codes[:, 0].tolist() == list(range(8))
    assert torch.equal(grid.dequantize()[:, 0], 2.0 * (torch.arange(8.0) - 1))


def test_ragged_groups_refused_where_the_format_refuses(model, tmp_path):
    wide = tiny_llama(hidden_size=48, head_dim=12)  # 48 columns: groups of 32 leave a ragged 16
    with pytest.raises(ModelError, match="group size to divide"):
        write_checkpoint(wide, None, WeightSpec.parse("int4-g32"), "compressed-tensors", tmp_path / "a")
    with pytest.raises(ModelError, match="AutoAWQ needs groups"):
        write_checkpoint(wide, None, WeightSpec.parse("int4-g32"), "awq", tmp_path / "b")
    write_checkpoint(wide, None, WeightSpec.parse("int4-g32"), "gptq", tmp_path / "c")  # GPTQ's g_idx allows a short last group
    loaded = quantize_model_weights(wide, WeightSpec.parse(f"checkpoint:{tmp_path / 'c'}"))
    simulated = build_quantized(wide, WeightSpec.parse("int4-g32"))
    assert all(torch.equal(v, loaded.model.state_dict()[k]) for k, v in simulated.model.state_dict().items())


@pytest.mark.parametrize("kind", ["f32", "f16", "q8_0", "q4_0", "q5_1", "iq4_nl"])
def test_gguf_written_like_llama_cpp_reads_back_as_its_blocks(model, tmp_path, kind):
    from wkvlab.formats import fake_quant_ggml
    from wkvlab.weights.checkpoints.gguf_file import write_llama_gguf

    path = tmp_path / f"tiny-{kind}.gguf"
    write_llama_gguf(model, path, kind, [f"t{i}" for i in range(128)])  # Q/K rows permuted as convert_hf_to_gguf.py does
    loaded = quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{path}"), tokenizer=_tokenizer([f"t{i}" for i in range(128)]))
    assert f"GGUF ({kind.upper()} × {16 if kind == 'f32' else 14}" in loaded.notes[0]
    for name, ref in model.state_dict().items():
        expected = ref
        if ".layers." in name and ref.ndim == 2 and kind != "f32":
            expected = ref.half().float() if kind == "f16" else fake_quant_ggml(ref, kind)
        assert torch.equal(loaded.model.state_dict()[name], expected), name
    with pytest.raises(ConfigError, match=r"token 3 is 't3' \(checkpoint\) vs 'x'"):
        quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{path}"), tokenizer=_tokenizer([f"t{i}" if i != 3 else "x" for i in range(128)]))


def test_gguf_checkpoint_is_read_one_tensor_at_a_time(tmp_path):
    """Host allocations while a GGUF checkpoint becomes a candidate (numpy's, which tracemalloc sees:
    the dequantized tensors; the candidate's torch copy is not traced) peak at a few tensors, not
    at the checkpoint: transformers' loader, used before, dequantized every tensor into a dictionary
    first (the whole file in float32: 34.7 MB traced here against 4.4 MB now, beside the reference and the candidate)."""
    from tests.host_memory import assert_loads_a_few_tensors_at_a_time, wide_llama
    from wkvlab.weights.checkpoints.gguf_file import write_llama_gguf

    vocabulary = [f"t{i}" for i in range(128)]
    model = wide_llama()
    path, warm = tmp_path / "tiny.gguf", tmp_path / "warm.gguf"
    write_llama_gguf(model, path, "q8_0", vocabulary)
    small = tiny_llama(vocab_size=128)
    write_llama_gguf(small, warm, "q8_0", vocabulary)
    quantize_model_weights(small, WeightSpec.parse(f"checkpoint:{warm}"))  # first use imports gguf-py, transformers' maps: not counted
    assert_loads_a_few_tensors_at_a_time(model, lambda: quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{path}")).model)


def test_gguf_checkpoint_with_its_own_head_unties_a_tied_reference(tmp_path):
    """A tied reference and a file that stores ``output.weight``: different values untie the candidate's
    head (the embedding keeps the file's embedding), equal values leave it tied."""
    from wkvlab.weights.checkpoints.gguf_file import write_llama_gguf

    vocabulary = [f"t{i}" for i in range(128)]
    untied = tiny_llama(vocab_size=128, tie_word_embeddings=False)
    for same in (False, True):
        with torch.no_grad():
            untied.lm_head.weight.copy_(untied.model.embed_tokens.weight if same else untied.model.embed_tokens.weight * 2)
        path = tmp_path / f"head-{same}.gguf"
        write_llama_gguf(untied, path, "f32", vocabulary)
        tied = tiny_llama(vocab_size=128, tie_word_embeddings=True)
        loaded = quantize_model_weights(tied, WeightSpec.parse(f"checkpoint:{path}")).model
        assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == same
        assert torch.equal(loaded.lm_head.weight, untied.lm_head.weight)
        assert torch.equal(loaded.model.embed_tokens.weight, untied.model.embed_tokens.weight)


def test_architecture_mismatch_is_one_line(model, tmp_path):
    write_checkpoint(tiny_llama(num_hidden_layers=3), None, WeightSpec.parse("int4-g16"), "compressed-tensors", tmp_path / "ck")
    with pytest.raises(ConfigError, match=r"num_hidden_layers 3 \(checkpoint\) vs 2 \(reference\)") as info:
        quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{tmp_path / 'ck'}"))
    assert "\n" not in str(info.value)


def _tokenizer(tokens):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(tokens)}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t0")), unk_token="t0")


def test_tokenizer_mismatch_is_one_line_naming_the_token(model, tmp_path):
    ours = [f"t{i}" for i in range(128)]
    theirs = ours[:5] + ["other"] + ours[6:]
    write_checkpoint(model, _tokenizer(theirs), WeightSpec.parse("int4-g16"), "compressed-tensors", tmp_path / "ck")
    spec = WeightSpec.parse(f"checkpoint:{tmp_path / 'ck'}")
    with pytest.raises(ConfigError, match=r"another tokenizer than the reference: token 5 is 'other' \(checkpoint\) vs 't5'"):
        quantize_model_weights(model, spec, tokenizer=_tokenizer(ours))
    write_checkpoint(model, _tokenizer(ours), WeightSpec.parse("int4-g16"), "compressed-tensors", tmp_path / "same")
    loaded = quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{tmp_path / 'same'}"), tokenizer=_tokenizer(ours))
    assert len(loaded.notes) == 1  # compared: no "tokenizer not available" note


def test_bad_paths_and_formats_are_one_line(model, tmp_path):
    with pytest.raises(ConfigError, match="checkpoint not found"):
        WeightSpec.parse(f"checkpoint:{tmp_path / 'missing'}")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelError, match="no quantization_config"):
        quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{tmp_path / 'plain'}"))
    (tmp_path / "x.bin").write_bytes(b"abc")
    with pytest.raises(ModelError, match="not .gguf"):
        quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{tmp_path / 'x.bin'}"))
    (tmp_path / "x.gguf").write_bytes(b"not a gguf file")
    with pytest.raises(ModelError, match="could not be read as GGUF"):
        quantize_model_weights(model, WeightSpec.parse(f"checkpoint:{tmp_path / 'x.gguf'}"))


def test_checkpoint_spec_keeps_the_path_and_round_trips(tmp_path):
    folder = tmp_path / "MyCkpt"
    folder.mkdir()
    spec = WeightSpec.parse(f"checkpoint:{folder}")
    assert spec.checkpoint == str(folder.resolve()) and spec.label == f"checkpoint:{folder}"
    assert WeightSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert not spec.needs_calibration and not spec.is_identity
    with pytest.raises(ConfigError):
        WeightSpec(method="checkpoint")


@pytest.mark.parametrize("text", ["int4-g16-sym", "int8;a=int8-tensor"])
def test_runner_evaluates_a_checkpoint_like_the_config_it_was_written_from(model, tmp_path, text):
    calibration = _calibration() if WeightSpec.parse(text).needs_calibration else None
    write_checkpoint(model, None, WeightSpec.parse(text), "compressed-tensors", tmp_path / "ck", calibration)
    ids = torch.randint(0, 128, (200,), generator=torch.Generator().manual_seed(3))
    windows = make_windows(ids, ctx=64, n_tokens=128, bos_id=None)
    specs = [WeightSpec.parse(text), WeightSpec.parse(f"checkpoint:{tmp_path / 'ck'}")]
    kv = [KVSpec.parse("fp16"), KVSpec.parse("q4_0")]
    results = run_grid(model, windows, specs, kv, model_name="tiny", data_name="random", calibration=calibration)
    assert results[0].kld["mean"] > 0
    for simulated, loaded in ((results[0], results[2]), (results[1], results[3])):
        assert loaded.kld == simulated.kld and loaded.top1_agreement == simulated.top1_agreement


def test_sentencepiece_space_spellings_compare_equal():
    from wkvlab.weights.checkpoints.compat import _first_difference

    assert _first_difference(["  a", "b"], ["\u2581\u2581a", "b"]) == ""  # GGUF token lists spell SentencePiece's ▁ as a space
    assert _first_difference(["a", "b"], ["a", "c"]) == "token 1 is 'b' (checkpoint) vs 'c' (reference)"
