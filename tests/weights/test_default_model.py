"""Integration on the packaged SmolLM2: calibrated methods beat RTN at the same bits.

Kept small for the suite (8 × 128 calibration tokens, the first 8 of 30 layers quantized by all
three configs, AWQ's grid at 10 points); the full comparison on both models is in docs/weights.md.
"""
import pytest

from wkvlab import api
from wkvlab.weights import CalibrationSpec


@pytest.mark.slow
def test_gptq_and_awq_beat_rtn_on_the_default_model(default_model):
    layers = "+skip=8-29"
    work = api.prepare(default_model, "default", ctx=128, tokens=512)
    weights = api.parse_weights([f"int4-g128{layers}", f"gptq-int4-g128{layers}", f"awq-int4-g128{layers}+grid=10"])
    results = api.evaluate_workload(work, weights, api.parse_kv(["fp16"]), calibration=CalibrationSpec("prose", 8, 128))
    kld = {r.weights.split("+")[0]: r.kld["mean"] for r in results}
    assert kld["gptq-int4-g128"] < kld["int4-g128"] and kld["awq-int4-g128"] < kld["int4-g128"], kld
    assert any("not multiples of 128" in n for n in results[0].notes)  # 576 columns: ragged last group
