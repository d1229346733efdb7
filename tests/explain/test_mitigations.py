import json

import numpy as np
import pytest

from tests.explain.results_a import result, window_noise
from wkvlab.explain.mitigations import Mitigations, candidates, edge_depth, higher_key_format, layers_holding, measure
from wkvlab.kv.spec import KVSpec


@pytest.mark.parametrize("k, high", [("int4", "int8"), ("q4_0", "q8_0"), ("iq4_nl", "q8_0"), ("int2", "int8"),
                                      ("q8_0", "fp16"), ("fp8_e4m3", "fp16"), ("fp4_e2m1", "fp8_e4m3"), ("fp16", None)])
def test_keys_one_step_up(k, high):
    assert higher_key_format(k, 64) == high


def test_layers_holding_half_the_share():
    assert layers_holding([0.1, 0.5, 0.3, 0.1]) == [1]
    assert layers_holding([0.3, 0.1, 0.05, 0.25, 0.3]) == [0, 4]
    assert layers_holding([1.0] * 10, cap=3) == [0, 1, 2]
    assert edge_depth([0, 2, 15], 16, from_end=False) == 3  # layers 0 and 2 lie in the first quarter
    assert edge_depth([0, 2, 15], 16, from_end=True) == 1
    assert edge_depth([8], 16, from_end=True) == 2  # none in the last quarter: the default


def test_candidates_follow_the_cross_term():
    shares = np.zeros(30)
    shares[[0, 1, 28]] = [0.3, 0.25, 0.2]
    chosen = {c.name: c.kv.canonical() for c in candidates(KVSpec.parse("int4"), 30, 64, shares)}
    assert chosen == {
        "16-bit layers 0,1": "int4+skip=0,1",
        "16-bit last 2 layers": "int4+skip=28,29",  # "first 2" is the same spec as "layers 0,1": measured once
        "first 4 tokens 16-bit": "int4+sinks=4",
        "K int8, V int4": "int8/int4",
    }
    # a preset's name must not survive a change of its layers (the label would lie)
    assert all(c.kv.label == c.kv.canonical() for c in candidates(KVSpec.parse("llamacpp:q4_0"), 30, 64, None))


def test_recovered_share_by_hand():
    n = window_noise(4)
    cells = {"w": result(0.1 + n), "wc": result(0.3 + 2 * n, agree=np.arange(256) % 2 == 0)}
    chosen = candidates(KVSpec.parse("int4"), 8, 64, None)[:2]
    mitigated = [result(0.2 + 1.5 * n, kv_bytes=150.0), result(0.35 + 2 * n, kv_bytes=120.0)]
    m = measure(cells, mitigated, chosen)
    best, worse = m.results
    assert best.kv == chosen[0].kv.label and best.kv_bytes_per_token == 150.0
    nm = n.mean()
    assert best.recovered.estimate == pytest.approx((0.1 + 0.5 * nm) / (0.2 + nm))
    assert worse.recovered.estimate == pytest.approx(-0.05 / (0.2 + nm))
    assert best.verdict.family_size == len(m.results) and best.verdict.margin.value == pytest.approx(0.1) and best.verdict.word == "recovers"
    assert worse.verdict.word != "recovers"
    assert best.top1.estimate == pytest.approx(0.5)  # all-agreeing mitigation vs half-agreeing W+C
    assert m.excess.estimate == pytest.approx(0.2 + nm)
    assert "recovers" in m.lines()[0]
    text = json.dumps(m.to_dict())
    assert json.dumps(Mitigations.from_dict(json.loads(text)).to_dict()) == text


def test_no_measurable_excess_is_said_not_divided():
    n = window_noise(6, scale=0.005)
    cells = {"w": result(0.1 + n), "wc": result(0.1 + n[::-1])}  # W+C differs from W by window noise only
    chosen = candidates(KVSpec.parse("q8_0"), 8, 64, None)[:2]
    m = measure(cells, [result(0.09 + n), result(0.12 + n)], chosen)
    assert m.excess.contains(0.0)
    assert [r.kld.estimate for r in m.results] == sorted(r.kld.estimate for r in m.results)  # lowest KLD first
    # the excess goes through the one rule: within ±m of KLD(W+C) here, so nothing is divided by it
    assert m.excess_verdict.word.startswith("no excess within ±") and m.excess_verdict.family_size == 1
    assert "nothing decided for a KV mitigation to recover" in m.lines()[0] and "recovers" not in m.lines()[0]
    assert "margin ±" in m.lines()[0] and "no Monte-Carlo error" in m.lines()[0]
