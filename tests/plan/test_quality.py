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


def _with_units(m, per_unit):
    """``m`` with per-document values (16 documents of 256 tokens), its mean their mean."""
    from dataclasses import replace

    from wkvlab.plan.measured import UnitValues

    per_unit = [float(x) for x in per_unit]
    return replace(m, kld=sum(per_unit) / len(per_unit), units=UnitValues("documents", (256,) * len(per_unit), tuple(per_unit)))


def _ranked(ms, kv=("fp8_e4m3", "int8")):
    # batch 64 leaves no room to spare (109 sequences fit): measured rows are ordered by KLD, ties by speed
    result = plan("Llama-3-8B", "H100", 64, 8192, weights=["bf16"], kv=list(kv), measurements=ms, engine="vllm")
    return [r for r in result.rows if r.rank]


def test_a_faster_config_goes_first_only_when_the_one_rule_shows_its_kld_equivalent():
    """Issue 38 item 7: the tie rule was 'within 2 token-level SEs' (tokens treated as independent); now a tie is a
    verdict of the one rule on per-document values, 'equivalent within ±m', Holm over the configs compared."""
    import numpy as np

    docs = np.random.default_rng(0).lognormal(np.log(0.001), 0.3, 16)
    fp8, int8 = (measurement("Meta-Llama-3-8B", "bf16", kv, 0.0) for kv in ("fp8_e4m3", "int8"))
    ranked = _ranked([_with_units(fp8, docs * 1.01), _with_units(int8, docs)])  # fp8 1% higher on every document, and faster
    assert [r.kv for r in ranked][:2] == ["fp8_e4m3", "int8"]
    assert ranked[0].throughput.decode.tokens_per_s > ranked[1].throughput.decode.tokens_per_s
    note = " ".join(ranked[0].ranking_notes)
    assert "equivalent within ±" in note and "margin ±9.55e-05 (10% of KLD of bf16 x int8" in note
    assert "Holm over 1 test" in note and "16 documents" in note

    apart = _ranked([_with_units(fp8, docs * 1.5), _with_units(int8, docs)])  # 50% higher: no tie, the lower KLD first
    assert [r.kv for r in apart][:2] == ["int8", "fp8_e4m3"] and "a faster config goes first only when shown" in apart[1].ranking_notes[0]

    # no per-document values (an eval --json result, a store row): a token-level SE decides nothing, KLD orders them
    # (the old rule called these a tie: 0.05e-3 apart, within 2 SE, and put the faster fp8 first)
    plain = _ranked([measurement("Meta-Llama-3-8B", "bf16", "int8", 0.00100, se=0.0001),
                     measurement("Meta-Llama-3-8B", "bf16", "fp8_e4m3", 0.00105, se=0.0001)])
    assert [r.kv for r in plain][:2] == ["int8", "fp8_e4m3"]
