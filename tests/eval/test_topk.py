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
