"""KL divergence when only the top-k log-probabilities are known (engines' logprob APIs).

The seed study scored engines by their top-200 log-probs; vLLM caps ``max_logprobs`` at 20 by
default. With the reference's top-k token ids, the reference's and the candidate's log-probs on
those ids, both distributions are coarsened to k + 1 buckets — the k tokens and one "rest" bucket
holding the remaining mass (1 − Σ top-k) of each side — and KL is taken between the coarsened
distributions. Merging outcomes never increases KL (the log-sum inequality), so this is a lower
bound of the full-vocabulary KLD that tightens as k grows and is exact at k = vocabulary size.
The reference's mean tail mass says how much was merged.
"""
from __future__ import annotations

import torch


def coarsened_kld(ref_logprobs_topk: torch.Tensor, cand_logprobs_topk: torch.Tensor) -> torch.Tensor:
    """Per-position KL over k + 1 buckets; inputs ``[T, k]`` on the same (reference top-k) token ids."""
    p = ref_logprobs_topk.double().exp()
    q = cand_logprobs_topk.double().exp()
    p_rest = (1 - p.sum(-1)).clamp_min(0)
    q_rest = (1 - q.sum(-1)).clamp_min(1e-300)  # a candidate with no tail mass left: the bound is still finite
    head = (p * (ref_logprobs_topk.double() - cand_logprobs_topk.double())).sum(-1)
    tail = torch.where(p_rest > 0, p_rest * (p_rest.clamp_min(1e-300).log() - q_rest.log()), torch.zeros_like(p_rest))
    return head + tail


def topk_kld(ref_logits: torch.Tensor, cand_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The lower bound from full logits ``[T, V]`` (for tests and simulations), and the reference's tail mass."""
    ref_lp = torch.log_softmax(ref_logits.double(), -1)
    cand_lp = torch.log_softmax(cand_logits.double(), -1)
    top = ref_lp.topk(k, dim=-1)
    bound = coarsened_kld(top.values, cand_lp.gather(-1, top.indices))
    tail_mass = 1 - top.values.exp().sum(-1)
    return bound, tail_mass
