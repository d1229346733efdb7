"""The blocked online-softmax ``mixed_attention`` as it was before issue #40 item 4 (main at cb535f1,
src/wkvlab/kv/attention.py): a Python loop over 512-key blocks, both products on every key, each
block broadcast to every query head. Kept only as the reference the vectorised version is tested
against (tests/kv/test_mixed_attention.py) and the "before" of benchmarks/attention_launches.py."""
from __future__ import annotations

import torch

from wkvlab.kv.attention import KVSelection, _mask_block, _side_mask

SCORE_BLOCK_BYTES = 32 << 20


def blocked_mixed_attention(query, key, key_q, value, value_q, attention_mask, *, scaling: float, selection, query_offset: int = 0,
                            key_offset: int = 0, softcap: float | None = None, chunk: int = 512) -> torch.Tensor:
    """The arguments and result of :func:`wkvlab.kv.attention.mixed_attention`."""
    sides = selection if isinstance(selection, KVSelection) else KVSelection(selection, selection)
    batch, heads, n_queries, head_dim = query.shape
    kv_heads, n_keys = key.shape[1], key.shape[2]
    n_rep = heads // kv_heads
    # float32 at least (transformers' eager softmax); a float64 model keeps float64, so its
    # teacher-forced and streamed passes agree to float64 rounding (tests/kv/test_streaming.py)
    work = torch.promote_types(query.dtype, torch.float32)
    lowest = torch.finfo(work).min
    chunk = max(1, min(chunk, n_queries))
    block = max(1, SCORE_BLOCK_BYTES // (4 * batch * heads * chunk))
    outputs = []
    for start in range(0, n_queries, chunk):
        rows = slice(start, min(start + chunk, n_queries))
        # [batch, kv_heads, n_rep, queries, head_dim]: a query head's group shares its key head (no repeat)
        q = query[:, :, rows].to(work).reshape(batch, kv_heads, n_rep, rows.stop - rows.start, head_dim)
        query_pos = torch.arange(rows.start, rows.stop, device=query.device) + query_offset
        use_kq = _side_mask(sides.k, query_pos, key_offset + n_keys)[:, key_offset:]  # [Tc, S]
        use_vq = use_kq if sides.v is sides.k else _side_mask(sides.v, query_pos, key_offset + n_keys)[:, key_offset:]
        running_max = torch.full(q.shape[:-1] + (1,), float("-inf"), dtype=work, device=q.device)
        total = torch.zeros_like(running_max)
        acc = torch.zeros_like(q)
        for k0 in range(0, n_keys, block):
            keys = slice(k0, min(k0 + block, n_keys))
            k_blk, kq_blk = (t[:, :, None, keys].to(work) for t in (key, key_q))  # [batch, kv_heads, 1, Kb, head_dim]
            sel_k = use_kq[:, keys]
            scores = torch.where(sel_k, q @ kq_blk.transpose(-1, -2), q @ k_blk.transpose(-1, -2)).mul_(scaling)
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            # masked keys at the dtype's lowest, never -inf: a block masked whole must rescale to 0, not NaN
            scores = (scores + _mask_block(attention_mask, rows, query_pos, n_keys, key_offset, work)[..., keys]).clamp_(min=lowest)
            new_max = torch.maximum(running_max, scores.amax(-1, keepdim=True))
            rescale = torch.exp(running_max - new_max)
            probs = torch.exp(scores - new_max)
            total = total * rescale + probs.sum(-1, keepdim=True)
            v_blk, vq_blk = (t[:, :, None, keys].to(work) for t in (value, value_q))
            sel_v = use_vq[:, keys]
            acc = acc * rescale + torch.where(sel_v, probs, 0.0) @ vq_blk + torch.where(sel_v, 0.0, probs) @ v_blk
            running_max = new_max
        outputs.append((acc / total).reshape(batch, heads, rows.stop - rows.start, head_dim))
    return torch.cat(outputs, dim=2).transpose(1, 2).to(query.dtype)
