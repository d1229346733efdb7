"""iq4_nl and q8_K against compiled ggml itself (the slow tier: llama-cpp-python builds it, ``make test-all``).

gguf-py only dequantizes IQ4_NL, so the quantizer's peer is ggml's C: ``quantize_iq4_nl`` (llama-quantize's
scale search, ntry 7) and ``quantize_row_iq4_nl_ref`` (the CPU backend's ``from_float``: a KV cache
of type iq4_nl, ntry -1), both ``GGML_API`` exports of ``libggml-base`` from ``ggml/src/ggml-quants.c``,
called through ctypes on random, outlier-heavy and boundary blocks, from float32 and bf16 inputs, byte
for byte. llama-cpp-python builds ggml with ``GGML_NATIVE=OFF`` (the Makefile): x86-64 code without FMA, the
strict-IEEE build wkvlab's encoder reproduces (see :mod:`wkvlab.formats._iq4nl`). ``WKVLAB_GGML_LIB``
names another library holding these functions (e.g. ggml-quants.c compiled alone, with -DNDEBUG as a
release build: ``nearest_int``'s assert would stop a block whose ``iscale`` overflows). q8_K (the matmul
input of K-quant weights, never in a file, so gguf-py has no port) goes through ``quantize_row_q8_K_ref`` and
``dequantize_row_q8_K``, compared value for value."""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.formats.test_iq4nl import _data
from wkvlab.formats import ggml_quantize


def _library() -> ctypes.CDLL:
    path = os.environ.get("WKVLAB_GGML_LIB")
    if not path:
        llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (make test-all) ships libggml-base")
        found = sorted(Path(llama_cpp.__file__).parent.glob("lib/libggml-base*.so*")) + sorted(Path(llama_cpp.__file__).parent.glob("lib/libggml-base*.dylib"))
        if not found:
            pytest.skip("llama-cpp-python has no libggml-base next to it")
        path = str(found[0])
    lib = ctypes.CDLL(path)
    lib.quantize_iq4_nl.restype = ctypes.c_size_t
    lib.quantize_iq4_nl.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    for name in ("quantize_row_iq4_nl_ref", "quantize_row_q8_K_ref", "dequantize_row_q8_K"):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return lib


def ggml_iq4_nl(x: torch.Tensor, ntry: int) -> np.ndarray:
    """ggml's bytes for ``x`` (``[rows, n]``, float32): quantize_iq4_nl (ntry 7) or quantize_row_iq4_nl_ref (-1)."""
    lib = _library()
    src = np.ascontiguousarray(x.float().numpy(), dtype=np.float32)
    rows, n = src.shape
    dst = np.zeros((rows, n // 32 * 18), dtype=np.uint8)
    if ntry == 7:
        assert lib.quantize_iq4_nl(src.ctypes.data, dst.ctypes.data, rows, n, None) == dst.size
    else:
        lib.quantize_row_iq4_nl_ref(src.ctypes.data, dst.ctypes.data, src.size)
    return dst


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    outliers = torch.randn(64, 128, generator=g)
    outliers[torch.rand(64, 128, generator=g) < 0.02] *= 50
    tiny = torch.randn(4, 128, generator=g) * torch.tensor([1e-14, 1e-16, 1e-30, 1e-38]).unsqueeze(1)  # around GROUP_MAX_EPS
    return {"boundary": _data(), "normal": torch.randn(200, 128, generator=g), "outliers": outliers, "tiny": tiny,
            "heavy": torch.randn(64, 128, generator=g) ** 3}


@pytest.mark.slow
@pytest.mark.parametrize("ntry", [7, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_iq4_nl_bytes_match_compiled_ggml(ntry, dtype):
    for name, x in _inputs().items():
        x = x.to(dtype)
        got = ggml_quantize(x, "iq4_nl", ntry=ntry).numpy().reshape(-1, 18).copy()
        want = ggml_iq4_nl(x, ntry).reshape(-1, 18).copy()
        if ntry == -1:
            # a block below GROUP_MAX_EPS gets scale 0 and `continue`s before its codes L[] are written, and
            # without the ntry > 0 recode nothing writes them: C packs whatever L holds (the previous block's
            # codes in quantize_row_iq4_nl_ref's stack array). Times a zero scale every value is 0 either way.
            zero_scale = (want[:, :2] == 0).all(axis=1)
            assert np.array_equal(zero_scale, (got[:, :2] == 0).all(axis=1))
            got[zero_scale, 2:] = want[zero_scale, 2:] = 0
        blocks = (got != want).any(axis=1)
        assert not blocks.any(), f"{name}: {int(blocks.sum())} of {blocks.size} blocks differ"


QK_K, Q8_K_BYTES = 256, 4 + 256 + 2 * 16  # block_q8_K: float d, int8 qs[256], int16 bsums[16]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_q8_K_values_match_compiled_ggml(dtype):
    from wkvlab.formats import fake_quant_q8_K

    lib = _library()
    g = torch.Generator().manual_seed(6)
    x = torch.randn(24, 512, generator=g)
    x[0, :256] = 0.0
    x[1, :256] = torch.randn(256, generator=g) * 1e-38  # iscale = -127/max overflows: values ±0 (0 * inf: NaN unless handled)
    x[1, 5] = 0.0
    x[2, 7], x[2, 9] = 4.0, -4.0  # a +a/-a tie for the largest magnitude (the first wins)
    x[3] = torch.randn(512, generator=g) ** 3 * 100
    x[4, :256] = (torch.arange(256) % 9 - 4) * 127 / 4.0 / 127  # codes on exact ties
    x = x.to(dtype).float()
    src = np.ascontiguousarray(x.numpy())
    blocks = np.zeros(src.size // QK_K * Q8_K_BYTES, dtype=np.uint8)
    out = np.zeros_like(src)
    lib.quantize_row_q8_K_ref(src.ctypes.data, blocks.ctypes.data, src.size)
    lib.dequantize_row_q8_K(blocks.ctypes.data, out.ctypes.data, src.size)
    got = fake_quant_q8_K(x).numpy()
    assert np.array_equal(got, out)  # -0.0 == 0.0: the sign of a zero is not compared
