"""Where the weight error and the KV error meet: the attention-score error, term by term.

With the candidate's query ``Q + ε_q`` (weight error propagated through every earlier layer, plus
query quantization where the KV spec has it) and the key the candidate's attention really reads
``K + ε_k`` (the dequantized cache: weight error and KV quantization together), the score error is

    (Q + ε_q)(K + ε_k)ᵀ − QKᵀ = Q·ε_kᵀ + ε_q·Kᵀ + ε_q·ε_kᵀ

exactly, each scaled like the scores themselves (1/√d, or the model's own ``scaling``, e.g. Gemma's
``query_pre_attn_scalar``). Per layer and query head (GQA: each key head repeated for its query
group) we accumulate the sum of squares of every term over the causal (query, key) pairs the layer
really attends to (the model's own mask, so sliding windows count only their window), split into
keys 0..3 (attention sinks) and the rest, and the KL between the reference's and the candidate's
attention rows (softcapping applied where the model has it). Statistics are accumulated per window,
never the [heads, T, T] scores themselves, so memory stays at one layer's scores.

Through the hook machinery wkvlab already has: the reference pass records each layer's post-RoPE
Q and K from the attention dispatch (:func:`attention_override`, :func:`wkvlab.explain.cells.record_pass`);
the candidate pass runs under :func:`kv_quantization` and, one level inside it, recomputes what the
layer's :class:`LayerStore` hands to attention (deterministic, so identical to what the hook uses).
When the spec smooths or rotates Q/K, the reference's Q and K are carried into the same space
(score-preserving transforms) so ε_q and ε_k are differences of like with like.

**The cross term split, and the attention-level 2×2 (issue #24).** ε_k contains the key error the
weights cause (and every earlier layer's error) as well as the cache's own, so the cross term
ε_q·ε_kᵀ is not the cache's interaction with the weights. Two more whole passes of the window
(:mod:`wkvlab.explain.cells`) give the missing cells: W, the weight-quantized model with a 16-bit
cache, and C, the reference model with the quantized cache. With ``K_W`` the key of the (W, fp16)
pass at this layer, ε_k splits into its weight part and its cache part

    ε_k,w = K_W − K,   ε_k,c = K_stored − K_W,   ε_q·ε_kᵀ = ε_q·ε_k,wᵀ + ε_q·ε_k,cᵀ

(``cross_weight`` and ``cross_cache``), and the cells' scores S_R, S_W, S_C, S_WC (each its own pass's
Q against the keys its attention read) give ``total_w`` = S_W − S_R, ``total_c`` = S_C − S_R and the
attention-level 2×2 interaction ``interaction`` = S_WC − S_W − S_C + S_R; the attention-row KL of the
W and C cells against R is accumulated too, so the same 2×2 can be read on attention KL.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from wkvlab.runtime import input_device
from wkvlab.formats.hadamard import rotate
from wkvlab.kv.calibrate import KVStats
from wkvlab.kv.hook import kv_quantization, layer_stores
from wkvlab.kv.override import attention_inputs, attention_override
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore

TERMS = ("kv", "weight", "cross", "total", "cross_weight", "cross_cache", "total_w", "total_c", "interaction")
TERM_LABELS = {"kv": "Q·ε_kᵀ", "weight": "ε_q·Kᵀ", "cross": "ε_q·ε_kᵀ", "total": "score error",
               "cross_weight": "ε_q·ε_k,wᵀ", "cross_cache": "ε_q·ε_k,cᵀ", "total_w": "score error of (W, fp16)",
               "total_c": "score error of (none, C)", "interaction": "S_WC − S_W − S_C + S_R"}
SINK_TOKENS = 4
Progress = Callable[[str, int], None]


def score_error_terms(q_ref: torch.Tensor, k_ref: torch.Tensor, q_cand: torch.Tensor, k_cand: torch.Tensor,
                      scaling: float) -> dict[str, torch.Tensor]:
    """The three terms of the score error and the total, ``[..., queries, keys]`` each.

    Inputs ``[..., tokens, head_dim]`` with the same number of heads (GQA already expanded).
    """
    eps_q, eps_k = q_cand - q_ref, k_cand - k_ref
    t = lambda x: x.transpose(-1, -2)  # noqa: E731
    return {
        "kv": (q_ref @ t(eps_k)) * scaling,
        "weight": (eps_q @ t(k_ref)) * scaling,
        "cross": (eps_q @ t(eps_k)) * scaling,
        "total": (q_cand @ t(k_cand) - q_ref @ t(k_ref)) * scaling,
    }


def cell_terms(q_ref: torch.Tensor, k_ref: torch.Tensor, q_cand: torch.Tensor, k_cand: torch.Tensor, q_w: torch.Tensor,
               k_w: torch.Tensor, q_c: torch.Tensor, k_c: torch.Tensor, scaling: float) -> dict[str, torch.Tensor]:
    """Every term of :data:`TERMS`: the three-term split, the cross term's weight and cache parts and the
    layer-local 2×2 cells (W: ``q_w``, ``k_w``, the candidate before the cache; C: ``q_c``, ``k_c``, the
    reference through the cache). Inputs as :func:`score_error_terms`."""
    terms = score_error_terms(q_ref, k_ref, q_cand, k_cand, scaling)
    eps_q = q_cand - q_ref
    t = lambda x: x.transpose(-1, -2)  # noqa: E731
    s_ref = q_ref @ t(k_ref)
    terms["cross_weight"] = (eps_q @ t(k_w - k_ref)) * scaling
    terms["cross_cache"] = (eps_q @ t(k_cand - k_w)) * scaling
    terms["total_w"] = (q_w @ t(k_w) - s_ref) * scaling
    terms["total_c"] = (q_c @ t(k_c) - s_ref) * scaling
    terms["interaction"] = terms["total"] - terms["total_w"] - terms["total_c"]
    return terms


def allowed_pairs(attention_mask: torch.Tensor | None, n_queries: int, n_keys: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool ``[queries, keys]``: the pairs the layer attends to (the model's mask, else causal, on ``device``)."""
    if attention_mask is None:
        return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).tril(n_keys - n_queries)
    mask = attention_mask[0, 0, -n_queries:, :n_keys]
    return mask if mask.dtype == torch.bool else mask == 0


def attention_kl(scores_ref: torch.Tensor, scores_cand: torch.Tensor, allowed: torch.Tensor,
                 softcap: float | None = None) -> torch.Tensor:
    """KL(reference row ‖ candidate row) per ``[..., query]``, over the allowed keys."""
    def logp(scores):
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        return torch.log_softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)

    lp_ref, lp_cand = logp(scores_ref), logp(scores_cand)
    diff = (lp_ref - lp_cand).masked_fill(~allowed, 0.0)
    return (lp_ref.exp() * diff).sum(-1)


def _expand(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    return x.repeat_interleave(n_heads // x.shape[1], dim=1)


def _reference_space(store: LayerStore, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
    """The reference's Q/K carried into the candidate store's space: smoothing (Q·λ, K/λ) and
    Hadamard rotation leave QKᵀ unchanged, and no quantization is applied."""
    key, _ = store.key_value_side(key, value)
    if store.smooth is not None:
        query = query * _expand(store.smooth.to(query.dtype), query.shape[1])
    if store.rot_k:
        query = rotate(query, store.rot_k)
    return query, key


@dataclass(frozen=True, eq=False)
class AttentionDecomposition:
    """Accumulated score-error statistics of one (weights, KV) candidate against the reference.

    ``sumsq[term]``: ``[layers, heads, 2]`` sums of squares over (query, key) pairs whose key is a
    sink (index 0) or not (index 1); ``pairs``: ``[layers, 2]`` how many pairs each head summed;
    ``kl_sum`` / ``kl_rows``: attention-row KL summed per ``[layers, heads]`` and the row count.
    """

    weights: str
    kv: str
    ctx: int
    n_windows: int
    sink_tokens: int
    sumsq: dict[str, np.ndarray]
    pairs: np.ndarray
    kl_sum: np.ndarray
    kl_rows: np.ndarray
    ref_sumsq: np.ndarray  # [layers, heads]: sums of squares of the reference's scores, for scale
    kl_cell_sum: dict[str, np.ndarray] = field(default_factory=dict)  # "w", "c": those cells' attention-row KL, summed like kl_sum

    @property
    def layers(self) -> int:
        return int(self.pairs.shape[0])

    @property
    def heads(self) -> int:
        return int(self.kl_sum.shape[1])

    def rms(self, term: str, keys: str = "all") -> np.ndarray:
        """``[layers, heads]`` root mean square of a term over keys ``all``, ``sinks`` or ``rest``."""
        ss, n = self.sumsq[term], self.pairs[:, None, :]
        sel = {"sinks": slice(0, 1), "rest": slice(1, 2), "all": slice(0, 2)}[keys]
        count = n[..., sel].sum(-1)
        return np.sqrt(np.divide(ss[..., sel].sum(-1), count, out=np.zeros(ss.shape[:2]), where=count > 0))

    def kl(self) -> np.ndarray:
        """``[layers, heads]`` mean KL between reference and candidate attention rows (nats)."""
        return np.divide(self.kl_sum, self.kl_rows, out=np.zeros_like(self.kl_sum), where=self.kl_rows > 0)

    def kl_of(self, cell: str) -> float:
        """Mean attention-row KL against the reference of cell ``wc`` (the candidate), ``w`` or ``c`` (nats)."""
        total = self.kl_sum if cell == "wc" else self.kl_cell_sum.get(cell)
        rows = float(self.kl_rows.sum())
        return float(total.sum()) / rows if total is not None and rows > 0 else float("nan")

    def kl_interaction(self) -> float:
        """The attention-level 2×2 on attention KL: KL(WC) − KL(W) − KL(C) (the reference cell's is 0)."""
        return self.kl_of("wc") - self.kl_of("w") - self.kl_of("c")

    def _energy(self, term: str) -> np.ndarray:
        return self.sumsq[term].sum(-1)

    def cross_share(self) -> np.ndarray:
        """``[layers, heads]``: the cross term's part of that head's term energy, ss_cross / Σ ss_terms."""
        parts = sum(self._energy(t) for t in ("kv", "weight", "cross"))
        return np.divide(self._energy("cross"), parts, out=np.zeros_like(parts), where=parts > 0)

    def cross_mass(self) -> np.ndarray:
        """``[layers, heads]``: the fraction of the whole network's cross-term energy in that head."""
        energy = self._energy("cross")
        total = energy.sum()
        return energy / total if total > 0 else np.zeros_like(energy)

    def top_heads(self, n: int = 5) -> list[tuple[int, int, float]]:
        """(layer, head, share of the network's cross-term energy), largest first."""
        mass = self.cross_mass()
        order = np.argsort(mass, axis=None)[::-1][:n]
        return [(int(i // self.heads), int(i % self.heads), float(mass.flat[i])) for i in order]

    def top_layers(self, n: int = 5) -> list[tuple[int, float]]:
        """(layer, share of the network's cross-term energy), largest first."""
        mass = self.cross_mass().sum(1)
        order = np.argsort(mass)[::-1][:n]
        return [(int(i), float(mass[i])) for i in order]

    def network_shares(self) -> dict[str, float]:
        """Each term's part of the summed term energy over the whole network."""
        energies = {t: float(self._energy(t).sum()) for t in ("kv", "weight", "cross")}
        total = sum(energies.values())
        return {t: (e / total if total > 0 else 0.0) for t, e in energies.items()}

    def cross_split(self) -> dict[str, float]:
        """The cross term's weight part ε_q·ε_k,wᵀ and cache part ε_q·ε_k,cᵀ, each as a share of the
        summed three-term energy (the two parts' energies need not add to the cross term's: they can cancel)."""
        total = sum(float(self._energy(t).sum()) for t in ("kv", "weight", "cross"))
        return {part: (float(self._energy(f"cross_{part}").sum()) / total if total > 0 else 0.0) for part in ("weight", "cache")}

    def interaction_share(self) -> float:
        """Energy of the attention-level 2×2 interaction S_WC − S_W − S_C + S_R over the score error's energy."""
        total = float(self._energy("total").sum())
        return float(self._energy("interaction").sum()) / total if total > 0 else 0.0

    def per_layer(self) -> list[dict]:
        rows = []
        for layer in range(self.layers):
            row = {"layer": layer}
            for term in TERMS:
                for keys in ("all", "sinks", "rest"):
                    row[f"rms_{term}_{keys}"] = float(np.sqrt(np.mean(self.rms(term, keys)[layer] ** 2)))
            pairs = self.pairs[layer].sum() * self.heads
            row["rms_reference_scores"] = float(np.sqrt(self.ref_sumsq[layer].sum() / pairs)) if pairs else 0.0
            row["attention_kl"] = float(self.kl()[layer].mean())
            row["cross_share"] = float(self.cross_share()[layer].mean())
            row["cross_mass"] = float(self.cross_mass()[layer].sum())
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        return {
            "weights": self.weights,
            "kv": self.kv,
            "ctx": self.ctx,
            "windows": self.n_windows,
            "sink_tokens": self.sink_tokens,
            "terms": dict(TERM_LABELS),
            "network_shares": self.network_shares(),
            "cross_split": self.cross_split(),
            "interaction_share": self.interaction_share(),
            "attention_kl_cells": {cell: self.kl_of(cell) for cell in ("w", "c", "wc")},
            "attention_kl_interaction": self.kl_interaction(),
            "top_layers": [{"layer": l, "cross_mass": s} for l, s in self.top_layers()],
            "top_heads": [{"layer": l, "head": h, "cross_mass": s} for l, h, s in self.top_heads()],
            "per_layer": self.per_layer(),
            "per_head": {
                **{f"rms_{t}": self.rms(t).round(6).tolist() for t in TERMS},
                "attention_kl": self.kl().round(8).tolist(),
                "cross_share": self.cross_share().round(6).tolist(),
            },
        }

    def lines(self) -> list[str]:
        shares = self.network_shares()
        kl = self.kl()
        if not any(self.sumsq[t].any() for t in TERMS):
            return [f"attention scores under {self.weights} × {self.kv} equal the reference's (no score error)"]
        worst = np.unravel_index(np.argmax(kl), kl.shape) if kl.size else (0, 0)
        top = ", ".join(f"L{l} ({s:.0%})" for l, s in self.top_layers(3))
        return [
            f"attention score error energy: KV term Q·ε_kᵀ {shares['kv']:.1%}, weight term ε_q·Kᵀ {shares['weight']:.1%}, "
            f"cross term ε_q·ε_kᵀ {shares['cross']:.1%}",
            f"the cross term sits mostly in layers {top}; its weight part ε_q·ε_k,wᵀ is {self.cross_split()['weight']:.1%} and its "
            f"cache part ε_q·ε_k,cᵀ {self.cross_split()['cache']:.1%} of the term energy; the attention-level 2×2 interaction "
            f"S_WC − S_W − S_C + S_R carries {self.interaction_share():.1%} of the score-error energy",
            f"attention KL per row: (W, fp16) {self.kl_of('w'):.2e}, (none, C) {self.kl_of('c'):.2e}, (W, C) {self.kl_of('wc'):.2e}; "
            f"2×2 interaction {self.kl_interaction():+.2e} nats",
            f"attention KL: mean {kl.mean():.2e} nats per row, largest at layer {worst[0]} head {worst[1]} ({kl.max():.2e})",
        ]


def pooled(parts: list["AttentionDecomposition"]) -> "AttentionDecomposition":
    """One :class:`AttentionDecomposition` of all windows from the per-window ones (its sums add)."""
    from dataclasses import replace

    first = parts[0]
    return replace(first, n_windows=sum(p.n_windows for p in parts), sumsq={t: sum(p.sumsq[t] for p in parts) for t in first.sumsq},
                   pairs=sum(p.pairs for p in parts), kl_sum=sum(p.kl_sum for p in parts), kl_rows=sum(p.kl_rows for p in parts),
                   ref_sumsq=sum(p.ref_sumsq for p in parts),
                   kl_cell_sum={c: sum(p.kl_cell_sum[c] for p in parts) for c in first.kl_cell_sum})



class _Accumulator:
    def __init__(self, layers: int, heads: int) -> None:
        self.sumsq = {t: np.zeros((layers, heads, 2)) for t in TERMS}
        self.ref_sumsq = np.zeros((layers, heads))
        self.pairs = np.zeros((layers, 2))
        self.kl_sum = np.zeros((layers, heads))
        self.kl_rows = np.zeros((layers, heads))
        self.kl_cells = {cell: np.zeros((layers, heads)) for cell in ("w", "c")}

    def add(self, layer: int, terms: dict[str, torch.Tensor], scores_ref: torch.Tensor, allowed: torch.Tensor,
            kl: dict[str, torch.Tensor], sink_tokens: int) -> None:
        """``kl``: attention-row KL against the reference of the cells ``wc`` (the candidate), ``w`` and ``c``."""
        is_sink = torch.arange(allowed.shape[-1], device=allowed.device) < sink_tokens  # where the scores are
        groups = (allowed & is_sink, allowed & ~is_sink)
        for term, x in terms.items():
            sq = x.square()
            for g, sel in enumerate(groups):
                self.sumsq[term][layer, :, g] += (sq * sel).sum((-1, -2)).cpu().numpy()
        self.ref_sumsq[layer] += (scores_ref.square() * allowed).sum((-1, -2)).cpu().numpy()
        for g, sel in enumerate(groups):
            self.pairs[layer, g] += float(sel.sum())
        self.kl_sum[layer] += kl["wc"].sum(-1).cpu().numpy()
        self.kl_rows[layer] += kl["wc"].shape[-1]
        for cell in self.kl_cells:
            self.kl_cells[cell][layer] += kl[cell].sum(-1).cpu().numpy()

    def result(self, weights: str, kv: str, tokens: torch.Tensor, sink_tokens: int) -> "AttentionDecomposition":
        return AttentionDecomposition(
            weights=weights, kv=kv, ctx=int(tokens.shape[1]), n_windows=int(tokens.shape[0]), sink_tokens=sink_tokens,
            sumsq=self.sumsq, pairs=self.pairs, kl_sum=self.kl_sum, kl_rows=self.kl_rows, ref_sumsq=self.ref_sumsq,
            kl_cell_sum=self.kl_cells)


def to_store_space(store: LayerStore, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A 16-bit pass's Q and K carried into ``store``'s space (smoothing and rotation, no quantization)."""
    return _reference_space(store, query, key, key)


def _per_pair(use_stored: torch.Tensor | None, stored, full):
    """Each (query, key) pair's value from the stored or the full-precision key (residual specs)."""
    return stored if use_stored is None or full is None else torch.where(use_stored, stored, full)


def _layer_statistics(store: LayerStore, selection, cells, query, key, value, attention_mask, rope, residual,
                      scaling: float, softcap: float | None):
    """Terms, reference scores, allowed pairs and attention KL of the W+C, W and C cells for one layer of one
    window (float64).

    ``cells``: this layer's ``(R raw, W raw, C seen)`` (:class:`~wkvlab.explain.cells.PassRecord`); ``query``,
    ``key``, ``value``, ``rope``, ``residual``: what the W+C pass's attention receives here."""
    (r_q, r_k), (w_q, w_k), (c_q, c_k_full, c_k_stored) = cells
    device = query.device
    q_cand, k_full, k_stored, _, _ = store.apply(query, key, value, rope, residual)
    q_ref, k_ref = to_store_space(store, r_q.to(device), r_k.to(device))
    q_w, k_w = to_store_space(store, w_q.to(device), w_k.to(device))
    heads = q_cand.shape[1]
    as64 = lambda x: _expand(x.to(device), heads)[0].double()  # noqa: E731
    q_ref, k_ref, q_cand, k_full, k_stored, q_w, k_w = map(as64, (q_ref, k_ref, q_cand, k_full, k_stored, q_w, k_w))
    q_c, c_k_full, c_k_stored = map(as64, (c_q, c_k_full, c_k_stored))
    allowed = allowed_pairs(attention_mask, q_cand.shape[-2], k_stored.shape[-2], device)
    terms = cell_terms(q_ref, k_ref, q_cand, k_stored, q_w, k_w, q_c, c_k_stored, scaling)
    if selection is not None and not (store.k_quant is None and store.v_quant is None):
        # residual / window specs: a query sees the full-precision key until the rule quantizes it, in both cache cells
        use_q = selection(torch.arange(q_cand.shape[-2], device=device), k_stored.shape[-2])
        fresh = cell_terms(q_ref, k_ref, q_cand, k_full, q_w, k_w, q_c, c_k_full, scaling)
        terms = {t: _per_pair(use_q, terms[t], fresh[t]) for t in TERMS}
    scores_ref = (q_ref @ k_ref.transpose(-1, -2)) * scaling
    kl = {cell: attention_kl(scores_ref, scores_ref + terms[name], allowed, softcap)
          for cell, name in (("wc", "total"), ("w", "total_w"), ("c", "total_c"))}
    return terms, scores_ref, allowed, kl


def _seen(record, layer: int):
    """(query, key_full, key_stored) a pass's attention read at ``layer`` (a 16-bit pass: its own Q and K)."""
    if record.seen:
        return record.seen[layer]
    q, k = record.raw[layer]
    return q, k, k


def decompose_window(candidate: torch.nn.Module, kv: KVSpec, ids: torch.Tensor, stores: list[LayerStore], cells, acc: "_Accumulator",
                     sink_tokens: int = SINK_TOKENS) -> torch.Tensor:
    """The W+C pass of one window ``ids`` ``[1, tokens]``, its score error accumulated into ``acc`` against the
    recorded cells ``(R, W, C)`` (:func:`wkvlab.explain.cells.record_pass`); returns the pass's float32 logits."""
    from wkvlab.eval.logits import model_logits

    ref, w, c = cells
    selection = kv.selection()
    with attention_inputs(candidate) as inputs, kv_quantization(candidate, kv, stores=stores):

        def compare(backend, module, query, key, value, attention_mask, **kwargs):
            layer = module.layer_idx
            seen = inputs.get(layer, {})
            scaling = kwargs.get("scaling") or module.scaling
            terms, scores_ref, allowed, kl = _layer_statistics(
                stores[layer], selection, (ref.raw[layer], w.raw[layer], _seen(c, layer)), query, key, value, attention_mask,
                seen.get("position_embeddings"), seen.get("residual"), scaling, kwargs.get("softcap"))
            acc.add(layer, terms, scores_ref, allowed, kl, sink_tokens)
            return backend(module, query, key, value, attention_mask, **kwargs)

        with attention_override(candidate, compare):
            return model_logits(candidate, ids.to(input_device(candidate))).cpu()


@torch.no_grad()
def attention_decomposition(
    reference: torch.nn.Module,
    candidate: torch.nn.Module,
    kv: KVSpec,
    tokens: torch.Tensor,
    *,
    weights_label: str = "none",
    stats: KVStats | None = None,
    stores: list[LayerStore] | None = None,
    reference_stats: KVStats | None = None,
    sink_tokens: int = SINK_TOKENS,
    progress: Progress | None = None,
) -> AttentionDecomposition:
    """Decompose the score error of ``candidate`` (weight-quantized model, or the reference itself)
    under ``kv`` against ``reference``, over token windows ``tokens`` ``[n_windows, ctx]``.

    Four passes per window: R and C on ``reference``, W and W+C on ``candidate``. ``stats``: KV
    calibration statistics under the candidate's weights for specs that need them
    (``reference_stats``: under the reference's, for the C cell; default ``stats``); ``stores``:
    the candidate's prebuilt layer stores.
    """
    from wkvlab.explain.cells import record_pass

    tick = progress or (lambda _d, _n: None)
    stores = stores if stores is not None else layer_stores(candidate, kv, stats)
    ref_stores = layer_stores(reference, kv, reference_stats if reference_stats is not None else stats)
    fp16 = KVSpec.parse("fp16")
    cfg = candidate.config.get_text_config()
    acc = _Accumulator(cfg.num_hidden_layers, cfg.num_attention_heads)
    for w in range(tokens.shape[0]):
        ids = tokens[w : w + 1]
        cells = (record_pass(reference, fp16, ids, logits=False), record_pass(candidate, fp16, ids, logits=False),
                 record_pass(reference, kv, ids, ref_stores, logits=False))
        decompose_window(candidate, kv, ids, stores, cells, acc, sink_tokens)
        tick("attention decomposition", 1)
    return acc.result(weights_label, kv.label, tokens, sink_tokens)
