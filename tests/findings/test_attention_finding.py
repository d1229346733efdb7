"""The attention finding on a tiny random Llama: pooled per-window decompositions against one decomposition of all windows."""
import json

import numpy as np
import pytest

from wkvlab.findings.attention import AttentionRow, measure_attention

CTX = 32


@pytest.fixture(scope="module")
def rows(tiny_folder):
    return measure_attention(tiny_folder, ("int4-g32",), ("int4", "q4_0"), ctx=CTX, windows=8, device="cpu", dtype="float32")[1:]


def test_every_weight_config_gets_its_fp16_cache_row(tiny_folder):
    """The (W, fp16) cell: the cross term is all weight part, no cache part, no 2×2 interaction."""
    rows = measure_attention(tiny_folder, ("none", "int4-g32"), ("int4",), ctx=CTX, windows=8, device="cpu", dtype="float32")
    assert [(r.weights, r.kv) for r in rows] == [("none", "int4"), ("int4-g32", "fp16"), ("int4-g32", "int4")]
    fp16 = rows[1]
    assert fp16.shares["cross"].estimate > 0 and fp16.shares["cross_cache"].estimate == 0.0
    assert fp16.shares["cross_weight"].estimate == pytest.approx(fp16.shares["cross"].estimate)
    assert abs(fp16.shares["interaction"].estimate) < 1e-12
    both = rows[2]
    assert both.shares["cross_cache"].estimate > 0 and both.shares["interaction"].estimate > 0
    from wkvlab.findings.render import attention_markdown

    text = attention_markdown(rows)
    assert "| int4-g32 | fp16 |" in text and "its cache part ε_q·ε_k,cᵀ [95%]" in text
    # the finding measures each pair once, and its tables say so as the replicated findings' say how many they pool
    assert text.endswith("Replicates: 1 replicate: run-to-run variance not included in any interval of this finding (the attention "
                         "finding measures each pair once; the additivity finding's output interactions, with replicates, are the "
                         "ones to plan on).")


@pytest.fixture(scope="module")
def whole(tiny_folder):
    """One decomposition over the same 8 windows at once (the path explain uses)."""
    from wkvlab import api
    from wkvlab.explain.attention import attention_decomposition
    from wkvlab.kv.spec import KVSpec
    from wkvlab.weights.apply import quantize_model_weights
    from wkvlab.weights.spec import WeightSpec

    work = api.prepare(tiny_folder, "default", ctx=CTX, tokens=8 * CTX, device="cpu", dtype="float32")
    quantized = quantize_model_weights(work.loaded.model, WeightSpec.parse("int4-g32"), None, model_key=work.loaded.fingerprint)
    return attention_decomposition(work.loaded.model, quantized.model, KVSpec.parse("int4"), work.windows.tokens, weights_label="int4-g32")


def test_pooled_windows_equal_one_decomposition_of_all_windows(rows, whole):
    row = rows[0]
    assert (row.weights, row.kv, row.windows) == ("int4-g32", "int4", 8)
    shares = whole.network_shares()
    for term in ("kv", "weight", "cross"):
        assert row.shares[term].estimate == pytest.approx(shares[term], rel=1e-9)
    assert [l for l, _ in row.top_layers] == [l for l, _ in whole.top_layers(3)]
    assert [m for _, m in row.top_layers] == pytest.approx([m for _, m in whole.top_layers(3)], rel=1e-9)
    assert row.attention_kl == pytest.approx(whole.kl().mean(), rel=1e-9)


def test_every_share_has_a_window_interval_that_varies(rows):
    for row in rows:
        for iv in row.shares.values():
            assert iv.n_units == 8 and iv.decided and iv.high - iv.low > 1e-6  # windows differ: a real interval, not a point
    # the two caches quantize differently: their KV terms' shares are not the same number
    int4, q4_0 = rows
    assert abs(int4.shares["kv"].estimate - q4_0.shares["kv"].estimate) > 1e-3


def test_fewer_windows_than_the_rule_give_no_interval(tiny_folder):
    row = measure_attention(tiny_folder, ("int4-g32",), ("int4",), ctx=CTX, windows=3, device="cpu", dtype="float32")[-1]
    assert row.windows == 3 and not row.shares["cross"].decided and np.isnan(row.shares["cross"].low)
    from wkvlab.findings.render import attention_markdown

    assert "[no interval: 3 < 8 units]" in attention_markdown([row])


def test_unquantized_weights_have_a_cross_term_only_through_earlier_layers(tiny_folder):
    # ε_q carries the cache error of earlier layers: layer 0's query is exact, later ones are not
    (row,) = measure_attention(tiny_folder, ("none",), ("int4",), ctx=CTX, windows=8, device="cpu", dtype="float32")
    assert row.layer_cross_mass[0] == 0.0 and sum(row.layer_cross_mass[1:]) == pytest.approx(1.0)
    assert row.shares["weight"].estimate > 0.0 and row.shares["kv"].estimate > row.shares["cross"].estimate


def test_row_round_trips_through_json(rows):
    back = AttentionRow.from_dict(json.loads(json.dumps(rows[0].to_dict())))
    assert back == rows[0]


def test_the_finding_runs_into_the_store_and_the_report_draws_it(tiny_folder, tmp_path, monkeypatch):
    from wkvlab.findings import grids
    from wkvlab.findings.run import run_finding
    from wkvlab.report.findings import finding_sections
    from wkvlab.store import open_store

    monkeypatch.setattr(grids, "ATTENTION_WEIGHTS", ("int4-g32",))
    monkeypatch.setattr(grids, "ATTENTION_KV", ("int4",))
    store = tmp_path / "f.db"
    finding = run_finding("attention", model=tiny_folder, store=store, ctx=CTX, tokens=8 * CTX, device="cpu", dtype="float32")
    assert finding.data["rows"][0]["windows"] == 8
    assert "| int4-g32 | int4 |" in finding.markdown
    with open_store(store) as db:
        (section,) = finding_sections(db.findings())
    assert section.title.startswith("Where the cross term sits")
    assert [r["kv"] for r in section.table.rows] == ["fp16", "int4"] and len(section.charts) == 1  # the (W, fp16) row first
