import math

import numpy as np
import torch

from wkvlab.eval.metrics import ReferenceTokens, by_position, compare_tokens, kld_summary, perplexity, position_buckets


def test_kl_of_a_distribution_with_itself_is_zero():
    torch.manual_seed(0)
    logits = torch.randn(7, 50) * 3
    targets = torch.randint(0, 50, (7,))
    m = compare_tokens(ReferenceTokens.from_logits(logits, targets), logits.clone())
    assert np.all(m.kld == 0.0)
    assert m.top1_agree.all() and np.all(m.delta_p == 0.0)
    np.testing.assert_array_equal(m.nll, m.nll_ref)


def test_uniform_logits_give_ppl_equal_to_vocabulary():
    vocab = 321
    logits = torch.zeros(5, vocab)
    targets = torch.arange(5)
    ref = ReferenceTokens.from_logits(logits, targets)
    assert math.isclose(perplexity(ref.nll.double().numpy()), vocab, rel_tol=1e-6)


def test_hand_computed_kl_and_delta_p():
    # p = [0.5, 0.5], q = [0.25, 0.75]: KL = 0.5 ln(2) + 0.5 ln(2/3)
    p_logits = torch.log(torch.tensor([[0.5, 0.5]]))
    q_logits = torch.log(torch.tensor([[0.25, 0.75]]))
    m = compare_tokens(ReferenceTokens.from_logits(p_logits, torch.tensor([1])), q_logits)
    expected = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert math.isclose(m.kld[0], expected, rel_tol=1e-6)
    assert math.isclose(m.delta_p[0], 0.25, rel_tol=1e-6)
    assert math.isclose(m.nll[0], -math.log(0.75), rel_tol=1e-6)
    assert not m.top1_agree[0]  # tie in p breaks to token 0, q picks token 1


def test_kld_summary_hand_values():
    s = kld_summary(np.array([0.0, 1.0, 2.0, 3.0]))
    assert s["mean"] == 1.5 and s["max"] == 3.0 and s["median"] == 1.5
    assert math.isclose(s["se"], np.std([0, 1, 2, 3], ddof=1) / 2)


def test_position_buckets_clip_to_context():
    assert position_buckets(512) == [(0, 64), (64, 256), (256, 511)]
    assert position_buckets(8192)[-1] == (4096, 8191)
    rows = by_position(np.array([1.0, 2.0, 3.0]), np.array([True, False, True]), np.array([0, 70, 80]), [(0, 64), (64, 256)])
    assert rows == [
        {"start": 0, "end": 64, "tokens": 1, "kld_mean": 1.0, "top1_agreement": 1.0},
        {"start": 64, "end": 256, "tokens": 2, "kld_mean": 2.5, "top1_agreement": 0.5},
    ]
