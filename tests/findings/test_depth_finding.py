"""The depth finding on identical tokens: the same target tokens after prefixes of increasing length."""
import numpy as np
import pytest
import torch

from tests.explain.results_a import result
from wkvlab.errors import DataError
from wkvlab.findings.depth import depth_rows, identical_token_windows, longest_reached, measure_depth, prefix_lengths, reach


def test_prefix_lengths_double_up_to_the_longest():
    assert prefix_lengths(512, 7680) == (512, 1024, 2048, 4096, 7680)
    assert prefix_lengths(16, 64) == (16, 32, 64)
    with pytest.raises(DataError, match="no prefix of 16"):
        prefix_lengths(16, 8)


def test_every_length_scores_the_same_target_tokens():
    docs = [torch.arange(1000 * d, 1000 * d + 200) for d in range(8)]
    windows = identical_token_windows(docs, (16, 32, 64, 128), 24, bos_id=7)
    targets = set()
    for length, w in windows.items():
        assert w.tokens.shape == (8, 1 + length + 24) and (w.tokens[:, 0] == 7).all()
        assert w.scored_per_window == 24
        # position p predicts token p + 1: the scored queries predict exactly the 24 target tokens
        predicted = w.tokens[:, w.score_from + 1 :]
        targets.add(tuple(predicted.flatten().tolist()))
        assert (predicted[:, 0] == torch.tensor([1000 * d + 128 for d in range(8)])).all()
        assert (w.tokens[:, 1 : 1 + length] == torch.stack([d[128 - length : 128] for d in docs])).all()  # the prefix right before
    assert len(targets) == 1
    with pytest.raises(DataError, match="shorter than the longest prefix"):
        identical_token_windows([torch.arange(100)] * 8, (16, 32, 64, 128), 24, bos_id=None)


def _by_length(growth_per_doubling: float, noise: float = 0.002, documents: int = 8, sharpening: float = 0.0):
    """Hand-made results: per-document penalties that grow by ``growth_per_doubling`` per doubling, the reference's
    NLL falling by ``sharpening`` per doubling."""
    rng = np.random.default_rng(0)
    doc = rng.lognormal(0.0, 0.5, documents) * 0.05  # documents differ a lot: pairing must cancel it
    out = {}
    for i, length in enumerate((16, 32, 64, 128)):
        per_doc = doc * (1 + growth_per_doubling * i) + rng.normal(0, noise, documents)
        nll = np.repeat(2.0 * (1 - sharpening) ** i + np.arange(documents) * 0.01, 32)
        out[length] = {"q4_0": result(np.repeat(per_doc, 32), nll_ref=nll, windows=documents, kv="q4_0")}
    return out


def test_growth_at_the_longest_prefix_is_paired_by_document_and_decided_by_the_rule():
    rows = depth_rows(_by_length(0.5))
    assert [r.length for r in rows] == [16, 32, 64, 128] and rows[0].growth is None and rows[0].verdict is None
    # the pre-declared contrast: only the longest prefix is decided, raw and adjusted, one family of 2 per cache
    assert all(r.verdict is None and r.adjusted_verdict is None and r.growth is not None for r in rows[1:3])
    last = rows[-1]
    assert last.relative.estimate == pytest.approx(1.5, abs=0.2) and last.verdict.word == "grows"
    assert last.adjusted_verdict.word == "grows" and last.verdict.family_size == 2 and "Holm over 2 tests" in last.verdict.describe()
    assert last.verdict.margin.value == pytest.approx(0.05 * rows[0].penalty.estimate)  # the design's 5% of the shortest's penalty
    flat = depth_rows(_by_length(0.0, noise=1e-5))
    assert flat[-1].verdict.outcome == "within" and flat[-1].adjusted_verdict.outcome == "within"
    few = depth_rows(_by_length(0.5, documents=4))
    assert few[-1].verdict.word == "undecided"  # 4 documents: no interval, never "flat"
    with pytest.raises(DataError, match="at least 4 prefix lengths"):
        depth_rows({k: v for k, v in _by_length(0.5).items() if k < 128})


def test_the_reference_sharpening_control_separates_a_sharper_reference_from_less_damage():
    """The penalty falls 20% per doubling exactly as the reference's NLL does: the cache's damage per nat of the
    reference is unchanged. The raw growth says "shrinks"; adjusted for the sharpening it is flat."""
    rows = depth_rows(_sharpened(), margin="5%")
    last = rows[-1]
    assert last.verdict.word == "shrinks"
    assert last.adjusted.estimate == pytest.approx(0.0, abs=1e-4) and last.adjusted_verdict.outcome == "within"
    assert last.sharpening.estimate == pytest.approx(0.8 ** 3 - 1, abs=0.01) and last.reference.estimate < rows[0].reference.estimate


def _sharpened():
    rng = np.random.default_rng(1)
    doc = rng.lognormal(0.0, 0.5, 12) * 0.05
    nll0 = 2.0 + rng.random(12)
    out = {}
    for i, length in enumerate((16, 32, 64, 128)):
        factor = 0.8 ** i  # the reference's NLL and the penalty fall together
        out[length] = {"int4": result(np.repeat(doc * factor, 32), nll_ref=np.repeat(nll0 * factor, 32), windows=12, kv="int4")}
    return out


def test_the_longest_prefix_is_the_longest_that_enough_documents_reach():
    sizes = [30_000, 25_000] + [12_000] * 30 + [9_000] * 16 + [3_000] * 100  # the 100 short ones hold no 1,024-token prefix and 2,048 targets
    # the 32nd longest document holds 12,000 tokens: with 2,048 targets the longest prefix is 9,952, within a 32k model
    assert longest_reached(sizes, 2048, 32, 32_768) == 12_000 - 2048
    # the model's limit binds first on an 8k model: 8,191 tokens of window (one for BOS), and 48 documents reach it
    top = longest_reached(sizes, 2048, 32, 8191)
    assert top == 8191 - 2048 and sum(n >= top + 2048 for n in sizes) == 48
    assert reach(sizes, 2048, lengths=(1024, 8192, 16384)) == {1024: 48, 8192: 32, 16384: 2}
    with pytest.raises(DataError, match="fewer than the 32"):
        longest_reached(sizes[:20], 2048, 32, 8191)


TINY = dict(target=32, longest=256, data="code-long", documents=8, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def tiny_depth(tiny_folder):
    return measure_depth(tiny_folder, ("int4", "q4_0"), **TINY)


def test_the_finding_runs_on_a_tiny_model_and_renders(tiny_depth):
    from wkvlab.findings.render import identical_depth_markdown

    found = tiny_depth
    assert found.documents == 8 and found.lengths == (32, 64, 128, 256) and found.data == "code-long"
    assert [(r.kv, r.length) for r in found.rows][:4] == [("int4", 32), ("int4", 64), ("int4", 128), ("int4", 256)]
    assert all(r.tokens == 8 * 32 and r.penalty.n_units == 8 and r.penalty.decided for r in found.rows)
    decided = [r for r in found.rows if r.verdict is not None]
    assert [r.length for r in decided] == [256, 256] and all(r.verdict.family_size == 4 for r in decided)
    assert len(found.per_document["int4"]["256"]) == 8 and len(found.per_document["reference NLL"]["32"]) == 8
    assert found.minimum == 8 and found.reach[1024] <= 8 and len(found.names) == 8
    text = identical_depth_markdown(found.to_dict())
    assert "the same 32 target tokens of each of 8 documents" in text and "Holm over 4 tests" in text
    assert "reference NLL change [95%]" in text and "at least 8 documents reach" in text and "adjusted: " in text


def test_the_stored_record_decides_the_same_table_as_the_run(tiny_depth):
    """Stored vs in-memory: the finding's dict through JSON (keys sorted, as a run record writes it) decided again from
    its per-document means gives the table the run rendered, reach in length order included."""
    import json

    from wkvlab.findings.records import redecide
    from wkvlab.findings.render import identical_depth_markdown

    data = tiny_depth.to_dict()
    markdown, again = redecide("depth-long", json.loads(json.dumps(data, sort_keys=True)))
    assert markdown == identical_depth_markdown(data)
    bounds = lambda rows: [r["adjusted"][k] for r in rows if r["adjusted"] for k in ("low", "high")]  # noqa: E731
    assert len(bounds(data["rows"])) == 12 and bounds(again["rows"]) == pytest.approx(bounds(data["rows"]), rel=1e-9, abs=1e-12)


def test_progress_steps_weigh_their_windows_tokens_so_the_eta_sees_the_long_prefixes(tiny_folder, tmp_path, monkeypatch):
    """The longest window's pass (256 + 32 tokens) weighs 4.5x the shortest's (32 + 32; one chunk each),
    and the weighted steps still add up to the total the progress line was opened with."""
    from contextlib import contextmanager

    from wkvlab.findings.depth import step_weights

    assert step_weights({64: 4, 512: 4}, {64: 128.0, 512: 576.0}) == pytest.approx({64: 8 * 128 / 2816, 512: 8 * 576 / 2816})
    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path))  # measured, not read back from another test's cache
    seen = {"total": None, "ticks": []}

    @contextmanager
    def recording(total, _title):
        seen["total"] = total
        yield lambda desc, n: seen["ticks"].append((desc, n))

    measure_depth(tiny_folder, ("int4",), target=32, longest=256, data="code-long", documents=8, device="cpu", dtype="float32",
                  progress=recording)
    assert sum(n for _, n in seen["ticks"]) == pytest.approx(seen["total"])
    passes = [n for desc, n in seen["ticks"] if desc == "reference"]  # one per document and length, shortest first
    bos = (0, 1)  # the tiny tokenizer may or may not prepend BOS to each window
    assert len(passes) == 8 * 4 and any(passes[-1] / passes[0] == pytest.approx((b + 256 + 32) / (b + 32 + 32)) for b in bos)


def test_an_interrupted_run_resumes_at_the_part_it_was_on(tiny_folder, tiny_depth, tmp_path, monkeypatch):
    """Each part of a prefix length (4 documents) goes into the cache when it is done; a rerun reads those parts back and
    measures only the rest — here the second half of the second length — and decides exactly what one uninterrupted run
    decides (the SmolLM2 run is hours at 8k tokens, longer than a machine here lives: the files are carried to the next
    one, and a part is minutes where a length is an hour)."""
    import json

    import wkvlab.eval.runner as runner

    kw, whole = TINY, tiny_depth
    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path / "cache"))
    real, calls = runner.run_grid, []

    def stopped_at_fourth(*a, **k):
        calls.append(k["data_name"])
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "run_grid", stopped_at_fourth)
    with pytest.raises(KeyboardInterrupt):
        measure_depth(tiny_folder, ("int4", "q4_0"), **kw)
    assert calls == ["code-long@prefix32[0:4]", "code-long@prefix32[4:8]", "code-long@prefix64[0:4]", "code-long@prefix64[4:8]"]
    assert len(list((tmp_path / "cache" / "findings-depth").glob("*.npz"))) == 3  # no half-written fourth
    calls.clear()
    monkeypatch.setattr(runner, "run_grid", lambda *a, **k: calls.append(k["data_name"]) or real(*a, **k))
    resumed = measure_depth(tiny_folder, ("int4", "q4_0"), **kw)
    assert calls == ["code-long@prefix64[4:8]", "code-long@prefix128[0:4]", "code-long@prefix128[4:8]", "code-long@prefix256[0:4]",
                     "code-long@prefix256[4:8]"]
    assert resumed.read_back == [(32, 0), (32, 4), (64, 0)]
    assert json.dumps([r.to_dict() for r in resumed.rows]) == json.dumps([r.to_dict() for r in whole.rows])
    assert resumed.per_document == whole.per_document
    calls.clear()
    again = measure_depth(tiny_folder, ("int4", "q4_0"), **kw)  # every part cached: nothing measured
    assert calls == [] and len(again.read_back) == 8 and {r.kv for r in again.rows} == {"int4", "q4_0"}
    assert again.to_dict()["parts"] == 8 and again.to_dict()["read_back"][-1] == [256, 4]
    calls.clear()
    other = measure_depth(tiny_folder, ("q4_0", "int4"), **kw)  # other caches (here: their order) are another measurement
    assert len(calls) == 8 and other.read_back == []


def test_a_length_measured_in_parts_scores_its_documents_as_one_whole_pass_does(tiny_folder, tiny_depth, tmp_path, monkeypatch):
    """Windows are scored one by one, so cutting a length into parts changes no number: with one part of all 8 documents
    (the code before parts) every row and per-document mean is the same to the last bit."""
    import json

    import wkvlab.findings.depth as depth

    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(depth, "DOCUMENTS_PER_PART", 8)
    one_part = measure_depth(tiny_folder, ("int4", "q4_0"), **TINY)
    assert one_part.to_dict()["parts"] == 4
    assert json.dumps([r.to_dict() for r in one_part.rows]) == json.dumps([r.to_dict() for r in tiny_depth.rows])
    assert one_part.per_document == tiny_depth.per_document


def test_the_per_document_sums_a_length_keeps_give_what_the_per_token_arrays_give():
    """A length is kept as per-document token counts and sums (bytes, not megabytes): the same intervals and verdicts
    as from the per-token results (the rule reads only per-unit sums)."""
    from wkvlab.findings.depth import LengthScores, depth_table
    from wkvlab.stats import resample

    by_length = _by_length(0.5)
    scores = {n: LengthScores.from_results(r) for n, r in by_length.items()}
    assert scores[16].counts.tolist() == [32.0] * 8 and len(scores[16].kld["q4_0"]) == 8
    rows = depth_table(scores)
    direct = resample(lambda m: m["b"] - m["a"], {"a": by_length[16]["q4_0"].arrays.kld, "b": by_length[128]["q4_0"].arrays.kld},
                      by_length[16]["q4_0"].arrays.window).interval()
    got = rows[-1].growth
    assert (got.estimate, got.low, got.high) == pytest.approx((direct.estimate, direct.low, direct.high), rel=1e-12)
    assert [r.to_dict() for r in rows] == [r.to_dict() for r in depth_rows(by_length)]


def test_the_findings_command_caches_each_length_where_it_says_it_resumes(tiny_folder, tmp_path, monkeypatch):
    """`wkvlab findings depth-long` (run_finding) caches every prefix length, and a second run measures nothing."""
    import json

    from wkvlab.findings.run import run_finding

    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path / "cache"))
    store = tmp_path / "f.db"
    first = run_finding("depth-long", model=tiny_folder, store=store, tokens=32, ctx=288, device="cpu", dtype="float32")
    assert len(list((tmp_path / "cache" / "findings-depth").glob("*.npz"))) == 8  # 4 lengths × 2 parts of 4 documents
    import wkvlab.eval.runner as runner

    real, runner.run_grid = runner.run_grid, None  # a second run that measured anything would fail here
    try:
        again = run_finding("depth-long", model=tiny_folder, store=store, tokens=32, ctx=288, device="cpu", dtype="float32")
    finally:
        runner.run_grid = real
    assert json.dumps(again.data["rows"]) == json.dumps(first.data["rows"])  # NaN-safe
    assert again.data["read_back"] == [[n, first] for n in (32, 64, 128, 256) for first in (0, 4)]
