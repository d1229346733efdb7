"""One evaluated configuration: its numbers, what produced them, and JSON in and out."""
from __future__ import annotations

import platform
from dataclasses import dataclass, field
from importlib import metadata

import numpy as np

from wkvlab.eval.metrics import TokenMetrics, by_position, kld_summary, perplexity
from wkvlab.stats.bootstrap import Units, per_unit, unit_labels


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("wkvlab", "torch", "transformers", "gguf", "numpy"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def unit_means(kld: np.ndarray, top1: np.ndarray, units) -> dict:
    """Per-unit means of per-token ``kld`` and ``top1`` agreement over ``units`` (labels or :class:`Units`), with each
    unit's token count: what a later decision on the mean needs (``plan --results ... --tolerance``), without the
    per-token arrays. Units in sorted label order."""
    counts, sums = per_unit({"kld": kld, "top1": top1}, units)
    return {"unit": unit_labels(units)[1], "tokens": [int(c) for c in counts],
            "kld": [float(x) for x in sums["kld"] / counts], "top1": [float(x) for x in sums["top1"] / counts]}


@dataclass
class TokenArrays:
    """Per scored token, in window order: what paired statistics need later."""

    kld: np.ndarray
    nll_ref: np.ndarray
    nll: np.ndarray
    top1_agree: np.ndarray
    delta_p: np.ndarray
    position: np.ndarray  # query position within its window
    window: np.ndarray  # window index
    # the document each token's window was cut from, when the text is several documents (each window
    # inside one: wkvlab.data.windows.cut_windows); None for one stream (a plain text, a stride, a
    # result stored before documents were recorded), whose windows are then the resampling units
    document: np.ndarray | None = None

    @property
    def units(self) -> Units:
        """What intervals resample: documents where the text has them, windows otherwise."""
        if self.document is None:
            return Units(self.window, "windows")
        return Units(self.document, "documents")

    @property
    def n_documents(self) -> int | None:
        return None if self.document is None else int(np.unique(self.document).size)

    @classmethod
    def concat(cls, parts: list[TokenMetrics], positions: np.ndarray, documents=None) -> "TokenArrays":
        """Per-token arrays of windows in order; ``documents``: each window's document (or None: one stream)."""
        n_per = positions.size
        return cls(
            kld=np.concatenate([p.kld for p in parts]),
            nll_ref=np.concatenate([p.nll_ref for p in parts]),
            nll=np.concatenate([p.nll for p in parts]),
            top1_agree=np.concatenate([p.top1_agree for p in parts]),
            delta_p=np.concatenate([p.delta_p for p in parts]),
            position=np.tile(positions, len(parts)),
            window=np.repeat(np.arange(len(parts)), n_per),
            document=None if documents is None else np.repeat(np.asarray(documents, dtype=np.int64)[: len(parts)], n_per),
        )


@dataclass
class EvalResult:
    model: str
    data: str
    ctx: int
    weights: str
    kv: str
    weights_spec: dict
    kv_spec: dict
    weight_bytes: int
    kv_bytes_per_token: float
    seconds: float
    arrays: TokenArrays
    buckets: list[tuple[int, int]]
    fingerprints: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=library_versions)
    # how it ran: chunk size, device, dtype, and what the KLD is against (the reference in memory,
    # or a stored reference with its top-k bound error); empty for results stored before these existed
    run: dict = field(default_factory=dict)
    threads: int | None = None  # torch intra-op threads the candidate passes ran with (wkvlab.threads)
    model_shape: dict | None = None  # layers, kv_heads, head_dim: what kv_bytes_per_token was computed from
    # how sure the KV preset is (label, what differs, source) and what the KLD is against (baseline)
    fidelity: dict = field(default_factory=dict)
    # fraction of the decoder's linear and MoE expert weights the weight config quantized (None: not known)
    quantized_fraction: float | None = None

    @property
    def tokens(self) -> int:
        return int(self.arrays.kld.size)

    @property
    def ppl(self) -> float:
        return perplexity(self.arrays.nll)

    @property
    def ppl_ref(self) -> float:
        return perplexity(self.arrays.nll_ref)

    @property
    def kld(self) -> dict[str, float]:
        return kld_summary(self.arrays.kld)

    @property
    def top1_agreement(self) -> float:
        return float(self.arrays.top1_agree.mean())

    @property
    def delta_p(self) -> dict[str, float]:
        dp = self.arrays.delta_p
        return {"mean": float(dp.mean()), "rms": float(np.sqrt(np.mean(dp**2)))}

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "data": self.data,
            "ctx": self.ctx,
            "tokens": self.tokens,
            "weights": self.weights,
            "kv": self.kv,
            "weights_spec": self.weights_spec,
            "kv_spec": self.kv_spec,
            "ppl": self.ppl,
            "ppl_ref": self.ppl_ref,
            "kld": self.kld,
            "top1_agreement": self.top1_agreement,
            "delta_p": self.delta_p,
            "by_position": by_position(self.arrays.kld, self.arrays.top1_agree, self.arrays.position, self.buckets),
            # per document (per window for one stream): a reader of this JSON can decide a tolerance on it
            "units": unit_means(self.arrays.kld, self.arrays.top1_agree, self.arrays.units),
            "weight_bytes": self.weight_bytes,
            "quantized_fraction": self.quantized_fraction,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "seconds": self.seconds,
            "fingerprints": self.fingerprints,
            "notes": self.notes,
            "fidelity": self.fidelity,
            "versions": self.versions,
            "run": self.run,
            "threads": self.threads,
            "model_shape": self.model_shape,
        }
