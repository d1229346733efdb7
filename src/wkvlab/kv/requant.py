"""Caches that re-quantize their whole content at every flush: transformers' ``QuantizedCache`` with HQQ.

transformers 5.24 ``src/transformers/cache_utils.py`` ``QuantizedLayer.update``: the first update
quantizes the whole prompt (and returns it unquantized); at a later update, when the residual is
full (``residual + new >= residual_length``), it quantizes ``cat(dequantize(quantized), residual,
new)`` — the whole cache, already-dequantized values included — and empties the residual. With
quanto's per-token groups that is nearly idempotent (``hf-quanto:*`` treat it as quantize-once);
with HQQ it is not: hqq's axis-0 groups are columns of the flattened cache, so which values share
a group changes with the cache's length, and its solver's early stop looks at the whole tensor
(:mod:`wkvlab.formats.hqq`). So the quantized version of a key depends on the flush a query
follows, and the simulation keeps the chain itself: with flush points F_0 < F_1 < ... (``L, L + R,
L + 2R, ...`` after an L-token prompt; ``R, 2R, ...`` without one),

    D_0 = Q(X[:F_0]),   D_m = Q(cat(D_{m-1}, X[F_{m-1}:F_m])),

and query t in [F_m, F_{m+1}) sees D_m for keys below F_m and the rest at model precision (the
selection of :func:`wkvlab.kv.attention.flush_selection`). Queries before F_0 (the prompt) see
everything at model precision. The teacher-forced hook, the chunked pass and the streaming cache
all build the same chain (tested equal), and a replay against transformers with the real hqq
matches its logits (tests/kv/test_hqq_cache_replay.py).
"""
from __future__ import annotations

from typing import Callable

import torch

from wkvlab.kv.attention import KVSelection, mixed_attention
from wkvlab.kv.tokens import TokenPolicy


def flush_points(policy: TokenPolicy, n_tokens: int) -> list[int]:
    """Positions below ``n_tokens`` at which the cache is (re-)quantized whole: a query at or after
    one sees every key before it quantized."""
    if not policy.residual:
        raise ValueError("a whole-cache format needs a flushed side (residual=R)")
    first = policy.prefill or policy.residual
    return list(range(first, n_tokens, policy.residual))


class FlushChain:
    """One side's chain ``D_m`` for one window, advanced as queries move forward (kept across chunks).

    Only the last flush's version is held: queries arrive in order (one teacher-forced pass, or the
    chunks of one window), so a window's memory is one cache copy per side, not one per flush.
    """

    def __init__(self, quantize: Callable[[torch.Tensor], torch.Tensor], policy: TokenPolicy) -> None:
        self.quantize, self.policy = quantize, policy
        self.point = 0  # where the last flush ended (0: none yet)
        self.flushes = 0
        self.state: torch.Tensor | None = None  # D_m, the dequantized cache below ``point``

    def _advance(self, raw: torch.Tensor, point: int) -> None:
        """One flush at ``point``: the stored (dequantized) cache and the tokens since, quantized whole."""
        previous = self.state if self.state is not None else raw[..., :0, :]
        self.state = self.quantize(torch.cat([previous, raw[..., self.point:point, :]], dim=-2)).to(raw.dtype)
        self.point = point

    def seen_by(self, position: int, raw: torch.Tensor) -> torch.Tensor:
        """What query ``position`` sees: the last flush at or before it (dequantized), then ``raw`` from there on.

        ``raw``: the side's keys (values) at model precision from position 0, at least up to ``position``.
        """
        points = flush_points(self.policy, position + 1)
        if len(points) < self.flushes:
            raise ValueError(f"query {position} comes before the flush at {self.point}: a chain only moves forward")
        for point in points[self.flushes:]:
            self._advance(raw, point)
            self.flushes += 1
        if self.state is None:
            return raw
        return torch.cat([self.state, raw[..., self.point:, :]], dim=-2)


def flush_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, stored_k: torch.Tensor, stored_v: torch.Tensor,
                    chains: tuple[FlushChain | None, FlushChain | None], attention_mask: torch.Tensor | None, *, scaling: float,
                    selection: KVSelection, query_offset: int = 0, softcap: float | None = None) -> torch.Tensor:
    """:func:`mixed_attention` with the whole-cache sides' keys (values) taken from their chains.

    ``key``/``value``: every key at model precision from position 0 (``[batch, kv_heads, keys, D]``);
    ``stored_k``/``stored_v``: the per-write stored versions, used on a side without a chain.
    Queries are split where a flush falls, each group attending to the version its flush left.
    """
    n_queries = query.shape[2]
    last = query_offset + n_queries - 1
    cuts = sorted({p for chain in chains if chain is not None for p in flush_points(chain.policy, last + 1) if p > query_offset})
    bounds = [query_offset, *cuts, last + 1]
    outputs = []
    for start, stop in zip(bounds, bounds[1:]):
        rows = slice(start - query_offset, stop - query_offset)
        k_seen = chains[0].seen_by(start, key) if chains[0] is not None else stored_k
        v_seen = chains[1].seen_by(start, value) if chains[1] is not None else stored_v
        mask = attention_mask[:, :, rows] if attention_mask is not None else None
        outputs.append(mixed_attention(query[:, :, rows], key, k_seen, value, v_seen, mask, scaling=scaling, selection=selection,
                                       query_offset=start, softcap=softcap))
    return torch.cat(outputs, dim=1)
