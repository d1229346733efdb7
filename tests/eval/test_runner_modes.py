"""The grid runner: chunk size, stored reference, in-place weights and bf16 do not change what it measures."""
import numpy as np
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama
from wkvlab.data.windows import make_windows
from wkvlab.errors import ConfigError
from wkvlab.eval.reference import StoredReference
from wkvlab.eval.runner import RunOptions, run_grid
from wkvlab.kv import KVSpec
from wkvlab.weights.spec import WeightSpec

WEIGHTS = ["none", "int4-g32"]
KV = ["fp16", "int4", "int2+residual=8"]


def _windows(ctx=48, n=2, seed=1):
    torch.manual_seed(seed)
    return make_windows(torch.randint(0, 128, (ctx * n + 10,)), ctx=ctx, n_tokens=ctx * n, bos_id=None)


def _run(model, windows, options=RunOptions(), weights=WEIGHTS, kv=KV, **kwargs):
    return run_grid(model, windows, [WeightSpec.parse(w) for w in weights], [KVSpec.parse(k) for k in kv],
                    model_name="tiny", data_name="random", fingerprints={"model_sha256": "m", "data_sha256": "d"},
                    options=options, **kwargs)


def test_chunk_size_does_not_change_the_metrics():
    model, windows = tiny_gemma3(), _windows()
    whole, chunked = _run(model, windows, RunOptions(chunk=48)), _run(model, windows, RunOptions(chunk=8))
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(b.arrays.kld, a.arrays.kld, atol=1e-5)
        np.testing.assert_allclose(b.arrays.nll, a.arrays.nll, atol=1e-5)
        assert b.run["chunk"] == 8 and a.run["chunk"] == 48
    assert chunked[0].kld["max"] == 0.0  # identity: exactly 0, chunked or not
    assert chunked[1].kld["mean"] > 1e-4  # and the quantized cache costs something (int4 on a random tiny model: ~3e-4)


def test_stored_reference_matches_the_in_memory_run(tmp_path):
    model, windows = tiny_llama(), _windows()
    memory = _run(model, windows, RunOptions(chunk=16))
    path = tmp_path / "ref.safetensors"
    stored = _run(model, windows, RunOptions(chunk=16, reference=path, topk=16))
    assert path.is_file()
    for m, s in zip(memory, stored):
        # exact against a stored reference: NLL, top-1 and Δp (same chunking: bit-identical)
        assert np.array_equal(m.arrays.nll_ref, s.arrays.nll_ref)
        assert np.array_equal(m.arrays.nll, s.arrays.nll)
        assert np.array_equal(m.arrays.top1_agree, s.arrays.top1_agree)
        np.testing.assert_allclose(s.arrays.delta_p, m.arrays.delta_p, atol=1e-6)
        info = s.run["reference"]
        assert info["kind"] == "stored" and info["k"] == 16 and info["created"]
        # the top-k bound never exceeds the true KLD; the sampled estimate is unbiased, so its mean
        # stays within a few of its own reported sampling standard errors of the exact mean
        assert info["kld_lower_bound_mean"] <= m.kld["mean"] + 1e-9
        assert abs(s.kld["mean"] - m.kld["mean"]) <= 4 * info["sampling_se"] + 1e-7
        assert info["sampling_se"] > 0 or m.kld["mean"] == 0
    assert stored[0].kld["max"] == 0.0  # identity against the stored reference: still exactly 0
    again = _run(model, windows, RunOptions(chunk=16, reference=path))
    assert not again[1].run["reference"]["created"]  # read back, not recomputed
    assert np.array_equal(again[1].arrays.kld, stored[1].arrays.kld)


def test_stored_reference_refuses_other_windows(tmp_path):
    model = tiny_llama()
    path = tmp_path / "ref.safetensors"
    _run(model, _windows(seed=1), RunOptions(reference=path), weights=["none"], kv=["int4"])
    with pytest.raises(ConfigError, match="another windows"):
        _run(model, _windows(seed=2), RunOptions(reference=path), weights=["none"], kv=["int4"])


def test_reference_file_round_trip(tmp_path):
    model, windows = tiny_llama(), _windows()
    path = tmp_path / "ref.safetensors"
    _run(model, windows, RunOptions(reference=path, topk=8), weights=["none"], kv=["fp16"])
    stored = StoredReference.load(path)
    assert stored.k == 8 and stored.tokens == windows.n_scored
    assert stored.meta["model_sha256"] == "m" and stored.meta["ctx"] == 48
    stored.save(tmp_path / "copy.safetensors")
    copy = StoredReference.load(tmp_path / "copy.safetensors")
    for name in ("nll", "argmax", "lse", "topk_ids", "topk_logprobs", "tail_ids", "tail_logprobs", "full_rows", "full_logprobs"):
        assert torch.equal(getattr(copy, name), getattr(stored, name))
    (tmp_path / "junk.safetensors").write_bytes(b"not a reference")
    with pytest.raises(ConfigError, match="not a wkvlab stored reference"):
        StoredReference.load(tmp_path / "junk.safetensors")


def test_bfloat16_reference_on_the_cpu():
    model = tiny_llama().to(torch.bfloat16)
    results = _run(model, _windows(), RunOptions(chunk=16), kv=["fp16", "int8", "int2"], weights=["none"])
    assert results[0].run["dtype"] == "bfloat16"
    assert results[0].kld["max"] == 0.0
    assert 0 < results[1].kld["mean"] < results[2].kld["mean"]
