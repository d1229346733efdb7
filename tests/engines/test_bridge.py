"""Engine output → metrics: full logits match the simulation's path; top-k buckets bound the full KLD."""
import numpy as np
import pytest
import torch

from tests.engines.scores import random_window, reported_topk
from wkvlab.engines.base import PAD_ID, WindowScores
from wkvlab.engines.bridge import compare_window
from wkvlab.errors import DataError
from wkvlab.eval.metrics import ReferenceTokens, compare_tokens


def _window(seed=0):
    return random_window(seed)


def _topk_scores(cand, tokens, positions, k):
    return reported_topk(cand[positions], tokens, positions, k)


def test_full_logits_path_is_the_simulation_path():
    ref, cand, tokens = _window()
    positions = torch.arange(3, 11)
    got = compare_window(ref, tokens, WindowScores(positions=positions, logits=cand[positions]))
    expected = compare_tokens(ReferenceTokens.from_logits(ref[positions], tokens[positions + 1]), cand[positions])
    np.testing.assert_array_equal(got.metrics.kld, expected.kld)
    np.testing.assert_array_equal(got.metrics.top1_agree, expected.top1_agree)
    np.testing.assert_array_equal(got.positions, positions.numpy())


@pytest.mark.parametrize("seed", range(3))
def test_engine_topk_bound_never_exceeds_full_kld_and_converges(seed):
    ref, cand, tokens = _window(seed)
    positions = torch.arange(0, 11)
    full = compare_window(ref, tokens, WindowScores(positions=positions, logits=cand[positions]))
    previous = np.zeros(len(positions))
    for k in (1, 5, 20, 100, 300):
        got = compare_window(ref, tokens, _topk_scores(cand, tokens, positions, k))
        assert np.all(got.metrics.kld <= full.metrics.kld + 1e-6)  # full path sums in float32
        assert np.all(got.metrics.kld >= previous - 1e-12)  # more buckets never lower the bound
        assert np.all((got.tail_mass >= 0) & (got.tail_mass <= 1))
        # NLL, Δp and top-1 need no bound: the scored token and the engine's argmax are reported
        np.testing.assert_allclose(got.metrics.nll, full.metrics.nll, atol=1e-5)
        np.testing.assert_array_equal(got.metrics.top1_agree, full.metrics.top1_agree)
        previous = got.metrics.kld
    np.testing.assert_allclose(previous, full.metrics.kld, atol=1e-5)  # every token reported: exact
    np.testing.assert_allclose(got.tail_mass, 0, atol=1e-12)


def test_hand_computed_bucket_bound():
    # vocabulary of 3; reference p = [0.5, 0.3, 0.2]; engine q = [0.4, 0.4, 0.2] reports token 0 only.
    ref = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]))
    cand_lp = torch.log(torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64))
    tokens = torch.tensor([0, 0])
    scores = WindowScores(positions=torch.tensor([0]), ids=torch.tensor([[0]]), logprobs=cand_lp[[0]][None], topk=1)
    got = compare_window(ref, tokens, scores)
    expected = 0.5 * np.log(0.5 / 0.4) + 0.5 * np.log(0.5 / 0.6)
    assert got.metrics.kld[0] == pytest.approx(expected, abs=1e-7)
    assert got.tail_mass[0] == pytest.approx(0.5, abs=1e-7)
    assert got.metrics.nll[0] == pytest.approx(-np.log(0.4))


def test_missing_scored_token_and_foreign_vocabulary_are_refused():
    ref, cand, tokens = _window()
    positions = torch.arange(0, 4)
    scores = _topk_scores(cand, tokens, positions, 5)
    scores.ids[1, 0] = PAD_ID  # drop the scored token of position 1
    with pytest.raises(DataError, match="no log-prob for the scored token at position 1"):
        compare_window(ref, tokens, scores)
    with pytest.raises(DataError, match="vocabulary"):
        compare_window(ref, tokens, WindowScores(positions=positions, logits=torch.zeros(4, 301)))
