"""Engine output + the reference's full distribution → the per-token arrays every result is made of.

Full logits go through :func:`wkvlab.eval.metrics.compare_tokens`, the same code the simulation
uses. With top-k log-probs (HTTP servers) the KLD is the lower bound of :mod:`wkvlab.eval.topk`:
the buckets are the tokens whose candidate log-prob the engine reported — its own top-k and the
scored token — plus one bucket for everything else. The reference's top-k ids cannot be used
directly because an engine reports only *its* top-k: a reference-top token it did not list has an
unknown probability. Any set of buckets gives a valid lower bound (merging outcomes never raises
KL), and this one holds every number the engine gave. The reference's mass outside the buckets
(its "tail mass") says how much was merged.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from wkvlab.engines.base import PAD_ID, WindowScores
from wkvlab.errors import DataError
from wkvlab.eval.metrics import ReferenceTokens, TokenMetrics, compare_tokens
from wkvlab.eval.topk import coarsened_kld

# Padded bucket entries get this log-prob on both sides: probability exactly 0 in float64, so they
# add nothing to either side's sums and 0 · (a − a) = 0 to the KL.
PAD_LOGPROB = -1.0e4


@dataclass
class WindowComparison:
    metrics: TokenMetrics
    tail_mass: np.ndarray  # reference mass outside the buckets (zeros for full logits)
    positions: np.ndarray


def reference_slice(ref_logits: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> ReferenceTokens:
    """Reference at the engine's positions; ``ref_logits`` covers every position of the window."""
    if positions.numel() == 0:
        raise DataError("the engine scored no position of the window; use a longer --ctx")
    return ReferenceTokens.from_logits(ref_logits[positions], tokens[positions + 1])


def compare_window(ref_logits: torch.Tensor, tokens: torch.Tensor, scores: WindowScores) -> WindowComparison:
    """Compare one window; ``ref_logits`` is ``[ctx, V]`` for the whole window (positions 0..ctx-1)."""
    ref = reference_slice(ref_logits, tokens, scores.positions)
    positions = scores.positions.numpy()
    if scores.full:
        logits = scores.logits
        if logits.shape[-1] != ref.logprobs.shape[-1]:
            raise DataError(f"the engine's vocabulary ({logits.shape[-1]}) differs from the reference model's ({ref.logprobs.shape[-1]}); use the same model on both sides")
        return WindowComparison(compare_tokens(ref, logits), np.zeros(len(positions)), positions)
    # float64 reference log-probs for the buckets: float32 ones sum to 1 ± 1e-6, and that error,
    # landing in a nearly empty rest bucket, would add up to 1e-4 to a bound that should be exact.
    ref_lp64 = torch.log_softmax(ref_logits[scores.positions].double(), dim=-1)
    return WindowComparison(*compare_topk(ref, ref_lp64, scores), positions)


def compare_topk(ref: ReferenceTokens, ref_lp64: torch.Tensor, scores: WindowScores) -> tuple[TokenMetrics, np.ndarray]:
    """Full reference (``ref_lp64``: its float64 log-probs at the scored positions) against top-k ``scores``."""
    ids, cand = scores.ids, scores.logprobs.double()
    vocab = ref_lp64.shape[-1]
    if int(ids.max()) >= vocab:
        raise DataError(f"the engine reported token id {int(ids.max())}, outside the reference's vocabulary of {vocab}; use the same model on both sides")
    valid = ids != PAD_ID
    safe = ids.clamp_min(0)
    ref_lp = ref_lp64.gather(-1, safe)
    ref_lp = torch.where(valid, ref_lp, torch.full_like(ref_lp, PAD_LOGPROB))
    cand = torch.where(valid, cand, torch.full_like(cand, PAD_LOGPROB))
    kld = coarsened_kld(ref_lp, cand)
    tail = (1 - ref_lp.exp().sum(-1)).clamp_min(0)

    # The candidate's own top-1 is the best token it reported (its top-k always holds its argmax).
    cand_argmax = safe.gather(-1, cand.argmax(-1, keepdim=True))[:, 0]
    target_hit = (ids == ref.targets[:, None]) & valid
    if not bool(target_hit.any(-1).all()):
        missing = int((~target_hit.any(-1)).nonzero()[0, 0])
        raise DataError(f"the engine gave no log-prob for the scored token at position {int(scores.positions[missing])}; "
                        "the server must report the prompt token's log-prob (vLLM prompt_logprobs and OpenAI echo do)")
    nll = -(torch.where(target_hit, cand, torch.zeros_like(cand)).sum(-1))
    delta_p = torch.exp(-nll) - torch.exp(-ref.nll.double())
    as_np = lambda t: t.double().numpy()  # noqa: E731
    metrics = TokenMetrics(as_np(kld), as_np(ref.nll), as_np(nll), (cand_argmax == ref.argmax).numpy(), as_np(delta_p))
    return metrics, as_np(tail)
