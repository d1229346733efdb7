"""Beyond teacher forcing: does the candidate generate what the reference generates?

Teacher-forced KLD scores each token with the reference's own context; in generation an early
different token changes everything after it. Here the reference and the candidate (weights W,
KV cache C) greedily continue the same prompts through the quantize-on-write cache
(:func:`wkvlab.kv.cache.quantized_generate`, the reference with the identity spec, so both run the
same code path), and we count the tokens until the first divergence and the fraction of positions
where the two continuations hold the same token.

Both generate exactly ``new_tokens`` tokens (end-of-sequence is suppressed until then, for both
alike): otherwise a continuation that stops early would make the lengths, and the rates, differ.
Prompts are cut from the corpus at evenly spaced token offsets, all the same length, so they run
as one batch without padding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from wkvlab.data.windows import tokenize
from wkvlab.errors import DataError
from wkvlab.kv.cache import quantized_generate
from wkvlab.kv.calibrate import KVStats
from wkvlab.kv.spec import KVSpec

Progress = Callable[[str, int], None]


def corpus_prompts(tokenizer, text: str, n_prompts: int, prompt_tokens: int, bos_id: int | None = None) -> torch.Tensor:
    """``[n_prompts, prompt_tokens]`` token prompts at evenly spaced offsets of ``text`` (deterministic)."""
    ids = tokenize(tokenizer, text)
    body = prompt_tokens - (1 if bos_id is not None else 0)
    if n_prompts < 1 or body < 1:
        raise DataError(f"need at least one prompt of at least 2 tokens (got {n_prompts} × {prompt_tokens})")
    if ids.numel() < n_prompts * body:
        raise DataError(f"the text has {ids.numel()} tokens, fewer than {n_prompts} prompts of {body}; use fewer or shorter prompts")
    step = (ids.numel() - body) // max(n_prompts - 1, 1)
    rows = torch.stack([ids[i * step : i * step + body] for i in range(n_prompts)])
    if bos_id is not None:
        rows = torch.cat([torch.full((n_prompts, 1), bos_id, dtype=torch.long), rows], dim=1)
    return rows


def first_divergence(a: np.ndarray, b: np.ndarray) -> int:
    """Index of the first position where the two sequences differ (their length when none)."""
    differ = np.flatnonzero(a != b)
    return int(differ[0]) if differ.size else int(a.size)


@dataclass(frozen=True, eq=False)
class GenerationAgreement:
    """Greedy continuations of the reference and the candidate, compared prompt by prompt."""

    weights: str
    kv: str
    prompt_tokens: int
    new_tokens: int
    reference: np.ndarray  # [prompts, new_tokens] token ids
    candidate: np.ndarray

    @property
    def divergence(self) -> np.ndarray:
        """Tokens generated identically before the first difference, per prompt."""
        return np.array([first_divergence(r, c) for r, c in zip(self.reference, self.candidate)])

    @property
    def match_rate(self) -> np.ndarray:
        """Fraction of positions holding the same token, per prompt (after a divergence the two
        texts can realign, which this counts and the divergence index does not)."""
        return (self.reference == self.candidate).mean(1)

    def summary(self) -> dict:
        div = self.divergence
        return {
            "prompts": int(div.size),
            "mean_tokens_to_divergence": float(div.mean()),
            "median_tokens_to_divergence": float(np.median(div)),
            "identical_fraction": float((div == self.new_tokens).mean()),
            "match_rate": float(self.match_rate.mean()),
        }

    def to_dict(self) -> dict:
        return {
            "weights": self.weights,
            "kv": self.kv,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            **self.summary(),
            "per_prompt": [
                {"tokens_to_divergence": int(d), "match_rate": float(m)} for d, m in zip(self.divergence, self.match_rate)
            ],
        }

    def lines(self) -> list[str]:
        s = self.summary()
        return [
            f"greedy generation ({s['prompts']} prompts × {self.new_tokens} tokens): {s['identical_fraction']:.0%} identical to the reference; "
            f"first divergence after {s['median_tokens_to_divergence']:.0f} tokens (median), {s['mean_tokens_to_divergence']:.1f} (mean)",
            f"position-wise token match rate {s['match_rate']:.1%}",
        ]


def _greedy(model: torch.nn.Module, spec: KVSpec, prompts: torch.Tensor, new_tokens: int, stats: KVStats | None) -> np.ndarray:
    eos = getattr(model.generation_config, "eos_token_id", None) or getattr(model.config, "eos_token_id", None)
    pad = eos[0] if isinstance(eos, (list, tuple)) else eos
    out = quantized_generate(
        model, spec, prompts, stats,
        attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
        min_new_tokens=new_tokens if eos is not None else 0, pad_token_id=pad if pad is not None else 0,
    )
    return out[:, prompts.shape[1] :].cpu().numpy()


@torch.no_grad()
def generation_agreement(
    reference: torch.nn.Module,
    candidate: torch.nn.Module,
    kv: KVSpec,
    prompts: torch.Tensor,
    *,
    new_tokens: int = 64,
    weights_label: str = "none",
    stats: KVStats | None = None,
    reference_tokens: np.ndarray | None = None,
    progress: Progress | None = None,
) -> GenerationAgreement:
    """Greedy continuations of ``prompts`` ``[n, prompt_tokens]`` by both models, compared.

    ``reference_tokens``: the reference's continuations from an earlier call (they depend only on
    the prompts and ``new_tokens``), so several candidates share one reference run.
    """
    tick = progress or (lambda _d, _n: None)
    if reference_tokens is None:
        reference_tokens = _greedy(reference, KVSpec.parse("fp16"), prompts, new_tokens, None)
        tick("reference generation", 1)
    cand = _greedy(candidate, kv, prompts, new_tokens, stats)
    tick(f"generation {weights_label} × {kv.label}", 1)
    return GenerationAgreement(weights_label, kv.label, int(prompts.shape[1]), new_tokens, reference_tokens, cand)
