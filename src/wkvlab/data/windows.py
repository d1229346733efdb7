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

A text of several documents (the embedded corpora, a ``.jsonl`` file) is cut by :func:`cut_windows`:
each document is tokenized on its own, no window crosses into the next document, and the windows
are **spread** across documents — the first window of every document that holds one, then the
second of each, and so on — so the windows cover as many documents as they can, and each window
records its document. Intervals then resample documents (:attr:`wkvlab.eval.TokenArrays.units`):
the default 8,192 tokens at ctx 512 are 16 windows of 16 pydoc topics, where the consecutive
windows of the stream touched 8 (several windows each). When the documents cannot hold the windows
asked for, the windows are cut from the stream as before and windows are the units (the output
says which).
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
    documents: tuple[int, ...] | None = None  # each window's document (cut_windows); None: one stream
    text_end: int | None = None  # characters of the corpus text the windows reach (None: n_windows * ctx tokens)

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
    """Like :func:`make_windows`, but no window crosses from one document into the next, and the
    windows are spread across documents.

    ``n_tokens // ctx`` windows are taken round robin: window 1 of every document that holds one
    (in document order), then window 2 of every document that holds two, and so on; a document's
    remainder is dropped. The windows come out in document order (a document's windows
    consecutive, as they sit in it), each with its document's index in ``documents``: a position in
    a window is that deep into one real document. Fewer windows than asked when the documents hold
    fewer. ``documents`` may be a lazy iterable: it is read only as far as the windows need.
    """
    import torch

    check_window_options(ctx, score)
    wanted = max(1, n_tokens // ctx)
    body = ctx - 1 if bos_id is not None else ctx
    read: list[torch.Tensor] = []
    source = iter(documents)
    # pass 1 needs only the first `wanted` documents that hold a window; later passes need them all
    holding = 0
    for ids in source:
        read.append(ids)
        holding += ids.numel() >= body
        if holding >= wanted:
            break
    if holding < wanted:
        read.extend(source)
    capacity = [ids.numel() // body for ids in read]
    taken = [0] * len(read)
    cut, depth = 0, 0
    while cut < wanted and any(c > depth for c in capacity):
        for d, c in enumerate(capacity):
            if c > depth and cut < wanted:
                taken[d] += 1
                cut += 1
        depth += 1
    if not cut:
        longest = max((d.numel() for d in read), default=0)
        raise DataError(f"no document holds one window of {ctx} tokens (the longest has {longest}); use a smaller --ctx")
    rows, owners = [], []
    for d, n in enumerate(taken):
        for k in range(n):
            rows.append(read[d][k * body : (k + 1) * body])
            owners.append(d)
    tokens = torch.stack(rows)
    if bos_id is not None:
        tokens = torch.cat([torch.full((len(rows), 1), bos_id, dtype=torch.long), tokens], dim=1)
    return WindowSet(tokens=tokens, score_from=0 if score == "all" else ctx // 2, bos=bos_id is not None,
                     documents=tuple(owners))


def cut_windows(corpus, tokenizer, *, ctx: int, n_tokens: int, bos_id: int | None, stride: int | None = None,
                score: ScoreMode = "all") -> WindowSet:
    """The windows every command scores for ``corpus`` (:class:`wkvlab.data.Corpus`).

    A corpus of documents without a ``stride``: :func:`make_document_windows` on the documents, each
    tokenized on its own, when they hold the windows asked for (``documents_only`` corpora always);
    otherwise :func:`make_windows` on the whole text tokenized once (one stream: ``documents`` None).
    """
    wanted = max(1, n_tokens // ctx)
    if corpus.documents and stride is None:
        check_window_options(ctx, score)
        try:
            spread = make_document_windows((tokenize(tokenizer, text) for text in corpus.documents), ctx=ctx, n_tokens=n_tokens,
                                           bos_id=bos_id, score=score)
        except DataError:
            if corpus.documents_only:
                raise
            spread = None
        if spread is not None and (spread.n_windows == wanted or corpus.documents_only):
            last = max(spread.documents)
            end = sum(len(text) for text in corpus.documents[: last + 1]) + 2 * last  # joined by blank lines
            return WindowSet(spread.tokens, spread.score_from, spread.bos, spread.documents, end)
    return make_windows(tokenize(tokenizer, corpus.text), ctx=ctx, n_tokens=n_tokens, bos_id=bos_id, stride=stride, score=score)


def unused_remainders(corpus, tokenizer, windows: WindowSet) -> torch.Tensor:
    """The tokens of the documents the spread windows touch that no window scores, in text order.

    Each touched document's windows are its first ``k`` window bodies (:func:`make_document_windows`),
    so its remainder is what follows them. Empty for stream windows (``documents`` None): there the
    evaluation uses a prefix of the text and the rest is the text after ``text_end``.
    """
    import torch

    if windows.documents is None or not corpus.documents:
        return torch.zeros(0, dtype=torch.long)
    body = windows.ctx - (1 if windows.bos else 0)
    counts: dict[int, int] = {}
    for d in windows.documents:
        counts[d] = counts.get(d, 0) + 1
    parts = [tokenize(tokenizer, corpus.documents[d])[counts.get(d, 0) * body:] for d in range(max(windows.documents) + 1)]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def window_layout(corpus, stride: int | None = None) -> str:
    """What identifies how :func:`cut_windows` cuts ``corpus`` beyond its text ("" for one stream)."""
    return "documents-spread-v1" if corpus.documents and stride is None else ""
