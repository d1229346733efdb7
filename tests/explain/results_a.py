"""Hand-made EvalResults on shared windows: the factorial, compare, context and mitigation maths
are tested on numbers whose answers are known without a model."""
from __future__ import annotations

import numpy as np

from wkvlab.eval.metrics import position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays


def result(kld, *, nll=None, agree=None, nll_ref=None, windows: int = 8, ctx: int = 33, weights: str = "w", kv: str = "c",
           kv_bytes: float = 100.0) -> EvalResult:
    """A result over ``windows`` windows of ``ctx`` (all positions scored); scalars broadcast."""
    n = windows * (ctx - 1)
    full = lambda x, default: np.broadcast_to(np.asarray(default if x is None else x, dtype=np.float64), (n,)).copy()  # noqa: E731
    arrays = TokenArrays(
        kld=full(kld, 0.0), nll_ref=full(nll_ref, 2.0), nll=full(nll, 2.0),
        top1_agree=full(agree, 1.0).astype(bool), delta_p=np.zeros(n),
        position=np.tile(np.arange(ctx - 1), windows), window=np.repeat(np.arange(windows), ctx - 1),
    )
    return EvalResult(model="m", data="d", ctx=ctx, weights=weights, kv=kv, weights_spec={}, kv_spec={}, weight_bytes=1,
                      kv_bytes_per_token=kv_bytes, seconds=0.0, arrays=arrays, buckets=position_buckets(ctx),
                      fingerprints={"model_sha256": "m" * 64, "data_sha256": "d" * 64})


def window_noise(seed: int = 0, windows: int = 8, ctx: int = 33, scale: float = 0.01) -> np.ndarray:
    """Per-token values that differ from window to window (what pairing must cancel)."""
    rng = np.random.default_rng(seed)
    return np.repeat(rng.random(windows) * scale, ctx - 1)
