"""The score-error decomposition: exact sums, zero for the identity, GQA and Gemma-style models."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama
from wkvlab.explain import attention as A
from wkvlab.kv.hook import kv_quantization
from wkvlab.kv.override import attention_override
from wkvlab.kv.spec import KVSpec


def _perturbed(model, scale=0.005, seed=1):
    """A stand-in for a weight-quantized copy: every parameter moved a little."""
    other = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return other


def _recorded_terms(monkeypatch):
    seen = {}
    original = A._Accumulator.add

    def add(self, layer, terms, scores_ref, allowed, kl, sink_tokens):
        seen[layer] = ({t: x.clone() for t, x in terms.items()}, scores_ref.clone(), allowed.clone())
        return original(self, layer, terms, scores_ref, allowed, kl, sink_tokens)

    monkeypatch.setattr(A._Accumulator, "add", add)
    return seen


def _scores_attention_sees(model, spec, ids):
    """Independent path: Q and K as the model's backend receives them (outside the KV hook, so
    after quantization), GQA-expanded, scaled like the model does."""
    got = {}

    def record(backend, module, query, key, value, mask, **kwargs):
        k = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        got[module.layer_idx] = (query[0].double() @ k[0].double().transpose(-1, -2)) * (kwargs.get("scaling") or module.scaling)
        return backend(module, query, key, value, mask, **kwargs)

    with torch.no_grad(), attention_override(model, record), kv_quantization(model, spec):
        model(input_ids=ids, use_cache=False)
    return got


@pytest.mark.parametrize("make,spec", [(tiny_llama, "int4"), (tiny_llama, "q4_0+sinks=4"), (tiny_gemma3, "int4")])
def test_terms_sum_to_the_score_error_the_attention_sees(monkeypatch, make, spec):
    ref = make()
    cand = _perturbed(ref)
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    kv = KVSpec.parse(spec)
    seen = _recorded_terms(monkeypatch)
    result = A.attention_decomposition(ref, cand, kv, ids)
    ref_scores = _scores_attention_sees(ref, KVSpec.parse("fp16"), ids)
    cand_scores = _scores_attention_sees(cand, kv, ids)
    assert sorted(seen) == list(range(ref.config.num_hidden_layers))
    for layer, (terms, scores_ref, allowed) in seen.items():
        total = terms["total"]
        assert total.abs().max() > 1e-3  # the test must see a real error
        torch.testing.assert_close(terms["kv"] + terms["weight"] + terms["cross"], total, rtol=0, atol=1e-10)
        torch.testing.assert_close(terms["cross_weight"] + terms["cross_cache"], terms["cross"], rtol=0, atol=1e-10)
        torch.testing.assert_close(terms["total_w"] + terms["total_c"] + terms["interaction"], total, rtol=0, atol=1e-10)
        expected = (cand_scores[layer] - ref_scores[layer])
        torch.testing.assert_close(total[:, allowed], expected[:, allowed], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(scores_ref, ref_scores[layer], rtol=1e-6, atol=1e-6)
    assert result.kl().min() > 0
    assert sum(result.network_shares().values()) == pytest.approx(1.0)
    # the (W, fp16) and (none, C) cells are whole passes of their own: at every layer, not only layer 0 (where
    # every cell has the same input), they are the two models' own scores captured outside the hook
    cand_fp16 = _scores_attention_sees(cand, KVSpec.parse("fp16"), ids)
    ref_c = _scores_attention_sees(ref, kv, ids)
    for layer, (terms, _, allowed) in seen.items():
        torch.testing.assert_close(terms["total_w"][:, allowed], (cand_fp16[layer] - ref_scores[layer])[:, allowed], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(terms["total_c"][:, allowed], (ref_c[layer] - ref_scores[layer])[:, allowed], rtol=1e-5, atol=1e-5)


def test_the_cross_term_splits_into_weight_and_cache_parts():
    """A 16-bit cache: the cross term is all weight part and the 2×2 interaction is exactly 0.
    Unquantized weights: the W cell is the reference, so the interaction is exactly 0 at every layer and
    the cross term (ε_q from earlier layers' cache error) is all cache part."""
    ref = tiny_llama()
    cand = _perturbed(ref)
    ids = torch.randint(0, 128, (1, 32), generator=torch.Generator().manual_seed(0))
    fp16 = A.attention_decomposition(ref, cand, KVSpec.parse("fp16"), ids)
    assert fp16.sumsq["cross"].sum() > 0 and not fp16.sumsq["cross_cache"].any() and fp16.sumsq["interaction"].max() < 1e-20
    assert fp16.cross_split()["cache"] == 0.0 and fp16.cross_split()["weight"] == pytest.approx(fp16.network_shares()["cross"])
    kv_only = A.attention_decomposition(ref, ref, KVSpec.parse("int4"), ids)
    assert not kv_only.sumsq["interaction"].any() and not kv_only.sumsq["cross_weight"].any()
    assert kv_only.sumsq["cross_cache"][1].min() > 0 and kv_only.kl_interaction() == pytest.approx(0.0, abs=1e-15)
    both = A.attention_decomposition(ref, cand, KVSpec.parse("int4"), ids)
    assert both.sumsq["cross_cache"].sum() > 0 and 0 < both.interaction_share() < 1
    assert "cache part ε_q·ε_k,cᵀ" in " ".join(both.lines())


def test_residual_window_keys_are_chosen_per_query(monkeypatch):
    """With +residual the newest keys stay at full precision: weights unchanged, so the error of
    those pairs is exactly zero while older keys carry the quantization error."""
    ref = tiny_llama()
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(0))
    seen = _recorded_terms(monkeypatch)
    A.attention_decomposition(ref, ref, KVSpec.parse("int4+residual=16"), ids)
    total = seen[0][0]["total"]
    assert total[:, :16, :].abs().max() == 0  # queries 0..15: nothing flushed yet
    assert total[:, 20, :16].abs().max() > 0  # query 20 sees the first 16 keys quantized
    assert total[:, 20, 16:21].abs().max() == 0


def test_identity_is_exactly_zero_and_kv_only_has_no_weight_term():
    ref = tiny_llama()
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))
    same = A.attention_decomposition(ref, ref, KVSpec.parse("fp16"), ids)
    assert all(not same.sumsq[t].any() for t in A.TERMS) and not same.kl().any()
    assert "no score error" in same.lines()[0]
    kv_only = A.attention_decomposition(ref, ref, KVSpec.parse("int4"), ids)
    # layer 0 sees the reference's own Q: no weight term, no cross term; later layers inherit ε_q
    assert kv_only.sumsq["weight"][0].max() < 1e-20 and kv_only.sumsq["cross"][0].max() < 1e-20
    assert kv_only.sumsq["kv"][0].min() > 0 and kv_only.sumsq["weight"][1].min() > 0
    assert kv_only.pairs[0].tolist() == [2 * (4 * 32 - 6), 2 * (32 * 33 / 2 - (4 * 32 - 6))]


def test_hand_checkable_terms_and_gemma_sliding_window_pairs():
    q, k = torch.tensor([[[1.0, 0.0]]]).double(), torch.tensor([[[2.0, 1.0]]]).double()
    terms = A.score_error_terms(q, k, q + torch.tensor([0.0, 1.0]).double(), k + torch.tensor([0.5, 0.0]).double(), 0.5)
    assert {t: float(x) for t, x in terms.items()} == {"kv": 0.25, "weight": 0.5, "cross": 0.0, "total": 0.75}
    ref = tiny_gemma3()
    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(0))
    result = A.attention_decomposition(ref, _perturbed(ref), KVSpec.parse("int8"), ids)
    # sliding layers (window 8) attend to at most 8 keys per query; the global layer to all causal keys
    assert result.pairs[0].sum() == sum(min(t + 1, 8) for t in range(20))
    assert result.pairs[2].sum() == 20 * 21 / 2
    d = result.to_dict()
    assert len(d["per_layer"]) == 3 and np.isfinite(d["per_layer"][2]["attention_kl"])
    assert result.top_heads(1)[0][2] == pytest.approx(result.cross_mass().max())


@pytest.mark.parametrize("spec", ["int4", "int4+residual=8"])
def test_decomposition_runs_on_the_device(spec):
    """On a GPU every tensor the decomposition makes (the causal pairs, the sink keys, the query
    positions of a residual window) must live where the scores are; ``meta`` stands in for CUDA."""
    from tests.fake_device import fake_accelerator, on_meta

    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(0))
    with fake_accelerator():
        model = on_meta(tiny_llama())
        result = A.attention_decomposition(model, model, KVSpec.parse(spec), ids)
    assert result.layers == 2
