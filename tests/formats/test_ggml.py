"""ggml block formats against the llama.cpp reference (gguf.quants), bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from wkvlab.errors import ConfigError
from wkvlab.formats import (
    GGML_TYPES,
    fake_quant_ggml,
    ggml_block_shape,
    ggml_bytes_per_element,
    ggml_dequantize,
    ggml_quantize,
)

LINEAR = ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]


def _qt(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name.upper()]


def _datasets() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(8, 256, generator=g)
    outliers = torch.randn(8, 256, generator=g)
    outliers[torch.rand(8, 256, generator=g) < 0.02] *= 100
    zeros = torch.randn(4, 128, generator=g)
    zeros[1] = 0
    zeros[2, 32:64] = 0
    zeros[3, :32] = -0.0
    # exact ties: blocks whose scale is exactly 1 so that x * id lands on k + 0.5
    ties = torch.zeros(6, 32)
    ties[0] = torch.arange(32) - 15.5  # q8_0 needs amax 127 for d = 1:
    ties[0, 0] = -127.0
    ties[1] = (torch.arange(32) % 16) - 7.5  # q4_0: max -8 gives d = 1, x + 8.5 integral
    ties[1, 3] = -8.0
    ties[2] = (torch.arange(32) % 15) + 0.5  # q4_1: min 0, max 15 gives d = 1
    ties[2, 0], ties[2, 1] = 0.0, 15.0
    ties[3] = torch.linspace(-16, 15, 32) + 0.5  # q5_0
    ties[3, 0] = -16.0
    ties[4] = (torch.arange(32) % 31) + 0.5  # q5_1
    ties[4, 0], ties[4, 1] = 0.0, 31.0
    ties[5] = torch.randn(32, generator=g)  # fp16 tie of the scale: d = 1 + 2^-11 rounds to even (1.0)
    ties[5, 7] = 127 * (1 + 2.0**-11)
    # negative maxima, including +a/-a ties (the first one wins in ggml)
    negmax = torch.randn(6, 64, generator=g)
    negmax[0, 5] = -9.0
    negmax[1, 3], negmax[1, 9] = 5.0, -5.0
    negmax[2, 3], negmax[2, 9] = -5.0, 5.0
    negmax[3, :32] = -torch.rand(32, generator=g)  # an all-negative block
    negmax[4, 40] = -1e4
    negmax[5, 32:] = 3.0  # a constant block
    tiny = torch.randn(2, 64, generator=g) * 1e-20  # subnormal-range fp16 scales
    big = torch.randn(2, 64, generator=g) * 1e4
    return {"normal": normal, "outliers": outliers, "zeros": zeros, "ties": ties, "negmax": negmax, "tiny": tiny, "big": big}


DATA = _datasets()


@pytest.mark.parametrize("type_name", LINEAR)
@pytest.mark.parametrize("data", list(DATA))
def test_bit_identical_to_gguf(type_name: str, data: str) -> None:
    x = DATA[data]
    qt = _qt(type_name)
    ref_bytes = quantize(x.numpy(), qt)
    raw = ggml_quantize(x, type_name)
    assert raw.dtype == torch.uint8 and raw.shape == ref_bytes.shape
    assert np.array_equal(raw.numpy(), ref_bytes)
    ref_vals = dequantize(ref_bytes, qt)
    assert np.array_equal(ggml_dequantize(torch.from_numpy(ref_bytes), type_name).numpy(), ref_vals)
    y = fake_quant_ggml(x, type_name)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert np.array_equal(y.numpy(), ref_vals)  # also sign of zero


@pytest.mark.parametrize("type_name", LINEAR)
def test_rounding_mode_matters_on_ties(type_name: str) -> None:
    # Row i of DATA["ties"] has d = 1 for type i by construction, so every x * id lands on k + 0.5.
    # Hand values from ggml-quants.c's reference formulas (gguf.quants ports them):
    #   q8_0: roundf(x)                      -> half AWAY from zero
    #   q4_0/q5_0: MIN(15, trunc(x + 8.5)) - 8 (31, 16.5, 16); q4_1/q5_1: trunc((x - 0) + 0.5) -> a tie goes UP (+inf),
    #   and on the positive side q4_0/q5_0 clip at code 15/31 (value 7/15: one level less than the negative side)
    row = {"q8_0": 0, "q4_0": 1, "q4_1": 2, "q5_0": 3, "q5_1": 4}[type_name]
    x = DATA["ties"][row : row + 1].double()
    ties = (x - torch.floor(x)) == 0.5
    assert ties.sum() >= 15  # the row really is made of ties
    want = torch.sign(x) * torch.floor(x.abs() + 0.5) if type_name == "q8_0" else torch.floor(x + 0.5)
    if type_name in ("q4_0", "q5_0"):
        want = want.clamp(max=7 if type_name == "q4_0" else 15)
    got = fake_quant_ggml(x.float(), type_name).double()
    assert torch.equal(got, want), (got - want)[got != want]
    # neither rule is torch's half-to-even: each type differs from torch.round on some ties
    assert not torch.equal(got[ties], torch.round(x)[ties])
    if type_name == "q8_0":  # and q8_0's rule is not "ties up": the negative ties go down
        assert not torch.equal(got[ties], torch.floor(x + 0.5)[ties])


@pytest.mark.parametrize("type_name", GGML_TYPES)
def test_other_dtypes_and_shapes(type_name: str) -> None:
    torch.manual_seed(3)
    x = torch.randn(2, 3, 96)
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        xd = x.to(dt)
        before = xd.clone()
        y = fake_quant_ggml(xd, type_name)
        assert y.dtype == torch.float32 and y.shape == x.shape
        assert torch.equal(y, fake_quant_ggml(xd.float(), type_name))
        assert torch.equal(xd, before)
    raw = ggml_quantize(x, type_name)
    block, size = ggml_block_shape(type_name)
    assert raw.shape == (2, 3, 96 // block * size)
    assert torch.equal(ggml_dequantize(raw, type_name), fake_quant_ggml(x, type_name))


@pytest.mark.parametrize("type_name", LINEAR)
def test_idempotent(type_name: str) -> None:
    torch.manual_seed(4)
    x = torch.randn(64, 256)
    x[0, 3] = 30.0
    for data in [x, *DATA.values()]:
        y = fake_quant_ggml(data, type_name)
        assert torch.equal(fake_quant_ggml(y, type_name), y)


def test_iq4_nl_requantization() -> None:
    """The runtime path (ntry=-1) is idempotent. The model-file path (ntry=7) is not quite:
    llama.cpp's scale search does not always find the scale of a block that is already on the
    grid (its candidates are tied to the largest element, which need not sit on code 0). A
    small share of blocks moves once, after which the result is a fixed point."""
    torch.manual_seed(4)
    x = torch.randn(256, 256)
    y = fake_quant_ggml(x, "iq4_nl", ntry=-1)
    assert torch.equal(fake_quant_ggml(y, "iq4_nl", ntry=-1), y)
    y = fake_quant_ggml(x, "iq4_nl")
    y2 = fake_quant_ggml(y, "iq4_nl")
    moved = (y2 != y).reshape(-1, 32).any(dim=-1).float().mean().item()
    assert moved < 0.02
    assert (y2 - y).pow(2).mean() < 0.02 * (y - x).pow(2).mean()
    assert torch.equal(fake_quant_ggml(y2, "iq4_nl"), y2)


def test_block_shapes_and_sizes() -> None:
    assert GGML_TYPES == ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")
    expected = {"q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18)}
    for name, shape in expected.items():
        assert ggml_block_shape(name) == shape == GGML_QUANT_SIZES[_qt(name)]
        assert ggml_bytes_per_element(name) == shape[1] / 32
    assert ggml_bytes_per_element("q8_0") == 34 / 32


def test_errors() -> None:
    with pytest.raises(ConfigError):
        fake_quant_ggml(torch.zeros(4, 48), "q4_0")
    with pytest.raises(ConfigError):
        ggml_quantize(torch.zeros(4, 32), "q4_k")
    with pytest.raises(ConfigError):
        ggml_block_shape("f16")
    with pytest.raises(ConfigError):
        ggml_dequantize(torch.zeros(4, 19, dtype=torch.uint8), "q4_0")
    with pytest.raises(ConfigError):
        ggml_dequantize(torch.zeros(4, 18), "q4_0")
    with pytest.raises(ConfigError):
        fake_quant_ggml(torch.zeros(32, dtype=torch.int32), "q8_0")
    with pytest.raises(ConfigError):
        fake_quant_ggml(torch.zeros(32), "iq4_nl", ntry=1.5)  # type: ignore[arg-type]
