"""Synthetic engine output for the bridge and pair tests: random logit windows, and what a server reports."""
from __future__ import annotations

import torch

from wkvlab.engines.base import PAD_ID, WindowScores


def random_window(seed: int = 0, ctx: int = 12, vocab: int = 300, noise: float = 0.4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference logits ``[ctx, vocab]``, a candidate near them, and the window's tokens."""
    torch.manual_seed(seed)
    ref = torch.randn(ctx, vocab) * 3
    cand = ref + torch.randn_like(ref) * noise
    tokens = torch.randint(0, vocab, (ctx,))
    return ref, cand, tokens


def reported_topk(logits: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, k: int) -> WindowScores:
    """What a server reports from ``logits`` (one row per position): its top-k plus the scored token, deduplicated, padded."""
    lp = torch.log_softmax(logits.double(), -1)
    rows = [list(dict.fromkeys([int(tokens[p + 1])] + lp[r].topk(k).indices.tolist())) for r, p in enumerate(positions.tolist())]
    ids = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
    logprobs = torch.zeros(ids.shape, dtype=torch.float64)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row)
        logprobs[r, : len(row)] = lp[r, row]
    return WindowScores(positions=positions, ids=ids, logprobs=logprobs, topk=k)
