"""Secondary commands and the residual/window attention on the chunked path: no ``[ctx, vocab]``
logits, no float32 copy of the whole cache — and the same numbers as before."""
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.conftest import tiny_gemma3, tiny_llama
from tests.engines.scores import reported_topk
from wkvlab.data.windows import make_windows
from wkvlab.engines.base import WindowScores
from wkvlab.engines.bridge import compare_window
from wkvlab.kv import attention as A
from wkvlab.kv.spec import KVSpec


class _Largest(TorchDispatchMode):
    """The largest float32 tensor any op returns, and the largest float32 copy ('.float()' / '.to')."""

    def __init__(self):
        super().__init__()
        self.copy = self.any = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.float32:
            self.any = max(self.any, out.numel())
            if func is torch.ops.aten._to_copy.default:
                self.copy = max(self.copy, out.numel())
        return out


def _plain_attention(query, key, key_q, value, value_q, selection, scaling):
    """The per-(query, key) selection computed whole in float64: the definition."""
    n_rep = query.shape[1] // key.shape[1]
    k, kq, v, vq = (t.double().repeat_interleave(n_rep, dim=1) for t in (key, key_q, value, value_q))
    q = query.double()
    pos = torch.arange(query.shape[2])
    use = selection(pos, key.shape[2])
    scores = torch.where(use, q @ kq.transpose(-1, -2), q @ k.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~(pos[None, :] <= pos[:, None]), float("-inf"))
    probs = scores.softmax(-1)
    return ((probs * use) @ vq + (probs * ~use) @ v).transpose(1, 2)


def test_mixed_attention_groups_queries_and_never_repeats_the_cache():
    torch.manual_seed(0)
    batch, heads, kv_heads, tokens, dim = 1, 4, 2, 192, 16
    query = torch.randn(batch, heads, tokens, dim, dtype=torch.bfloat16)
    key, value = (torch.randn(batch, kv_heads, tokens, dim, dtype=torch.bfloat16) for _ in range(2))
    key_q, value_q = key + 0.1 * torch.randn_like(key), value + 0.1 * torch.randn_like(value)
    selection = A.flush_selection(8)
    with _Largest() as seen:
        out = A.mixed_attention(query, key, key_q, value, value_q, None, scaling=dim ** -0.5, selection=selection, chunk=32)
    whole_cache = batch * kv_heads * tokens * dim
    # float32 copies: the quantized cache once (not repeated per query head), a group of queries, a band of keys
    assert seen.copy == whole_cache
    assert seen.any == batch * heads * 32 * tokens  # the largest: one group's [heads, 32 queries, all keys] scores
    expected = _plain_attention(query, key, key_q, value, value_q, selection, dim ** -0.5)
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=2e-2)  # bf16 output
    again = A.mixed_attention(query.float(), key.float(), key_q.float(), value.float(), value_q.float(), None,
                              scaling=dim ** -0.5, selection=selection, chunk=32)
    torch.testing.assert_close(again.double(), expected, rtol=0, atol=1e-5)


def _no_full_windows(model, ctx):
    """Fail if a whole window goes through ``model`` at once (its [ctx, vocab] logits would exist)."""
    def check(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        assert ids.shape[-1] < ctx, "a whole window went through the model at once"

    return model.register_forward_pre_hook(check, with_kwargs=True)


def test_search_scores_chunk_by_chunk_and_match_the_whole_window():
    from wkvlab.eval.runner import forward_logits
    from wkvlab.eval.metrics import ReferenceTokens, compare_tokens
    from wkvlab.kv.hook import kv_quantization
    from wkvlab.search.measure import Scorer

    torch.manual_seed(0)
    windows = make_windows(torch.randint(0, 128, (140,)), ctx=64, n_tokens=128, bos_id=None)
    reference, kv = tiny_gemma3(), KVSpec.parse("int4")
    expected = []
    with torch.no_grad():
        for t in windows.tokens:
            ref = ReferenceTokens.from_logits(forward_logits(reference, t)[:-1], t[1:])
            with kv_quantization(reference, kv):
                expected.append(compare_tokens(ref, forward_logits(reference, t)[:-1]).kld)
    _no_full_windows(reference, 64)
    scorer = Scorer(reference, windows, chunk=16)
    first, second = scorer.score(reference, kv), scorer.score(reference, kv)  # the second reuses the kept reference chunks
    np.testing.assert_allclose(first.per_token, np.concatenate(expected), atol=1e-5)
    assert np.array_equal(first.per_token, second.per_token)
    assert scorer.score(reference).kld == 0.0


def test_engine_runs_compare_chunk_by_chunk():
    from wkvlab.engines.run import compare_chunked
    from wkvlab.eval.chunks import WindowPass
    from wkvlab.eval.runner import forward_logits

    model = tiny_llama()
    tokens = torch.randint(0, 128, (48,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = forward_logits(model, tokens)
        engine = whole + 0.3 * torch.randn(whole.shape, generator=torch.Generator().manual_seed(3))
        positions = torch.arange(5, 47)
        for scores in (WindowScores(positions=positions, logits=engine[positions]), reported_topk(engine[positions], tokens, positions, 20)):
            expected = compare_window(whole, tokens, scores)
            got = compare_chunked(WindowPass(model), tokens, scores, chunk=16)
            np.testing.assert_array_equal(got.positions, expected.positions)
            np.testing.assert_allclose(got.metrics.kld, expected.metrics.kld, atol=1e-5)
            np.testing.assert_allclose(got.tail_mass, expected.tail_mass, atol=1e-6)
            np.testing.assert_array_equal(got.metrics.top1_agree, expected.metrics.top1_agree)


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_explain_backend_floor_runs_chunked(make, monkeypatch):
    from wkvlab.eval.runner import RunOptions, run_grid
    from wkvlab.explain.compare import backend_result
    from wkvlab.weights.spec import WeightSpec

    torch.manual_seed(0)
    windows = make_windows(torch.randint(0, 128, (100,)), ctx=48, n_tokens=96, bos_id=None)
    model = make()
    identity = run_grid(model, windows, [WeightSpec.parse("none")], [KVSpec.parse("fp16")], model_name="t", data_name="d",
                        options=RunOptions(chunk=16))[0]
    monkeypatch.setattr("wkvlab.explain.compare.auto_chunk", lambda *_a, **_k: 16)
    _no_full_windows(model, 48)
    floor = backend_result(model, windows, identity, "eager")
    assert floor.arrays.kld.shape == identity.arrays.kld.shape
    assert floor.kld["max"] < 1e-4  # eager against sdpa: rounding only
