"""Per-layer hidden-state diagnostics and KLD by reference confidence."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama
from wkvlab.explain.hidden import hidden_errors, layer_diagnostics, reference_confidence_buckets
from wkvlab.kv.spec import KVSpec


def test_hand_checked_errors():
    ref = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    cand = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # second token rotated by 90°
    e = hidden_errors(ref, cand)
    assert e["rel_err"] == pytest.approx(np.sqrt(2) / np.sqrt(26))
    assert e["cos_err_sum"] == pytest.approx(1.0)
    assert (e["signal"], e["noise"]) == (26.0, 2.0)


def test_buckets_count_every_token_once_and_include_one():
    kld = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    top1 = np.array([0.1, 0.3, 0.3, 0.96, 1.0])
    rows = reference_confidence_buckets(kld, top1)
    assert [r["tokens"] for r in rows] == [1, 2, 0, 0, 2]
    assert rows[1]["kld_mean"] == 2.5 and rows[4]["kld_median"] == 4.5 and rows[2]["kld_mean"] is None


@pytest.mark.parametrize("make", [tiny_llama, tiny_gemma3])
def test_identity_is_exact_and_errors_grow_with_kv_bits(make):
    model = make()
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    same = layer_diagnostics(model, model, KVSpec.parse("fp16"), ids)
    assert not same.rel_err.any() and not same.cos_err.any() and np.isinf(same.sqnr_db).all()
    assert not same.kld.any() and "equal the reference" in same.lines()[0]
    int8 = layer_diagnostics(model, model, KVSpec.parse("int8"), ids)
    int4 = layer_diagnostics(model, model, KVSpec.parse("int4"), ids)
    assert (int4.rel_err > int8.rel_err).all() and (int4.sqnr_db < int8.sqnr_db).all()
    assert int4.kld.size == 2 * 23 and sum(b["tokens"] for b in int4.buckets()) == 2 * 23
    assert len(int4.to_dict()["per_layer"]) == model.config.num_hidden_layers and len(int4.lines()) == 3


def test_weight_error_enters_at_the_first_layer():
    model = tiny_llama()
    cand = copy.deepcopy(model)
    with torch.no_grad():
        cand.model.layers[1].mlp.down_proj.weight.mul_(1.1)  # only layer 1 changes
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(0))
    d = layer_diagnostics(model, cand, KVSpec.parse("fp16"), ids)
    assert d.rel_err[0] == 0 and d.rel_err[1] > 0 and d.worst_jump()[0] == 1
