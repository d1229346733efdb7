"""IQ4_NL block quantization (scale search), vectorized over blocks.

``gguf.quants`` only implements IQ4_NL *de*quantization, so the encoder follows ggml's C code in
``ggml/src/ggml-quants.c`` (llama.cpp, read from the upstream source, not reconstructed from
memory): ``quantize_row_iq4_nl_impl`` with ``super_block_size = block_size = 32`` and no
importance matrix, so the weights are ``w_j = x_j**2``. Two callers differ only in ``ntry``:

* ``quantize_iq4_nl`` (``ntry = 7``) is what ``llama-quantize`` / ``ggml_quantize_chunk`` use to
  write model files; it is the default here.
* ``quantize_row_iq4_nl_ref`` (``ntry = -1``: no search, codes from the first pass) is the CPU
  backend's ``from_float``, i.e. what a llama.cpp KV cache of type ``iq4_nl`` stores at runtime.

Per block (``values`` = the 16-entry codebook ``kvalues_iq4nl``, ``max`` = the element of largest
magnitude, first one on ties):

1. ``amax < 1e-15`` → scale 0 and codes 0 (step 4 still recodes them when ``ntry > 0``).
2. First pass with ``d = -max / values[0]`` (``max / values[0]`` when ``ntry <= 0``): codes are the
   nearest codebook entries of ``x / d``; the scale is refined by weighted least squares
   ``d = Σ w q x / Σ w q²``, and ``best = d * Σ w q x``.
3. For ``itry`` in ``-ntry..ntry``: inverse scale ``(itry + values[0]) / max``, nearest codes, and
   the least-squares scale replaces the current one if ``(Σwqx)² > best * Σwq²`` (strictly).
4. The fp16 scale is ``fp16(d)``; when ``ntry > 0`` the codes are recomputed as the nearest entries
   of ``x / d`` with the float32 ``d``.

Float semantics are reproduced operation by operation: products in the C evaluation order
(``(w*q)*x``), sums accumulated sequentially in float32 over j = 0..31 (a vectorized ``sum`` would
reassociate), and the nearest-entry search of ``best_index_int8``. Upstream searches the codebook
and returns ``x - v[mu-1] < v[mu] - x ? mu-1 : mu`` in float32 (an exact midpoint goes up); here a
table indexed by ``floor(2x)`` encodes the rule ``2x >= v[i-1] + v[i]`` (exact: the sums are
integers). That is different code with the same answers — tests/formats/test_iq4nl.py compares it
with a literal transcription of upstream's search on every float32 within 300 ulps of each
midpoint and 20k random values.

This matches a strict-IEEE build of that C code (``-ffp-contract=off``) byte for byte (checked on
100k blocks of varied data). Builds that contract ``sumqx += w*q*x`` into FMAs (GCC's default with
``-march=native``, clang's default) round the sums differently and so pick another, equally good
scale in near-ties: about 0.15% of blocks of Gaussian data (more on integer-valued data), with the
same error to 6 digits. NaN/inf inputs give unspecified codes (no exception), as in llama.cpp.
"""
from __future__ import annotations

import torch
from torch import Tensor

from wkvlab.formats._checks import const_like, device_constant

KVALUES_IQ4NL: tuple[int, ...] = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

QK_IQ4NL = 32

# ggml-quants.c: #define GROUP_MAX_EPS 1e-15f
_GROUP_MAX_EPS = 1e-15

# Blocks per chunk: bounds the [32, chunk, 2*ntry+2] temporaries (~2 MiB per 1k blocks at ntry=7).
_CHUNK = 8192

_LUT_HALF = 256


def _codebook(device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """(values [16], code LUT [513], value LUT [513]); the LUTs are indexed by ``floor(2*al) + 256``.

    The nearest entry (``best_index_int8``'s answer, see the module docstring) is the largest i with
    ``2*al >= v[i-1] + v[i]``. The right-hand sides
    are integers, so ``2*al >= m`` iff ``floor(2*al) >= m``: the index depends only on
    ``floor(2*al)``, and clamping that to [-256, 256] (beyond every midpoint sum, -231..202)
    changes nothing. The table lookup is several times faster than ``torch.bucketize``.
    """
    vals = torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=device)
    grid = torch.arange(-_LUT_HALF, _LUT_HALF + 1, dtype=torch.float32, device=device)
    idx = torch.bucketize(grid, vals[:-1] + vals[1:], right=True)
    return vals, idx, vals[idx]


def _lut_pos(al2: Tensor) -> Tensor:
    """LUT row for ``al2 = 2*al``; NaN maps to a valid row so that bad input cannot crash."""
    pos = torch.floor(torch.nan_to_num(al2, nan=0.0)).clamp_(-_LUT_HALF, _LUT_HALF).add_(_LUT_HALF)
    return pos.to(torch.int64)


def _lookup(table: Tensor, pos: Tensor) -> Tensor:
    return table.index_select(0, pos.reshape(-1)).view(pos.shape)


def _encode_chunk(x: Tensor, ntry: int, luts: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    # Work in a [32, n, T] layout (element j first) so that the sequential sums over j walk
    # contiguous slices. T = 1 + (2*ntry + 1) candidate inverse scales per block.
    dev = x.device
    _, lut_idx, lut_q = luts
    one = const_like(x, 1.0)
    v0 = float(KVALUES_IQ4NL[0])
    ax = x.abs()
    imax = ax.argmax(dim=-1, keepdim=True)
    tiny = (ax.gather(-1, imax) < _GROUP_MAX_EPS).squeeze(-1)
    mx = x.gather(-1, imax)  # [n, 1], the signed element of largest magnitude (first on ties)

    v0_t = const_like(x, v0)
    d0 = (-mx) / v0_t if ntry > 0 else mx / v0_t  # C: ntry > 0 ? -max/values[0] : max/values[0]
    # C: id = (itry + values[0])/max for itry = -ntry..ntry (integer numerators, exact in float)
    n_trials = max(2 * ntry + 1, 0)  # no trials for ntry = -1
    numer = torch.arange(n_trials, dtype=torch.float32, device=dev) + (v0 - ntry)
    inv_t = torch.cat([one / d0, numer / mx], dim=-1)  # [n, T]
    t_count = inv_t.shape[1]

    xt = x.t().contiguous().unsqueeze(-1)  # [32, n, 1]
    # 2*(id*x) == (2*id)*x exactly (scaling by 2 commutes with rounding); saves a full pass.
    pos = _lut_pos((inv_t + inv_t) * xt)  # [32, n, T]
    q = _lookup(lut_q, pos)
    wq = (xt * xt) * q  # C: w*q with w = x*x
    pqx = wq * xt  # C: w*q*xb[j]
    pq2 = wq * q  # C: w*q*q
    sqx, sq2 = pqx[0].clone(), pq2[0].clone()
    for j in range(1, QK_IQ4NL):  # sequential float32 accumulation, like the C loop
        sqx.add_(pqx[j])
        sq2.add_(pq2[j])

    ok = sq2[:, 0] > 0
    d = torch.where(ok, sqx[:, 0] / torch.where(ok, sq2[:, 0], one), torch.zeros_like(sqx[:, 0]))
    best = d * sqx[:, 0]
    for t in range(1, t_count):
        s1, s2 = sqx[:, t], sq2[:, t]
        better = (s2 > 0) & (s1 * s1 > best * s2)
        dt = s1 / torch.where(s2 > 0, s2, one)
        d = torch.where(better, dt, d)
        best = torch.where(better, dt * s1, best)

    d = torch.where(tiny, torch.zeros_like(d), d)
    if ntry > 0:
        nz = d != 0
        inv_d = torch.where(nz, one / torch.where(nz, d, one), torch.zeros_like(d)).unsqueeze(-1)
        codes = _lookup(lut_idx, _lut_pos((inv_d + inv_d) * x))
    else:
        first = _lookup(lut_idx, pos[:, :, 0]).t()
        codes = torch.where(tiny.unsqueeze(-1), torch.zeros_like(first), first)
    return d.unsqueeze(-1), codes


def iq4nl_encode(blocks: Tensor, ntry: int = 7) -> tuple[Tensor, Tensor]:
    """Float32 scales ``[n, 1]`` (before fp16 rounding) and int64 codes ``[n, 32]`` for ``[n, 32]`` blocks."""
    if blocks.shape[0] == 0:
        return blocks.new_zeros((0, 1)), torch.zeros((0, QK_IQ4NL), dtype=torch.int64, device=blocks.device)
    luts = device_constant("iq4nl_luts", blocks.device, _codebook)
    ds, cs = [], []
    for chunk in blocks.split(_CHUNK):
        d, c = _encode_chunk(chunk, ntry, luts)
        ds.append(d)
        cs.append(c)
    return torch.cat(ds), torch.cat(cs)


def iq4nl_values(codes: Tensor) -> Tensor:
    """Float32 codebook values for integer codes (any shape)."""
    vals = device_constant("iq4nl_values", codes.device, lambda device: torch.tensor(KVALUES_IQ4NL, dtype=torch.float32, device=device))
    return _lookup(vals, codes.long())
