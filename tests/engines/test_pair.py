"""Engine against engine: both sides' log-probs on the same tokens, the shared-bucket bound, KV deltas."""
import math

import numpy as np
import pytest
import torch

from tests.engines.fake_server import VOCAB, FakeServer, TinyTokenizer, bigram_logits, prompt_logprobs_answer
from tests.engines.scores import random_window, reported_topk
from wkvlab.data.corpora import Corpus
from wkvlab.data.windows import WindowSet
from wkvlab.engines.base import PAD_ID, WindowScores
from wkvlab.engines.bridge import compare_window
from wkvlab.engines.openai import OpenAIEngine, ServerSpec
from wkvlab.engines.pair import compare_pair
from wkvlab.engines.pair_run import evaluate_pair, kv_delta
from wkvlab.engines.run import EngineEvalResult
from wkvlab.engines.tokens import TokenWorkload
from wkvlab.errors import DataError
from wkvlab.eval.metrics import ReferenceTokens, compare_tokens
from wkvlab.eval.result import TokenArrays


def _window(seed=0, vocab=300):
    return random_window(seed, vocab=vocab, noise=0.5)


def _topk(logits, tokens, positions, k):
    return reported_topk(logits[positions], tokens, positions, k)


def _full(logits, positions):
    return WindowScores(positions=positions, logits=logits[positions])


def _exact(ref, cand, tokens, positions):
    return compare_tokens(ReferenceTokens.from_logits(ref[positions], tokens[positions + 1]), cand[positions])


POS = torch.arange(2, 11)


def test_two_full_sides_are_the_simulation_path_and_full_ref_is_the_bridge():
    ref, cand, tokens = _window()
    got = compare_pair(_full(ref, POS), _full(cand, POS), tokens)
    np.testing.assert_array_equal(got.metrics.kld, _exact(ref, cand, tokens, POS).kld)
    assert got.tail_mass.tolist() == [0.0] * len(POS) and got.positions.tolist() == POS.tolist()
    scores = _topk(cand, tokens, POS, 7)
    bridge = compare_window(ref, tokens, scores)
    pair = compare_pair(_full(ref, POS), scores, tokens)
    np.testing.assert_array_equal(pair.metrics.kld, bridge.metrics.kld)
    np.testing.assert_array_equal(pair.tail_mass, bridge.tail_mass)


@pytest.mark.parametrize("seed", [0, 1])
def test_topk_reference_bounds_never_exceed_full_kld_and_converge(seed):
    ref, cand, tokens = _window(seed, vocab=200)
    exact = _exact(ref, cand, tokens, POS)
    previous = None
    for k in (1, 5, 40, 200):
        for cand_side in (_full(cand, POS), _topk(cand, tokens, POS, k)):
            got = compare_pair(_topk(ref, tokens, POS, k), cand_side, tokens)
            assert np.all(got.metrics.kld <= exact.kld + 1e-6)  # exact: float32 sums
            assert np.all(got.metrics.kld >= -1e-12)
            # NLL and top-1 need no bound
            np.testing.assert_allclose(got.metrics.nll, exact.nll, atol=1e-5)
            np.testing.assert_allclose(got.metrics.nll_ref, exact.nll_ref, atol=1e-5)
            np.testing.assert_array_equal(got.metrics.top1_agree, exact.top1_agree)
        both = compare_pair(_topk(ref, tokens, POS, k), _topk(cand, tokens, POS, k), tokens)
        if previous is not None:
            assert both.metrics.kld.mean() >= previous - 1e-9  # more shared buckets, tighter bound
        previous = both.metrics.kld.mean()
    np.testing.assert_allclose(both.metrics.kld, exact.kld, atol=1e-5)  # k = vocabulary: exact
    assert both.tail_mass.max() < 1e-9


def test_both_topk_bound_by_hand():
    # vocabulary of 5; the reference reports {0, 1} + target 4, the candidate {2, 1} + target 4: shared {1, 4}
    p = torch.tensor([0.4, 0.3, 0.1, 0.05, 0.15], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.4, 0.1, 0.2], dtype=torch.float64)
    tokens = torch.tensor([3, 4])
    pos = torch.tensor([0])
    ref = WindowScores(positions=pos, ids=torch.tensor([[0, 1, 4]]), logprobs=p[[0, 1, 4]].log()[None], topk=2)
    cand = WindowScores(positions=pos, ids=torch.tensor([[2, 1, 4, PAD_ID]]), logprobs=torch.cat([q[[2, 1, 4]].log(), torch.zeros(1, dtype=torch.float64)])[None], topk=2)
    got = compare_pair(ref, cand, tokens)
    p_rest, q_rest = 1 - 0.3 - 0.15, 1 - 0.2 - 0.2
    hand = 0.3 * math.log(0.3 / 0.2) + 0.15 * math.log(0.15 / 0.2) + p_rest * math.log(p_rest / q_rest)
    assert got.metrics.kld[0] == pytest.approx(hand, abs=1e-12)
    assert got.tail_mass[0] == pytest.approx(p_rest, abs=1e-12)
    assert got.metrics.nll[0] == pytest.approx(-math.log(0.2)) and got.metrics.nll_ref[0] == pytest.approx(-math.log(0.15))
    assert not got.metrics.top1_agree[0]  # reference's best is 0, candidate's is 2
    assert got.metrics.delta_p[0] == pytest.approx(0.2 - 0.15)


def test_refusals_and_position_alignment():
    ref, cand, tokens = _window()
    r = _topk(ref, tokens, POS, 3)
    no_target = _topk(cand, tokens, POS, 3)
    no_target.ids[0, 0] = PAD_ID  # the scored token is first in each row
    with pytest.raises(DataError, match="candidate gave no log-prob for the scored token at position 2"):
        compare_pair(r, no_target, tokens)
    with pytest.raises(DataError, match="no position in common"):
        compare_pair(_topk(ref, tokens, torch.tensor([2, 3]), 3), _topk(cand, tokens, torch.tensor([5, 6]), 3), tokens)
    # the candidate skipped a position: only the shared ones are compared, each with its own rows
    got = compare_pair(_topk(ref, tokens, POS, 3), _topk(cand, tokens, POS[1:], 3), tokens)
    assert got.positions.tolist() == POS[1:].tolist()
    full = compare_pair(_topk(ref, tokens, POS, 3), _topk(cand, tokens, POS, 3), tokens)
    np.testing.assert_array_equal(got.metrics.kld, full.metrics.kld[1:])


def _result(kld, window, kv):
    n = len(kld)
    arrays = TokenArrays(kld=np.array(kld, float), nll_ref=np.zeros(n), nll=np.zeros(n), top1_agree=np.ones(n, bool),
                         delta_p=np.zeros(n), position=np.array([i % 3 for i in range(n)]), window=np.array(window))
    return EngineEvalResult(model="m", data="d", ctx=4, weights="engine", kv=kv, weights_spec={}, kv_spec={}, weight_bytes=0,
                            kv_bytes_per_token=float("nan"), seconds=0.0, arrays=arrays, buckets=[(0, 3)])


def test_kv_delta_is_paired_per_prompt():
    base = _result([0.1, 0.2, 0.3, 0.0, 0.0, 0.3], [0, 0, 0, 1, 1, 1], "f16")
    cand = _result([0.2, 0.4, 0.3, 0.1, 0.1, 0.4], [0, 0, 0, 1, 1, 1], "q4_0")
    d = kv_delta(base, cand)
    assert d["baseline"] == "f16" and d["tokens"] == 6
    assert d["kld"]["estimate"] == pytest.approx(0.6 / 6)
    assert [p["kld_delta"] for p in d["per_prompt"]] == pytest.approx([0.1, 0.1])
    assert d["kld"]["low"] is None and not d["kld"]["decided"]  # two prompts: too few for an interval (wkvlab.stats)
    eight = [p // 2 for p in range(16)]
    d8 = kv_delta(_result([0.1] * 16, eight, "f16"), _result([0.2] * 16, eight, "q4_0"))
    assert d8["kld"]["low"] == pytest.approx(0.1) and d8["kld"]["high"] == pytest.approx(0.1)  # every prompt moved by 0.1
    assert d["top1"]["estimate"] == 0.0
    # a candidate that scored one token fewer is paired on the shared tokens only
    short = _result([0.2, 0.4, 0.1, 0.1, 0.4], [0, 0, 1, 1, 1], "q4_0")
    short.arrays.position = np.array([0, 1, 0, 1, 2])
    d = kv_delta(base, short)
    assert d["tokens"] == 5 and d["per_prompt"][0]["kld_delta"] == pytest.approx((0.2 + 0.4 - 0.1 - 0.2) / 2)


def test_served_reference_and_candidates_end_to_end_against_exact_klds():
    """Three scripted vLLM-style servers (a reference bigram table and two perturbed ones)."""
    torch.manual_seed(7)
    base_table = bigram_logits(list(range(VOCAB))).clone()
    tables = [base_table, base_table + 0.05 * torch.randn_like(base_table), base_table + 0.6 * torch.randn_like(base_table)]
    windows = torch.tensor([[0, 5, 9, 12, 3, 37, 7, 21, 36, 4], [0, 8, 1, 33, 2, 2, 14, 30, 6, 11]])
    work = TokenWorkload("tiny", TinyTokenizer(), "fp", Corpus("text", "x"), WindowSet(windows, score_from=0, bos=True))

    def handler(table):
        return lambda p: (200, prompt_logprobs_answer(p["prompt"], p["prompt_logprobs"], table=table), 0)

    for k, exact_expected in ((5, False), (VOCAB, True)):
        with FakeServer(handler(tables[0])) as r, FakeServer(handler(tables[1])) as a, FakeServer(handler(tables[2])) as b:
            engine = lambda s: OpenAIEngine(ServerSpec(url=s.url, model="tiny", topk=k), TinyTokenizer())  # noqa: E731
            results = evaluate_pair(engine(r), [engine(a), engine(b)], work)
        exact = [np.concatenate([_exact(bigram_logits(w.tolist(), tables[0]).float(), bigram_logits(w.tolist(), t).float(), w,
                                        torch.arange(0, len(w) - 1)).kld for w in windows]) for t in tables[1:]]
        for result, full in zip(results, exact):
            assert result.kld_method == "topk-bound" and result.tokens == 2 * 9
            assert result.reference["name"] == "openai" and result.reference["server"]["url"] == r.url
            assert np.all(result.arrays.kld <= full + 1e-6)
            if exact_expected:
                np.testing.assert_allclose(result.arrays.kld, full, atol=1e-5)
        assert results[0].kv_delta is None
        delta = results[1].kv_delta
        assert delta["kld"]["estimate"] == pytest.approx(results[1].arrays.kld.mean() - results[0].arrays.kld.mean())
        assert delta["kld"]["estimate"] > 0 and not delta["kld"]["decided"]  # worse, but two prompts decide nothing
        assert len(delta["per_prompt"]) == 2 and results[1].to_dict()["kv_delta"] == delta
