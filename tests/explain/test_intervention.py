"""The full-pass 2×2 cells, the cross term's cache part removed from the scores, the sinks kept at 16 bits."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama
from tests.explain.test_attention import _perturbed as perturbed
from wkvlab.explain import attention as A
from wkvlab.explain import intervention as I
from wkvlab.explain.cells import Spill, record_pass
from wkvlab.kv.hook import kv_quantization, layer_stores
from wkvlab.kv.override import attention_override
from wkvlab.kv.spec import KVSpec

FP16 = KVSpec.parse("fp16")


def _perturbed(model, scale=0.01, seed=1):
    return perturbed(model, scale, seed)


def _ids(n=24, seed=0):
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed))


def test_cells_sum_exactly_on_numbers_checked_by_hand():
    """One query, one key, head_dim 1, dyadic numbers: every term is exact in binary floating point."""
    t = lambda v: torch.tensor([[[v]]], dtype=torch.float64)  # noqa: E731
    terms = A.cell_terms(q_ref=t(1.0), k_ref=t(2.0), q_cand=t(1.5), k_cand=t(2.25), q_w=t(1.5), k_w=t(2.5), q_c=t(1.0), k_c=t(1.75),
                         scaling=1.0)
    got = {name: float(x) for name, x in terms.items()}
    # S_R = 2, S_W = 3.75, S_C = 1.75, S_WC = 3.375; ε_q = 0.5, ε_k = 0.25 = ε_k,w 0.5 + ε_k,c −0.25
    assert got == {"kv": 0.25, "weight": 1.0, "cross": 0.125, "total": 1.375, "cross_weight": 0.25, "cross_cache": -0.125,
                   "total_w": 1.75, "total_c": -0.25, "interaction": -0.125}
    assert got["kv"] + got["weight"] + got["cross"] == got["total"]
    assert got["cross_weight"] + got["cross_cache"] == got["cross"]
    assert got["total_w"] + got["total_c"] + got["interaction"] == got["total"]


def test_removing_the_term_by_hand():
    q, q_ref = torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 2.0]])
    k, k_w = torch.tensor([[3.0, -1.0], [0.0, 1.0]]), torch.tensor([[2.0, -1.0], [0.0, 0.5]])
    # ε_q = [0.5, 0], ε_k,c = [[1, 0], [0, 0.5]]: the term is [0.5, 0] · s; the scores Q·Kᵀ = [1, 2]
    term = I.cross_cache_term(q, q_ref, k, k_w, 0.5)
    assert term.tolist() == [[0.25, 0.0]]
    assert I.intervened_scores(q, q_ref, k, k_w, 0.5).tolist() == [[0.25, 1.0]]
    # the same as Q·K_Wᵀ + Q_R·ε_k,cᵀ
    torch.testing.assert_close(I.intervened_scores(q, q_ref, k, k_w, 0.5), (q @ k_w.T + q_ref @ (k - k_w).T) * 0.5, rtol=0, atol=0)


def test_the_intervened_run_removes_exactly_the_term_computed_by_hand():
    """Layer 0 has the same input in every pass: its scores before the intervention are the W pass's Q
    against the stored keys, and the term removed is (Q_W − Q_R)(K_stored − K_W)ᵀ·s, computed here from
    the recorded passes and the store alone."""
    ref = tiny_llama()
    cand = _perturbed(ref)
    ids, kv = _ids(), KVSpec.parse("int4")
    r, w = record_pass(ref, FP16, ids), record_pass(cand, FP16, ids)
    stores = layer_stores(cand, kv)
    seen = {}
    logits = I.intervened_logits(cand, kv, ids, stores, r, w, observe=lambda layer, before, term: seen.setdefault(layer, (before, term)))
    assert sorted(seen) == [0, 1]
    (q_w, k_w), (q_r, _) = w.raw[0], r.raw[0]
    k_stored = stores[0].store_keys(k_w, None)
    rep = lambda x: x.repeat_interleave(4 // x.shape[1], dim=1)[0]  # noqa: E731 - 4 query heads, 2 KV heads
    scaling = cand.model.layers[0].self_attn.scaling
    before, term = seen[0]
    torch.testing.assert_close(before, rep(q_w) @ rep(k_stored).transpose(-1, -2) * scaling, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(term, (rep(q_w) - rep(q_r)) @ (rep(k_stored) - rep(k_w)).transpose(-1, -2) * scaling, rtol=1e-6, atol=1e-6)
    assert term.abs().max() > 1e-4  # a real term is removed
    plain = I.cache_logits(cand, kv, ids, stores)
    assert (logits - plain).abs().max() > 1e-5  # and the output moves


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_with_nothing_to_remove_the_intervened_run_is_the_plain_run(make):
    """A 16-bit cache: K_stored = K_W at every layer, the term is 0, and the hook's own attention (mask, sliding
    windows, softcapping, GQA) reproduces the model's backend."""
    ref = make()
    cand = _perturbed(ref)
    ids = _ids(20)
    r, w = record_pass(ref, FP16, ids), record_pass(cand, FP16, ids)
    terms = []
    logits = I.intervened_logits(cand, FP16, ids, layer_stores(cand, FP16), r, w, observe=lambda _l, _b, term: terms.append(term))
    # layer 0 reads exactly the W pass's keys; later layers differ from it only by the backend's rounding
    assert not terms[0].any() and max(float(t.abs().max()) for t in terms) < 1e-6
    torch.testing.assert_close(logits, w.logits, rtol=1e-5, atol=1e-5)


def test_residual_specs_remove_the_term_per_pair():
    """+residual: pairs whose key is still full precision use that key in the term too."""
    ref = tiny_llama()
    cand = _perturbed(ref)
    ids, kv = _ids(24), KVSpec.parse("int4+residual=8")
    r, w = record_pass(ref, FP16, ids), record_pass(cand, FP16, ids)
    seen = {}
    I.intervened_logits(cand, kv, ids, layer_stores(cand, kv), r, w, observe=lambda layer, b, term: seen.setdefault(layer, term))
    # layer 0: the full-precision key is the W pass's own, so queries 0..7 (nothing flushed) have no cache part
    assert seen[0][:, :8].abs().max() == 0 and seen[0][:, 12, :8].abs().max() > 0


def test_sinks_kept_run_equals_a_run_with_those_positions_unquantized():
    model = tiny_llama()
    ids, kv = _ids(), KVSpec.parse("int4")
    kept = I.sinks_kept(kv)
    assert kept.sinks == 4 and I.sinks_kept(KVSpec.parse("int4+sinks=8")).sinks == 8
    stores = layer_stores(model, kv)

    def by_hand(backend, module, query, key, value, mask, **kwargs):  # quantize, then put tokens 0..3 back
        store = stores[module.layer_idx]
        k_q, v_q = store.store_keys(key, None), store._store(value, store.v_quant)
        k_q[:, :, :4], v_q[:, :, :4] = key[:, :, :4], value[:, :, :4]
        return backend(module, query, k_q, v_q, mask, **kwargs)

    from wkvlab.eval.logits import model_logits

    with torch.no_grad(), attention_override(model, by_hand):
        expected = model_logits(model, ids)
    got = I.cache_logits(model, kept, ids, layer_stores(model, kept))
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    assert (got - I.cache_logits(model, kv, ids, stores)).abs().max() > 1e-5  # the sinks' quantization mattered


def test_window_cells_and_the_decision_rule():
    """Per-window KLD of every cell from one call, then the five effects decided as one Holm family."""
    from wkvlab.explain.crossterm import EFFECTS, CrossTermData, cross_terms

    ref = tiny_llama()
    cand = _perturbed(ref, scale=0.02)
    kv = KVSpec.parse("int4")
    stores, ref_stores, kept = layer_stores(cand, kv), layer_stores(ref, kv), layer_stores(cand, I.sinks_kept(kv))
    data = CrossTermData.empty()
    with Spill() as spill:
        for window in range(8):
            ids = _ids(24, seed=window)
            spill.put(("R", window), record_pass(ref, FP16, ids))
            spill.put(("C", window), record_pass(ref, kv, ids, ref_stores))
            cells = (spill.get(("R", window)), record_pass(cand, FP16, ids), spill.get(("C", window)))
            decomposition, kld, attention_kl = I.window_cells(cand, kv, ids, stores, kept, cells)
            assert set(kld) == {"w", "c", "wc", "wc_removed", "wc_sinks"} and all(len(v) == 23 for v in kld.values())
            assert min(v.mean() for v in kld.values()) > 0 and not np.allclose(kld["wc_removed"], kld["wc"])
            assert attention_kl["wc"] == pytest.approx(decomposition.kl_of("wc")) and attention_kl["c"] > 0
            data.add(kld, attention_kl)
    (x,) = cross_terms([("W", "int4", data)], family="test")
    assert x.windows == 8 and x.tokens == 8 * 23 and set(x.verdicts) == set(EFFECTS)
    k = {c: x.kld[c].estimate for c in x.kld}
    assert x.effects["interaction"].estimate == pytest.approx(k["wc"] - k["w"] - k["c"])
    assert x.effects["removed"].estimate == pytest.approx(k["wc_removed"] - k["wc"])
    assert x.explained.estimate == pytest.approx((k["wc"] - k["wc_removed"]) / (k["wc"] - k["w"] - k["c"]))
    for v in x.verdicts.values():
        assert v.family_size == 5 and v.family == "test" and v.raw.n_units in (8,)
    # m: 10% of the predicted total KLD(W)+KLD(C) (issue #38), for the attention KL its own predicted total
    assert x.verdicts["removed"].margin.value == pytest.approx(0.1 * (k["w"] + k["c"]))
    assert "predicted total KLD(W)+KLD(C)" in x.verdicts["removed"].margin.of
    assert "attention KL(W)+attention KL(C)" in x.verdicts["attention_interaction"].margin.of
    assert all(v.tokens == 8 * 23 for v in x.verdicts.values())  # what would decide an undecided one is counted in tokens too
    assert x.per_window["wc"] == pytest.approx([float(a.mean()) for a in data.kld["wc"]]) and len(x.per_window["attention_c"]) == 8
    assert (x.explained_text() == format(x.explained, ".2f")) == x.effects["interaction"].excludes_zero
    text = " ".join(x.lines())
    assert "Holm over 5 tests" in text and "margin ±" in text


def test_fewer_windows_than_the_rule_are_undecided():
    from wkvlab.explain.crossterm import CrossTermData, cross_terms

    data = CrossTermData.empty()
    rng = np.random.default_rng(0)
    for _ in range(3):
        w, c = rng.uniform(0.1, 0.2, 10), rng.uniform(0.1, 0.2, 10)
        data.add({"w": w, "c": c, "wc": w + c, "wc_removed": w + c, "wc_sinks": w + c}, {"w": 0.1, "c": 0.1, "wc": 0.2})
    (x,) = cross_terms([("W", "C", data)], family="three windows")
    assert all(v.word == "undecided" for v in x.verdicts.values())


def test_cross_term_verdicts_name_the_windows_they_resample():
    """The diagnosis windows are the unit: every cross-term verdict says "8 windows", not "units"."""
    import numpy as np

    from wkvlab.explain.crossterm import CrossTermData, cross_terms

    rng = np.random.default_rng(0)
    data = CrossTermData.empty()
    for _ in range(8):
        base = rng.gamma(2.0, 0.05, size=32)
        data.add({"w": base, "c": base / 2, "wc": 1.6 * base, "wc_removed": 1.5 * base, "wc_sinks": 1.55 * base},
                 {"w": 0.1, "c": 0.05, "wc": 0.16})
    (cross,) = cross_terms([("int4-g128", "int4", data)], family="test")
    assert all(v.resampling.startswith("8 windows, skew-robust t") for v in cross.verdicts.values())
