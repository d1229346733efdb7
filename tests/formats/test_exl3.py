"""ExLlamaV3's cache rotation in the kernel's butterfly order (q_cache_kernels.cuh @4f8ad012):
hand-computed codes and values on structured groups, and the kernel's lane/shuffle structure."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from wkvlab.formats.exl3 import R32, exl3_encode, fake_quant_exl3, kernel_hadamard32
from wkvlab.formats.hadamard import hadamard_matrix

H32 = (hadamard_matrix(32) * 32**0.5).round().long()  # the ±1 Sylvester matrix, exact integers


def _structured() -> torch.Tensor:
    """Integer groups whose exact Hadamard transform takes only the values -a, 0, a: every code is
    known by hand (a → 2^b − 1, −a → 0, 0 → m, exactly on the code boundary floor(0·m + m) = m)."""
    rows = []
    for i, j in [(0, 1), (3, 17), (5, 30), (31, 8)]:
        for sign in (1, -1):
            v = torch.zeros(32)
            v[i] += 1
            v[j] += sign
            rows.append(v * 3)
    rows.append(torch.ones(32))  # a constant group: (32, 0, ..., 0)
    rows.append(torch.cat([torch.full((16,), -2.0), torch.zeros(16)]))  # H·x = (−32, 0, …, −32 at 16, 0, …)
    return torch.stack(rows)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_structured_groups_hand_computed(bits):
    x = _structured().half()  # what the kernel reads: fp16
    hx = x.double().round().long() @ H32.T  # exact integers
    a = hx.abs().amax(dim=-1, keepdim=True)
    assert set(hx.abs().unique().tolist()) <= {0, 2 * 3, 32}  # the -a / 0 / a structure
    # rotated values: the integer butterflies are exact, then one float32 product with the kernel's r32
    y = kernel_hadamard32(x.float()) * torch.tensor(R32, dtype=torch.float32)
    assert torch.equal(y, (hx.float() * torch.tensor(R32, dtype=torch.float32)))
    m = 2 ** (bits - 1)
    want_q = torch.where(hx == a, 2 * m - 1, torch.where(hx == -a, 0, m)).float()
    q, scale = exl3_encode(x, bits)
    assert torch.equal(q.reshape(want_q.shape), want_q)
    # values: levels (q − m + 1/2)·sm with sm = fp16(s)·r32·(1/m) in float32, rotated back by the
    # unnormalized H32 — here in exact float64, rounded once to fp16 (the kernel's float32 sums round
    # to the same fp16 values on these groups)
    s16 = (a.double() * float(np.float32(R32)) + 1e-10).float().half()  # s = |y|max + 1e-10f, stored as fp16
    sm = (s16.float() * torch.tensor(R32, dtype=torch.float32)) * (1.0 / m)  # float32, as the kernel
    levels = (want_q.double() - (m - 0.5)) * sm.double()
    want = (levels @ H32.T.double()).half()
    assert torch.equal(fake_quant_exl3(x, bits), want)


def test_a_matrix_product_misses_the_code_boundary():
    # the previous rotation (x @ H/√32 in float32) rounds every product and partial sum: the exact zeros
    # of H·x come out as ±1 ulp, floor(±ε·m + m) flips codes by a full step, and the values move
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-4, 5, (256, 32), generator=g).half()
    exact = (x.double().round().long() @ H32.T).float() * torch.tensor(R32, dtype=torch.float32)
    y_butterfly = kernel_hadamard32(x.float()) * torch.tensor(R32, dtype=torch.float32)
    y_matmul = x.float() @ (hadamard_matrix(32).float())
    assert torch.equal(y_butterfly, exact)
    assert (y_matmul != exact).float().mean() > 0.1
    assert ((y_matmul == 0) != (exact == 0)).any()


def _lane_kernel(group: np.ndarray) -> np.ndarray:
    """had_4_inreg then had_8_subgroup as the CUDA code runs them: 8 lanes holding values 4l..4l+3,
    ``__shfl_xor`` partners and the sign-flip mask ``sfm`` of the upper lane, in numpy float32."""
    v = [[np.float32(group[4 * lane + r]) for r in range(4)] for lane in range(8)]
    for lane in range(8):
        v0, v1, v2, v3 = v[lane]
        s0, d0, s1, d1 = v0 + v1, v0 - v1, v2 + v3, v2 - v3
        v[lane] = [s0 + s1, d0 + d1, s0 - s1, d0 - d1]
    i = 1
    while i < 8:
        partner = [list(v[lane ^ i]) for lane in range(8)]
        v = [[(-v[lane][r] if lane & i else v[lane][r]) + partner[lane][r] for r in range(4)] for lane in range(8)]
        i <<= 1
    return np.array([v[lane][r] for lane in range(8) for r in range(4)], dtype=np.float32)


def test_butterflies_are_the_kernels_lane_structure():
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).half().float()
    want = np.stack([_lane_kernel(row) for row in x.numpy()])
    assert np.array_equal(kernel_hadamard32(x).numpy().view(np.uint32), want.view(np.uint32))
