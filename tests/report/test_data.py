"""The report's numbers on hand-made data: Pareto front, memory, KV classes, penalties, cross-terms, position buckets."""
from __future__ import annotations

import numpy as np
import pytest

from wkvlab.errors import ConfigError, DataError
from wkvlab.report.data import (build_report_data, kv_bit_class, kv_bits, memory_bytes, pareto_front, position_curve,
                                position_edges)
from wkvlab.kv.spec import KVSpec
from tests.report.helpers import demo_like_grid, make_result


def test_pareto_front_on_hand_points():
    xs = [1.0, 2.0, 2.0, 3.0, 4.0, 0.5, 3.0]
    ys = [5.0, 3.0, 4.0, 3.0, 1.0, 9.0, 3.0]
    # 0.5/9 and 1/5 are cheapest; 2/3 beats 2/4 (same x) and 3/3 (same y, more memory); 4/1 is the lowest KLD.
    assert pareto_front(xs, ys) == [5, 0, 1, 4]
    assert pareto_front([], []) == []
    assert pareto_front([1.0, 1.0], [2.0, 2.0]) == [0]  # identical points: the first only


def test_memory_is_weights_plus_kv_per_token_times_context_and_batch():
    assert memory_bytes(1_000, 10.0, 8192) == 1_000 + 81_920
    assert memory_bytes(1_000, 10.0, 8192, batch=4) == 1_000 + 4 * 81_920
    assert memory_bytes(1_000, 10.0, 0) == 1_000
    with pytest.raises(ConfigError):
        memory_bytes(1, 1.0, 10, batch=0)


@pytest.mark.parametrize("kv, bits, cls", [("fp16", 16.0, 16), ("fp8_e4m3", 8.0, 8), ("q8_0", 8.5, 8), ("q4_0", 4.5, 4),
                                            ("int4", None, 4), ("q8_0/q4_0", 6.5, 8), ("int2", None, 2)])
def test_kv_bit_classes(kv, bits, cls):
    measured = kv_bits(KVSpec.parse(kv).to_dict())
    if bits is not None:
        assert measured == pytest.approx(bits)
    assert kv_bit_class(measured) == cls


def test_configs_memory_and_pareto_flags():
    data = build_report_data(demo_like_grid(), source="t", context=1000, batch=2)
    row = next(r for r in data.configs if r.weights == "int8" and r.kv == "int4")
    assert row.memory_bytes == 100_000_000 + 280.0 * 1000 * 2
    assert row.kld_mean == pytest.approx(0.004 + 0.01)
    # Brute force: on the front exactly when no other config is at most as large and at most as bad, one strictly.
    for r in data.configs:
        dominated = any(o.memory_bytes <= r.memory_bytes and o.kld_mean <= r.kld_mean and
                        (o.memory_bytes, o.kld_mean) != (r.memory_bytes, r.kld_mean) for o in data.configs)
        assert r.pareto == (not dominated), (r.weights, r.kv)
    assert sum(r.pareto for r in data.configs) >= 3


def test_cross_terms_hand_computed_with_a_cast_baseline():
    data = build_report_data(demo_like_grid(), source="t")
    rows = {(r.weights, r.kv): r for r in data.cross_terms}
    assert len(rows) == 6  # int8, int4 × fp8, int8, int4 (the bf16 row is the baseline)
    both = rows[("int4-g128", "int4")]
    assert both.baseline_weights == "bf16"
    # 0.043 − 0.030 − 0.011 + 0.001 (bf16's own KLD) = 0.003
    assert (both.kld_both, both.kld_weights, both.kld_kv, both.kld_baseline) == pytest.approx((0.043, 0.03, 0.011, 0.001))
    assert both.interaction.estimate == pytest.approx(0.003)
    assert both.additive == pytest.approx(0.04)
    assert abs(rows[("int8", "fp8_e4m3")].interaction.estimate) < 1e-12


def test_cross_terms_prefer_the_identity_baseline_and_resample_windows():
    grid = [make_result("none", "fp16", 0.0), make_result("none", "int4", 0.01), make_result("int8", "fp16", 0.004),
            make_result("int8", "int4", np.array([0.014, 0.016, 0.018, 0.020, 0.014, 0.016, 0.018, 0.020])), make_result("bf16", "fp16", 0.001)]
    (row,) = [r for r in build_report_data(grid, source="t").cross_terms if r.weights == "int8"]
    assert row.baseline_weights == "none" and row.kld_baseline == 0.0
    assert row.interaction.estimate == pytest.approx(0.017 - 0.004 - 0.01)
    # Windows differ (0 .. +0.006 of interaction), so the interval is a real spread around it (the skewness
    # allowance of issue #38 widens it a little beyond the range at 8 windows)
    assert -0.001 <= row.interaction.low < row.interaction.estimate < row.interaction.high <= 0.007


def test_kv_penalty_pairs_each_quantized_cache_with_its_16bit_twin():
    data = build_report_data(demo_like_grid(), source="t")
    rows = {(r.weights, r.kv): r for r in data.penalties}
    assert len(rows) == 9
    assert rows[("int4-g128", "int4")].penalty.estimate == pytest.approx(0.013)
    assert rows[("bf16", "fp8_e4m3")].penalty.estimate == pytest.approx(0.002)
    assert rows[("bf16", "fp8_e4m3")].kv_class == 8 and rows[("bf16", "int4")].kv_class == 4


def test_results_on_other_tokens_are_not_paired():
    grid = demo_like_grid()
    other = make_result("int8", "int4", 0.02, windows=3)  # same names, different windows: a group of its own
    data = build_report_data(grid[:4] + [other], source="t")
    assert len(data.groups) == 2
    assert {r.group for r in data.penalties} == {0}


def test_position_buckets_double_and_average_by_position():
    assert position_edges(64) == [0, 16, 32, 64]
    assert position_edges(512) == [0, 16, 32, 64, 128, 256, 512]
    result = make_result("int8", "int4", 0.01, ctx=64)
    curve = position_curve(0, result)
    assert curve.starts == (0, 16, 32) and curve.ends == (16, 32, 64) and curve.tokens == (128, 128, 256)
    pos, kld = result.arrays.position, result.arrays.kld
    assert curve.kld_mean[2] == pytest.approx(kld[pos >= 32].mean())
    assert curve.kld_mean[0] < curve.kld_mean[1] < curve.kld_mean[2]  # the synthetic KLD grows with position


def test_no_results_is_a_one_line_error():
    with pytest.raises(DataError, match="holds no results"):
        build_report_data([], source="empty.db")


def test_cross_terms_from_too_few_windows_are_not_called_significant():
    grid = [make_result(w, k, v, windows=2) for w, k, v in (("none", "fp16", 0.0), ("none", "int4", 0.01), ("int8", "fp16", 0.004),
                                                                ("int8", "int4", 0.03))]
    (row,) = build_report_data(grid, source="t").cross_terms
    assert row.interaction.estimate == pytest.approx(0.016) and not row.interaction.decided and not row.interaction.excludes_zero
    assert row.verdict.word == "undecided" and "≥ 8 windows" in row.verdict.need()  # a stream: windows are the units


@pytest.mark.parametrize("kv, head_dim, bits", [("int8", 64, 8.25), ("int4", 64, 4.5), ("int8", 128, 8.125), ("int4", 128, 4.25),
                                                ("q8_0", 64, 8.5), ("int4", 256, 4.125)])
def test_kv_bits_count_scales_at_the_model_head_dim(kv, head_dim, bits):
    # int8: d bytes + a 2-byte scale per head vector; int4: d/2 + 2-byte scale + 2-byte minimum
    assert kv_bits(KVSpec.parse(kv).to_dict(), head_dim) == pytest.approx(bits)


def test_report_rows_use_the_recorded_head_dim():
    from wkvlab.report.data import head_dim_of

    grid = demo_like_grid()
    for r in grid:
        r.model_shape = {"layers": 30, "kv_heads": 3, "head_dim": 64}
    data = build_report_data(grid, source="t")
    assert {r.kv: r.kv_bits for r in data.configs if r.weights == "bf16"} == pytest.approx(
        {"fp16": 16.0, "fp8_e4m3": 8.0, "int8": 8.25, "int4": 4.5})
    unknown = demo_like_grid()[0]  # no recorded shape and a model name that is no file: the nominal 128
    assert head_dim_of(unknown) == 128


def test_a_quantized_file_explains_why_its_requantized_configs_fall_off_the_memory_front():
    """Issue 41: on a Q4_K_M GGUF 'none' is the file (468.6 MiB) and int4-g128 (696.7 MiB), int8 (861.3 MiB) are larger:
    the report says why instead of silently dropping them off the front."""
    from wkvlab.report.build import render_report
    from wkvlab.report.data import quantized_reference_note

    mib = 2**20
    results = [make_result("none", "fp16", 0.0, weight_bytes=int(468.6 * mib)),
               make_result("int4-g128", "fp16", 0.05, weight_bytes=int(696.7 * mib)),
               make_result("int8", "fp16", 0.002, weight_bytes=int(861.3 * mib))]
    data = build_report_data(results, source="eval on a GGUF")
    assert [r.pareto for r in data.configs] == [True, False, False]
    note = quantized_reference_note(data.groups[0])
    assert "a quantized file (468.6 MiB in its own blocks)" in note and "against that file dequantized" in note
    assert "(int4-g128 696.7 MiB, int8 861.3 MiB:" in note and "re-quantizing this file saves no memory" in note
    files = render_report(data)
    assert note in files["report.md"].decode() and data.to_dict()["groups"][0]["note"] == note
    assert "re-quantizing this file saves no memory" in files["index.html"].decode()  # the memory chart's caption
    # a 16-bit checkpoint: every weight config is smaller than 'none', nothing to explain
    assert quantized_reference_note(build_report_data(demo_like_grid() + [make_result("none", "fp16", 0.0)], source="x").groups[0]) == ""
