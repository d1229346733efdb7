"""The attention finding's interventions on a tiny random Llama: the (W, fp16) row, the reference pass run once,
one model copy, and the cross term's effects decided by the one rule as one Holm family."""
import json

import pytest

from wkvlab.findings.attention import AttentionRow, measure_attention

CTX = 32


@pytest.fixture(scope="module")
def counted(tiny_folder):
    """The finding with every recorded pass counted: (model id, cache) per call."""
    import wkvlab.explain.cells as cells

    calls, original = [], cells.record_pass

    def counting(model, kv, ids, stores=None, **kwargs):
        calls.append((id(model), kv.label))
        return original(model, kv, ids, stores, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(cells, "record_pass", counting)
    try:
        rows = measure_attention(tiny_folder, ("none", "int4-g32"), ("int4",), ctx=CTX, windows=8, device="cpu", dtype="float32")
    finally:
        mp.undo()
    return rows, calls


def test_rows_include_the_fp16_cell_and_only_quantized_pairs_get_interventions(counted):
    rows, _ = counted
    assert [(r.weights, r.kv) for r in rows] == [("none", "int4"), ("int4-g32", "fp16"), ("int4-g32", "int4")]
    assert rows[0].cross is None and rows[1].cross is None  # no weight error, or no cache: no 2×2 to intervene on
    x = rows[2].cross
    assert x is not None and x.windows == 8 and x.tokens == 8 * (CTX - 1)


def test_the_reference_pass_runs_once_per_window_on_one_model(counted):
    """R once per window (not once per weight config), C once per window and cache, W once per window per quantized
    config; every pass on the same model object (the weight configs are built in place)."""
    _, calls = counted
    assert len({model for model, _ in calls}) == 1
    assert [kv for _, kv in calls].count("fp16") == 8 + 8 and [kv for _, kv in calls].count("int4") == 8


def test_effects_are_paired_and_decided_as_one_family(counted):
    rows, _ = counted
    x = rows[2].cross
    k = {c: iv.estimate for c, iv in x.kld.items()}
    assert x.effects["interaction"].estimate == pytest.approx(k["wc"] - k["w"] - k["c"])
    assert x.effects["interaction_removed"].estimate == pytest.approx(k["wc_removed"] - k["w"] - k["c"])
    assert x.effects["sinks"].estimate == pytest.approx(k["wc_sinks"] - k["wc"]) and k["wc_sinks"] != k["wc"]
    for name, v in x.verdicts.items():
        assert v.family_size == 5 and v.family.startswith("attention finding: 1 (W, C) pairs")
        assert v.raw.n_units == 8 and v.raw.decided
        assert v.margin.relative == 0.1
    assert x.verdicts["sinks"].margin.value == pytest.approx(0.1 * (k["w"] + k["c"]))  # of the predicted total
    # the finding's KLD(W) and KLD(C) cells are the decomposition's own passes: W+C's attention KL matches the row's
    assert rows[2].attention_kl > 0


def test_markdown_shows_the_fp16_row_and_the_verdicts_with_margin_and_family(counted):
    from wkvlab.findings.render import attention_markdown

    rows, _ = counted
    text = attention_markdown(rows)
    assert "| int4-g32 | fp16 |" in text and "sinks at 16 bits" in text and "share of the interaction it carries" in text
    assert "Holm over 5 tests" in text and "margin m = 10% of the predicted total KLD(W)+KLD(C)" in text
    assert "RMS" not in text


def test_rows_with_interventions_round_trip_and_old_rows_still_read(counted):
    rows, _ = counted
    back = AttentionRow.from_dict(json.loads(json.dumps(rows[2].to_dict())))
    assert back == rows[2]
    old = rows[0].to_dict()
    old.pop("cross")
    old["cross_sink_ratio"] = rows[0].shares["kv"].to_dict()  # a row stored before: its RMS ratio is ignored
    assert AttentionRow.from_dict(old).cross is None
