"""The catastrophe guard (issue #27 item 2) and measured rows named as the plan's rows (issue #26 item 4)."""
from __future__ import annotations

import re

import pytest
from rich.console import Console

from wkvlab.kv.spec import KVSpec
from wkvlab.plan import plan
from wkvlab.plan.guard import UNMEASURED, UNSAFE_KLD, UNSAFE_TOP1, risky_keys, unsafe_reason
from wkvlab.plan.measured import Measurement
from wkvlab.plan.models import ModelDescription
from wkvlab.plan.render import render
from wkvlab.weights.spec import WeightSpec
from tests.plan.conftest import CONFIG

def measurement(weights: str, kv: str, kld: float, top1: float | None = 0.99, model: str = "tinyplan") -> Measurement:
    w, k = WeightSpec.parse(weights), KVSpec.parse(kv)
    return Measurement(model, "default", 512, 4096, w.label, k.label, kld, kld / 20, "test", w.to_dict(), k.to_dict(), top1=top1)


def text_of(result) -> str:
    console = Console(width=400, record=True, highlight=False)
    render(result, console)
    return console.export_text()


def test_thresholds_are_the_stated_constants():
    assert (UNSAFE_KLD, UNSAFE_TOP1) == (0.1, 0.90)
    assert unsafe_reason(0.099, 0.901) == ""
    assert "KLD 0.101 > 0.1 nat" in unsafe_reason(0.101, 0.99)
    assert "top-1 agreement 89.0% < 90%" in unsafe_reason(0.01, 0.89)
    assert unsafe_reason(0.05, None) == ""


def test_per_token_low_bit_keys_are_the_risky_ones():
    desc = ModelDescription.from_config(CONFIG, name="tinyplan")
    risky = {kv: risky_keys(KVSpec.parse(kv), desc) for kv in
             ["int4", "q4_0", "llamacpp:q4_0", "q4_0/q8_0", "int2", "q8_0/q4_0", "int8", "fp8_e4m3", "kivi4", "int4-c32", "fp16", "K8V4"]}
    assert {kv for kv, name in risky.items() if name} == {"int4", "q4_0", "llamacpp:q4_0", "q4_0/q8_0", "int2"}


def test_without_a_probe_every_prior_row_says_unmeasured_and_none_is_recommended(model_dir):
    """Issue 41: 8-bit and FP8 caches collapse on large enough key outliers, so no prior row is recommended."""
    result = plan(str(model_dir), "RTX-4090", 4, 1024)
    for row in result.rows:
        exact = row.weights == "bf16" and row.kv == "bf16"
        assert (UNMEASURED in row.quality.shown) != exact, (row.weights, row.kv, row.quality.shown)
        assert row.recommendable == exact
        if row.kv in ("int4", "llamacpp:q4_0"):
            assert "keys per token" in row.quality.caution
    text = text_of(result)
    table_rows = [line for line in text.splitlines() if re.search(r"│ (int8|fp8_e4m3|int4|llamacpp:q4_0) +│", line)]
    assert table_rows and all(UNMEASURED in line for line in table_rows)  # whole, on the row's own line
    assert all(r.verified == (r.kv == "bf16" and r.weights == "bf16") for r in result.recommendations)
    # a plan with nothing but an unmeasured cache: its launch line is labelled unverified, with how to measure it
    only = plan(str(model_dir), "RTX-4090", 4, 1024, kv=["int8"], engine="vllm")
    rec = only.recommendations[0]
    assert not rec.verified and any("UNVERIFIED ON THIS MODEL" in line for line in rec.why)
    assert "unverified on this model" in text_of(only) and "wkvlab plan --model" in only.measure_hint


def test_measured_unsafe_is_never_recommended_and_the_launch_lines_say_why(model_dir):
    measured = [measurement("none", "int4", 1.3, 0.48), measurement("none", "int8", 0.004), measurement("none", "fp8_e4m3", 0.02, 0.88)]
    result = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=measured)
    rows = {(r.weights, r.kv): r for r in result.rows}
    collapsed = rows[("bf16", "int4")]
    assert collapsed.fits and collapsed.rank is None and "KLD 1.300 > 0.1 nat" in collapsed.quality.unsafe
    assert "top-1 agreement 48.0% < 90%" in collapsed.quality.unsafe
    assert rows[("bf16", "fp8_e4m3")].rank is None and "top-1 agreement 88.0%" in rows[("bf16", "fp8_e4m3")].quality.unsafe
    # the cache alone collapses: every combination holding it is unsafe too, and no longer "unmeasured"
    assert rows[("fp8", "int4")].rank is None and "KV int4 alone" in rows[("fp8", "int4")].quality.unsafe
    assert UNMEASURED not in rows[("fp8", "int4")].quality.shown
    # the checkpoint itself fits: memory is not the constraint, so the exact row ranks first, then the safe measured one
    assert rows[("bf16", "bf16")].rank == 1 and rows[("bf16", "int8")].rank == 2 and rows[("bf16", "int8")].recommendable
    rec = result.recommendations[0]
    assert (rec.weights, rec.kv) == ("bf16", "bf16") and rec.verified
    dropped = [line for line in rec.why if line.startswith("dropped")]
    assert any("bf16 x int4" in line and "KLD 1.300 > 0.1 nat" in line and "unsafe = measured KLD > 0.1 nat" in line for line in dropped)
    text = text_of(result)
    assert "UNSAFE (KLD 1.300 > 0.1 nat" in text and "dropped bf16 x int4" in text
    # an engine whose every combination was dropped says so instead of printing a line
    alone = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", kv=["int4"], weights=["bf16"], measurements=measured)
    assert not alone.recommendations and any("dropped as unsafe" in w for w in alone.warnings)


def test_results_plan_every_measured_configuration_as_a_measured_row_ranked_first(model_dir):
    """#26 item 4: none weights are the bf16 checkpoint, fp16 is the engine's 16-bit cache, plain q8_0 is llama.cpp's -ctk q8_0."""
    measured = [measurement("none", "fp16", 0.0), measurement("none", "q8_0", 0.0006), measurement("none", "int4", 0.04),
                measurement("q8_0", "fp16", 0.002)]
    result = plan(str(model_dir), "RTX-4090", 4, 1024, measurements=measured)
    rows = [r for r in result.rows if r.quality.is_measured]
    assert {(r.weights, r.kv) for r in rows} == {("bf16", "bf16"), ("bf16", "q8_0"), ("bf16", "int4"), ("q8_0", "bf16")}
    assert result.measured == 4
    ranked = sorted((r for r in result.rows if r.rank), key=lambda r: r.rank)
    assert all(r.quality.is_measured for r in ranked[:4]) and not any(r.quality.is_measured for r in ranked[4:])
    q8 = next(r for r in rows if r.kv == "q8_0")
    assert q8.engine == "llama.cpp" and "LLAMA_ATTN_ROT_DISABLE=1" in q8.evaluation("llama.cpp").command.env
    assert "4 row(s) measured); the 4 that fit and an engine runs rank first, by measured KLD" in text_of(result)
