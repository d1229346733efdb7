import pytest
import torch

from wkvlab.eval.topk import coarsened_kld, topk_kld


def _full_kld(a, b):
    pa, la, lb = torch.softmax(a.double(), -1), torch.log_softmax(a.double(), -1), torch.log_softmax(b.double(), -1)
    return (pa * (la - lb)).sum(-1)


@pytest.mark.parametrize("seed", range(5))
def test_bound_never_exceeds_full_kld_and_converges(seed):
    torch.manual_seed(seed)
    ref = torch.randn(16, 300) * 3
    cand = ref + torch.randn_like(ref) * 0.5
    full = _full_kld(ref, cand)
    previous = torch.zeros_like(full)
    for k in (1, 5, 20, 100, 200, 299, 300):
        bound, tail = topk_kld(ref, cand, k)
        assert torch.all(bound <= full + 1e-12)
        assert torch.all(bound >= previous - 1e-12)  # refining buckets never lowers the bound
        assert torch.all((tail >= -1e-12) & (tail <= 1))
        previous = bound
    torch.testing.assert_close(previous, full)


def test_identical_distributions_give_zero():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    bound, _ = topk_kld(logits, logits, 10)
    assert torch.allclose(bound, torch.zeros(4, dtype=torch.float64), atol=1e-12)


def test_hand_computed_two_buckets():
    # p = [0.5 | rest 0.5], q = [0.25 | rest 0.75]
    bound = coarsened_kld(torch.log(torch.tensor([[0.5]])), torch.log(torch.tensor([[0.25]])))
    expected = 0.5 * torch.log(torch.tensor(2.0)) + 0.5 * torch.log(torch.tensor(0.5 / 0.75))
    assert torch.isclose(bound[0], expected.double())


def test_candidate_probabilities_summing_above_one_keep_the_bound_below_the_true_kld():
    # The candidate puts all but 1e-7 of its mass on 5 tokens; the reference leaves 0.1 outside them.
    # A server reports the 5 log-probs rounded so that they sum slightly above 1: the candidate's
    # leftover is then unknown, and clamping it to ~0 gave 0.1 * log(0.1 / 1e-300) ≈ 69 nats.
    cand_p = torch.full((1, 50), 1e-7 / 45, dtype=torch.float64)
    cand_p[0, :5] = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]) * (1 - 1e-7)
    ref_p = torch.full((1, 50), 0.1 / 45, dtype=torch.float64)
    ref_p[0, :5] = torch.tensor([0.3, 0.3, 0.1, 0.1, 0.1])
    full = (ref_p * (ref_p.log() - cand_p.log())).sum(-1)
    reported = (cand_p[:, :5] * (1 + 2e-6)).log()  # rounded upwards: sums to 1.000002
    assert reported.exp().sum() > 1
    bound = coarsened_kld(ref_p[:, :5].log(), reported)
    assert 0 < bound[0] <= full[0]
    # a leftover well above the rounding (1e-3) keeps its own bucket: the hand-computed k + 1 bound
    cand_p[0, :5] *= (1 - 1e-3) / (1 - 1e-7)
    exact = coarsened_kld(ref_p[:, :5].log(), cand_p[:, :5].log())
    head = (ref_p[0, :5] * (ref_p[0, :5].log() - cand_p[0, :5].log())).sum()
    q_rest = 1 - cand_p[0, :5].sum()
    assert abs(q_rest - 1e-3) < 1e-8
    p_rest = 1 - ref_p[0, :5].sum()
    torch.testing.assert_close(exact[0], head + p_rest * torch.log(p_rest / q_rest))
