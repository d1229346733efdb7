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


TICKS = {}  # run -> (bar total, steps ticked)


def _recorder(run: str):
    from contextlib import contextmanager

    @contextmanager
    def progress(total, _title):
        TICKS[run] = [total, 0.0]

        def tick(_description, steps):
            TICKS[run][1] += steps
        yield tick
    return progress


@pytest.fixture(scope="module")
def finding(tiny_folder):
    return measure_search(tiny_folder, GRID, device="cpu", dtype="float32", progress=_recorder("first"))


def test_every_budget_gets_a_row_with_two_stage_intervals_over_the_replicates(finding):
    assert [(r.profile_text, r.share, r.heldout_text) for r in finding.rows] == [("default", s, "default") for s in GRID.budgets]
    for r in finding.rows:
        assert r.tokens == 16 * 31 and r.replicates == 5  # 16 held-out windows of 32, the first token unscored
        for rival in ("unaware", "kvtuner", "greedy", "random"):
            d = r.differences[rival]
            # 16 windows from 16 documents: the documents are the units
            assert d.n_units == 16 and d.unit == "documents" and d.estimate == pytest.approx(r.aware - getattr(r, rival), abs=1e-12)
            assert len(r.per_document[rival]) == 5 and len(r.per_document[rival][0]) == 16
            if rival in r.identical:  # the same plans: exactly 0, and no test
                assert (d.estimate, d.low, d.high) == (0.0, 0.0, 0.0) and rival not in r.verdicts
            else:
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


def test_identical_plans_give_an_exact_zero_and_are_not_counted_as_equivalent(tiny_folder):
    # with unquantized weights the weight-aware profile IS the unaware one: every replicate's plans coincide and
    # the two-stage difference is exactly zero — the pairing, not two noisy means, is compared — and that zero is
    # no evidence that two different plans are equivalent: no test, no verdict, and the counts say "same plans"
    found = measure_search(tiny_folder, dataclasses.replace(GRID, weights="none", budgets=(0.40,)), device="cpu", dtype="float32")
    row = found.rows[0]
    d = row.differences["unaware"]
    assert (d.estimate, d.low, d.high) == (0.0, 0.0, 0.0)
    assert "unaware" in row.identical and "unaware" not in row.verdicts and "kvtuner" not in row.identical
    text = search_markdown(found.to_dict())
    assert "the same plans as aware in every replicate: no test" in text
    counts = next(line for line in text.splitlines() if line.startswith("| unaware |"))
    assert counts.startswith("| unaware | 1 | 1 | 0 | 0 | 0 | 0 | 0 |")


def test_held_out_windows_come_from_at_least_16_distinct_documents_no_profile_touches(tiny_folder):
    from transformers import AutoTokenizer

    from wkvlab.findings.search import _windows

    tok = AutoTokenizer.from_pretrained(tiny_folder)
    for text in ("default", "code"):
        _, profiles, heldout, used = _windows(GRID, [text], tok, None)
        held = heldout[text]
        assert held.n_windows == 16 and len(set(held.documents)) == 16  # one window from each of 16 documents
        held_rows = {tuple(row.tolist()) for row in held.tokens}
        assert all(tuple(row.tolist()) not in held_rows for p in profiles[text] for row in p.tokens)
        assert len(profiles[text]) == 5 and used[text] > 0


def test_a_stream_text_is_refused_in_one_line(tiny_folder, tmp_path):
    from transformers import AutoTokenizer

    from wkvlab.errors import DataError
    from wkvlab.findings.search import _windows

    stream = tmp_path / "one.txt"
    stream.write_text("word " * 5000)
    with pytest.raises(DataError, match="one stream; the search finding's held-out windows are spread over documents"):
        _windows(GRID, [str(stream)], AutoTokenizer.from_pretrained(tiny_folder), None)


def test_rank_correlations_count_each_distinct_plan_once_and_rank_by_bytes_too():
    from wkvlab.findings.search import rank_correlations

    plans = {"a": ("x",), "b": ("y",), "c": ("z",), "d": ("w",), "b again": ("y",)}
    size = {("x",): 4.0, ("y",): 3.0, ("z",): 2.0, ("w",): 1.0}
    measured = {"a": 0.10, "b": 0.30, "c": 0.20, "d": 0.40, "b again": 0.30}
    predicted = {("x",): 0.1, ("y",): 0.2, ("z",): 0.3, ("w",): 0.4}
    rho, by_bytes, n = rank_correlations(plans, predicted.__getitem__, measured, size.__getitem__)
    assert n == 4  # "b again" is b's plan: one point, not two
    assert rho == pytest.approx(0.8) and by_bytes == pytest.approx(0.8)  # ranks 1,3,2,4 against 1,2,3,4: 1 − 6·2/60


def test_a_rerun_reads_profiles_and_scores_back_without_measuring(tiny_folder, finding, monkeypatch):
    import wkvlab.search.api as api
    from wkvlab.search.measure import Scorer

    def fail(*_a, **_k):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(api, "collect_profile", fail)
    monkeypatch.setattr(Scorer, "score", fail)
    again = measure_search(tiny_folder, GRID, device="cpu", dtype="float32", progress=_recorder("again"))
    assert json.dumps([r.to_dict() for r in again.rows]) == json.dumps([r.to_dict() for r in finding.rows])  # NaN-safe


def test_the_bar_ends_at_its_total_measured_or_read_back(tiny_folder, finding, monkeypatch):
    """A resumed run's bar counts what the cache holds as done, so its ETA is the work left (a resumed SmolLM2
    search read "3:30 to go" with half of its profiles cached; cached profiles did not tick). Plans that two
    rivals share are one score and still one step each."""
    test_a_rerun_reads_profiles_and_scores_back_without_measuring(tiny_folder, finding, monkeypatch)
    for run in ("first", "again"):
        total, ticked = TICKS[run]
        assert ticked == pytest.approx(total), run


def test_markdown_names_every_rival_its_margin_and_the_family(finding):
    text = search_markdown(finding.to_dict())
    assert text.count("\n| default |") >= len(finding.rows)
    assert all(f"aware − {k} [raw 95%]; Holm-adjusted → verdict" in text for k in RIVALS) and "no uniform at this budget" in text
    assert "Holm over" in text and "(m ±" in text and "equal memory" in text and "Pareto front" in text
    assert "of the rival's own KLD in that row" in text and "replicated profiles × held-out documents (two-stage)" in text
    assert "Spearman: bytes alone vs held-out KLD" in text and "same plans (no test)" in text
    assert set(finding.bytes_rank_correlation) == set(finding.rank_correlation) == set(finding.distinct_plans)
    assert all(-1 <= v <= 1 for v in finding.bytes_rank_correlation.values())
    r = finding.rows[0]  # raw and adjusted side by side in every cell: the adjusted one is wider
    v = r.verdicts["random"]
    assert f"{r.differences['random']:+.5f}; Holm {v.adjusted:+.5f} → " in text
    assert v.adjusted.high - v.adjusted.low > r.differences['random'].high - r.differences['random'].low


def test_a_finding_stored_before_equal_memory_renders_labelled():
    old = {"rows": [{"profile_text": "default", "budget": 7603.2, "share": 0.33, "heldout_text": "code", "aware": 0.6, "unaware": 0.55,
                     "uniform_name": "K4V4", "uniform": 0.62, "tokens": 496, "aware_minus_unaware": None, "aware_minus_uniform": None}],
           "rank_correlation": {}, "layer_agreement": {}, "plans": {}}
    assert "not a comparison at equal memory" in search_markdown(old)


def test_held_out_scores_keep_per_window_sums_that_give_the_token_and_document_means():
    """The cache keeps each window's KLD sum and token count (a few hundred bytes, carried between machines):
    the token mean and the per-document means come out as from the per-token values (hand values)."""
    import numpy as np

    from wkvlab.findings.search import HeldOutScore, document_means
    from wkvlab.search.measure import Score

    per_token = np.array([1.0, 3.0, 2.0, 4.0, 6.0, 10.0])
    windows = np.array([0, 0, 1, 1, 1, 3])  # window 2 scored nothing (an all-padding tail)
    held = HeldOutScore.from_score(Score(float(per_token.mean()), 0.0, 6, per_token, windows), n_windows=4)
    assert held.sums.tolist() == [4.0, 12.0, 0.0, 10.0] and held.counts.tolist() == [2, 3, 0, 1]
    assert held.kld == pytest.approx(26 / 6) and held.tokens == 6
    # windows 0 and 1 are document 7's, 2 and 3 document 5's: sorted documents 5, 7
    assert document_means(held, (7, 7, 5, 5)).tolist() == [10.0, 16 / 5]
