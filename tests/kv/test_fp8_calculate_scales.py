"""Issue 41, the FP8 scale mystery: vLLM's calculated k_scale (max|K| / 200) lets one outlier channel push every other
key below E4M3's normal range; scale 1.0 clips only the outlier. Values by hand from the E4M3 grid."""
from __future__ import annotations

import torch

from wkvlab.formats.fp8 import fake_quant_fp8
from wkvlab.kv.presets import fidelity_of
from wkvlab.kv.spec import KVSpec
from wkvlab.kv.store import VLLM_SCALE_CONSTANTS, _fp8_scale


def test_a_key_outlier_sets_the_calculated_scale_and_ordinary_keys_lose_their_mantissa():
    keys = torch.tensor([30000.0, 0.3, 0.05])  # one outlier channel, two ordinary ones
    scale = _fp8_scale(keys.abs(), "calculate", "k", 448.0)
    assert VLLM_SCALE_CONSTANTS["k"] == 200.0 and float(scale) == 150.0  # 30000 / 200
    calc = fake_quant_fp8(keys, "e4m3", scale)
    one = fake_quant_fp8(keys, "e4m3", 1.0)
    # scale 1.0: the outlier clips at 448, ordinary keys keep 3 mantissa bits (0.3 -> 0.3125 = 1.25 x 2^-2; 0.05 -> 0.05078125 = 1.625 x 2^-5)
    assert one.tolist() == [448.0, 0.3125, 0.05078125]
    # calculated: 0.3 / 150 = 0.002 is subnormal (step 2^-9): 1 x 2^-9 x 150 = 0.29296875; 0.05 / 150 rounds to 0
    # and the outlier itself: 30000 / 150 = 200, halfway between 192 and 208 (step 16): ties to the even mantissa, 192 x 150
    assert calc.tolist() == [28800.0, 0.29296875, 0.0]


def test_the_preset_says_why_calculated_scales_can_measure_worse():
    differs = fidelity_of(KVSpec.parse("vllm@0.27:fp8_e4m3+scales=calculate"))["differs"]
    assert "max|K| over the whole first batch" in differs and "/ 200" in differs and "0.00339" in differs
    assert "max|K|" not in fidelity_of(KVSpec.parse("vllm@0.27:fp8_e4m3"))["differs"]
