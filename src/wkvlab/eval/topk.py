"""KL divergence when only the top-k log-probabilities are known (engines' logprob APIs).

The seed study scored engines by their top-200 log-probs; vLLM caps ``max_logprobs`` at 20 by
default. With the reference's top-k token ids, the reference's and the candidate's log-probs on
those ids, both distributions are coarsened to k + 1 buckets — the k tokens and one "rest" bucket
holding the remaining mass (1 − Σ top-k) of each side — and KL is taken between the coarsened
distributions. Merging outcomes never increases KL (the log-sum inequality), so this is a lower
bound of the full-vocabulary KLD that tightens as k grows and is exact at k = vocabulary size.
The reference's mean tail mass says how much was merged.

A server's log-probs are rounded (float32 at best, often fewer digits), so the candidate's reported
probabilities can sum to 1 or slightly more even when its true leftover mass is positive. Clamping
that leftover to ~0 would put ``p_rest · log(p_rest / 1e-300)`` into the "bound" and make it exceed
the true KLD. When the candidate's leftover is below the rounding noise of what it reported, the
rest bucket is therefore merged into the candidate's most probable reported token — a coarser
partition, so still a lower bound — instead of being given a mass nobody measured.
"""
from __future__ import annotations

import torch


# Relative rounding of one reported probability: float32 log-probs carry ~6e-8; allow an order more.
REPORTED_ROUNDING = 1e-6


def coarsened_kld(ref_logprobs_topk: torch.Tensor, cand_logprobs_topk: torch.Tensor) -> torch.Tensor:
    """Per-position KL over k + 1 buckets; inputs ``[T, k]`` on the same token ids."""
    ref_lp, cand_lp = ref_logprobs_topk.double(), cand_logprobs_topk.double()
    p, q = ref_lp.exp(), cand_lp.exp()
    p_rest = (1 - p.sum(-1)).clamp_min(0)
    q_rest = 1 - q.sum(-1)
    # the candidate's leftover is unknown when it is within the rounding of the k reported values
    unresolved = q_rest <= REPORTED_ROUNDING * q.shape[-1]
    top = torch.nn.functional.one_hot(cand_lp.argmax(-1), q.shape[-1]).bool() & unresolved[:, None]
    # merged: the rest joins the candidate's top bucket on both sides (a negative leftover is rounding: 0)
    p_bucket = torch.where(top, p + p_rest[:, None], p)
    q_bucket_lp = torch.where(top, (q + q_rest.clamp_min(0)[:, None]).log(), cand_lp)
    head = torch.where(p_bucket > 0, p_bucket * (p_bucket.clamp_min(1e-300).log() - q_bucket_lp), torch.zeros_like(p))
    tail = torch.where((p_rest > 0) & ~unresolved, p_rest * (p_rest.clamp_min(1e-300).log() - q_rest.clamp_min(1e-300).log()),
                       torch.zeros_like(p_rest))
    return head.sum(-1) + tail


def topk_kld(ref_logits: torch.Tensor, cand_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower bound from full logits ``[T, V]`` (for tests and simulations), and the reference's tail mass."""
    ref_lp = torch.log_softmax(ref_logits.double(), -1)
    cand_lp = torch.log_softmax(cand_logits.double(), -1)
    top = ref_lp.topk(k, dim=-1)
    bound = coarsened_kld(top.values, cand_lp.gather(-1, top.indices))
    tail_mass = 1 - top.values.exp().sum(-1)
    return bound, tail_mass
