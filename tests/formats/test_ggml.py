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
    # blocks whose 1/d overflows float32 (max below ~3.7e-37 for q8_0, ~2.4e-38 for q4_0, ~4.4e-38 for
    # q4_1): x*id is ±inf, or NaN where x is 0; gguf (and ggml's C) store code 0 and a zero fp16 scale
    overflow = torch.randn(8, 32, generator=g) * torch.tensor([1e-36, 3.6e-37, 3.8e-37, 2e-38, 2.5e-38, 1e-38, 1e-40, 1e-45]).unsqueeze(1)
    overflow[2:, 5] = 0.0
    overflow[3, 7] = -0.0
    subnormal = torch.randint(-64, 64, (4, 32), generator=g).float() * 2.0**-149  # float32 subnormals, exact
    subnormal[1, :16] = 0.0
    # huge values: fp16 scales overflow to inf (d*0 is NaN in gguf too), max - min overflows float32
    huge = torch.randn(4, 32, generator=g) * torch.tensor([1e5, 1e30, 1e38, 3e38]).unsqueeze(1)
    huge[3, 0], huge[3, 1] = 3.4e38, -3.4e38
    # outlier-heavy: a Student-t-like tail, one channel 1e3 times larger
    heavy = torch.randn(8, 128, generator=g) ** 3
    heavy[:, 17] *= 1e3
    return {"normal": normal, "outliers": outliers, "zeros": zeros, "ties": ties, "negmax": negmax, "tiny": tiny, "big": big,
            "overflow": overflow, "subnormal": subnormal, "huge": huge, "heavy": heavy}


DATA = _datasets()


def assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Float32 arrays equal bit for bit: the sign of every zero counts, NaN matches NaN (any payload)."""
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    bad = got.view(np.uint32)[~nan] != want.view(np.uint32)[~nan]
    assert not bad.any(), f"{bad.sum()} of {bad.size} values differ, e.g. {got[~nan][bad][:4]} vs {want[~nan][bad][:4]}"


def _zero_min_unsigned(raw: np.ndarray, type_name: str) -> np.ndarray:
    """q4_1/q5_1 bytes with the sign of a zero ``m`` cleared. A block whose smallest values are +0 and
    -0 stores either: ggml's C loop keeps the first (``if (v < min)``), numpy's and torch's SIMD
    reductions do not say which. It never changes a value (``d*q + m`` is +0 either way)."""
    if type_name not in ("q4_1", "q5_1"):
        return raw
    blocks = raw.reshape(-1, ggml_block_shape(type_name)[1]).copy()
    zero_m = (blocks[:, 2] == 0) & ((blocks[:, 3] & 0x7F) == 0)
    blocks[zero_m, 3] = 0
    return blocks.reshape(raw.shape)


@pytest.mark.parametrize("type_name", LINEAR)
@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bit_identical_to_gguf(type_name: str, data: str, dtype: torch.dtype) -> None:
    # gguf-py (llama.cpp's numpy port of ggml-quants.c, the installed gguf package) is the peer: its
    # bytes, its dequantized values, and wkvlab's direct fake-quant path, bit for bit
    x = DATA[data].to(dtype)
    qt = _qt(type_name)
    with np.errstate(all="ignore"):  # gguf's own overflow warnings on the tiny and huge blocks
        ref_bytes = quantize(x.float().numpy(), qt)
        ref_vals = dequantize(ref_bytes, qt)
    raw = ggml_quantize(x, type_name)
    assert raw.dtype == torch.uint8 and raw.shape == ref_bytes.shape
    assert np.array_equal(_zero_min_unsigned(raw.numpy(), type_name), _zero_min_unsigned(ref_bytes, type_name))
    assert_same_bits(ggml_dequantize(torch.from_numpy(ref_bytes), type_name).numpy(), ref_vals)
    y = fake_quant_ggml(x, type_name)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert_same_bits(y.numpy(), ref_vals)


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_iq4_nl_values_are_what_gguf_decodes(data: str, dtype: torch.dtype) -> None:
    # gguf-py has no IQ4_NL quantizer (its IQ4_NL class only dequantizes), so for iq4_nl the peer
    # checks the decode side: gguf's values of wkvlab's bytes are wkvlab's fake-quant values, for
    # both llama-quantize's scale search (ntry 7) and the KV cache's runtime path (ntry -1)
    x = DATA[data].to(dtype)
    for ntry in (7, -1):
        raw = ggml_quantize(x, "iq4_nl", ntry=ntry)
        with np.errstate(all="ignore"):
            ref = dequantize(raw.numpy(), GGMLQuantizationType.IQ4_NL)
        assert_same_bits(fake_quant_ggml(x, "iq4_nl", ntry=ntry).numpy(), ref)
        assert_same_bits(ggml_dequantize(raw, "iq4_nl").numpy(), ref)


@pytest.mark.parametrize("type_name", [*GGML_TYPES, "q8_0-x86", "q8_K"])
def test_tiny_blocks_give_zero_not_nan(type_name: str) -> None:
    # 1/d overflows to inf for these blocks (gguf-py and ggml's C: id = d ? 1/d : 0 = inf), so x*id is
    # ±inf, and NaN where x == 0; the stored fp16 scale is 0 and every value comes back as a zero.
    # q8_0-x86 (id = 127/max) and q8_K (iscale = -127/max) overflow below 127/FLT_MAX = 3.7e-37 too.
    from wkvlab.formats import fake_quant_q8_K
    from wkvlab.formats.ggml_x86 import fake_quant_q8_0_x86

    # (q8_K keeps a float32 scale: only blocks of 256 whose max is below 3.7e-37 come back as zeros)
    for scale in (1e-38, 1e-40, 1e-45) if type_name == "q8_K" else (3.6e-37, 1e-38, 1e-40, 1e-45):
        x = torch.randn(8, 256, generator=torch.Generator().manual_seed(7)) * scale
        x[:, ::9] = 0.0
        if type_name == "q8_0-x86":
            y = fake_quant_q8_0_x86(x)
        elif type_name == "q8_K":
            y = fake_quant_q8_K(x)
        else:
            y = fake_quant_ggml(x, type_name)
        assert torch.equal(y, torch.zeros_like(x)), (scale, y.isnan().sum())  # -0.0 == 0.0: only the value is asserted
    if type_name == "q8_0-x86":  # code -128 (cvtps_epi32's 0x80000000, saturated by packs) times a zero scale: -0
        assert torch.signbit(fake_quant_q8_0_x86(torch.full((1, 32), 1e-38))).all()


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
    for data in [x, *(v for k, v in DATA.items() if k != "huge")]:  # huge: inf scales give NaN (as in gguf)
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
