"""Quality priors, the measured-results hook and the ranking rules that use them."""
from __future__ import annotations

import math

import pytest

from wkvlab.plan import ModelDescription, estimate_quality, parse_kv, parse_weight_spec, plan
from wkvlab.plan.quality import MEASURED, PRIOR_EXTRAPOLATED, PRIOR_LITERATURE, priors
from wkvlab.plan.weights import FORMATS
from wkvlab.plan.kv import KV_FORMATS

M = ModelDescription.from_name("Llama-3-8B")


def q(w, kv, ctx=4096, measured=None):
    return estimate_quality(M, parse_weight_spec(w), parse_kv(kv), ctx, measured)


def test_every_format_has_a_sourced_prior():
    table = priors()
    assert set(table["weights"]) == set(FORMATS) and set(table["kv"]) == set(KV_FORMATS)
    for section in ("weights", "kv"):
        for name, entry in table[section].items():
            assert entry["basis"] in ("literature", "extrapolated") and entry["source"], name


def test_literature_numbers_and_labels():
    assert q("bf16", "q8_0").kld == pytest.approx(0.00079)  # llama.cpp PR 7412
    assert q("bf16", "q8_0").source == PRIOR_LITERATURE
    assert q("fp8", "fp8_e4m3").kld == pytest.approx(0.0039 + 0.0005)  # seed study 002
    assert q("int4-g128", "bf16").source == PRIOR_EXTRAPOLATED


def test_measured_values_replace_priors():
    measured = {("int4-g128", "int4"): 0.0031}
    est = q("int4-g128", "int4", measured=measured)
    assert est.kld == 0.0031 and est.source == MEASURED


def test_sub_8_bit_penalty_grows_with_context():
    """Seed 002: the 4-bit penalty is 15-30% larger at 16-32k than in the first 4k tokens."""
    short, long = q("bf16", "q4_0", 4096).kld, q("bf16", "q4_0", 32768).kld
    assert long / short == pytest.approx(1 + 0.1 * math.log2(8))
    assert q("bf16", "q8_0", 32768).kld == q("bf16", "q8_0", 4096).kld


def test_mixed_pair_and_skipped_layers():
    assert q("bf16", "k=q8_0,v=q4_0").kld == pytest.approx(max(0.00079, 0.7 * 0.0022))
    assert q("bf16", "q8_0;skip=0-15").kld == pytest.approx(0.00079 / 2)
    assert q("int4-g128;skip=0-15", "bf16").kld == pytest.approx(0.0117 / 2)


def test_low_bit_kv_ranked_after_8_bit_unless_measured():
    result = plan("Llama-3-8B", "H100", 8, 8192, weights=["bf16"], kv=["int4", "fp8_e4m3"])
    ranked = [r.kv for r in result.rows if r.rank]
    assert ranked == ["fp8_e4m3", "int4"]  # int4 is faster but below 8 bits
    measured = {("bf16", "int4"): 0.0001}
    result = plan("Llama-3-8B", "H100", 8, 8192, weights=["bf16"], kv=["int4", "fp8_e4m3"],
                  measured_quality=measured)
    ranked = [r for r in result.rows if r.rank]
    assert ranked[0].kv == "int4" and ranked[0].quality.source == "measured"
