from __future__ import annotations

import pytest
import torch

from wkvlab.errors import ConfigError
from wkvlab.formats import fake_quant_fp8, fp8_absmax_scale, fp8_max

CASES = [("e4m3", torch.float8_e4m3fn, 448.0), ("e5m2", torch.float8_e5m2, 57344.0)]


@pytest.mark.parametrize("fmt,dtype,fmax", CASES)
def test_matches_torch_cast(fmt: str, dtype: torch.dtype, fmax: float) -> None:
    assert fp8_max(fmt) == fmax  # type: ignore[arg-type]
    torch.manual_seed(0)
    x = torch.randn(64, 128) * torch.logspace(-8, 5, 128)
    ref = x.clamp(-fmax, fmax).to(dtype).float()
    assert torch.equal(fake_quant_fp8(x, fmt), ref)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt,dtype,fmax", CASES)
def test_overflow_saturates(fmt: str, dtype: torch.dtype, fmax: float) -> None:
    x = torch.tensor([1e6, -1e6, 1e30, -1e30, float("inf"), -float("inf"), 3e38])
    y = fake_quant_fp8(x, fmt)  # type: ignore[arg-type]
    assert y.tolist() == [fmax, -fmax, fmax, -fmax, fmax, -fmax, fmax]
    assert torch.isfinite(y).all()


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_nan_stays_nan_and_dtype_shape(fmt: str) -> None:
    x = torch.tensor([[1.0, float("nan")], [0.1, -3.0]], dtype=torch.bfloat16)
    before = x.clone()
    y = fake_quant_fp8(x, fmt)  # type: ignore[arg-type]
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert torch.isnan(y[0, 1]) and not torch.isnan(y[1]).any()
    assert torch.equal(x[1], before[1])


@pytest.mark.parametrize("fmt,dtype,fmax", CASES)
def test_scaled(fmt: str, dtype: torch.dtype, fmax: float) -> None:
    torch.manual_seed(1)
    x = torch.randn(8, 256) * torch.tensor([1e-4, 1e-2, 1.0, 10.0, 1e3, 1e5, 0.0, 3.0]).unsqueeze(1)
    s = fp8_absmax_scale(x, fmt, dim=-1)  # type: ignore[arg-type]
    assert s.shape == (8, 1) and s[6].item() == 1.0  # all-zero row: guarded scale
    ref = ((x / s).clamp(-fmax, fmax).to(dtype).float() * s)
    y = fake_quant_fp8(x, fmt, s)  # type: ignore[arg-type]
    assert torch.equal(y, ref)
    assert torch.equal(y[6], torch.zeros(256))
    rel = (y - x).abs().amax(dim=-1) / x.abs().amax(dim=-1).clamp(min=1e-30)
    assert (rel[torch.arange(8) != 6] < (0.07 if fmt == "e4m3" else 0.13)).all()
    # the scaled largest magnitude lands on (or within rounding of) the format max, not above
    assert ((x / s).abs().amax(dim=-1) <= fmax * (1 + 1e-6)).all()


def test_absmax_scale_shapes() -> None:
    x = torch.randn(2, 3, 4)
    assert fp8_absmax_scale(x, "e4m3").shape == (1, 1, 1)
    assert fp8_absmax_scale(x, "e4m3", keepdim=False).shape == ()
    assert fp8_absmax_scale(x, "e4m3", dim=(0, 2)).shape == (1, 3, 1)
    assert fp8_absmax_scale(torch.zeros(3, 4), "e5m2").flatten().tolist() == [1.0]
    expected = x.abs().amax() / torch.tensor(448.0)
    assert fp8_absmax_scale(x, "e4m3").item() == expected.item()


def test_errors() -> None:
    with pytest.raises(ConfigError):
        fake_quant_fp8(torch.zeros(4), "e3m4")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        fp8_max("fp8")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        fake_quant_fp8(torch.zeros(4), "e4m3", 0.0)
    with pytest.raises(ConfigError):
        fake_quant_fp8(torch.zeros(4), "e4m3", -1.0)
    with pytest.raises(ConfigError):
        fake_quant_fp8(torch.zeros(4, dtype=torch.int32), "e4m3")
