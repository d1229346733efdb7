"""Deterministic tokenization and windowing.

The whole text is tokenized once without special tokens, then cut into consecutive windows of
``ctx`` tokens (a BOS token first when the model expects one, as llama.cpp's perplexity tool does,
so each window holds ``ctx - 1`` text tokens). ``stride`` defaults to the window's text length,
i.e. no overlap.

Which positions are scored:

* ``all`` (default): every next-token prediction in the window — positions 0..ctx-2 predict tokens
  1..ctx-1. This is what a by-position analysis needs (short contexts included).
* ``second-half``: only predictions whose query sits in the second half of the window, llama.cpp's
  ``perplexity`` convention "so the model always has some context"; numbers then compare with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from wkvlab.errors import ConfigError, DataError

if TYPE_CHECKING:  # torch loads when text is tokenized, not when options are checked
    import torch

ScoreMode = Literal["all", "second-half"]
SCORE_MODES = ("all", "second-half")


@dataclass(frozen=True)
class WindowSet:
    """Token windows ready to run: ``tokens`` is ``[n_windows, ctx]`` (int64)."""

    tokens: torch.Tensor
    score_from: int  # first scored query position within each window
    bos: bool

    @property
    def n_windows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def ctx(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def scored_per_window(self) -> int:
        return self.ctx - 1 - self.score_from

    @property
    def n_scored(self) -> int:
        return self.n_windows * self.scored_per_window


def tokenizer_wants_bos(tokenizer) -> bool:
    """True when the tokenizer adds BOS by itself for plain text (Gemma does, SmolLM2 does not)."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = tokenizer("a").input_ids
    return bool(ids) and ids[0] == bos


def tokenize(tokenizer, text: str) -> torch.Tensor:
    import torch

    ids = tokenizer(text, add_special_tokens=False).input_ids
    return torch.tensor(ids, dtype=torch.long)


def check_window_options(ctx: int, score: str = "all") -> None:
    """The window options every command shares; also called by the CLI before any model loads."""
    if ctx < 2:
        raise ConfigError(f"context length {ctx} is too short; use --ctx 16 or more")
    if score not in SCORE_MODES:
        raise ConfigError(f"unknown scoring mode {score!r}; use one of {', '.join(SCORE_MODES)}")


def make_windows(
    ids: torch.Tensor,
    *,
    ctx: int,
    n_tokens: int,
    bos_id: int | None,
    stride: int | None = None,
    score: ScoreMode = "all",
) -> WindowSet:
    """Cut ``ids`` into ``n_tokens // ctx`` windows of ``ctx`` tokens (at least one)."""
    import torch

    check_window_options(ctx, score)
    body = ctx - 1 if bos_id is not None else ctx
    step = body if stride is None else stride
    if step < 1:
        raise ConfigError(f"stride {stride} must be at least 1")
    n_windows = max(1, n_tokens // ctx)
    needed = (n_windows - 1) * step + body
    if ids.numel() < body:
        raise DataError(f"the text has only {ids.numel()} tokens, fewer than one window of {ctx}; use a longer text or a smaller --ctx")
    if ids.numel() < needed:
        # Fewer windows than asked: honest, but say so through the count the result reports.
        n_windows = (ids.numel() - body) // step + 1
    rows = [ids[i * step : i * step + body] for i in range(n_windows)]
    tokens = torch.stack(rows)
    if bos_id is not None:
        tokens = torch.cat([torch.full((n_windows, 1), bos_id, dtype=torch.long), tokens], dim=1)
    # llama.cpp: first = n_ctx/2; logits first..n_ctx-2 predict tokens first+1..n_ctx-1.
    score_from = 0 if score == "all" else ctx // 2
    return WindowSet(tokens=tokens, score_from=score_from, bos=bos_id is not None)


def make_document_windows(
    documents: list[torch.Tensor],
    *,
    ctx: int,
    n_tokens: int,
    bos_id: int | None,
    score: ScoreMode = "all",
) -> WindowSet:
    """Like :func:`make_windows`, but no window crosses from one document into the next.

    Each document gives as many consecutive windows as it holds (its remainder is dropped), in
    document order, until ``n_tokens // ctx`` windows are cut: a position in a window is that deep
    into one real document.
    """
    import torch

    wanted = max(1, n_tokens // ctx)
    body = ctx - 1 if bos_id is not None else ctx
    parts, cut = [], 0
    for ids in documents:
        fits = min(ids.numel() // body, wanted - cut)
        if fits:
            parts.append(make_windows(ids, ctx=ctx, n_tokens=fits * ctx, bos_id=bos_id, score=score).tokens)
            cut += fits
    if not parts:
        longest = max((d.numel() for d in documents), default=0)
        raise DataError(f"no document holds one window of {ctx} tokens (the longest has {longest}); use a smaller --ctx")
    return WindowSet(tokens=torch.cat(parts), score_from=0 if score == "all" else ctx // 2, bos=bos_id is not None)
