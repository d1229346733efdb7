from __future__ import annotations

import itertools

import pytest
import torch

from wkvlab.errors import ConfigError
from wkvlab.formats import (
    affine_dequantize,
    affine_qparams,
    affine_quantize,
    bytes_per_element_affine,
    fake_quant_affine,
)

MODES = [(True, "int"), (False, "int"), (False, "float")]
X4 = torch.tensor([-1.0, 0.0, 0.5, 1.0])


def _fq(x: torch.Tensor, bits: int, sym: bool, zp: str, rounding: str = "half_even", **kw: object) -> torch.Tensor:
    return fake_quant_affine(x, bits, symmetric=sym, zero_point=zp, rounding=rounding, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- hand-computed cases


def test_symmetric_2bit_by_hand() -> None:
    # qmax = 1, scale = amax / 1 = 1; 0.5 is an exact tie: half-even -> 0, half-away -> 1.
    s, z = affine_qparams(X4, 2)
    assert s.item() == 1.0 and z.item() == 0.0
    assert affine_quantize(X4, s, z, 2).tolist() == [-1, 0, 0, 1]
    assert _fq(X4, 2, True, "int").tolist() == [-1.0, 0.0, 0.0, 1.0]
    assert _fq(X4, 2, True, "int", "half_away").tolist() == [-1.0, 0.0, 1.0, 1.0]


def test_symmetric_4bit_by_hand() -> None:
    # qmax = 7, scale = fl(1/7); 0.5 / fl(1/7) = 3.4999998 (not a tie in float32) -> 3.
    s, _ = affine_qparams(X4, 4)
    assert s.item() == (torch.tensor(1.0) / 7).item()
    assert affine_quantize(X4, s, torch.zeros(1), 4).tolist() == [-7, 0, 3, 7]
    assert torch.equal(_fq(X4, 4, True, "int"), torch.tensor([-7.0, 0.0, 3.0, 7.0]) * s.flatten())
    # scale exactly 1: real ties, and the two rounding modes differ
    x = torch.tensor([-7.0, -2.5, 2.5, 7.0])
    assert _fq(x, 4, True, "int").tolist() == [-7.0, -2.0, 2.0, 7.0]
    assert _fq(x, 4, True, "int", "half_away").tolist() == [-7.0, -3.0, 3.0, 7.0]


def test_asymmetric_float_min_by_hand() -> None:
    # 2 bits: scale = 2/3, offset = -1; (x+1)/scale = [0, 1.5, 2.25, 3] -> [0, 2, 2, 3]
    s, z = affine_qparams(X4, 2, symmetric=False, zero_point="float")
    assert z.item() == -1.0 and s.item() == (torch.tensor(2.0) / 3).item()
    assert affine_quantize(X4, s, z, 2, symmetric=False, zero_point="float").tolist() == [0, 2, 2, 3]
    y = _fq(X4, 2, False, "float")
    assert torch.equal(y, torch.tensor([0.0, 2.0, 2.0, 3.0]) * s.flatten() + -1.0)
    assert y[0] == -1.0 and y[3] == 1.0  # both ends exact
    # 4 bits: scale = 2/15; (x+1)/scale = [0, 7.4999995, 11.25, 15] -> [0, 7, 11, 15]
    s, z = affine_qparams(X4, 4, symmetric=False, zero_point="float")
    assert affine_quantize(X4, s, z, 4, symmetric=False, zero_point="float").tolist() == [0, 7, 11, 15]
    assert _fq(X4, 4, False, "float")[[0, 3]].tolist() == [-1.0, 1.0]


def test_asymmetric_int_zero_point_by_hand() -> None:
    # 2 bits: scale = 2/3, zp = round(1 / (2/3)) = round(1.5) = 2 (half-even);
    # codes = clamp(round(x/scale) + 2, 0, 3) = [0, 2, 3, 3]; values (q - 2) * scale.
    s, z = affine_qparams(X4, 2, symmetric=False, zero_point="int")
    assert z.item() == 2.0 and s.item() == (torch.tensor(2.0) / 3).item()
    q = affine_quantize(X4, s, z, 2, symmetric=False, zero_point="int")
    assert q.tolist() == [0, 2, 3, 3]
    assert torch.equal(_fq(X4, 2, False, "int"), torch.tensor([-2.0, 0.0, 1.0, 1.0]) * s.flatten())
    # 4 bits: scale = 2/15, zp = round(7.4999995) = 7, codes [0, 7, 11, 14]
    s, z = affine_qparams(X4, 4, symmetric=False, zero_point="int")
    assert z.item() == 7.0
    assert affine_quantize(X4, s, z, 4, symmetric=False, zero_point="int").tolist() == [0, 7, 11, 14]


def test_int_zero_point_range_includes_zero() -> None:
    # An all-positive group (a K channel with an offset): the range is widened to [0, max], so
    # the values are not clamped onto one code.
    x = torch.linspace(10.0, 11.0, 32)
    s, z = affine_qparams(x, 4, symmetric=False, zero_point="int")
    assert z.item() == 0.0 and s.item() == (torch.tensor(11.0) / 15).item()
    assert (_fq(x, 4, False, "int") - x).abs().max() <= s.item() / 2 + 1e-6


# ---------------------------------------------------------------- degenerate groups


@pytest.mark.parametrize("sym,zp", MODES)
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_zero_and_constant_groups(sym: bool, zp: str, bits: int) -> None:
    x = torch.zeros(3, 64)
    x[1, :32] = 0.7  # a constant group next to a zero group
    x[2, 32:] = -3.25
    y = _fq(x, bits, sym, zp, group_size=32)
    assert torch.isfinite(y).all()
    assert torch.equal(y[0], torch.zeros(64)) and torch.equal(y[1, 32:], torch.zeros(32))
    s, z = affine_qparams(x, bits, group_size=32, symmetric=sym, zero_point=zp)  # type: ignore[arg-type]
    assert torch.isfinite(s).all() and torch.isfinite(z).all() and s[0].eq(0).all()
    if not sym and zp == "float":
        assert (y[1, :32] == 0.7).all() and (y[2, 32:] == -3.25).all()  # exactly the constant
    else:
        assert torch.allclose(y[1, :32], torch.full((32,), 0.7)) and torch.allclose(y[2, 32:], torch.full((32,), -3.25))


# ---------------------------------------------------------------- layout, dtypes, errors


def test_qparams_shapes() -> None:
    x = torch.randn(2, 3, 128)
    s, z = affine_qparams(x, 4, group_size=32)
    assert s.shape == z.shape == (2, 3, 4, 1)
    s, z = affine_qparams(x, 4)
    assert s.shape == (2, 3, 1, 1)
    s, z = affine_qparams(x, 4, per_tensor=True, symmetric=False)
    assert s.shape == z.shape == (1, 1, 1, 1)
    assert s.item() == ((x.max() - x.min()) / torch.tensor(15.0)).item()


@pytest.mark.parametrize("sym,zp", MODES)
@pytest.mark.parametrize("layout", [{"group_size": 32}, {}, {"per_tensor": True}])
@pytest.mark.parametrize("rounding", ["half_even", "half_away"])
def test_quantize_dequantize_equals_fake_quant(sym: bool, zp: str, layout: dict, rounding: str) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 5, 64) * 3 + 0.5
    before = x.clone()
    for bits in (2, 3, 4, 8):
        kw = dict(symmetric=sym, zero_point=zp, **layout)
        s, z = affine_qparams(x, bits, **kw)  # type: ignore[arg-type]
        q = affine_quantize(x, s, z, bits, rounding=rounding, **kw)  # type: ignore[arg-type]
        assert q.dtype == torch.int32 and q.shape == x.shape
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if sym else (0, 2**bits - 1)
        assert q.min() >= lo and q.max() <= hi
        y = affine_dequantize(q, s, z, **kw)  # type: ignore[arg-type]
        assert torch.equal(y, _fq(x, bits, sym, zp, rounding, **layout))
    assert torch.equal(x, before)  # inputs are never modified


def test_error_shrinks_with_bits() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 128)
    for sym, zp in MODES:
        errs = [(_fq(x, b, sym, zp, group_size=32) - x).pow(2).mean().item() for b in range(2, 9)]
        assert all(a > b for a, b in itertools.pairwise(errs)), (sym, zp, errs)
    assert (_fq(x, 8, True, "int", group_size=32) - x).abs().max() < 0.02


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtype_preserved(dtype: torch.dtype) -> None:
    x = torch.randn(4, 64).to(dtype)
    y = _fq(x, 4, False, "float", group_size=32)
    assert y.dtype == dtype and y.shape == x.shape
    expected = _fq(x.float(), 4, False, "float", group_size=32).to(dtype)
    assert torch.equal(y, expected)


def test_config_errors() -> None:
    x = torch.randn(4, 96)
    bad = [
        dict(bits=1), dict(bits=9), dict(bits=4.0), dict(bits=True),
        dict(bits=4, group_size=64), dict(bits=4, group_size=0), dict(bits=4, group_size=-32),
        dict(bits=4, zero_point="fp16", symmetric=False), dict(bits=4, rounding="up"),
        dict(bits=4, per_tensor=True, group_size=32),
    ]
    for kw in bad:
        with pytest.raises(ConfigError):
            fake_quant_affine(x, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        affine_qparams(x, 4, group_size=7)
    with pytest.raises(ConfigError):
        fake_quant_affine(torch.ones(4, dtype=torch.int64), 4)
    with pytest.raises(ConfigError):
        fake_quant_affine(torch.tensor(1.0), 4)
    assert issubclass(ConfigError, ValueError)


def test_bytes_per_element() -> None:
    assert bytes_per_element_affine(4, 32, False, "float") == 20 / 32  # == llama.cpp Q4_1
    assert bytes_per_element_affine(8, 32, True, "int") == 34 / 32  # == Q8_0
    assert bytes_per_element_affine(4, 128, False, "int") == 0.5 + (2 + 0.5) / 128
    assert bytes_per_element_affine(2, 64, True, "float", scale_bytes=4) == 0.25 + 4 / 64
    with pytest.raises(ConfigError):
        bytes_per_element_affine(4, None, True, "int")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        bytes_per_element_affine(12, 32, True, "int")
