"""Synthetic EvalResults: the store never needs a model to be tested."""
from __future__ import annotations

import numpy as np

from wkvlab.eval.metrics import position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays


def fake_result(seed: int = 0, *, windows: int = 3, ctx: int = 64, weights: str = "int8", kv: str = "q4_0",
                documents: list[int] | None = None) -> EvalResult:
    """``documents``: each window's document (None: one stream, no document row, as stored before them)."""
    rng = np.random.default_rng(seed)
    n = windows * (ctx - 1)
    as32 = lambda a: a.astype(np.float32).astype(np.float64)  # noqa: E731 - what the runner produces
    arrays = TokenArrays(
        kld=as32(rng.exponential(0.01, n)), nll_ref=as32(rng.exponential(2.0, n)), nll=as32(rng.exponential(2.0, n)),
        top1_agree=rng.random(n) < 0.9, delta_p=as32(rng.normal(0, 0.01, n)),
        position=np.tile(np.arange(ctx - 1), windows), window=np.repeat(np.arange(windows), ctx - 1),
        document=None if documents is None else np.repeat(np.asarray(documents, dtype=np.int64), ctx - 1),
    )
    return EvalResult(model="smollm2", data="prose", ctx=ctx, weights=weights, kv=kv, weights_spec={"method": "rtn"}, kv_spec={"k": kv},
                      weight_bytes=1000 + seed, kv_bytes_per_token=12.5, seconds=0.5, arrays=arrays, buckets=position_buckets(ctx),
                      fingerprints={"model_sha256": "m" * 64, "data_sha256": "d" * 64}, notes=[f"note {seed}"])
