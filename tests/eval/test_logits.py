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


# -- the split bf16 head a GPU runs (eval/logits.py: split_product) -------------------------------------

U = 2.0 ** -24  # float32's unit roundoff


def _rounding_bound(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The textbook bound on a float32 dot product of K exact terms, |computed - exact| ≤ γ_{K+2} Σ|h_i w_i|
    (γ_n = n·u / (1 - n·u)), per logit: every product and sum rounds once; +2 for the split's two additions."""
    k = hidden.shape[-1] + 2
    return k * U / (1 - k * U) * (hidden.double().abs() @ weight.double().abs().T)


def test_three_bf16_pieces_sum_to_the_float32_hidden_exactly_and_two_do_not():
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(0)) * torch.logspace(-6, 6, 512)
    three = L.split_bf16(x, 3)
    assert all(p.dtype == torch.bfloat16 for p in three)
    assert torch.equal(sum(p.double() for p in three), x.double())
    assert not torch.equal(sum(p.double() for p in L.split_bf16(x, 2)), x.double())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_split_head_is_within_the_float32_heads_own_rounding_bound(dtype):
    """Logits from bf16 GEMMs of the split pieces differ from the exact product by no more than the
    float32 head's own worst-case rounding (γ_{K+2}·Σ|h·w|), so they are float32-grade; a single
    bf16 piece (the hidden state rounded to bf16, what a plain bf16 head does) is far outside it."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(48, 256, generator=g) * 3
    weight = (torch.randn(300, 256, generator=g) * 0.05).to(dtype)
    exact = hidden.double() @ weight.double().T
    bound = _rounding_bound(hidden, weight)
    split = L.split_product(L.split_bf16(hidden, L.SPLIT_TERMS), weight)
    fp32 = hidden @ weight.float().T
    assert split.dtype == torch.float32
    assert ((split.double() - exact).abs() <= bound).all()
    assert ((fp32.double() - exact).abs() <= bound).all()  # the float32 head's error is of the same kind
    one_piece = L.split_product(L.split_bf16(hidden, 1), weight)
    assert ((one_piece.double() - exact).abs() > bound).float().mean() > 0.5


def _klds(ref: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    a, b = torch.log_softmax(ref.double(), -1), torch.log_softmax(cand.double(), -1)
    return (a.exp() * (a - b)).sum(-1)


def test_split_head_klds_match_the_float32_heads_within_the_bound(monkeypatch):
    """A bf16 model's KLD (reference vs a KV-quantized candidate) with the head split as on a GPU, against
    the float32 head, per token. If every logit moves by at most ε, each log-probability moves by at most
    2ε, and KLD = Σ p (a - b) moves by at most 4ε + (e^{2ε} - 1)·Σ p |a - b| (the first from the log-
    probabilities, the second from p). ε here is the largest logit difference measured on that token;
    the test above bounds it by float32's own rounding."""
    from wkvlab.kv.hook import kv_quantization

    model = _loud(tiny_llama).to(torch.bfloat16)
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(2))

    def both(split: bool):
        monkeypatch.setattr(L, "splits_head", lambda weight, device: split)
        with torch.no_grad():
            ref = L.model_logits(model, ids, use_cache=False)
            with kv_quantization(model, KVSpec.parse("q4_0")):
                cand = L.model_logits(model, ids, use_cache=False)
        return ref, cand

    (ref32, cand32), (ref_split, cand_split) = both(False), both(True)
    eps = torch.maximum((ref32 - ref_split).abs().amax(-1), (cand32 - cand_split).abs().amax(-1)).double()
    assert 0 < eps.max() < 1e-4  # the split really ran (not bit-identical), at float32's rounding level (logits ~±40)
    kld32, kld_split = _klds(ref32, cand32), _klds(ref_split, cand_split)
    a, b = torch.log_softmax(ref32.double(), -1), torch.log_softmax(cand32.double(), -1)
    allowed = 4 * eps + torch.expm1(2 * eps) * (a.exp() * (a - b).abs()).sum(-1)
    assert kld32.mean() > 1e-3  # q4_0 moves this model: the comparison is not of zeros
    assert ((kld_split - kld32).abs() <= allowed).all()
    assert ((kld_split - kld32).abs() / kld32).max() < 1e-3


def test_the_split_head_runs_on_meta_for_a_bf16_model_and_not_on_the_cpu(monkeypatch):
    products = []
    real = L._product_f32
    monkeypatch.setattr(L, "_product_f32", lambda a, b: products.append(b.shape) or real(a, b))
    head = torch.nn.Linear(64, 100, bias=False, dtype=torch.bfloat16)
    assert not L.splits_head(head.weight, torch.device("cpu"))  # the CPU keeps the exact float32 GEMM
    assert not L.splits_head(head.weight.float(), torch.device("meta"))
    meta = torch.nn.Linear(64, 100, bias=False, dtype=torch.bfloat16, device="meta")
    from tests.fake_device import fake_accelerator

    with fake_accelerator() as audit:
        out = L.head_in_float32(meta, torch.empty(5, 64, device="meta"))
    assert out.shape == (5, 100) and out.dtype == torch.float32 and audit.syncs == 0
    assert len(products) == L.SPLIT_TERMS  # one bf16 GEMM per hidden piece (one block of rows)
