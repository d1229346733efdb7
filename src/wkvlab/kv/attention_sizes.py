"""How :func:`wkvlab.kv.attention.mixed_attention` sizes its query groups and what one call allocates,
in plain integers: the preflight estimate (wkvlab.eval.memory, which imports no torch) counts the
same bytes the function allocates (tests/kv/test_mixed_attention.py measures them on ``meta``)."""
from __future__ import annotations

SCORE_FLOOR_BYTES = 256 << 20  # the score budget at short contexts
SCORES_ALIVE = 2  # the scores and their softmax


def score_budget(batch: int, heads: int, n_keys: int, head_dim: int, itemsize: int) -> int:
    """Bytes the score tensors of one query group may take: the K/V that ``repeat_kv`` expands to every
    query head on the sdpa path (2 × heads × keys × head_dim in the model's dtype), at least 256 MiB."""
    return max(SCORE_FLOOR_BYTES, 2 * batch * heads * n_keys * head_dim * itemsize)


def query_group(batch: int, heads: int, n_keys: int, head_dim: int, itemsize: int, work_itemsize: int = 4) -> int:
    """Queries per group: as many as keep :data:`SCORES_ALIVE` ``[batch, heads, queries, keys]`` work-dtype
    tensors within :func:`score_budget`."""
    per_query = SCORES_ALIVE * work_itemsize * batch * heads * max(n_keys, 1)
    return max(1, score_budget(batch, heads, n_keys, head_dim, itemsize) // per_query)


def mixed_attention_bytes(batch: int, heads: int, kv_heads: int, n_queries: int, n_keys: int, head_dim: int, itemsize: int) -> int:
    """What one ``mixed_attention`` call allocates beyond its inputs, at most: the quantized K and V in
    float32 (none when they are float32 already), two score-sized tensors of one query group (the scores
    with the band's full-precision product, then the scores with their softmax), the group's float32
    mask block, and the float32 output."""
    upcast = 2 * batch * kv_heads * n_keys * head_dim * 4 if itemsize < 4 else 0
    rows = min(n_queries, query_group(batch, heads, n_keys, head_dim, itemsize))
    score = 4 * batch * heads * rows * n_keys
    mask = 4 * batch * rows * n_keys
    return upcast + SCORES_ALIVE * score + mask + 4 * batch * n_queries * heads * head_dim
