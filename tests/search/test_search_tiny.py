"""End to end on a tiny random model: scorer equivalence with the runner, profile, search, cache."""
import pytest
import torch

from tests.conftest import tiny_llama
from wkvlab.data.windows import WindowSet
from wkvlab.errors import ConfigError
from wkvlab.eval.runner import run_grid
from wkvlab.kv.spec import KVSpec
from wkvlab.search import api
from wkvlab.search.choices import parse_choices
from wkvlab.search.measure import Scorer, WeightSwap, layer_of
from wkvlab.search.profile import collect_profile
from wkvlab.weights.apply import quantize_model_weights
from wkvlab.weights.spec import WeightSpec


@pytest.fixture(scope="module")
def setup():
    model = tiny_llama(num_hidden_layers=3)
    g = torch.Generator().manual_seed(0)
    prof = WindowSet(torch.randint(0, 128, (1, 24), generator=g), 0, False)
    held = WindowSet(torch.randint(0, 128, (2, 24), generator=g), 0, False)
    return model, prof, held


def test_scorer_equals_the_runner(setup):
    model, _, held = setup
    weights, kv = WeightSpec.parse("int4-g32"), KVSpec(layers=((1, "int4", "fp16"),))
    runner = run_grid(model, held, [weights], [kv], model_name="t", data_name="t")[0]
    qw = quantize_model_weights(model, weights)
    score = Scorer(model, held).score(qw.model, kv)
    assert score.kld == pytest.approx(runner.kld["mean"], rel=1e-9, abs=1e-12)
    assert score.tokens == held.n_scored


def test_kept_reference_gives_the_scores_of_a_stepped_one_without_a_second_forward(setup, monkeypatch):
    import wkvlab.search.measure as measure

    model, _, held = setup
    qw = quantize_model_weights(model, WeightSpec.parse("int4-g32"))
    kvs = [KVSpec(layers=((1, "int4", "fp16"),)), KVSpec(layers=((0, "int8", "int4"),))]
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    kept = Scorer(model, held)
    assert kept.keep
    first = [kept.score(qw.model, kv).per_token for kv in kvs]
    forwards_first = len(calls)
    again = [kept.score(qw.model, kv).per_token for kv in kvs]
    handle.remove()
    assert forwards_first > 0 and len(calls) == forwards_first  # the reference ran for the first candidate only
    assert len(kept._refs) and all(ref.probs is None for ref in kept._refs.values())  # log-probs only: half the bytes
    monkeypatch.setattr(measure, "REFERENCE_CACHE_BYTES", 0)
    stepped = Scorer(model, held)
    assert not stepped.keep
    for a, b, kv in zip(first, again, kvs):
        c = stepped.score(qw.model, kv).per_token
        assert (a == b).all() and (a == c).all()  # bit-identical: exp of the same log-probs


def test_weight_swap_of_every_layer_is_the_quantized_model(setup):
    model, _, held = setup
    qw = quantize_model_weights(model, WeightSpec.parse("int4-g32"))
    swap = WeightSwap(model, qw.model)
    scorer = Scorer(model, held)
    with swap.only(lambda n: layer_of(n) is not None) as mixed:
        assert scorer.score(mixed).kld == pytest.approx(scorer.score(qw.model).kld, rel=1e-9)
    assert scorer.score(swap.model).kld == 0.0  # restored to the reference


def test_profile_single_layer_cells_are_real_measurements(setup):
    model, prof_w, _ = setup
    choices = parse_choices("K4V4")
    prof = collect_profile(model, prof_w, WeightSpec.parse("int4-g32"), choices, model_name="t", data_name="t")
    assert set(prof.k) == {"int4"} and set(prof.v) == {"int4"} and len(prof.k["int4"]) == 3
    qw = quantize_model_weights(model, WeightSpec.parse("int4-g32"))
    again = Scorer(model, prof_w).score(qw.model, KVSpec(layers=((2, "fp16", "int4"),))).kld
    assert prof.v["int4"][2] == pytest.approx(again, rel=1e-9)
    assert len(prof.weight_layers) == 3 and "mlp" in prof.weight_modules
    assert len(prof.sinks) == 3 and 0 < prof.sinks[0]["attention_to_first"] <= 1
    assert prof.outliers[0]["k_max_over_median"] >= 1


def test_search_end_to_end_and_profile_cache(setup, monkeypatch):
    model, prof_w, held = setup
    weights, choices = WeightSpec.parse("int4-g32"), parse_choices("K8V8,K4V4,K4V2")
    budget = 320.0  # 3 layers x 2 heads, head_dim 32: uniform K4V4 is 240 B/token, K8V8 408: a real choice
    result = api.search_windows(model, prof_w, held, weights, choices, budget, candidates=3)
    assert result.chosen is not None and result.chosen.fits
    assert result.chosen.kv_bytes_per_token <= budget
    kinds = {r.kind for r in result.rows}
    assert {"plan", "reference", "unaware", "greedy", "kvtuner", "random"} <= kinds
    assert all(r.at_budget for r in result.rows if r.kind != "reference")  # every plan and rival spends the budget
    assert "uniform" not in kinds  # K4V4 240 and K8V8 408 B/token are not within ±2% of 320
    assert result.chosen.plan == result.plan and len(result.rows[-1].plan) == 3
    from wkvlab.display import console
    from wkvlab.search.cli import print_search

    monkeypatch.setattr(console, "width", 400)  # one line per row
    with console.capture() as out:
        print_search(result)
    text = out.get()
    assert "mean of 5 random mixes" in text and all(f"random mix {i}" in text for i in range(1, 6))  # one budget: each mix too
    assert result.profile["cached"] is False
    assert result.verdict
    vllm = result.exports["vllm"]  # the tiny model's 64-wide layers are too narrow for Marlin: cache flags, no line
    assert vllm["kv_args"][:2] == ["--kv-cache-dtype", "int8_per_token_head"] and vllm["command"] is None
    assert any("no launch line for int4-g32 weights" in n and "Marlin" in n for n in vllm["notes"])
    assert KVSpec.from_dict(result.spec).bytes_per_token(layers=3, kv_heads=2, head_dim=32) == pytest.approx(result.chosen.kv_bytes_per_token)
    again = api.search_windows(model, prof_w, held, weights, choices, budget, candidates=1, unaware=False)
    assert again.profile["cached"] is True


def test_budget_too_small_is_one_clear_error(setup):
    model, prof_w, held = setup
    with pytest.raises(ConfigError, match="nothing fits"):
        api.search_windows(model, prof_w, held, WeightSpec(), parse_choices("K4V4"), 10.0, unaware=False)


def test_search_needs_exactly_one_budget():
    with pytest.raises(ConfigError, match="either --budget"):
        api.search(budget=None, gpu=None)
    with pytest.raises(ConfigError, match="positive"):
        api.search(budget=-1)


def test_gpu_budget_uses_the_planner_pool():
    from wkvlab.plan.gpus import find_gpu
    from wkvlab.plan.memory import memory_budget
    from wkvlab.plan.models import ModelDescription

    model = tiny_llama()
    small = api.gpu_budget(model, "tiny", "rtx-4090", 10**6, 16, 4096)["bytes_per_token"]
    big = api.gpu_budget(model, "tiny", "rtx-4090", 10**6, 32, 4096)["bytes_per_token"]
    assert big == pytest.approx(small / 2)
    pool = memory_budget(None, ModelDescription.from_config(model.config.to_dict(), name="tiny"), find_gpu("rtx-4090"), 10**6).kv_pool_bytes
    assert small == pytest.approx(pool / (16 * 4096))


def test_joint_search_keeps_weight_layers_when_memory_is_plentiful(setup):
    model, prof_w, held = setup
    # a huge budget at a 1-token context: 16-bit weight layers are the only way to spend it
    result = api.search_windows(model, prof_w, held, WeightSpec.parse("int4-g32"), parse_choices("K4V4"), 10**6,
                                context=1, candidates=1, unaware=False, joint_weights=True)
    assert result.keep_16bit == [0, 1, 2] and result.chosen.fits
    assert result.exports["weights_16bit_layers"] == [0, 1, 2]
    assert any("16 bits" in n for n in result.exports["vllm"]["notes"])
    assert result.chosen.kld == 0.0  # 16-bit weights and cache everywhere: the reference itself
    assert {r.kind for r in result.rows} == {"plan", "reference"} and "16-bit cache" in result.verdict  # no KV mix spends 10^6 B


def test_curve_decides_every_rival_in_one_family(monkeypatch):
    model = tiny_llama(num_hidden_layers=3)
    g = torch.Generator().manual_seed(1)
    prof = WindowSet(torch.randint(0, 128, (1, 24), generator=g), 0, False)
    held = WindowSet(torch.randint(0, 128, (8, 24), generator=g), 0, False)  # 8 windows: enough for an interval
    choices = parse_choices("K8V8,K4V4,K4V2")  # 3 layers x 2 heads of 32: K4V2 180, K4V4 240, K8V8 408 B/token
    result = api.search_windows(model, prof, held, WeightSpec.parse("int4-g32"), choices, [200.0, 240.0, 320.0],
                                random_mixes=2, unaware=False)
    assert result.is_curve and [p.budget for p in result.points] == [200.0, 240.0, 320.0]
    assert result.chosen is None and result.exports == {}
    verdicts = [c.verdict for p in result.points for c in p.comparisons]
    assert all(v is not None and v.family_size == len(verdicts) for v in verdicts)
    assert all(v.margin.relative == 0.10 and v.margin.of.startswith("KLD of ") for v in verdicts)
    assert [p.uniform for p in result.points] == ["", "K4V4", ""]  # uniform K4V4 only at 240 B/token
    for p in result.points:
        assert [c.rival for c in p.comparisons if c.rival != "uniform"] == ["greedy", "kvtuner", "random"]
        step = p.step
        for c in p.comparisons:
            assert (abs(c.gap[0]) <= 0.02 * p.budget) if c.rival == "uniform" else (0 <= c.gap[0] and c.gap[1] < step)
    assert "comparisons" in result.verdict and "Holm over" in result.verdict
    from wkvlab.display import console
    from wkvlab.search.cli import print_search

    monkeypatch.setattr(console, "width", 400)  # one line per row
    with console.capture() as out:
        print_search(result)
    text = out.get()
    assert "3 budgets 200, 240, 320 B/token" in text and "mean of 2 random mixes" in text and "no uniform format within ±2%" in text
    assert text.count("KVTuner rule, approx.") == 3 and "uniform fp16 (cache untouched)" in text
