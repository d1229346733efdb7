"""hf-hqq's kernel against hqq itself, in the fast tier (hqq 0.2.8.post1 is pinned in the ``test``
extra; it installs beside torch 2.13 and transformers 5.24 without changing them).

hqq's ``Quantizer.quantize`` / ``dequantize`` with axis 0 and groups of 64 — what transformers 5.24's
``HQQQuantizedLayer._quantize`` calls on the whole cache — against :func:`wkvlab.formats.hqq.fake_quant_hqq`
on random, outlier-heavy and boundary caches, float32 and bf16, bit for bit. The replay through
transformers' QuantizedCache stays in tests/kv/test_hqq_cache_replay.py (slow)."""
from __future__ import annotations

import pytest
import torch

hqq_quantize = pytest.importorskip("hqq.core.quantize", reason="hqq is in the test extra: pip install -e '.[test]'")

from wkvlab.formats.hqq import fake_quant_hqq  # noqa: E402


def hqq_cache_roundtrip(x: torch.Tensor, nbits: int) -> torch.Tensor:
    """HQQQuantizedLayer's _quantize then _dequantize (transformers 5.24 cache_utils.py)."""
    q, meta = hqq_quantize.Quantizer.quantize(x.contiguous(), axis=0, device=x.device, compute_dtype=x.dtype, nbits=nbits, group_size=64)
    meta["compute_dtype"] = x.dtype
    hqq_quantize.Quantizer.cuda(q, meta=meta, device=x.device)
    return hqq_quantize.Quantizer.dequantize(q, meta)


def caches() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    normal = torch.randn(1, 2, 13, 64, generator=g) * torch.rand(1, 2, 1, 64, generator=g) * 3
    outliers = torch.randn(1, 2, 5, 64, generator=g)
    outliers[..., 9] *= 60
    boundary = torch.randn(1, 2, 4, 64, generator=g)
    boundary[0, 0, 0] = 0.75  # constant, zero and tiny stretches of the flattened cache
    boundary[0, 0, 1] = 0.0
    boundary[0, 1, 0] = torch.randn(64, generator=g) * 1e-20
    one_token = torch.randn(1, 1, 1, 64, generator=g)  # a one-token prompt on one KV head of 64
    return {"normal": normal, "outliers": outliers, "boundary": boundary, "one_token": one_token}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nbits", [1, 2, 3, 4, 8])
def test_kernel_bit_exact_with_hqq(nbits, dtype):
    for name, x in caches().items():
        x = x.to(dtype)
        ref = hqq_cache_roundtrip(x, nbits)
        got = fake_quant_hqq(x, nbits, 64)
        assert got.dtype == ref.dtype == dtype
        assert torch.equal(got, ref), f"{name}: {int((got != ref).sum())} of {got.numel()} values differ"
