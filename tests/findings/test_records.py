"""A finding's record keeps per-unit values, and the verdicts decided again from the record are the run's."""
import json

import numpy as np
import pytest

from wkvlab.errors import DataError
from wkvlab.eval.metrics import position_buckets
from wkvlab.eval.result import EvalResult, TokenArrays
from wkvlab.findings.records import dicts_with, redecide, result_from_units, unit_values
from wkvlab.findings.run import analyse
from wkvlab.kv import KVSpec
from wkvlab.weights.spec import WeightSpec

DOCS, CTX, WINDOWS = 10, 33, 16  # 16 windows of 32 scored tokens from 10 documents: unequal tokens per document


def _result(weights: str, kv: str, kld: np.ndarray, nll_ref: np.ndarray, calibration: str = "") -> EvalResult:
    n = CTX - 1
    arrays = TokenArrays(kld=kld, nll_ref=nll_ref, nll=nll_ref + kld, top1_agree=kld < 0.2, delta_p=-kld / 3,
                         position=np.tile(np.arange(n), WINDOWS), window=np.repeat(np.arange(WINDOWS), n),
                         document=np.repeat(np.arange(WINDOWS) % DOCS, n))
    spec = WeightSpec.parse(weights).to_dict()
    return EvalResult("m", "d", CTX, weights, kv, spec, KVSpec.parse(kv).to_dict(), 1000, 64.0, 1.5, arrays, position_buckets(CTX),
                      fingerprints={"data_sha256": "x"}, notes=[calibration] if calibration else [])


def _grid(seed: int = 0, calibration: str = ""):
    """Two weight methods × two caches with right-skewed per-token KLD, one of the pairs compounding."""
    rng = np.random.default_rng(seed)
    size = WINDOWS * (CTX - 1)
    nll_ref = np.random.default_rng(99).gamma(2.0, 1.0, size)  # one text: the same reference in every grid
    doc = np.repeat(rng.lognormal(0, 0.2, DOCS)[np.arange(WINDOWS) % DOCS], CTX - 1)  # documents differ in difficulty
    skewed = lambda scale: scale * doc * rng.lognormal(0, 1.0, size)  # noqa: E731
    out = [_result("none", "fp16", np.zeros(size), nll_ref, calibration)]
    for kv, c in (("int4", 0.10), ("int8", 0.01)):
        out.append(_result("none", kv, skewed(c), nll_ref, calibration))
    for weights, w in (("int4-g128", 0.3), ("w8a8-int8", 0.05)):
        base = skewed(w)
        out.append(_result(weights, "fp16", base, nll_ref, calibration))
        for kv, c, extra in (("int4", 0.10, 0.3 if weights == "int4-g128" else 0.0), ("int8", 0.01, 0.0)):
            out.append(_result(weights, kv, base + skewed(c) + extra, nll_ref, calibration))
    return out


def _outcomes(data: dict) -> list:
    """Every verdict of a finding's data: (name, outcome, adjusted low, adjusted high)."""
    return [(x["name"], x["outcome"], x["adjusted"]["low"], x["adjusted"]["high"]) for x in dicts_with(data, ("outcome", "adjusted"))]


def test_a_cell_rebuilt_from_its_unit_values_gives_the_same_means_per_unit():
    cell = _grid()[3]  # int4-g128 × fp16
    values = json.loads(json.dumps(unit_values(cell)))
    assert values["unit"] == "documents" and values["labels"] == list(range(DOCS))
    assert values["counts"] == [64] * 6 + [32] * 4  # windows 10–15 are the second window of documents 0–5
    rebuilt = result_from_units(values)
    assert rebuilt.tokens == cell.tokens and rebuilt.arrays.units.kind == "documents"
    for name in ("kld", "nll", "nll_ref", "top1_agree", "delta_p"):
        original = np.bincount(cell.arrays.document, weights=getattr(cell.arrays, name).astype(float))
        again = np.bincount(rebuilt.arrays.document, weights=getattr(rebuilt.arrays, name))
        np.testing.assert_allclose(again, original, rtol=1e-12, atol=1e-12)
    assert (rebuilt.weights, rebuilt.kv, rebuilt.weights_spec, rebuilt.fingerprints) == (cell.weights, cell.kv, cell.weights_spec,
                                                                                         cell.fingerprints)


@pytest.mark.parametrize("name", ["additivity", "methods"])
def test_verdicts_decided_again_from_a_stored_record_are_the_runs(name):
    markdown, data = analyse(name, {("grid",): _grid()}, "10%")
    stored = json.loads(json.dumps(data))  # what the store and docs/runs/ keep
    again_markdown, again = redecide(name, stored)
    before, after = _outcomes(data), _outcomes(again)
    assert len(before) >= 4 and [b[:2] for b in before] == [a[:2] for a in after]
    assert any(outcome == "above" for _, outcome, *_ in before)  # the int4-g128 × int4 pair compounds: the test can tell
    for (_, _, lo, hi), (_, _, lo2, hi2) in zip(before, after):
        assert lo2 == pytest.approx(lo, rel=1e-9, abs=1e-12) and hi2 == pytest.approx(hi, rel=1e-9, abs=1e-12)
    assert again_markdown == markdown and again["margin"] == "10%"


def test_calibration_grids_keep_their_keys():
    cells = {("prose", "default"): _grid(0), ("code", "default"): _grid(1)}
    markdown, data = analyse("calibration", cells, "10%")
    again_markdown, again = redecide("calibration", json.loads(json.dumps(data)))
    assert [tuple(g["key"]) for g in data["units"]["grids"]] == list(cells)
    assert _outcomes(again) and [o[:2] for o in _outcomes(again)] == [o[:2] for o in _outcomes(data)]
    assert again_markdown == markdown


def test_the_verdict_comes_from_the_recorded_values_and_the_margin_from_the_rule():
    _, data = analyse("additivity", {("grid",): _grid()}, "10%")
    compounds = [o for o in _outcomes(data) if o[1] == "above"]
    assert [o[0] for o in compounds] == ["int4-g128 × int4"]
    # the interaction removed in the record: int4-g128 × int4's KLD sums set to w + c per document → no longer compounds
    stored = json.loads(json.dumps(data))
    cells = {(c["weights"], c["kv"]): c for c in stored["units"]["grids"][0]["cells"]}
    w, c, ref = (np.array(cells[k]["sums"]["kld"]) for k in (("int4-g128", "fp16"), ("none", "int4"), ("none", "fp16")))
    cells[("int4-g128", "int4")]["sums"]["kld"] = list(w + c - ref)
    assert "int4-g128 × int4" not in [o[0] for o in _outcomes(redecide("additivity", stored)[1]) if o[1] == "above"]
    # a wider stated margin decides the same record otherwise
    wide = _outcomes(redecide("additivity", json.loads(json.dumps(data)), margin="1000%")[1])
    assert all(outcome != "above" for _, outcome, *_ in wide)


def test_a_record_without_unit_values_is_refused_in_one_line():
    with pytest.raises(DataError, match="keeps intervals, not per-unit values .*measure the finding again") as info:
        redecide("additivity", {"rows": []}, where="docs/runs/findings-additivity-default.json")
    assert "\n" not in str(info.value) and "docs/runs/findings-additivity-default.json" in str(info.value)
    with pytest.raises(DataError, match="format 99"):
        redecide("additivity", {"rows": [], "units": {"format": 99, "grids": []}})
    with pytest.raises(DataError, match="not re-decided from per-unit values"):
        redecide("search", {"rows": []})


def test_explains_factorial_is_decided_again_from_its_record():
    from wkvlab.explain.factorial import factorial
    from wkvlab.findings.records import factorial_record, redecide_factorial

    grid = {(r.weights, r.kv): r for r in _grid()}
    cells = {"ref": grid[("none", "fp16")], "w": grid[("int4-g128", "fp16")], "c": grid[("none", "int4")], "wc": grid[("int4-g128", "int4")]}
    before = factorial(cells, margin="10%")
    again = redecide_factorial(json.loads(json.dumps(factorial_record(cells))))
    assert before.kld.verdict.word == again.kld.verdict.word == "compounds"
    assert again.kld.verdict.adjusted.low == pytest.approx(before.kld.verdict.adjusted.low, rel=1e-9)
    assert again.metric("ppl").verdict.outcome == before.metric("ppl").verdict.outcome


def test_the_committed_attention_record_is_decided_again_from_its_per_window_means():
    """docs/runs/findings-attention-default.json keeps per-window means of every (W, C) pair: today's rule decides its
    75 cross-term effects again with the run's own point estimates; a pair without them is refused in one line."""
    from pathlib import Path

    from wkvlab.findings.records import can_redecide

    path = Path(__file__).parents[2] / "docs" / "runs" / "findings-attention-default.json"
    data = json.loads(path.read_text())["data"]
    assert can_redecide("attention", data)
    _, again = redecide("attention", data)
    old = {(r["weights"], r["kv"]): r["cross"] for r in data["rows"] if r["cross"]}
    new = {(r["weights"], r["kv"]): r["cross"] for r in again["rows"] if r["cross"]}
    assert set(new) == set(old) and len(new) == 15
    for pair, cross in new.items():
        for effect, verdict in cross["verdicts"].items():
            assert verdict["family_size"] == 75 and verdict["adjusted"]["method"]  # today's analytic interval
            assert verdict["raw"]["estimate"] == pytest.approx(old[pair]["verdicts"][effect]["raw"]["estimate"], rel=1e-9, abs=1e-12)
    broken = json.loads(json.dumps(data))
    next(r for r in broken["rows"] if r["cross"])["cross"]["per_window"] = None
    with pytest.raises(DataError, match="keeps no per-window means"):
        redecide("attention", broken)


def test_the_committed_depth_record_is_decided_again_from_its_per_document_values():
    """docs/runs/findings-depth-default.json keeps each document's mean KLD and reference NLL at every prefix (2,048
    targets each): today's rule gives the run's own table from them (the run's rule is today's), a stated margin
    changes the verdicts, and values that do not give the run's sums are refused in one line."""
    from pathlib import Path

    from wkvlab.findings.records import can_redecide

    record = json.loads((Path(__file__).parents[2] / "docs" / "runs" / "findings-depth-default.json").read_text())
    data = record["data"]
    assert can_redecide("depth", data) and not can_redecide("depth", {**data, "per_document": {}})
    markdown, again = redecide("depth", data)
    assert markdown == record["markdown"] and again["margin"] == "5%"
    for old, new in zip(data["rows"], again["rows"], strict=True):
        assert new["verdict"] == old["verdict"]
        for key in ("penalty", "growth", "adjusted", "reference"):
            if old[key]:
                assert (new[key]["low"], new[key]["high"]) == pytest.approx((old[key]["low"], old[key]["high"]), rel=1e-9, abs=1e-12)
    # every growth is undecided at 5%; at 20% of the penalty at 512 tokens every Holm interval lies inside the margin
    decided = lambda d: [(r["kv"], r["decision"]["outcome"], r["adjusted_decision"]["outcome"]) for r in d["rows"] if r["decision"]]  # noqa: E731
    assert {o for _, *outcomes in decided(again) for o in outcomes} == {"undecided"}
    wide = decided(redecide("depth", data, margin="20%")[1])
    assert [kv for kv, *_ in wide] == ["q8_0", "q4_0", "int4"] and {o for _, *outcomes in wide for o in outcomes} == {"within"}
    short = json.loads(json.dumps(data))
    short["per_document"]["q4_0"]["6144"].pop()
    with pytest.raises(DataError, match=r"keeps 31 per-document values of q4_0 at prefix 6144, not 32; measure the depth") as info:
        redecide("depth", short, where="docs/runs/findings-depth-default.json")
    assert "\n" not in str(info.value)
    with pytest.raises(DataError, match="did not score 1024 target tokens in each of its 32 documents"):
        redecide("depth", {**data, "target": 1024})


def test_depth_says_when_its_advice_asks_for_more_documents_than_the_text_has():
    """depth-long on SmolLM2: code-long's 8 modules all hold the 6,144-token prefix and its targets, and every undecided
    verdict asks for 48 or more documents; a record that counted the documents at its longest prefix says so."""
    from pathlib import Path

    data = json.loads((Path(__file__).parents[2] / "docs" / "runs" / "findings-depth-long-default.json").read_text())["data"]
    assert "no run decides" not in redecide("depth-long", data)[0]  # the record did not count them at 6,144
    counted = {**data, "reach": {**data["reach"], "6144": 8}}
    markdown, again = redecide("depth-long", counted)
    needs = [r[k]["units_needed"] for r in again["rows"] for k in ("decision", "adjusted_decision") if r.get(k)]
    assert len(needs) == 6 and min(needs) == 48
    assert ("The text (code-long) has 8 documents that hold the longest prefix (6,144 tokens) and the 2,048 targets, and every "
            "undecided verdict asks for more: on this text no run decides them.") in markdown
    assert "no run decides" not in redecide("depth-long", {**data, "reach": {**data["reach"], "6144": 10000}})[0]
