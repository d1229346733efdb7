"""Synthetic EvalResults for the report tests: the report is under test here, not the numbers."""
from __future__ import annotations

import numpy as np

from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.kv.spec import KVSpec

WEIGHT_SPECS = {
    "none": {"method": "none", "bits": 32, "format": "fp32"},
    "bf16": {"method": "cast", "bits": 16, "format": "bf16"},
    "int8": {"method": "rtn", "bits": 8, "format": "int"},
    "int4-g128": {"method": "rtn", "bits": 4, "format": "int"},
}
WEIGHT_BYTES = {"none": 400_000_000, "bf16": 200_000_000, "int8": 100_000_000, "int4-g128": 60_000_000}
KV_BYTES = {"fp16": 1000.0, "fp8_e4m3": 500.0, "int8": 520.0, "int4": 280.0}


def make_result(weights: str, kv: str, kld, *, model: str = "tiny", windows: int = 8, ctx: int = 64,
                weight_bytes: int | None = None, kv_bytes: float | None = None) -> EvalResult:
    """A result whose per-token KLD is ``kld`` (a scalar, or one value per window) on windows × ctx tokens."""
    n = windows * ctx
    per_window = np.broadcast_to(np.asarray(kld, dtype=np.float64), (windows,))
    kld_tokens = np.repeat(per_window, ctx) * (1 + np.tile(np.arange(ctx), windows) / ctx)  # grows with position
    kld_tokens *= per_window.mean() / max(kld_tokens.mean(), 1e-300) if per_window.mean() else 1.0
    arrays = TokenArrays(kld=kld_tokens, nll_ref=np.full(n, 2.0), nll=np.full(n, 2.0) + kld_tokens,
                         top1_agree=(np.arange(n) % 10 != 0).astype(np.float64), delta_p=np.zeros(n),
                         position=np.tile(np.arange(ctx), windows), window=np.repeat(np.arange(windows), ctx))
    return EvalResult(model=model, data="default", ctx=ctx, weights=weights, kv=kv, weights_spec=dict(WEIGHT_SPECS[weights]),
                      kv_spec=KVSpec.parse(kv).to_dict(), weight_bytes=WEIGHT_BYTES[weights] if weight_bytes is None else weight_bytes,
                      kv_bytes_per_token=KV_BYTES[kv] if kv_bytes is None else kv_bytes, seconds=1.0, arrays=arrays,
                      buckets=[(0, 16), (16, 63)], fingerprints={"model_sha256": "m" + model, "data_sha256": "d"})


def demo_like_grid(model: str = "tiny") -> list[EvalResult]:
    """bf16/int8/int4 × fp16/fp8/int8/int4 with KLDs that add up plus a known interaction."""
    w = {"bf16": 0.001, "int8": 0.004, "int4-g128": 0.03}
    c = {"fp16": 0.0, "fp8_e4m3": 0.002, "int8": 0.0015, "int4": 0.01}
    out = []
    for wn, wk in w.items():
        for cn, ck in c.items():
            extra = 0.003 if (wn == "int4-g128" and cn == "int4") else 0.0
            out.append(make_result(wn, cn, wk + ck + extra, model=model))
    return out


def profile_payload(model: str = "tiny", layers: int = 6, seed: int = 0) -> dict:
    """The fields of a SensitivityProfile JSON (docs/search.md) the report reads."""
    rng = np.random.default_rng(seed)
    base = 0.004
    return {"version": 1, "model": model, "data": "default", "weights": "int4-g128", "layers": layers, "base": {"kld": base, "se": 0.0, "tokens": 100},
            "k": {"int4": list(base + rng.uniform(0, 0.01, layers)), "int8": list(base + rng.uniform(0, 0.001, layers))},
            "v": {"int4": list(base + rng.uniform(0, 0.004, layers))}, "uniform": {}, "weight_layers": list(rng.uniform(0, 0.002, layers))}


def demo_record_grid() -> list[EvalResult]:
    """The committed demo run's twelve configs (docs/runs/demo.json): their real memory, KV bytes and mean KLDs on
    8 windows of 512 tokens, so the page lays out the demo's crowded points (issue #42: labels at 195–210 MiB)."""
    import json
    from pathlib import Path

    rows = json.loads((Path(__file__).resolve().parents[2] / "docs" / "runs" / "demo.json").read_text())["rows"]
    return [make_result(r["weights"], r["kv"], r["kld"]["mean"], model=r["model"], ctx=512, weight_bytes=r["weight_bytes"],
                        kv_bytes=r["kv_bytes_per_token"]) for r in rows]
