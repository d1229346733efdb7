"""What a real engine returns for one token window, whatever engine it is.

An engine scores the same token window the reference scored and gives back, for the query
positions it could score, either

* the full next-token logits (llama.cpp in-process: every position, every token), or
* the log-probabilities of a few tokens per position (HTTP servers: their top-k plus the token
  that actually follows), as ``ids``/``logprobs`` padded to a common width with ``PAD_ID``.

Positions are query positions within the window: position ``i`` predicts token ``i + 1``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # annotations only: the CLI checks engine options before torch loads
    import torch

PAD_ID = -1  # padding of ragged per-position token lists


@dataclass
class WindowScores:
    """One window as the engine scored it."""

    positions: torch.Tensor  # [T] int64 query positions, increasing
    logits: torch.Tensor | None = None  # [T, V] float32, when the engine gives full distributions
    ids: torch.Tensor | None = None  # [T, k] int64 token ids with known log-probs (PAD_ID = none)
    logprobs: torch.Tensor | None = None  # [T, k] float64 log-probs of ``ids``
    topk: int = 0  # k the engine was asked for (its own top-k; the target may come on top)

    def __post_init__(self) -> None:
        if (self.logits is None) == (self.ids is None):
            raise ValueError("WindowScores holds either full logits or top-k ids/logprobs")

    @property
    def full(self) -> bool:
        return self.logits is not None

    def rows(self, index: torch.Tensor, shift: int = 0) -> "WindowScores":
        """The positions at ``index`` (rows of this window), with ``shift`` subtracted from them."""
        positions = self.positions[index] - shift
        if self.full:
            return WindowScores(positions=positions, logits=self.logits[index])
        return WindowScores(positions=positions, ids=self.ids[index], logprobs=self.logprobs[index], topk=self.topk)


@dataclass(frozen=True)
class EngineInfo:
    """What identifies the engine run: goes into the result's JSON."""

    engine: str  # "llamacpp" | "openai"
    version: str
    kv: str  # the cache types as the engine names them, e.g. "q8_0/q4_0"
    details: dict


class Engine(Protocol):
    """Anything that scores a token window (``[ctx]`` int64) from query position ``score_from`` on."""

    info: EngineInfo

    def score_window(self, tokens: torch.Tensor, score_from: int) -> WindowScores: ...
