"""Per-token comparison of a candidate's next-token distribution with the reference's.

Definitions follow llama.cpp ``tools/perplexity`` and exllamav3 ``eval/model_diff.py``:

* KLD per token = Σ_v p_ref(v) (log p_ref(v) − log p_cand(v)) over the full vocabulary.
* top-1 agreement: argmax of the two distributions is the same token.
* Δp = p_cand(correct token) − p_ref(correct token).
* PPL = exp(mean NLL of the correct token), for reference and candidate on the same tokens.

The reference side (log-probs, probs, argmax) is computed once per chunk and shared by every
candidate; all sums run in float32 on float32 logits (a bf16 model's final norm and head run in
float32 too, :mod:`wkvlab.eval.logits`), so the identity candidate gives a KLD of exactly 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class ReferenceTokens:
    """What every candidate is compared against, for the scored positions of one window."""

    logprobs: torch.Tensor  # [T, V] float32
    probs: torch.Tensor  # [T, V]
    targets: torch.Tensor  # [T] int64
    nll: torch.Tensor  # [T]
    argmax: torch.Tensor  # [T]

    @classmethod
    def from_logits(cls, logits: torch.Tensor, targets: torch.Tensor) -> "ReferenceTokens":
        targets = targets.to(logits.device)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        nll = -logprobs.gather(-1, targets[:, None])[:, 0]
        return cls(logprobs, logprobs.exp(), targets, nll, logits.argmax(-1))


@dataclass
class TokenMetrics:
    """Per-token arrays for one window (numpy float64 / bool), the raw material of every summary."""

    kld: np.ndarray
    nll_ref: np.ndarray
    nll: np.ndarray
    top1_agree: np.ndarray
    delta_p: np.ndarray


METRIC_NAMES = ("kld", "nll_ref", "nll", "top1_agree", "delta_p")


def chunk_metrics(ref: ReferenceTokens, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token metrics of one chunk as tensors on the logits' device: a chunked pass collects
    them and reads them back once per window (:func:`host_metrics`), not once per chunk."""
    logits = logits.to(ref.logprobs.device)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    # One [T, V] temporary instead of two: this runs once per chunk and candidate.
    kld = torch.sub(ref.logprobs, logprobs).mul_(ref.probs).sum(-1)
    nll = -logprobs.gather(-1, ref.targets[:, None])[:, 0]
    delta_p = torch.exp(-nll) - torch.exp(-ref.nll)
    return {"kld": kld, "nll_ref": ref.nll, "nll": nll, "top1_agree": logits.argmax(-1) == ref.argmax, "delta_p": delta_p}


def host_metrics(parts: list[dict[str, torch.Tensor]]) -> TokenMetrics:
    """Consecutive chunks' :func:`chunk_metrics` as one window's arrays (float64 for the sums that follow)."""
    def host(name: str) -> np.ndarray:
        joined = torch.cat([p[name] for p in parts]).cpu()
        return joined.numpy() if joined.dtype == torch.bool else joined.double().numpy()

    return TokenMetrics(*(host(name) for name in METRIC_NAMES))


def compare_tokens(ref: ReferenceTokens, logits: torch.Tensor) -> TokenMetrics:
    return host_metrics([chunk_metrics(ref, logits)])


def concat_metrics(parts: list[TokenMetrics]) -> TokenMetrics:
    """The metrics of consecutive chunks of one window, as one window's."""
    return TokenMetrics(*(np.concatenate([getattr(p, name) for p in parts]) for name in METRIC_NAMES))


def kld_summary(kld: np.ndarray) -> dict[str, float]:
    """Mean ± standard error (tokens treated as independent, as llama.cpp reports) and quantiles.

    The standard error is a description comparable with llama.cpp's output, never a basis for a verdict:
    tokens of one document are correlated, so it is far too narrow. Verdicts (and the planner's tie rule)
    use per-unit values through :mod:`wkvlab.stats` (docs/stats.md, "What is not decided")."""
    n = kld.size
    q = np.quantile(kld, [0.5, 0.9, 0.99, 0.999]) if n else [float("nan")] * 4
    return {
        "mean": float(kld.mean()) if n else float("nan"),
        "se": float(kld.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
        "median": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
        "p999": float(q[3]),
        "max": float(kld.max()) if n else float("nan"),
    }


def perplexity(nll: np.ndarray) -> float:
    return float(np.exp(nll.mean()))


DEFAULT_POSITION_EDGES = (0, 64, 256, 1024, 4096, 8192)


def position_buckets(ctx: int, edges: tuple[int, ...] = DEFAULT_POSITION_EDGES) -> list[tuple[int, int]]:
    """Buckets of query positions, clipped to the window (the last position predicts nothing).

    Past the last edge the buckets keep doubling (8k–16k, 16k–32k, 32k–64k, ...), the seed
    study's depth buckets.
    """
    last = ctx - 1
    edges = tuple(edges)
    while edges[-1] < last:
        edges += (edges[-1] * 2,)
    cuts = sorted({min(e, last) for e in edges} | {last})
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def by_position(kld: np.ndarray, agree: np.ndarray, positions: np.ndarray, buckets: list[tuple[int, int]]) -> list[dict]:
    rows = []
    for start, end in buckets:
        mask = (positions >= start) & (positions < end)
        count = int(mask.sum())
        if count == 0:
            continue
        rows.append({
            "start": start,
            "end": end,
            "tokens": count,
            "kld_mean": float(kld[mask].mean()),
            "top1_agreement": float(agree[mask].mean()),
        })
    return rows
