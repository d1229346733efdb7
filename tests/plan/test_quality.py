"""Quality: priors that cite openable sources, the user's measurements first, transfers labelled as such."""
from __future__ import annotations

import re

import pytest

from wkvlab.kv.spec import KVSpec
from wkvlab.plan import ModelDescription, estimate_quality, plan
from wkvlab.plan.measured import Measurement, family_and_size, index_measurements
from wkvlab.plan.quality import MEASURED, PRIOR_EXTRAPOLATED, PRIOR_LITERATURE, TRANSFER, priors
from wkvlab.weights import WeightSpec

M = ModelDescription.from_name("Llama-3-8B")


def q(w, kv, measured=None):
    return estimate_quality(M, WeightSpec.parse(w), KVSpec.parse(kv), measured)


def measurement(model, w, kv, kld, se=0.0001, tokens=4096):
    return Measurement(model, "default", 512, tokens, w, kv, kld, se, "test", WeightSpec.parse(w).to_dict(), KVSpec.parse(kv).to_dict())


def test_every_prior_cites_an_openable_source():
    table = priors()
    for section in ("weights", "kv"):
        for name, entry in table[section].items():
            assert entry["basis"] in ("literature", "extrapolated"), name
            source = table["sources"].get(entry["source"], entry["source"])
            assert re.search(r"https?://|docs/|checkpoint|cache itself", source), name
            assert entry["basis"] == "literature" or entry.get("rule"), name
            WeightSpec.parse(name) if section == "weights" else KVSpec.parse(name.replace("+scales", "").replace("+rot", "+rot"))
    assert all(re.search(r"https?://|docs/", text) for text in table["sources"].values())


def test_literature_numbers_and_labels():
    assert q("bf16", "q8_0").kld == pytest.approx(0.00079)  # llama.cpp PR #7412
    assert q("bf16", "q8_0").source == PRIOR_LITERATURE
    assert q("q4_0", "bf16").kld == pytest.approx(0.073598)  # llama.cpp's Llama-3-8B scoreboard
    assert q("int4-g128", "bf16").source == PRIOR_EXTRAPOLATED
    assert q("bf16", "fp8_e4m3+scales=tensor").kld == pytest.approx(0.0061)  # calibrated scales
    assert q("q4_0", "llamacpp:q4_0").kld == pytest.approx(0.073598 + 0.0193)  # rotated q4_0


def test_mixed_pair_and_skipped_layers():
    assert q("bf16", "q8_0/q4_0").kld == pytest.approx(max(0.955 * 0.00079, 0.70 * 0.0416))
    assert q("bf16", "q8_0+skip=0-15").kld == pytest.approx(0.00079 / 2)
    assert q("int4-g128+skip=0-15", "bf16").kld == pytest.approx(0.0725 / 2)


def test_measured_values_replace_priors_and_transfers_are_labelled():
    own, notes = index_measurements([measurement("Meta-Llama-3-8B", "int4-g128", "int4", 0.0031),
                                     measurement("Meta-Llama-3-8B", "int4-g128", "int4", 0.0035, tokens=100),
                                     measurement("SmolLM2-135M", "int8", "int8", 0.004)], M)
    est = q("int4-g128", "int4", own)
    assert (est.kld, est.source) == (0.0031, MEASURED) and "4,096 tokens, ctx 512, default" in est.label  # the longest run
    assert any("SmolLM2-135M" in n and "another family" in n for n in notes)
    big = ModelDescription.from_name("Llama-3-70B")
    proxy, _ = index_measurements([measurement("Meta-Llama-3-8B", "int8", "int8", 0.002)], big)
    est = estimate_quality(big, WeightSpec.parse("int8"), KVSpec.parse("int8"), proxy)
    assert est.source == TRANSFER and est.label.startswith("transfer from Meta-Llama-3-8B")
    larger, notes = index_measurements([measurement("Llama-3.1-405B", "int8", "int8", 0.002)], big)
    assert not larger  # a larger model of another family is no proxy


def test_family_and_size():
    assert family_and_size("Meta-Llama-3-70B") == ("llama-3", 70e9)
    assert family_and_size("SmolLM2-135M-Instruct.Q4_1") == ("smollm2", 135e6)
    assert family_and_size("HuggingFaceTB/SmolLM2-1.7B-Instruct") == ("smollm2", 1.7e9)


def test_measured_combinations_rank_first_by_kld():
    ms = [measurement("Meta-Llama-3-8B", "bf16", "int4", 0.0001), measurement("Meta-Llama-3-8B", "bf16", "fp8_e4m3", 0.0100)]
    result = plan("Llama-3-8B", "H100", 8, 8192, weights=["bf16"], kv=["int4", "fp8_e4m3", "int8"], measurements=ms)
    ranked = [r for r in result.rows if r.rank]
    assert [r.kv for r in ranked[:2]] == ["int4", "fp8_e4m3"] and ranked[0].quality.source == "measured"
    assert ranked[2].kv == "int8" and ranked[2].quality.source.startswith("prior")
    assert "memory is not the constraint" in ranked[0].ranking_notes[0]  # int4 fits 205 sequences, 8 asked: by KLD alone
    unmeasured = plan("Llama-3-8B", "H100", 8, 8192, weights=["bf16"], kv=["int4", "fp8_e4m3"])
    assert [r.kv for r in unmeasured.rows if r.rank][-1] == "int4"  # below 8 bits: after 8-bit caches until measured


def test_measured_kld_ties_within_noise_go_to_the_faster():
    ms = [measurement("Meta-Llama-3-8B", "bf16", "bf16", 0.00100, se=0.0001),
          measurement("Meta-Llama-3-8B", "bf16", "int8", 0.00105, se=0.0001)]
    result = plan("Llama-3-8B", "H100", 64, 8192, weights=["bf16"], kv=["bf16", "int8"], measurements=ms, engine="vllm")
    assert [r.kv for r in result.rows if r.rank][0] == "int8"  # 0.05e-3 apart, within 2 se: the smaller cache is faster
