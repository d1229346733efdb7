"""Round-to-nearest integer weights against compressed-tensors' own qparams and fake-quant, in the fast
tier (compressed-tensors 0.20.1 is pinned in the ``test`` extra; it leaves torch and transformers as
they are). ``calculate_qparams`` (minmax observer values per group) and ``fake_quantize`` from
compressed_tensors.quantization are what llm-compressor's RTN (QuantizationModifier) applies."""
from __future__ import annotations

import pytest
import torch

ct = pytest.importorskip("compressed_tensors.quantization", reason="compressed-tensors is in the test extra: pip install -e '.[test]'")

from compressed_tensors.quantization.lifecycle.forward import fake_quantize  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

from wkvlab.weights.rtn import quantize_weight  # noqa: E402
from wkvlab.weights.spec import WeightSpec  # noqa: E402


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(32, 512, generator=g) * 0.05
    outliers = torch.randn(32, 512, generator=g) * 0.05
    outliers[torch.rand(32, 512, generator=g) < 0.01] *= 40
    boundary = torch.randn(8, 512, generator=g) * 0.05
    boundary[0, :128] = 0.0  # a zero group (scale eps)
    boundary[1, 128:256] = 0.01  # a constant positive group (the zero point clamps)
    boundary[2, :128] = -torch.rand(128, generator=g)  # an all-negative group
    boundary[3, :128] = (torch.arange(128) % 16 - 7.5) / 8  # values on k + 0.5 steps: ties
    boundary[4, 256:384] = torch.randn(128, generator=g) * 1e-20  # tiny
    return {"normal": normal, "outliers": outliers, "boundary": boundary}


def _compressed_tensors(w: torch.Tensor, bits: int, group: int, symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    args = ct.QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, strategy="group", group_size=group)
    grouped = w.reshape(w.shape[0], -1, group)
    scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    return fake_quantize(w, scale, zero, args), scale


@pytest.mark.parametrize("name", ["normal", "outliers", "boundary"])
@pytest.mark.parametrize("spec,bits", [("int4-g128", 4), ("int8-g128-asym", 8)])  # int4's default grid is asymmetric
def test_asymmetric_rtn_bit_exact_with_compressed_tensors(name, spec, bits):
    w = _weights()[name]
    ref, _ = _compressed_tensors(w, bits, 128, symmetric=False)
    got = quantize_weight(w, WeightSpec.parse(spec))
    assert torch.equal(got, ref), f"{int((got != ref).sum())} of {got.numel()} values differ"


def test_symmetric_grids_differ_by_the_documented_scale_rule():
    # compressed-tensors' minmax symmetric scale is amax / ((2^b - 1) / 2) = amax / 7.5 at 4 bits (codes -8..7,
    # +amax lands on 7.5 and clamps to 7); wkvlab's symmetric int4 (GPTQ/AWQ checkpoints, the engines' readers) is
    # amax / 7. Same codes range, another grid: this states the difference so that a change on either side shows.
    w = _weights()["normal"]
    _, scale = _compressed_tensors(w, 4, 128, symmetric=True)
    amax = w.reshape(32, -1, 128).abs().amax(-1)
    assert torch.equal(scale, amax / 7.5)
    got = quantize_weight(w, WeightSpec.parse("int4-g128-sym"))
    steps = (got.reshape(32, -1, 128).abs().amax(-1) / amax)
    assert torch.allclose(steps, torch.ones_like(steps), rtol=1e-6)  # wkvlab keeps amax on the grid (7 * amax/7)
