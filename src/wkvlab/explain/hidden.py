"""Per-layer diagnostics in the style of exllamav3's ``eval/model_diff.py``.

After every decoder layer the candidate's hidden state (weights W, KV cache C, teacher-forced on
the same tokens) is compared with the reference's:

* relative error ‖h_c − h_r‖_F / ‖h_r‖_F over each window, averaged over windows (model_diff's
  ``rfn_err``);
* cosine error 1 − cos(h_c, h_r), per token, averaged over tokens (model_diff's ``cos_err``);
* SQNR in dB, 10·log10(Σ‖h_r‖² / Σ‖h_c − h_r‖²) over all tokens (model_diff averages per-token
  dB; a ratio of sums stays finite and meaningful when a few tokens are exact).

At the output, the per-token KLD is bucketed by the reference's top-1 probability, with
model_diff's buckets [0, .25), [.25, .5), [.5, .75), [.75, .95), [.95, 1]: mean KLD is dominated by
tokens where the reference itself is undecided, and the buckets show it.

Hidden states come from forward hooks on the decoder layers (removed on exit); the reference's
are kept for one window only.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from wkvlab.runtime import input_device
from wkvlab.eval.metrics import ReferenceTokens, compare_tokens
from wkvlab.kv.calibrate import KVStats
from wkvlab.kv.hook import kv_quantization
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import LayerStore

CONFIDENCE_EDGES = (0.0, 0.25, 0.5, 0.75, 0.95, 1.0)  # exllamav3 model_diff's buckets
Progress = Callable[[str, int], None]


@contextmanager
def layer_outputs(model: torch.nn.Module) -> Iterator[dict[int, torch.Tensor]]:
    """Within the block, ``seen[i]`` is decoder layer i's latest output ``[tokens, hidden]``."""
    seen: dict[int, torch.Tensor] = {}

    def hook(index):
        def record(module, args, output):
            seen[index] = (output[0] if isinstance(output, tuple) else output)[0].detach()

        return record

    handles = []
    for name, module in model.named_modules():
        match = re.search(r"(?:^|\.)layers\.(\d+)$", name)
        if match:
            handles.append(module.register_forward_hook(hook(int(match.group(1)))))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def hidden_errors(ref: torch.Tensor, cand: torch.Tensor) -> dict[str, float]:
    """Sums for one layer and window: ``[tokens, hidden]`` each, summed in float64."""
    r, c = ref.double(), cand.double()
    diff = (c - r).square().sum(-1)
    nc, nr = c.norm(dim=-1), r.norm(dim=-1)
    # 1 − cos written as (‖c−r‖² − (‖c‖−‖r‖)²) / (2‖c‖‖r‖): exactly 0 for equal states, and free of
    # the cancellation of 1 − (c·r)/(‖c‖‖r‖) when the error is tiny
    cos_err = ((diff - (nc - nr).square()) / (2 * nc * nr).clamp_min(1e-30)).clamp_min(0)
    return {
        "rel_err": float(diff.sum().sqrt() / r.square().sum().sqrt()),
        "cos_err_sum": float(cos_err.sum()),
        "signal": float(r.square().sum()),
        "noise": float(diff.sum()),
    }


def reference_confidence_buckets(kld: np.ndarray, ref_top1: np.ndarray, edges=CONFIDENCE_EDGES) -> list[dict]:
    """Mean and median KLD per bucket of the reference's top-1 probability, with token counts."""
    rows = []
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        last = i == len(edges) - 2
        mask = (ref_top1 >= lo) & ((ref_top1 <= hi) if last else (ref_top1 < hi))
        n = int(mask.sum())
        rows.append({
            "low": lo, "high": hi, "tokens": n, "fraction": n / max(kld.size, 1),
            "kld_mean": float(kld[mask].mean()) if n else None,
            "kld_median": float(np.median(kld[mask])) if n else None,
        })
    return rows


@dataclass(frozen=True, eq=False)
class LayerDiagnostics:
    """Hidden-state error after each decoder layer, and KLD by reference confidence."""

    weights: str
    kv: str
    ctx: int
    n_windows: int
    rel_err: np.ndarray  # [layers], mean over windows
    cos_err: np.ndarray  # [layers], mean over tokens
    sqnr_db: np.ndarray  # [layers]; inf where the layer is exact
    kld: np.ndarray  # per scored token
    ref_top1: np.ndarray  # the reference's top-1 probability per scored token

    @property
    def layers(self) -> int:
        return int(self.rel_err.size)

    def buckets(self) -> list[dict]:
        return reference_confidence_buckets(self.kld, self.ref_top1)

    def worst_jump(self) -> tuple[int, float]:
        """The layer whose relative error grows most over the previous layer's (layer, ratio)."""
        prev = np.concatenate([[0.0], self.rel_err[:-1]])
        growth = self.rel_err - prev
        layer = int(np.argmax(growth)) if growth.size else 0
        return layer, float(growth[layer]) if growth.size else 0.0

    def to_dict(self) -> dict:
        finite = lambda x: float(x) if np.isfinite(x) else None  # noqa: E731 - JSON has no inf
        return {
            "weights": self.weights,
            "kv": self.kv,
            "ctx": self.ctx,
            "windows": self.n_windows,
            "per_layer": [
                {"layer": i, "rel_err": float(self.rel_err[i]), "cos_err": float(self.cos_err[i]), "sqnr_db": finite(self.sqnr_db[i])}
                for i in range(self.layers)
            ],
            "kld_mean": float(self.kld.mean()) if self.kld.size else None,
            "kld_by_reference_confidence": self.buckets(),
        }

    def lines(self) -> list[str]:
        if not self.rel_err.any():
            return [f"hidden states under {self.weights} × {self.kv} equal the reference's after every layer"]
        first, last = 0, self.layers - 1
        layer, jump = self.worst_jump()
        rows = [b for b in self.buckets() if b["tokens"]]
        undecided, confident = rows[0], rows[-1]
        return [
            f"hidden-state relative error {self.rel_err[first]:.3f} after layer {first}, {self.rel_err[last]:.3f} "
            f"after layer {last} (SQNR {self.sqnr_db[first]:.1f} → {self.sqnr_db[last]:.1f} dB)",
            f"the largest step is at layer {layer} (+{jump:.3f})",
            f"KLD where the reference is undecided (top-1 p in [{undecided['low']}, {undecided['high']})): {undecided['kld_mean']:.4f} "
            f"over {undecided['fraction']:.0%} of tokens; where it is confident (≥ {confident['low']}): {confident['kld_mean']:.4f} "
            f"over {confident['fraction']:.0%}",
        ]


@torch.no_grad()
def layer_diagnostics(
    reference: torch.nn.Module,
    candidate: torch.nn.Module,
    kv: KVSpec,
    tokens: torch.Tensor,
    *,
    weights_label: str = "none",
    stats: KVStats | None = None,
    stores: list[LayerStore] | None = None,
    progress: Progress | None = None,
) -> LayerDiagnostics:
    """Compare ``candidate`` under ``kv`` with ``reference`` layer by layer on ``tokens`` ``[n_windows, ctx]``."""
    tick = progress or (lambda _d, _n: None)
    n_layers = candidate.config.get_text_config().num_hidden_layers
    rel = np.zeros(n_layers)
    cos = np.zeros(n_layers)
    signal, noise = np.zeros(n_layers), np.zeros(n_layers)
    klds, top1 = [], []
    for w in range(tokens.shape[0]):
        ids = tokens[w : w + 1]
        with layer_outputs(reference) as ref_states:
            ref_logits = reference(input_ids=ids.to(input_device(reference)), use_cache=False).logits[0]
        with layer_outputs(candidate) as cand_states, kv_quantization(candidate, kv, stats=stats, stores=stores):
            cand_logits = candidate(input_ids=ids.to(input_device(candidate)), use_cache=False).logits[0]
        for i in range(n_layers):
            e = hidden_errors(ref_states[i], cand_states[i])
            rel[i] += e["rel_err"]
            cos[i] += e["cos_err_sum"]
            signal[i] += e["signal"]
            noise[i] += e["noise"]
        ref = ReferenceTokens.from_logits(ref_logits[:-1], ids[0, 1:])
        klds.append(compare_tokens(ref, cand_logits[:-1]).kld)
        top1.append(ref.probs.max(-1).values.double().cpu().numpy())
        tick("layer diagnostics", 1)
    n_windows, ctx = int(tokens.shape[0]), int(tokens.shape[1])
    with np.errstate(divide="ignore"):
        sqnr = 10 * np.log10(signal / noise)
    return LayerDiagnostics(
        weights=weights_label, kv=kv.label, ctx=ctx, n_windows=n_windows,
        rel_err=rel / n_windows, cos_err=cos / (n_windows * ctx), sqnr_db=sqnr,
        kld=np.concatenate(klds), ref_top1=np.concatenate(top1),
    )
