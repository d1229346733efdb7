"""The search finding end to end on a tiny random Llama with the default tokenizer (real texts, no download; tests/findings/conftest.py)."""
import dataclasses

import pytest

from wkvlab.findings.render import search_markdown
from wkvlab.findings.search import SearchGrid, measure_search
from wkvlab.search.choices import choice_bytes, choice_label, parse_choices

GRID = SearchGrid(weights="int4-g32", formats="K8V8,K8V4,K4V4,K4V2", budgets=(0.33, 0.45), ctx=32, profile_tokens=64, heldout_tokens=512)


@pytest.fixture(scope="module")
def finding(tiny_folder):
    return measure_search(tiny_folder, GRID, device="cpu", dtype="float32")


def test_every_profile_text_budget_and_heldout_text_gets_a_paired_row(finding):
    assert [(r.profile_text, r.share, r.heldout_text) for r in finding.rows] == [
        (p, s, h) for p in ("default", "code") for s in (0.33, 0.45) for h in ("default", "code")]
    for r in finding.rows:
        assert r.tokens == 16 * 31  # 16 held-out windows of 32, the first token unscored
        assert r.aware_minus_unaware.n_units == 16 and r.aware_minus_unaware.decided
        assert r.aware_minus_unaware.estimate == pytest.approx(r.aware - r.unaware, abs=1e-12)
        if r.aware_minus_uniform is not None:
            assert r.aware_minus_uniform.estimate == pytest.approx(r.aware - r.uniform, abs=1e-12)
    assert set(finding.rank_correlation) == {"default -> default", "default -> code", "code -> default", "code -> code"}
    assert set(finding.layer_agreement) == {"K int8", "K int4", "V int8", "V int4", "V int2"}


def test_plans_fit_their_budgets(finding):
    choices = {choice_label(c): choice_bytes(c, kv_heads=1, head_dim=32) for c in parse_choices(GRID.formats)}
    fp16 = 4 * choice_bytes(("fp16", "fp16"), kv_heads=1, head_dim=32)
    for name, labels in finding.plans.items():
        share = float(name.rsplit("/", 1)[1])
        spent = sum(choices[label] for label in labels)
        assert len(labels) == 4 and spent <= share * fp16 + 1e-9, name


def test_identical_profiles_give_identical_plans_and_an_exact_zero(tiny_folder):
    # with unquantized weights the weight-aware profile IS the unaware one: the plans coincide and
    # every paired difference is exactly zero — the pairing, not two noisy means, is compared
    found = measure_search(tiny_folder, dataclasses.replace(GRID, weights="none", budgets=(0.40,)), device="cpu", dtype="float32")
    for r in found.rows:
        assert r.aware == r.unaware
        d = r.aware_minus_unaware
        assert (d.estimate, d.low, d.high) == (0.0, 0.0, 0.0)


def test_a_rerun_reads_profiles_and_scores_back_without_measuring(tiny_folder, finding, monkeypatch):
    import wkvlab.search.api as api
    from wkvlab.search.measure import Scorer

    def fail(*_a, **_k):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(api, "collect_profile", fail)
    monkeypatch.setattr(Scorer, "score", fail)
    again = measure_search(tiny_folder, GRID, device="cpu", dtype="float32")
    assert [r.to_dict() for r in again.rows] == [r.to_dict() for r in finding.rows]


def test_markdown_shows_every_row_with_its_interval(finding):
    text = search_markdown(finding.to_dict())
    assert text.count("\n| default |") + text.count("\n| code |") >= len(finding.rows)
    assert "aware − unaware [raw 95%] → verdict" in text and "Spearman between the two profile texts" in text
    assert all(set(r.verdicts) >= {"unaware"} and r.verdicts["unaware"].family_size >= len(finding.rows) for r in finding.rows)
    assert "Holm over" in text and "not a comparison at equal memory" in text
