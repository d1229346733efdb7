"""The vectorised mixed attention (issue #40 item 4) against the blocked online softmax it replaced
(tests/kv/blocked_attention.py, main at cb535f1): the same outputs to float rounding on the CPU, the
prefix rule its key band relies on, no n_rep copy of K or V, launches that do not grow with the
context, and memory within :func:`wkvlab.kv.attention_sizes.mixed_attention_bytes` (counted on ``meta``)."""
import pytest
import torch

from tests import fake_device
from tests.kv import blocked_attention as old
from tests.meta_memory import MemoryAudit
from wkvlab.kv import attention as A
from wkvlab.kv.attention_sizes import mixed_attention_bytes, query_group

SELECTIONS = {
    "flush": A.flush_selection(8),
    "flush-prefill": A.flush_selection(8, prefill=20),
    "flush-prompt-exact": A.flush_selection(8, prefill=20, prompt_exact=True),
    "sliding": A.sliding_selection(12),
    "past-only": A.past_only(None),
    "past-only-flush": A.past_only(A.flush_selection(8)),
    "kivi-sides": A.KVSelection(A.flush_selection(16), A.sliding_selection(10)),
    "keys-only": A.KVSelection(A.flush_selection(8), None),
    "any-callable": lambda pos, n: (torch.arange(n)[None, :] % 3 == 0) & (torch.arange(n)[None, :] < pos[:, None]),
}


def _inputs(dtype, batch=2, heads=4, kv_heads=2, queries=40, keys=64, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, queries, dim, generator=g).to(dtype)
    k, v = (torch.randn(batch, kv_heads, keys, dim, generator=g).to(dtype) for _ in range(2))
    kq, vq = ((t.float() + 0.2 * torch.randn(t.shape, generator=g)).to(dtype) for t in (k, v))
    return q, k, kq, v, vq


def _masks(batch, queries, keys, key_offset, query_offset):
    qpos = torch.arange(queries)[:, None] + query_offset
    kpos = torch.arange(keys)[None, :] + key_offset
    causal = (kpos <= qpos).expand(batch, 1, queries, keys)
    window = (kpos <= qpos) & (qpos - kpos < 20)  # a sliding-window layer's float mask
    return {"none": None, "bool-causal": causal,
            "float-window": torch.zeros(batch, 1, queries, keys).masked_fill(~window, torch.finfo(torch.float32).min)}


@pytest.mark.parametrize("name", SELECTIONS)
@pytest.mark.parametrize("mask", ["none", "bool-causal", "float-window"])
@pytest.mark.parametrize("dtype, atol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_the_vectorised_attention_equals_the_blocked_one(monkeypatch, name, mask, dtype, atol):
    """A chunk of 40 queries (positions 34..73) against the 64 keys a cache holds from position 10 on,
    grouped-query heads, soft-capping; the old path in 16-key blocks, the new in groups of 7 queries."""
    monkeypatch.setattr(old, "SCORE_BLOCK_BYTES", 16 * 2 * 4 * 7 * 4)  # [batch 2, heads 4, chunk 7, 16 keys] float32
    q, k, kq, v, vq = _inputs(dtype)
    attention_mask = _masks(2, 40, 64, key_offset=10, query_offset=34)[mask]
    if attention_mask is None:
        q = q[:, :, :, :]  # plain causal, built inside from the offsets
    args = dict(scaling=0.3, selection=SELECTIONS[name], query_offset=34, key_offset=10, softcap=5.0, chunk=7)
    before = old.blocked_mixed_attention(q, k, kq, v, vq, attention_mask, **args)
    after = A.mixed_attention(q, k, kq, v, vq, attention_mask, **args)
    assert after.shape == before.shape == (2, 40, 4, 16) and after.dtype == dtype
    torch.testing.assert_close(after, before, rtol=0, atol=atol)
    whole = A.mixed_attention(q, k, kq, v, vq, attention_mask, **{**args, "chunk": None})  # one group
    torch.testing.assert_close(whole, before, rtol=0, atol=atol)


def test_a_bf16_model_gets_the_blocked_outputs_to_its_own_rounding():
    q, k, kq, v, vq = _inputs(torch.bfloat16, queries=64)
    args = dict(scaling=0.25, selection=SELECTIONS["kivi-sides"], chunk=16)
    before = old.blocked_mixed_attention(q, k, kq, v, vq, None, **args)
    after = A.mixed_attention(q, k, kq, v, vq, None, **args)
    assert after.dtype == torch.bfloat16
    torch.testing.assert_close(after.float(), before.float(), rtol=2 ** -7, atol=1e-6)  # one bf16 rounding apart at most


@pytest.mark.parametrize("name", [n for n in SELECTIONS if n not in ("kivi-sides", "keys-only", "any-callable")])
def test_each_rule_quantizes_a_prefix_that_never_shrinks(name):
    """What the key band rests on: query t sees exactly keys below ``prefix(t)`` quantized, and the
    prefix does not decrease with t, so a group's first query bounds the keys all of it sees quantized."""
    selection = SELECTIONS[name]
    mask = selection(torch.arange(100), 120)
    prefixes = [selection.prefix(t) for t in range(100)]
    assert torch.equal(mask, torch.arange(120)[None, :] < torch.tensor(prefixes)[:, None])
    assert prefixes == sorted(prefixes) and prefixes[-1] > 0


def _ops_of_one_call(n_keys: int, queries: int = 512, heads: int = 32, kv_heads: int = 8, dim: int = 128):
    import torch._dynamo  # noqa: F401 - its first import reads torch.Generator, which the fake accelerator replaces
    q = torch.empty(1, heads, queries, dim, dtype=torch.bfloat16, device="meta")
    k, kq, v, vq = (torch.empty(1, kv_heads, n_keys, dim, dtype=torch.bfloat16, device="meta") for _ in range(4))
    with fake_device.fake_accelerator() as audit:
        A.mixed_attention(q, k, kq, v, vq, None, scaling=0.1, selection=A.flush_selection(128),
                          query_offset=n_keys - queries)
    return audit


def test_launches_do_not_grow_with_the_context_and_make_no_sync():
    """A Llama-3-8B-shaped layer, a 512-query chunk (KIVI's 128-token residual): the blocked version
    launched one block's ops per 512 keys (64 blocks at 32k, 256 at 128k); this one a fixed number per
    query group, and a group is 64 queries (bf16, head_dim 128) at any context past the 256 MiB floor."""
    at = {n: _ops_of_one_call(n) for n in (4096, 32768, 131072)}
    assert all(a.syncs == 0 for a in at.values())
    groups = {n: -(-512 // query_group(1, 32, n, 128, 2)) for n in at}
    assert groups == {4096: 2, 32768: 8, 131072: 8}
    ops = {n: at[n].ops for n in at}
    assert ops[32768] == ops[131072] and (ops[32768] - ops[4096]) % 6 == 0, ops  # the same ops per group, 6 groups more
    assert ops[32768] < 8 * 100, ops


def test_no_key_or_value_is_repeated_per_query_head_and_memory_is_as_stated():
    """On ``meta`` inside the counting audit: the peak of one call beyond its inputs stays within
    :func:`wkvlab.kv.attention_sizes.mixed_attention_bytes` and above 85% of it; every matmul reads K/V with kv_heads heads."""
    heads, kv_heads, n_keys, queries, dim = 32, 8, 16384, 512, 128
    q = torch.empty(1, heads, queries, dim, dtype=torch.bfloat16, device="meta")
    k, kq, v, vq = (torch.empty(1, kv_heads, n_keys, dim, dtype=torch.bfloat16, device="meta") for _ in range(4))
    widths = []
    real_matmul = torch.Tensor.__matmul__
    with MemoryAudit(slack=0) as audit:
        audit.hold(q, k, kq, v, vq)
        before = audit.live()
        audit.reset_peak()
        torch.Tensor.__matmul__ = lambda a, b: widths.append(b.shape[1]) or real_matmul(a, b)
        try:
            out = A.mixed_attention(q, k, kq, v, vq, None, scaling=0.1, selection=A.flush_selection(128), query_offset=n_keys - queries)
        finally:
            torch.Tensor.__matmul__ = real_matmul
        peak = audit.peak - before - out.untyped_storage().nbytes()
    stated = mixed_attention_bytes(1, heads, kv_heads, queries, n_keys, dim, 2)
    assert widths and set(widths) == {kv_heads}
    assert 0.85 * stated <= peak <= stated, (peak / 2**20, stated / 2**20)
