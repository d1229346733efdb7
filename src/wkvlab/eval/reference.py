"""The reference's next-token distributions, kept on disk so candidates need not share memory with it.

A model that does not fit in memory twice cannot hold the reference and a quantized copy at once,
and the full-vocabulary reference of a long run is too big to keep (8k tokens × 262k vocabulary
is 8.6 GB in float32). A :class:`StoredReference` keeps per scored token what every metric needs:

* ``nll`` (float32), ``argmax`` and ``lse`` (log-sum-exp of the logits): NLL, PPL, top-1
  agreement and Δp against it are exact;
* the reference's top-k token ids and their log-probabilities. KLD splits into the top-k head,
  ``Σ_top-k p (log p − log q)``, exact from these, and the tail ``P_t · E_{v ~ p_tail}[log p_v − log q_v]``
  over the other tokens (``P_t`` their reference mass);
* ``samples`` tail tokens per position drawn from the reference's own tail distribution, with
  their reference log-probabilities: the tail's mean over them is an unbiased estimate of the
  tail term, so KLD = head + estimated tail is unbiased. Its error is sampling alone (stored in
  float32, the top-k head plus the exact tail reproduces the in-memory KLD to 1e-17), with a
  standard error that falls with the tail's mass and the samples: on the default model (q4_0,
  ctx 512, 1,022 tokens) 1.5e-4 at k = 256 with 64 samples, 3.0e-5 at the defaults k = 1,024
  with 256 (:mod:`wkvlab.eval.constants`). The top-k lower bound (both sides' tails merged into
  one bucket, :mod:`wkvlab.eval.topk`) is kept beside it: there it is 1.6e-3 nats low at k = 1,024
  and needs k ≈ 16,384 — a third of the vocabulary — to come within 1e-4 (docs/scale.md);
* for a sample of positions (every ``full_every``-th scored token) the full log-probabilities,
  so each run measures its own error: exact KLD minus the estimate (and minus the bound) there.

Per token that is ``8 (k + samples) + 12`` bytes (10,252 B at k = 1,024, 256 samples), against
llama.cpp's ``--kl-divergence-base`` file, which keeps the full vocabulary in 16 bits (2 × vocab
bytes: 98 kB per token for SmolLM2, 524 kB for Gemma 3). The file is a safetensors archive with a
JSON header naming the model, text and window fingerprints, so it is refused with anything else.
"""
from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from wkvlab.errors import ConfigError
from wkvlab.eval.constants import DEFAULT_SAMPLES, DEFAULT_TOPK
from wkvlab.eval.metrics import TokenMetrics, host_metrics
from wkvlab.eval.topk import coarsened_kld

FORMAT = "wkvlab-reference-v1"
DEFAULT_FULL_EVERY = 256
_TENSORS = ("nll", "argmax", "lse", "topk_ids", "topk_logprobs", "tail_ids", "tail_logprobs", "full_rows", "full_logprobs")


def windows_fingerprint(tokens: torch.Tensor, score_from: int) -> str:
    """SHA-256 of the window tokens and the first scored position: what the reference was run on."""
    digest = hashlib.sha256(np.ascontiguousarray(tokens.cpu().numpy().astype("<i8")).tobytes())
    digest.update(f"|score_from={score_from}".encode())
    return digest.hexdigest()


@dataclass
class ReferenceChunk:
    """The stored reference of consecutive scored tokens, as the comparison needs them (on a device)."""

    nll: torch.Tensor
    argmax: torch.Tensor
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    tail_ids: torch.Tensor
    tail_logprobs: torch.Tensor
    full_rows: torch.Tensor  # [M] rows within the chunk whose full log-probabilities are kept
    full: torch.Tensor  # [M, vocab] those full log-probabilities
    full_rows_host: tuple[int, ...] = ()  # ``full_rows`` as the host knows them (ascending)

    def rows(self, start: int, end: int) -> "ReferenceChunk":
        """Rows ``start..end-1`` of this chunk (a view). The full rows inside are found among the
        host's copy of their indices and sliced: a boolean mask of the device's would make the host
        wait for the device (its result's length depends on the data) on every chunk."""
        a, b = bisect.bisect_left(self.full_rows_host, start), bisect.bisect_left(self.full_rows_host, end)
        return ReferenceChunk(self.nll[start:end], self.argmax[start:end], self.topk_ids[start:end], self.topk_logprobs[start:end],
                              self.tail_ids[start:end], self.tail_logprobs[start:end], self.full_rows[a:b] - start, self.full[a:b],
                              tuple(r - start for r in self.full_rows_host[a:b]))

    def to(self, device: torch.device) -> "ReferenceChunk":
        tensors = (getattr(self, f).to(device) for f in _CHUNK_TENSORS)
        return ReferenceChunk(*tensors, full_rows_host=self.full_rows_host)


_CHUNK_TENSORS = ("nll", "argmax", "topk_ids", "topk_logprobs", "tail_ids", "tail_logprobs", "full_rows", "full")


@dataclass
class StoredReference:
    """Per scored token, in window order (window-major), everything :func:`compare_stored` needs."""

    meta: dict
    nll: torch.Tensor  # [N] float32
    argmax: torch.Tensor  # [N] int32
    lse: torch.Tensor  # [N] float32
    topk_ids: torch.Tensor  # [N, k] int32
    topk_logprobs: torch.Tensor  # [N, k] float32
    tail_ids: torch.Tensor  # [N, samples] int32, drawn from the reference's tail distribution
    tail_logprobs: torch.Tensor  # [N, samples] float32
    full_rows: torch.Tensor  # [M] int64, indices into N
    full_logprobs: torch.Tensor  # [M, vocab] float32
    _full_index: dict[int, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._full_index = {int(r): i for i, r in enumerate(self.full_rows.tolist())}

    @property
    def k(self) -> int:
        return int(self.topk_ids.shape[1])

    @property
    def tokens(self) -> int:
        return int(self.nll.shape[0])

    def bytes_per_token(self) -> float:
        total = sum(getattr(self, n).numel() * getattr(self, n).element_size() for n in _TENSORS)
        return total / max(self.tokens, 1)

    def chunk(self, start: int, end: int, device: torch.device | str = "cpu") -> ReferenceChunk:
        """Scored tokens ``start..end-1`` (indices into the whole run) for comparison on ``device``:
        one copy per call, so a pass takes a window at a time and slices it per chunk (:meth:`ReferenceChunk.rows`)."""
        full = [(i - start, self._full_index[i]) for i in range(start, end) if i in self._full_index]
        rows = torch.tensor([r for r, _ in full], dtype=torch.long)
        picked = self.full_logprobs[torch.tensor([j for _, j in full], dtype=torch.long)]
        return ReferenceChunk(self.nll[start:end].to(device), self.argmax[start:end].to(device).long(),
                              self.topk_ids[start:end].to(device).long(), self.topk_logprobs[start:end].to(device),
                              self.tail_ids[start:end].to(device).long(), self.tail_logprobs[start:end].to(device),
                              rows.to(device), picked.to(device), tuple(r for r, _ in full))

    def check_matches(self, expected: dict) -> None:
        """Refuse a reference made for another model, text or windows, or in another dtype or on
        another kind of device (its logits would differ from this run's own: one line naming what)."""
        for key in ("dtype", "device"):
            # files from before the device was recorded were all made on the CPU
            made = self.meta.get(key, "cpu" if key == "device" else None)
            if key in expected and made != expected[key]:
                flag = "--dtype" if key == "dtype" else "--device"
                raise ConfigError(f"the stored reference was made with {key} {made} and this run uses {expected[key]}; "
                                  f"run with {flag} {made}, or give --reference a new file to record one for this run")
        for key in ("model_sha256", "data_sha256", "windows_sha256", "ctx", "baseline"):
            if key in expected and self.meta.get(key, expected[key] if key == "baseline" else None) != expected[key]:
                raise ConfigError(f"the stored reference was made for another {key.replace('_sha256', '')} "
                                  f"({self.meta.get(key)!s:.16} vs {expected[key]!s:.16}); make a new one with wkvlab reference save, or drop --reference")

    # ---- file ---------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        from safetensors.torch import save_file

        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"--reference {path} is a folder; give a file name such as {path / 'reference.safetensors'}")
        tensors = {n: getattr(self, n).contiguous().cpu() for n in _TENSORS}
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, str(tmp), metadata={"wkvlab": json.dumps(self.meta)})
        tmp.replace(path)  # atomic: a half-written reference is never read back

    @classmethod
    def load(cls, path: Path) -> "StoredReference":
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"stored reference not found: {path}; make one with wkvlab reference save (or pass a new path to --reference to create it)")
        try:
            with safe_open(str(path), "pt") as handle:
                meta = json.loads((handle.metadata() or {}).get("wkvlab", "{}"))
                tensors = {n: handle.get_tensor(n) for n in _TENSORS if n in handle.keys()}
        except Exception as exc:  # safetensors raises its own error types for a file that is not one
            raise ConfigError(f"{path} is not a wkvlab stored reference ({type(exc).__name__}); make one with wkvlab reference save") from None
        if meta.get("format") != FORMAT or set(tensors) != set(_TENSORS):
            raise ConfigError(f"{path} is not a {FORMAT} file; make one with wkvlab reference save")
        return cls(meta=meta, **tensors)


class ReferenceRecorder:
    """Collects a reference chunk by chunk while the reference pass runs.

    Tail samples come from a generator seeded per (window, chunk start), so a file is reproducible
    for the same windows and chunk size.
    """

    def __init__(self, k: int = DEFAULT_TOPK, samples: int = DEFAULT_SAMPLES, full_every: int = DEFAULT_FULL_EVERY) -> None:
        if k < 1:
            raise ConfigError(f"--topk {k} must be at least 1")
        if samples < 1 or full_every < 1:
            raise ConfigError(f"tail samples ({samples}) and full_every ({full_every}) must be at least 1")
        self.k, self.samples, self.full_every = k, samples, full_every
        self.parts: dict[str, list[torch.Tensor]] = {n: [] for n in _TENSORS}  # on the host, a window per entry
        self._window: dict[str, list[torch.Tensor]] = {n: [] for n in _TENSORS}  # this window's chunks, where the logits are
        self.count = 0

    def add(self, logits: torch.Tensor, targets: torch.Tensor, seed: int = 0) -> None:
        logits = logits.float()
        lse = torch.logsumexp(logits, dim=-1)
        # log_softmax, as the in-memory comparison computes it: NLLs are then bit-identical, and a
        # candidate equal to the reference gets exactly 0
        logprobs = torch.log_softmax(logits, dim=-1)
        top = logprobs.topk(min(self.k, logprobs.shape[-1]), dim=-1)
        # the tail distribution, built in place: the chunk holds three [T, V] tensors at most
        tail = logprobs.exp().scatter_(-1, top.indices, 0.0)
        # a row whose tail has no mass left (k covers every token it gives weight to) samples any
        # token: the tail term is weighted by the tail mass, 0 there
        tail.masked_fill_(tail.sum(-1, keepdim=True) <= 0, 1.0)
        generator = torch.Generator(device=logits.device).manual_seed(seed)
        tail_ids = torch.multinomial(tail, self.samples, replacement=True, generator=generator)
        del tail
        # every full_every-th token of the run: a stride the host knows, so a slice of the device's rows
        first = min(-self.count % self.full_every, logits.shape[0])
        part = self._window
        part["nll"].append(-logprobs.gather(-1, targets[:, None].to(logprobs.device))[:, 0])
        part["argmax"].append(logits.argmax(-1).int())
        part["lse"].append(lse)
        part["topk_ids"].append(top.indices.int())
        part["topk_logprobs"].append(top.values)
        part["tail_ids"].append(tail_ids.int())
        part["tail_logprobs"].append(logprobs.gather(-1, tail_ids))
        part["full_rows"].append(torch.arange(self.count + first, self.count + logits.shape[0], self.full_every))
        part["full_logprobs"].append(logprobs[first :: self.full_every].clone())  # not a view pinning the chunk's [T, V]
        self.count += logits.shape[0]

    def end_window(self) -> None:
        """Read this window's chunks back to the host: one copy per kind of record per window, not
        one per chunk (each is a synchronization on a GPU)."""
        for name, chunks in self._window.items():
            if chunks:
                self.parts[name].append(torch.cat(chunks).cpu())
            chunks.clear()

    def finish(self, meta: dict) -> StoredReference:
        self.end_window()
        tensors = {n: torch.cat(parts) for n, parts in self.parts.items()}
        meta = dict(meta, format=FORMAT, k=self.k, samples=self.samples, full_every=self.full_every, tokens=self.count)
        return StoredReference(meta=meta, **tensors)


STORED_METRIC_NAMES = ("bound", "tail_variance", "exact", "estimate_at_exact", "bound_at_exact")


@dataclass
class StoredComparison:
    """A candidate against the stored reference, for consecutive chunks (read back to the host once)."""

    metrics: TokenMetrics  # KLD = top-k head + sampled tail (unbiased); NLL, top-1, Δp exact
    bound: np.ndarray  # the top-k lower bound per token (never above the true KLD)
    tail_variance: np.ndarray  # per token, the sampling variance of its tail estimate (from its own samples)
    exact: np.ndarray  # exact KLD on the rows whose full reference is stored
    estimate_at_exact: np.ndarray  # the estimate on those rows
    bound_at_exact: np.ndarray

    @classmethod
    def from_parts(cls, parts: list[dict[str, torch.Tensor]]) -> "StoredComparison":
        """:func:`stored_chunk_metrics` of consecutive chunks, joined on the device and read back once."""
        def host(name: str) -> np.ndarray:
            return torch.cat([p[name] for p in parts]).double().cpu().numpy()

        return cls(host_metrics(parts), *(host(name) for name in STORED_METRIC_NAMES))


def stored_chunk_metrics(ref: ReferenceChunk, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token metrics of a candidate chunk against the stored reference (see the module docstring),
    as tensors on the logits' device (the reference chunk is moved there if it is elsewhere)."""
    device = logits.device
    if ref.nll.device != device:  # a model spread over GPUs: its logits come from lm_head's device
        ref = ref.to(device)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    cand_top = logprobs.gather(-1, ref.topk_ids).double()
    ref_top = ref.topk_logprobs.double()
    bound = coarsened_kld(ref.topk_logprobs, logprobs.gather(-1, ref.topk_ids))
    head = (ref_top.exp() * (ref_top - cand_top)).sum(-1)
    tail_mass = (1 - ref_top.exp().sum(-1)).clamp_min(0)
    gaps = ref.tail_logprobs.double() - logprobs.gather(-1, ref.tail_ids).double()  # log p − log q at the sampled tokens
    tail = tail_mass * gaps.mean(-1)
    samples = gaps.shape[-1]
    tail_variance = tail_mass.square() * (gaps.var(-1, correction=1) if samples > 1 else torch.zeros_like(tail)) / samples
    estimate = head + tail
    nll = -logprobs.gather(-1, targets[:, None].to(device))[:, 0]
    delta_p = torch.exp(-nll) - torch.exp(-ref.nll)
    full = ref.full.double()
    exact = (full.exp() * (full - logprobs[ref.full_rows].double())).sum(-1)
    return {"kld": estimate, "nll_ref": ref.nll, "nll": nll, "top1_agree": logits.argmax(-1) == ref.argmax, "delta_p": delta_p,
            "bound": bound, "tail_variance": tail_variance, "exact": exact, "estimate_at_exact": estimate[ref.full_rows],
            "bound_at_exact": bound[ref.full_rows]}


def compare_stored(ref: ReferenceChunk, logits: torch.Tensor, targets: torch.Tensor) -> StoredComparison:
    """Per-token metrics of a candidate chunk against the stored reference (see the module docstring)."""
    return StoredComparison.from_parts([stored_chunk_metrics(ref, logits, targets)])
