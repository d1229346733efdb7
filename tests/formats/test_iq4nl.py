"""iq4_nl: gguf only dequantizes it, so in the fast tier quantization is checked against a scalar
transcription of ggml's C reference (quantize_row_iq4_nl_impl, read from ggml/src/ggml-quants.c)
evaluated with numpy float32 scalars, one operation at a time in C order. The peer itself — ggml's
compiled quantize_iq4_nl / quantize_row_iq4_nl_ref from llama-cpp-python's libggml-base — runs in the
slow tier (tests/formats/test_ggml_compiled.py), which found that C leaves a zero-scale block's runtime
codes unwritten (values 0 either way)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from wkvlab.formats import fake_quant_ggml, ggml_dequantize, ggml_quantize
from wkvlab.formats._iq4nl import KVALUES_IQ4NL, iq4nl_encode

f32 = np.float32
KV = KVALUES_IQ4NL


def _best_index_int8(x: np.float32) -> int:
    """ggml-quants.c's best_index_int8, transcribed literally: a binary search, then the float32
    comparison ``x - val[mu-1] < val[mu] - x ? mu-1 : mu`` (so an exact midpoint goes up)."""
    val = [f32(v) for v in KV]
    if x <= val[0]:
        return 0
    if x >= val[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < val[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if f32(x - val[mu - 1]) < f32(val[mu] - x) else mu


def test_the_lookup_table_agrees_with_upstreams_search_around_every_midpoint():
    # wkvlab indexes a table by floor(2x) (2x >= v[i-1] + v[i]: exact integer sums) instead of
    # upstream's subtraction; the two must agree, above all on and next to the midpoints
    from wkvlab.formats._iq4nl import _codebook, _lookup, _lut_pos

    xs = []
    for i in range(1, 16):
        lo = hi = f32((KV[i - 1] + KV[i]) / 2)
        xs.append(lo)
        for _ in range(300):
            lo, hi = np.nextafter(lo, f32(-1e9), dtype=np.float32), np.nextafter(hi, f32(1e9), dtype=np.float32)
            xs += [lo, hi]
    xs += list(np.random.default_rng(0).uniform(-140, 130, 20000).astype(np.float32))
    _, idx, _ = _codebook(torch.device("cpu"))
    x = torch.tensor(np.array(xs, dtype=np.float32))
    got = _lookup(idx, _lut_pos(x + x)).tolist()
    assert got == [_best_index_int8(v) for v in xs]
    assert _best_index_int8(f32(-4.5)) == 8 and _best_index_int8(f32(-4.500001)) == 7  # the midpoint of -10 and 1 goes up


def _sums(xb: np.ndarray, weight: list[np.float32], inv: np.float32) -> tuple[np.float32, np.float32, list[int]]:
    sumqx, sumq2, codes = f32(0), f32(0), []
    for j in range(32):
        al = f32(inv * xb[j])
        l = _best_index_int8(al)
        codes.append(l)
        q, w = f32(KV[l]), weight[j]
        sumqx = f32(sumqx + f32(f32(w * q) * xb[j]))
        sumq2 = f32(sumq2 + f32(f32(w * q) * q))
    return sumqx, sumq2, codes


def _ref_block(xb: np.ndarray, ntry: int) -> bytes:
    weight = [f32(v * v) for v in xb]
    amax, mx = f32(0), f32(0)
    for v in xb:
        if f32(abs(v)) > amax:
            amax, mx = f32(abs(v)), v
    if amax < f32(1e-15):
        scale, codes = f32(0), [0] * 32
    else:
        d = f32(-mx / f32(KV[0])) if ntry > 0 else f32(mx / f32(KV[0]))
        sumqx, sumq2, codes = _sums(xb, weight, f32(f32(1) / d))
        d = f32(sumqx / sumq2) if sumq2 > 0 else f32(0)
        best = f32(d * sumqx)
        for itry in range(-ntry, ntry + 1):
            sumqx, sumq2, _ = _sums(xb, weight, f32(f32(itry + KV[0]) / mx))
            if sumq2 > 0 and f32(sumqx * sumqx) > f32(best * sumq2):
                d = f32(sumqx / sumq2)
                best = f32(d * sumqx)
        scale = d
    if ntry > 0:
        inv = f32(f32(1) / scale) if scale else f32(0)
        codes = [_best_index_int8(f32(inv * v)) for v in xb]
    qs = bytes(codes[j] | (codes[j + 16] << 4) for j in range(16))
    return np.float16(scale).tobytes() + qs


def _ref_quantize(x: np.ndarray, ntry: int) -> np.ndarray:
    blocks = x.astype(np.float32).reshape(-1, 32)
    out = b"".join(_ref_block(b, ntry) for b in blocks)
    return np.frombuffer(out, dtype=np.uint8).reshape(*x.shape[:-1], x.shape[-1] // 32 * 18)


def _data() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 32, generator=g)
    x[1] = 0.0
    x[2] = torch.randn(32, generator=g) * 1e-16  # below GROUP_MAX_EPS
    x[3, 4] = -25.0  # negative outlier
    x[4, 4], x[4, 9] = 3.0, -3.0  # +a/-a tie for the largest element
    x[5] = 2.5  # constant block
    x[6] = -torch.rand(32, generator=g)
    x[7] = torch.randint(-8, 8, (32,), generator=g).float()  # small integers: ties to midpoints
    x[8] = torch.randn(32, generator=g) * 1e4
    x[9] = torch.randn(32, generator=g) ** 3  # heavy tails
    return x.reshape(10, 128)


@pytest.mark.parametrize("ntry", [7, -1])
def test_bytes_match_c_transcription(ntry: int) -> None:
    x = _data()
    raw = ggml_quantize(x, "iq4_nl", ntry=ntry)
    assert raw.shape == (10, 4 * 18)
    assert np.array_equal(raw.numpy(), _ref_quantize(x.numpy(), ntry))


@pytest.mark.parametrize("ntry", [7, -1])
def test_dequantize_matches_gguf(ntry: int) -> None:
    torch.manual_seed(1)
    x = torch.cat([_data(), torch.randn(30, 128)])
    raw = ggml_quantize(x, "iq4_nl", ntry=ntry)
    ref = dequantize(raw.numpy(), GGMLQuantizationType.IQ4_NL)
    assert np.array_equal(ggml_dequantize(raw, "iq4_nl").numpy(), ref)
    assert np.array_equal(fake_quant_ggml(x, "iq4_nl", ntry=ntry).numpy(), ref)
    # arbitrary bytes (any code, any fp16 scale) decode like gguf too
    rnd = torch.randint(0, 256, (16, 18 * 4), dtype=torch.uint8)
    rnd[:, 0::18] = torch.randint(0, 0x7B, (16, 4), dtype=torch.uint8)  # keep scales finite
    rnd[:, 1::18] = torch.randint(0, 0x7B, (16, 4), dtype=torch.uint8)
    assert np.array_equal(ggml_dequantize(rnd, "iq4_nl").numpy(), dequantize(rnd.numpy(), GGMLQuantizationType.IQ4_NL))


def test_codes_are_nearest_for_the_chosen_scale() -> None:
    torch.manual_seed(2)
    x = torch.randn(512, 32)
    d, codes = iq4nl_encode(x, 7)
    vals = torch.tensor(KV, dtype=torch.float64)
    al = (x.double() / d.double())  # [n, 32]
    dist = (al.unsqueeze(-1) - vals).abs()  # [n, 32, 16]
    chosen = dist.gather(-1, codes.unsqueeze(-1)).squeeze(-1)
    assert (chosen <= dist.amin(dim=-1) + 1e-4).all()


def test_error_below_q4_0() -> None:
    # Bell-shaped and heavy-tailed data, what the codebook is built for. (On uniform data the
    # non-linear grid is no better than q4_0's, as expected.)
    torch.manual_seed(3)
    laplace = torch.distributions.Laplace(0.0, 1.0).sample((128, 256))
    for x in (torch.randn(128, 256), torch.randn(128, 256) ** 3, laplace):
        e_iq4 = (fake_quant_ggml(x, "iq4_nl") - x).pow(2).mean()
        e_q40 = (fake_quant_ggml(x, "q4_0") - x).pow(2).mean()
        e_ref = (fake_quant_ggml(x, "iq4_nl", ntry=-1) - x).pow(2).mean()
        assert e_iq4 < e_q40 and e_iq4 <= e_ref
