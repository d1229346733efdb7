"""The depth finding on identical tokens: the same target tokens after prefixes of increasing length."""
import numpy as np
import pytest
import torch

from tests.explain.results_a import result
from wkvlab.errors import DataError
from wkvlab.findings.depth import depth_rows, identical_token_windows, measure_depth, prefix_lengths


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


def _by_length(growth_per_doubling: float, noise: float = 0.002, documents: int = 8):
    """Hand-made results: per-document penalties that grow by ``growth_per_doubling`` per doubling."""
    rng = np.random.default_rng(0)
    doc = rng.lognormal(0.0, 0.5, documents) * 0.05  # documents differ a lot: pairing must cancel it
    out = {}
    for i, length in enumerate((16, 32, 64, 128)):
        per_doc = doc * (1 + growth_per_doubling * i) + rng.normal(0, noise, documents)
        out[length] = {"q4_0": result(np.repeat(per_doc, 32), windows=documents, kv="q4_0")}
    return out


def test_growth_is_paired_by_document_and_decided_by_the_rule():
    rows = depth_rows(_by_length(0.5))
    assert [r.length for r in rows] == [16, 32, 64, 128] and rows[0].growth is None and rows[0].verdict is None
    last = rows[-1]
    assert last.relative.estimate == pytest.approx(1.5, abs=0.2) and last.verdict.word == "grows"
    assert last.verdict.family_size == 3 and "Holm over 3 tests" in last.verdict.describe()
    flat = depth_rows(_by_length(0.0, noise=1e-5))
    assert all(r.verdict.outcome == "within" for r in flat[1:])
    few = depth_rows(_by_length(0.5, documents=4))
    assert all(r.verdict.word == "undecided" for r in few[1:])  # 4 documents: no interval, never "flat"
    with pytest.raises(DataError, match="at least 4 prefix lengths"):
        depth_rows({k: v for k, v in _by_length(0.5).items() if k < 128})


def test_the_finding_runs_on_a_tiny_model_and_renders(tiny_folder):
    from wkvlab.findings.render import identical_depth_markdown

    found = measure_depth(tiny_folder, ("int4", "q4_0"), target=32, longest=256, device="cpu", dtype="float32")
    assert found.documents == 8 and found.lengths == (32, 64, 128, 256) and found.data == "code-long"
    assert [(r.kv, r.length) for r in found.rows][:4] == [("int4", 32), ("int4", 64), ("int4", 128), ("int4", 256)]
    assert all(r.tokens == 8 * 32 and r.penalty.n_units == 8 and r.penalty.decided for r in found.rows)
    assert all(r.verdict is not None and r.verdict.family_size == 6 for r in found.rows if r.length != 32)
    text = identical_depth_markdown(found.to_dict())
    assert "the same 32 target tokens of each of 8 documents" in text and "Holm over 6 tests" in text


def test_progress_steps_weigh_their_windows_tokens_so_the_eta_sees_the_long_prefixes(tiny_folder):
    """The longest window's pass (256 + 32 tokens) weighs 4.5x the shortest's (32 + 32; one chunk each),
    and the weighted steps still add up to the total the progress line was opened with."""
    from contextlib import contextmanager

    from wkvlab.findings.depth import step_weights

    assert step_weights({64: 4, 512: 4}, {64: 128.0, 512: 576.0}) == pytest.approx({64: 8 * 128 / 2816, 512: 8 * 576 / 2816})
    seen = {"total": None, "ticks": []}

    @contextmanager
    def recording(total, _title):
        seen["total"] = total
        yield lambda desc, n: seen["ticks"].append((desc, n))

    measure_depth(tiny_folder, ("int4",), target=32, longest=256, device="cpu", dtype="float32", progress=recording)
    assert sum(n for _, n in seen["ticks"]) == pytest.approx(seen["total"])
    passes = [n for desc, n in seen["ticks"] if desc == "reference"]  # one per document and length, shortest first
    bos = (0, 1)  # the tiny tokenizer may or may not prepend BOS to each window
    assert len(passes) == 8 * 4 and any(passes[-1] / passes[0] == pytest.approx((b + 256 + 32) / (b + 32 + 32)) for b in bos)
