"""The search finding end to end on a tiny random Llama with the default tokenizer (real texts, no download; tests/findings/conftest.py):
replicated profiles, every rival at equal memory, verdicts by the one rule from the two-stage bootstrap."""
import dataclasses
import json

import pytest

from wkvlab.findings.render import search_markdown
from wkvlab.findings.search import RIVALS, SearchGrid, measure_search
from wkvlab.search.baselines import at_budget, budget_step
from wkvlab.search.choices import choice_bytes, choice_label, parse_choices

GRID = SearchGrid(weights="int4-g32", formats="K8V8,K8V4,K4V4,K4V2", profile_texts=("default",), heldout_texts=("default",),
                  budgets=(0.33, 0.42), replicates=5, ctx=32, profile_tokens=64, heldout_tokens=512)
PER = {choice_label(c): choice_bytes(c, kv_heads=1, head_dim=32) for c in parse_choices(GRID.formats)}
FP16 = 4 * PER["fp16"]


@pytest.fixture(scope="module")
def finding(tiny_folder):
    return measure_search(tiny_folder, GRID, device="cpu", dtype="float32")


def test_every_budget_gets_a_row_with_two_stage_intervals_over_the_replicates(finding):
    assert [(r.profile_text, r.share, r.heldout_text) for r in finding.rows] == [("default", s, "default") for s in GRID.budgets]
    for r in finding.rows:
        assert r.tokens == 16 * 31 and r.replicates == 5  # 16 held-out windows of 32, the first token unscored
        for rival in ("unaware", "kvtuner", "greedy", "random"):
            d = r.differences[rival]
            assert d.n_units == 16 and d.estimate == pytest.approx(r.aware - getattr(r, rival), abs=1e-12)
            assert r.verdicts[rival].family_size == sum(len(x.verdicts) for x in finding.rows)
    assert set(finding.rank_correlation) == {"default -> default"}
    assert set(finding.layer_agreement) == {"K int8", "K int4", "V int8", "V int4", "V int2"}
    assert finding.agreement_between == "default (replicate 0) and default (replicate 1)"


def test_every_plan_spends_its_budget_within_one_step(finding):
    step = budget_step([list(PER.values())] * 4)
    assert len(finding.plans) == len(GRID.budgets) * 5 * 5  # aware, unaware, kvtuner, greedy per replicate, and random mixes
    for name, labels in finding.plans.items():
        share = float(name.rsplit("/", 1)[1])
        assert len(labels) == 4 and at_budget(sum(PER[x] for x in labels), share * FP16, step), name


def test_uniform_only_where_it_hits_the_budget(finding):
    # on 1 KV head of 32: K8V4 is 42.2% of the 16-bit cache (within 2% of the 42% budget); K4V4 (31.25%) is 5% off 33%
    by_share = {r.share: r for r in finding.rows}
    assert by_share[0.42].uniform_name == "K8V4" and "uniform" in by_share[0.42].differences
    assert by_share[0.33].uniform_name == "" and "uniform" not in by_share[0.33].differences
    curve = finding.curve["default -> default"]
    assert any(p["front"] for p in curve) and {p["kind"] for p in curve} == {"uniform", "aware", "unaware", "kvtuner", "greedy", "random"}


def test_identical_profiles_give_an_exact_zero(tiny_folder):
    # with unquantized weights the weight-aware profile IS the unaware one: every replicate's plans coincide and
    # the two-stage difference is exactly zero — the pairing, not two noisy means, is compared
    found = measure_search(tiny_folder, dataclasses.replace(GRID, weights="none", budgets=(0.40,)), device="cpu", dtype="float32")
    d = found.rows[0].differences["unaware"]
    assert (d.estimate, d.low, d.high) == (0.0, 0.0, 0.0)


def test_a_rerun_reads_profiles_and_scores_back_without_measuring(tiny_folder, finding, monkeypatch):
    import wkvlab.search.api as api
    from wkvlab.search.measure import Scorer

    def fail(*_a, **_k):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(api, "collect_profile", fail)
    monkeypatch.setattr(Scorer, "score", fail)
    again = measure_search(tiny_folder, GRID, device="cpu", dtype="float32")
    assert json.dumps([r.to_dict() for r in again.rows]) == json.dumps([r.to_dict() for r in finding.rows])  # NaN-safe


def test_markdown_names_every_rival_its_margin_and_the_family(finding):
    text = search_markdown(finding.to_dict())
    assert text.count("\n| default |") >= len(finding.rows)
    assert all(f"aware − {k} [raw 95%]; Holm-adjusted → verdict" in text for k in RIVALS) and "no uniform at this budget" in text
    assert "Holm over" in text and "(m ±" in text and "equal memory" in text and "Pareto front" in text
    assert "of the rival's own KLD in that row" in text and "replicated profiles × held-out windows (two-stage)" in text
    r = finding.rows[0]  # raw and adjusted side by side in every cell: the adjusted one is wider
    v = r.verdicts["random"]
    assert f"{r.differences['random']:+.5f}; Holm {v.adjusted:+.5f} → " in text
    assert v.adjusted.high - v.adjusted.low > r.differences['random'].high - r.differences['random'].low


def test_a_finding_stored_before_equal_memory_renders_labelled():
    old = {"rows": [{"profile_text": "default", "budget": 7603.2, "share": 0.33, "heldout_text": "code", "aware": 0.6, "unaware": 0.55,
                     "uniform_name": "K4V4", "uniform": 0.62, "tokens": 496, "aware_minus_unaware": None, "aware_minus_uniform": None}],
           "rank_correlation": {}, "layer_agreement": {}, "plans": {}}
    assert "not a comparison at equal memory" in search_markdown(old)
