"""Exactness properties of affine fake quantization: Q4_1 grids and idempotence."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from wkvlab.formats import affine_qparams, fake_quant_affine


def _grid(n: int, bits: int, d: torch.Tensor, m: torch.Tensor, seed: int) -> torch.Tensor:
    """Groups of 32 of the form q*d + m (float32 arithmetic, as gguf dequantizes), with q = 0 and 2^b-1 present."""
    g = torch.Generator().manual_seed(seed)
    levels = 2**bits - 1
    q = torch.randint(0, levels + 1, (n, 32), generator=g).float()
    q[:, 0], q[:, 1] = 0, levels
    q = q[:, torch.randperm(32, generator=g)]
    return (d * q) + m


def _fp16_pairs(n: int, seed: int, max_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d = torch.exp(torch.empty(n, 1).uniform_(-16, 3, generator=g)).half().float()
    ratio = torch.empty(n, 1).uniform_(-max_ratio, max_ratio, generator=g)
    m = (ratio * d).clamp(-60000, 60000)  # stay inside the fp16 range
    return d, m.half().float()


@pytest.mark.parametrize("bits", [4, 5])
def test_lattice_groups_are_reproduced_exactly(bits: int) -> None:
    # fp16 d and m like a dequantized Q4_1/Q5_1 block; |m| up to 1000 d covers every block
    # llama.cpp produces from data whose spread is not negligible against its offset.
    d, m = _fp16_pairs(20000, 0, 1000.0)
    x = _grid(20000, bits, d, m, 1)
    y = fake_quant_affine(x, bits, group_size=32, symmetric=False, zero_point="float")
    assert torch.equal(y, x)
    s, z = affine_qparams(x, bits, group_size=32, symmetric=False, zero_point="float")
    assert torch.equal(s.flatten(), d.flatten()) and torch.equal(z.flatten(), m.flatten())


def test_lattice_exact_whenever_grid_points_are_float32_exact() -> None:
    # The documented boundary: offsets up to 2^20 * d. Every group whose grid points q*d + m are
    # all exactly representable in float32 must come back bit for bit; others may not.
    d, m = _fp16_pairs(20000, 2, 2.0**20)
    x = _grid(20000, 4, d, m, 3)
    exact = ((d.double() * x.new_tensor(range(16)).double()) + m.double()).float().double() == (
        d.double() * x.new_tensor(range(16)).double() + m.double()
    )
    exact = exact.all(dim=-1)
    y = fake_quant_affine(x, 4, group_size=32, symmetric=False, zero_point="float")
    assert exact.sum() > 5000
    assert torch.equal(y[exact], x[exact])


@pytest.mark.parametrize("qtype,bits", [(GGMLQuantizationType.Q4_1, 4), (GGMLQuantizationType.Q5_1, 5)])
@pytest.mark.parametrize("scale,offset", [(1.0, 0.0), (1e-3, 0.0), (50.0, 0.0), (1.0, 3.0), (0.02, -0.05)])
def test_real_gguf_data_is_reproduced_exactly(qtype: GGMLQuantizationType, bits: int, scale: float, offset: float) -> None:
    torch.manual_seed(0)
    x = (torch.randn(64, 512) * scale + offset).numpy()
    x[3, 5] = 40 * scale  # an outlier
    xq = torch.from_numpy(dequantize(quantize(x, qtype), qtype))
    y = fake_quant_affine(xq, bits, group_size=32, symmetric=False, zero_point="float")
    assert torch.equal(y, xq)
    # and with llama.cpp's layout of the same data, viewed as [n_blocks, 32]
    assert torch.equal(fake_quant_affine(xq.reshape(-1, 32), bits, symmetric=False, zero_point="float"), xq.reshape(-1, 32))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("layout", [{"group_size": 32}, {}, {"per_tensor": True}])
@pytest.mark.parametrize("rounding", ["half_even", "half_away"])
def test_symmetric_is_idempotent(bits: int, layout: dict, rounding: str) -> None:
    torch.manual_seed(bits)
    x = torch.randn(256, 128) * torch.exp(torch.randn(256, 1) * 3)
    y = fake_quant_affine(x, bits, rounding=rounding, **layout)  # type: ignore[arg-type]
    assert torch.equal(fake_quant_affine(y, bits, rounding=rounding, **layout), y)  # type: ignore[arg-type]


@pytest.mark.parametrize("zero_point", ["int", "float"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_asymmetric_requantization(zero_point: str, bits: int) -> None:
    """Re-quantizing gives the same values up to a few ulps of the group's largest magnitude.

    The scale recomputed from the dequantized extremes can move by one ulp (see the affine module
    docstring), which moves ``q * scale`` by at most ``L`` ulps of the scale, i.e. about one ulp of
    the group range.
    """
    torch.manual_seed(bits)
    x = torch.randn(512, 128) * torch.exp(torch.randn(512, 1) * 2) + torch.randn(512, 1)
    kw = dict(group_size=32, symmetric=False, zero_point=zero_point)
    y = fake_quant_affine(x, bits, **kw)  # type: ignore[arg-type]
    y2 = fake_quant_affine(y, bits, **kw)  # type: ignore[arg-type]
    amax = y.abs().reshape(-1, 32).amax(dim=-1, keepdim=True)
    ulp = torch.nextafter(amax, torch.tensor(float("inf"))) - amax
    assert ((y2 - y).abs().reshape(-1, 32) <= 4 * ulp).all()
    # most groups are bit-exact fixed points already
    same = (y2 == y).reshape(-1, 32).all(dim=-1).float().mean().item()
    assert same > (0.95 if zero_point == "float" else 0.8)
    # and an fp16-scaled (Q4_1-like) result is an exact fixed point
    if zero_point == "float" and bits in (4, 5):
        xq = torch.from_numpy(dequantize(quantize(x.numpy(), _QT[bits]), _QT[bits]))
        assert torch.equal(fake_quant_affine(xq, bits, **kw), xq)  # type: ignore[arg-type]


_QT = {4: GGMLQuantizationType.Q4_1, 5: GGMLQuantizationType.Q5_1}


def test_requantization_codes_are_stable() -> None:
    from wkvlab.formats import affine_quantize

    torch.manual_seed(0)
    x = torch.randn(256, 64)
    for zp in ("int", "float"):
        kw = dict(group_size=32, symmetric=False, zero_point=zp)
        y = fake_quant_affine(x, 4, **kw)  # type: ignore[arg-type]
        q1 = affine_quantize(x, *affine_qparams(x, 4, **kw), 4, **kw)  # type: ignore[arg-type]
        q2 = affine_quantize(y, *affine_qparams(y, 4, **kw), 4, **kw)  # type: ignore[arg-type]
        assert np.array_equal(q1.numpy(), q2.numpy())
