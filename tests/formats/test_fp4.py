import pytest
import torch

from wkvlab.errors import ConfigError
from wkvlab.formats import fake_quant_fp4, fp4_bytes, nvfp4_global_scale, round_e2m1

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
EVEN_MANTISSA = torch.tensor([True, False, True, False, True, False, True, False])


def _brute_force(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 magnitude by exhaustive search; ties go to the even mantissa."""
    a = x.abs().clamp(max=6.0)[:, None]
    dist = (a - GRID[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    ties = dist == best
    pick = torch.where((ties & EVEN_MANTISSA).any(1), (ties & EVEN_MANTISSA).float().argmax(1), ties.float().argmax(1))
    return torch.sign(x) * GRID[pick]


def test_round_e2m1_matches_exhaustive_nearest_with_even_ties():
    x = torch.cat([torch.linspace(-8, 8, 4097), GRID + 0.25, -(GRID + 0.25), torch.tensor([0.75, 1.25, 1.75, 2.5, 3.5, 5.0])])
    assert torch.equal(round_e2m1(x), _brute_force(x))


def test_nvfp4_reproduces_representable_blocks_and_scales_to_e4m3():
    block = torch.tensor([6.0, -3.0, 1.5, 0.5, 0, 4, -6, 2, 1, 0.5, 3, -4, 6, 0, 1.5, 2]) * 0.125
    x = torch.stack([block, block * 2])
    assert torch.equal(fake_quant_fp4(x, "nvfp4"), x)
    assert nvfp4_global_scale(torch.tensor(0.0)) == 1.0


def test_mxfp4_power_of_two_scale_and_saturation():
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 7.9, 1.0  # floor(log2 7.9) - 2 = 0: scale 1, 7.9 saturates to 6
    y = fake_quant_fp4(x, "mxfp4")
    assert y[0, 0] == 6.0 and y[0, 1] == 1.0 and torch.equal(y[0, 2:], x[0, 2:])
    assert torch.equal(fake_quant_fp4(x * 2**-10, "mxfp4"), y * 2**-10)


def test_fp4_zero_blocks_and_bytes():
    assert torch.equal(fake_quant_fp4(torch.zeros(2, 32), "nvfp4"), torch.zeros(2, 32))
    assert torch.equal(fake_quant_fp4(torch.zeros(2, 32), "mxfp4"), torch.zeros(2, 32))
    assert fp4_bytes(10, 64, "nvfp4") == 320 + 40 + 8
    assert fp4_bytes(10, 64, "mxfp4") == 320 + 20


def test_fp4_error_is_bounded_relative_to_block_max():
    torch.manual_seed(0)
    x = torch.randn(64, 128)
    for fmt in ("nvfp4", "mxfp4"):
        err = (fake_quant_fp4(x, fmt) - x).abs().max()
        assert err <= x.abs().max() / 4  # half the widest E2M1 step (2) relative to max 6, with scale slack


def test_fp4_rejects_ragged_blocks():
    with pytest.raises(ConfigError, match="divisible by 16"):
        fake_quant_fp4(torch.zeros(2, 24), "nvfp4")
    with pytest.raises(ConfigError):
        fake_quant_fp4(torch.zeros(2, 32), "fp4")
