"""Float32 logits from a bf16 model: the final norm and head recomputed in float32, checked by hand."""
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama
from wkvlab.data.windows import make_windows
from wkvlab.errors import ConfigError
from wkvlab.eval import logits as L
from wkvlab.eval.runner import RunOptions, run_grid
from wkvlab.kv import KVSpec
from wkvlab.weights.spec import WeightSpec


def _loud(make, **kwargs):
    """A tiny model whose logits are large (tens, as a real LM's are), so bf16 rounding shows."""
    model = make(**kwargs)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40.0)
    return model


def _by_hand(model, ids):
    """Independent path: the last decoder layer's output, RMS-normed and projected in float64."""
    seen = {}
    layer = model.model.layers[-1]
    def keep(module, args, out):
        seen["h"] = (out[0] if isinstance(out, tuple) else out).double()

    handle = layer.register_forward_hook(keep)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    handle.remove()
    norm = model.model.norm
    h = seen["h"][0]
    eps = getattr(norm, "variance_epsilon", None) or norm.eps
    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    weight = norm.weight.double()
    normed = normed * (1.0 + weight if "Gemma" in type(norm).__name__ else weight)
    logits = normed @ model.get_output_embeddings().weight.double().T
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


@pytest.mark.parametrize("make, kwargs", [(tiny_llama, {}), (tiny_gemma3, {})])
def test_bf16_model_logits_are_full_precision(make, kwargs):
    model = _loud(make, **kwargs).to(torch.bfloat16)
    if make is tiny_gemma3:
        model.config.final_logit_softcapping = 30.0  # Gemma 2's final soft-capping, redone in float32
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(0))
    expected = _by_hand(model, ids)
    with torch.no_grad():
        ours = L.model_logits(model, ids, use_cache=False)
        own = model(input_ids=ids, use_cache=False).logits[0].double()
    assert ours.dtype == torch.float32
    ours_err = (ours.double() - expected).abs().max().item()
    own_err = (own - expected).abs().max().item()
    assert ours_err < 1e-3  # float32 arithmetic on the bf16 model's own hidden states
    assert own_err > 20 * ours_err  # the model's bf16 logits are rounded to 8 significant bits


def test_float32_models_keep_their_own_logits_bit_for_bit():
    model = tiny_llama()
    ids = torch.randint(0, 128, (1, 20))
    with torch.no_grad():
        assert torch.equal(L.model_logits(model, ids, use_cache=False), model(input_ids=ids, use_cache=False).logits[0])


def test_the_head_in_blocks_equals_one_block(monkeypatch):
    model = _loud(tiny_llama).to(torch.bfloat16)
    ids = torch.randint(0, 128, (1, 16))
    with torch.no_grad():
        whole = L.model_logits(model, ids, use_cache=False)
        monkeypatch.setattr(L, "HEAD_BLOCK_BYTES", 64 * 4 * 10)  # 10 vocabulary rows at a time
        blocked = L.model_logits(model, ids, use_cache=False)
    torch.testing.assert_close(blocked, whole, rtol=0, atol=1e-5)


def test_bf16_grid_identity_is_exactly_zero_and_logits_are_float32():
    model = _loud(tiny_llama).to(torch.bfloat16)
    torch.manual_seed(1)
    windows = make_windows(torch.randint(0, 128, (106,)), ctx=48, n_tokens=96, bos_id=None)
    results = run_grid(model, windows, [WeightSpec.parse("none")], [KVSpec.parse("fp16"), KVSpec.parse("q8_0")], model_name="tiny",
                       data_name="random", options=RunOptions(chunk=16))
    assert results[0].kld["max"] == 0.0 and results[1].kld["mean"] > 0
    assert results[0].run["dtype"] == "bfloat16"


def test_a_stored_reference_refuses_another_dtype(tmp_path):
    torch.manual_seed(1)
    windows = make_windows(torch.randint(0, 128, (106,)), ctx=48, n_tokens=96, bos_id=None)
    path = tmp_path / "ref.safetensors"

    def run(model):
        return run_grid(model, windows, [WeightSpec.parse("none")], [KVSpec.parse("int4")], model_name="tiny", data_name="random",
                        fingerprints={"model_sha256": "m", "data_sha256": "d"}, options=RunOptions(chunk=16, reference=path))

    run(tiny_llama())
    with pytest.raises(ConfigError, match="made with dtype float32 and this run uses bfloat16; run with --dtype float32"):
        run(tiny_llama().to(torch.bfloat16))


def test_a_stored_reference_refuses_another_device(tmp_path):
    from wkvlab.eval.reference import StoredReference

    stored = StoredReference(meta={"dtype": "bfloat16", "device": "cuda"}, **{n: torch.zeros(1) for n in (
        "nll", "argmax", "lse", "topk_ids", "topk_logprobs", "tail_ids", "tail_logprobs", "full_rows", "full_logprobs")})
    with pytest.raises(ConfigError, match="made with device cuda and this run uses cpu; run with --device cuda"):
        stored.check_matches({"dtype": "bfloat16", "device": "cpu"})


@pytest.mark.parametrize("make, dtype", [(tiny_llama, torch.float32), (tiny_gemma3, torch.float32), (tiny_llama, torch.bfloat16)])
def test_an_unscored_chunk_fills_the_cache_without_the_head(make, dtype):
    """Empty ``rows``: no head call, no logits, and the next chunk's logits exactly as if the head had run."""
    from wkvlab.eval.chunks import WindowPass

    model = make().to(dtype)
    ids = torch.randint(0, 128, (32,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        usual = WindowPass(model)
        usual.step(ids[:16])
        expected = usual.step(ids[16:])[4:12]
        heads = []
        model.get_output_embeddings().register_forward_hook(lambda m, a, out: heads.append(a[0].shape[1]))
        skipping = WindowPass(model)
        none = skipping.step(ids[:16], slice(16, 16))
        assert none.shape == (0, model.config.vocab_size) and none.dtype == torch.float32
        assert heads in ([], [0])  # the head saw no position (HF calls it on an empty slice)
        got = skipping.step(ids[16:], slice(4, 12))
    assert torch.equal(got, expected)
