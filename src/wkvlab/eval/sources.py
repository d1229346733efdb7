"""What a candidate chunk is compared with: the reference's pass itself, or its per-token record.

The grid runner (:mod:`wkvlab.eval.runner`) runs one loop for both: per window, per chunk, it asks
the source for the reference's chunk, then compares every candidate's logits with it.

* :class:`LiveReference` (the ``copies`` plan): the reference model's own pass runs its chunk
  first; its float32 log-probabilities are compared with each candidate's over the full
  vocabulary (exact KLD) and dropped — the ``[tokens, vocab]`` reference is never stored.
* :class:`RecordedReference` (the ``one-model`` plan): the reference ran once before any weight
  config was built, and what it left per token (:class:`~wkvlab.eval.reference.StoredReference`,
  in a file or in memory) is read window by window — one host-to-device copy per window, sliced
  per chunk on the device.

Both keep per-chunk metrics on the device and read them back once per window.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from wkvlab.data.windows import WindowSet
from wkvlab.errors import ConfigError
from wkvlab.eval.baseline import FLOAT_BASELINE, Baseline, float_baseline
from wkvlab.eval.chunks import WindowPass, chunk_bounds, scored_rows, window_tokens
from wkvlab.eval.metrics import ReferenceTokens, TokenMetrics, chunk_metrics, host_metrics
from wkvlab.eval.reference import DEFAULT_TOPK, ReferenceChunk, ReferenceRecorder, StoredComparison, StoredReference, stored_chunk_metrics, windows_fingerprint


def placement(model: torch.nn.Module) -> dict[str, str]:
    """The dtype of the model's weights and the kind of device its logits come from: what a stored
    reference must have been made with to be compared with this model's runs."""
    head = model.get_output_embeddings()
    param = head.weight if head is not None else next(model.parameters())
    return {"dtype": str(param.dtype).replace("torch.", ""), "device": param.device.type}


class LiveReference:
    """The reference model's pass, stepped chunk by chunk beside the candidates (exact KLD)."""

    kind = "memory"

    def __init__(self, model: torch.nn.Module, baseline: Baseline = FLOAT_BASELINE) -> None:
        self.pass_ = WindowPass(model, baseline=baseline)
        self.forward_calls = 0

    def start_window(self, window: int) -> None:
        self.pass_.reset()

    def chunk(self, tokens: torch.Tensor, start: int, end: int, rows: slice, targets: torch.Tensor, first: int) -> ReferenceTokens:
        self.forward_calls += 1
        return ReferenceTokens.from_logits(self.pass_.step(tokens[start:end], rows), targets)

    @staticmethod
    def compare(ref: ReferenceTokens, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return chunk_metrics(ref, logits)

    @staticmethod
    def to_host(parts: list[dict[str, torch.Tensor]]) -> TokenMetrics:
        return host_metrics(parts)

    def info(self, comparisons: list) -> dict:
        return {"kind": "memory"}


class RecordedReference:
    """The reference's per-token record, read a window at a time (KLD: top-k head + sampled tail)."""

    kind = "stored"

    def __init__(self, stored: StoredReference, windows: WindowSet, path: Path | None, created: bool) -> None:
        self.stored, self.windows, self.path, self.created = stored, windows, path, created
        self.forward_calls = 0
        self._window: ReferenceChunk | None = None
        self._first = 0

    def start_window(self, window: int) -> None:
        self._window = None  # taken on the first chunk, where the logits' device is known
        self._first = window * self.windows.scored_per_window

    def chunk(self, tokens: torch.Tensor, start: int, end: int, rows: slice, targets: torch.Tensor, first: int) -> tuple:
        return first - self._first, rows.stop - rows.start

    def compare(self, ref: tuple, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        if self._window is None or self._window.nll.device != logits.device:
            # the whole window's record, where the logits are (lm_head's device on a model spread over GPUs)
            self._window = self.stored.chunk(self._first, self._first + self.windows.scored_per_window, logits.device)
        offset, count = ref
        return stored_chunk_metrics(self._window.rows(offset, offset + count), logits, targets)

    @staticmethod
    def to_host(parts: list[dict[str, torch.Tensor]]) -> StoredComparison:
        return StoredComparison.from_parts(parts)

    def info(self, comparisons: list[StoredComparison]) -> dict:
        """What a stored-reference KLD is, and its error measured where the record keeps the full reference."""
        stored = self.stored
        exact = np.concatenate([c.exact for c in comparisons])
        estimate = np.concatenate([c.estimate_at_exact for c in comparisons])
        bound_at = np.concatenate([c.bound_at_exact for c in comparisons])
        err = exact - estimate
        tail = 1.0 - stored.topk_logprobs.double().exp().sum(-1)
        n = int(err.size)
        variance = np.concatenate([c.tail_variance for c in comparisons])
        return {
            "kind": "stored", "path": str(self.path) if self.path is not None else None, "k": stored.k,
            "samples": stored.meta.get("samples"), "created": self.created,
            "reference_tail_mass_mean": float(tail.mean()),
            # standard error of the mean KLD from tail sampling alone, estimated from the samples themselves
            "sampling_se": float(np.sqrt(variance.sum()) / variance.size) if variance.size else float("nan"),
            # the top-k lower bound over all tokens (never above the true KLD), for comparison with the estimate
            "kld_lower_bound_mean": float(np.concatenate([c.bound for c in comparisons]).mean()),
            # exact KLD minus the estimate (and minus the bound) on the tokens whose full reference the file keeps
            "error": {"tokens": n, "mean": float(err.mean()) if n else float("nan"),
                      "se": float(err.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan"),
                      "bound_gap_mean": float((exact - bound_at).mean()) if n else float("nan")},
        }


def record_reference(model: torch.nn.Module, windows: WindowSet, *, chunk: int, k: int = DEFAULT_TOPK, meta: dict | None = None,
                     progress=None, baseline: Baseline | None = None) -> StoredReference:
    """Run the reference over every window chunk by chunk and keep what the comparison needs, per token
    (``baseline``: the float reference in the model's dtype unless given)."""
    baseline = baseline or float_baseline(model)
    tick = progress or (lambda _desc, _n: None)
    recorder = ReferenceRecorder(k)
    reference = WindowPass(model, baseline=baseline)
    lo, hi = windows.score_from, windows.ctx - 1
    for w in range(windows.n_windows):
        tokens, labels = window_tokens(model, windows.tokens[w])  # once per window, not per chunk
        reference.reset()
        for start, end in chunk_bounds(windows.ctx, chunk):
            rows = scored_rows(start, end, lo, hi)
            logits = reference.step(tokens[start:end], rows)
            recorder.add(logits, labels[start + rows.start + 1 : start + rows.stop + 1], seed=w * windows.ctx + start)
            tick("reference", 1)
        recorder.end_window()
    info = dict(meta or {}, baseline=baseline.label, windows_sha256=windows_fingerprint(windows.tokens, windows.score_from), ctx=windows.ctx,
                n_windows=windows.n_windows, score_from=windows.score_from, **placement(model))
    return recorder.finish(info)


def recorded_reference(model: torch.nn.Module, windows: WindowSet, *, chunk: int, k: int, path: Path | None, fingerprints: dict,
                       model_name: str, data_name: str, baseline: Baseline, progress=None) -> RecordedReference:
    """The per-token reference: read back from ``path`` and checked, or recorded now (and written
    there when a path is given; kept in memory otherwise)."""
    expected = {**{key: fingerprints[key] for key in ("model_sha256", "data_sha256") if key in fingerprints},
                "windows_sha256": windows_fingerprint(windows.tokens, windows.score_from), "ctx": windows.ctx,
                "baseline": baseline.label, **placement(model)}
    if path is not None and path.exists():
        stored = StoredReference.load(path)
        stored.check_matches(expected)
        return RecordedReference(stored, windows, path, created=False)
    if path is not None and not path.parent.exists():
        raise ConfigError(f"folder {path.parent} does not exist; create it or choose another --reference path")
    stored = record_reference(model, windows, chunk=chunk, k=k, progress=progress, baseline=baseline,
                              meta={**fingerprints, "model": model_name, "data": data_name})
    if path is not None:
        stored.save(path)
    source = RecordedReference(stored, windows, path, created=True)
    source.forward_calls = windows.n_windows * len(chunk_bounds(windows.ctx, chunk))
    return source
