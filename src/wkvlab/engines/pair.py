"""Engine against engine: compare a reference engine's scores with a candidate's, on the same tokens.

The seed study scored each checkpoint on its engine against the bf16 original served too, with the
top-200 log-probs of *both* sides. Each side here is a :class:`WindowScores`: full logits
(llama.cpp in-process) or top-k log-probs (a server). The KLD is exact when both are full;
otherwise it is the coarsened lower bound of :mod:`wkvlab.eval.topk` over the tokens whose
log-prob is known on **both** sides, plus one bucket for the rest:

* reference full, candidate top-k: the candidate's reported tokens (what :mod:`bridge` does);
* reference top-k, candidate full: the reference's reported tokens;
* both top-k: the tokens both reported — always at least the scored token, which every echo and
  ``prompt_logprobs`` API reports on both sides.

Merging outcomes never raises KL (log-sum inequality), so every one of these is a lower bound of
the full-vocabulary KLD between the two engines; the reference's mass outside the shared tokens
(its tail mass) says how much was merged. NLL, Δp and top-1 need no bound: the scored token and
each side's argmax are among what each side reports.
"""
from __future__ import annotations

import numpy as np
import torch

from wkvlab.engines.base import PAD_ID, WindowScores
from wkvlab.engines.bridge import PAD_LOGPROB, WindowComparison, compare_topk
from wkvlab.errors import DataError
from wkvlab.eval.metrics import ReferenceTokens, TokenMetrics, compare_tokens
from wkvlab.eval.topk import coarsened_kld


def common_positions(ref: WindowScores, cand: WindowScores) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positions both sides scored, and the row of each in ``ref`` and in ``cand``."""
    r, c = ref.positions.tolist(), cand.positions.tolist()
    shared = sorted(set(r) & set(c))
    if not shared:
        raise DataError("the reference and the candidate scored no position in common; check both serve the same model and --flavor")
    r_row, c_row = {p: i for i, p in enumerate(r)}, {p: i for i, p in enumerate(c)}
    return torch.tensor(shared), torch.tensor([r_row[p] for p in shared]), torch.tensor([c_row[p] for p in shared])


def _rows(scores: WindowScores, rows: torch.Tensor) -> WindowScores:
    return scores.rows(rows)


def _check_vocab(ids: torch.Tensor, vocab: int, side: str) -> None:
    if ids.numel() and int(ids.max()) >= vocab:
        raise DataError(f"the {side} reported token id {int(ids.max())}, outside the other side's vocabulary of {vocab}; serve the same model on both sides")


def _target_logprob(ids: torch.Tensor, logprobs: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor, side: str) -> torch.Tensor:
    hit = (ids == targets[:, None]) & (ids != PAD_ID)
    if not bool(hit.any(-1).all()):
        missing = int((~hit.any(-1)).nonzero()[0, 0])
        raise DataError(f"the {side} gave no log-prob for the scored token at position {int(positions[missing])}; "
                        "the server must report the prompt token's log-prob (vLLM prompt_logprobs and OpenAI echo do)")
    return torch.where(hit, logprobs, torch.zeros_like(logprobs)).sum(-1)


def _best_reported(ids: torch.Tensor, logprobs: torch.Tensor) -> torch.Tensor:
    """The side's top-1: the best token it reported (its top-k holds its argmax)."""
    masked = torch.where(ids != PAD_ID, logprobs, torch.full_like(logprobs, -torch.inf))
    return ids.gather(-1, masked.argmax(-1, keepdim=True))[:, 0]


def _topk_reference(ref: WindowScores, cand: WindowScores, targets: torch.Tensor) -> tuple[TokenMetrics, np.ndarray]:
    """Reference top-k against a full or top-k candidate: buckets are the tokens known on both sides."""
    r_ids, r_lp = ref.ids, ref.logprobs.double()
    r_valid = r_ids != PAD_ID
    if cand.full:
        _check_vocab(r_ids, cand.logits.shape[-1], "reference")
        c_full = torch.log_softmax(cand.logits.double(), dim=-1)
        known = r_valid
        c_at = c_full.gather(-1, r_ids.clamp_min(0))
        nll = -c_full.gather(-1, targets[:, None])[:, 0]
        c_top1 = cand.logits.argmax(-1)
    else:
        c_ids, c_lp = cand.ids, cand.logprobs.double()
        match = (r_ids[:, :, None] == c_ids[:, None, :]) & r_valid[:, :, None] & (c_ids != PAD_ID)[:, None, :]
        known = match.any(-1)
        c_at = torch.where(match, c_lp[:, None, :], torch.zeros((), dtype=torch.float64)).sum(-1)
        nll = -_target_logprob(c_ids, c_lp, targets, cand.positions, "candidate")
        c_top1 = _best_reported(c_ids, c_lp)
    ref_b = torch.where(known, r_lp, torch.full_like(r_lp, PAD_LOGPROB))
    cand_b = torch.where(known, c_at, torch.full_like(c_at, PAD_LOGPROB))
    kld = coarsened_kld(ref_b, cand_b)
    tail = (1 - ref_b.exp().sum(-1)).clamp_min(0)
    nll_ref = -_target_logprob(r_ids, r_lp, targets, ref.positions, "reference")
    delta_p = torch.exp(-nll) - torch.exp(-nll_ref)
    agree = c_top1 == _best_reported(r_ids, r_lp)
    as_np = lambda t: t.double().numpy()  # noqa: E731
    return TokenMetrics(as_np(kld), as_np(nll_ref), as_np(nll), agree.numpy(), as_np(delta_p)), as_np(tail)


def compare_pair(ref: WindowScores, cand: WindowScores, tokens: torch.Tensor) -> WindowComparison:
    """Per-token metrics of one window scored by both engines, on the positions both scored."""
    positions, r_rows, c_rows = common_positions(ref, cand)
    ref, cand = _rows(ref, r_rows), _rows(cand, c_rows)
    targets = tokens[positions + 1]
    if ref.full:
        reference = ReferenceTokens.from_logits(ref.logits, targets)
        if cand.full:
            if cand.logits.shape[-1] != ref.logits.shape[-1]:
                raise DataError(f"the candidate's vocabulary ({cand.logits.shape[-1]}) differs from the reference's ({ref.logits.shape[-1]}); serve the same model on both sides")
            return WindowComparison(compare_tokens(reference, cand.logits), np.zeros(len(positions)), positions.numpy())
        ref_lp64 = torch.log_softmax(ref.logits.double(), dim=-1)
        metrics, tail = compare_topk(reference, ref_lp64, cand)
        return WindowComparison(metrics, tail, positions.numpy())
    metrics, tail = _topk_reference(ref, cand, targets)
    return WindowComparison(metrics, tail, positions.numpy())
