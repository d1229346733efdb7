import json

import numpy as np
import pytest
import torch

from tests.explain.results_a import result, window_noise
from tests.explain.tiny_loaded import VOCAB, tiny_loaded
from wkvlab.data.windows import make_windows
from wkvlab.errors import DataError
from wkvlab.eval.runner import run_grid
from wkvlab.explain.compare import Comparison, NoiseFloor, backend_result, check_same_tokens, compare_results, other_backend
from wkvlab.kv.spec import KVSpec
from wkvlab.weights.spec import WeightSpec


def test_difference_and_its_interval_by_hand():
    n = window_noise(3)
    a = result(0.10 + n, nll=1.0, agree=np.arange(256) % 4 != 0)  # agrees on 192 of 256
    b = result(0.13 + n, nll=1.5, agree=np.arange(256) % 8 != 0, kv="other")  # on 224
    c = compare_results(a, b)
    assert c.kld.estimate == pytest.approx(0.03) and c.kld.low == pytest.approx(0.03) and c.kld.high == pytest.approx(0.03)
    assert c.ppl.estimate == pytest.approx(np.exp(1.5) - np.exp(1.0))
    assert c.top1.estimate == pytest.approx((224 - 192) / 256)
    assert c.max_abs_kld_diff == pytest.approx(0.03) and not c.identical
    assert (c.a, c.b) == ("w × c", "w × other")
    assert json.dumps(Comparison.from_dict(json.loads(json.dumps(c.to_dict()))).to_dict()) == json.dumps(c.to_dict())


def test_identical_results_are_exactly_zero():
    a = result(0.1 + window_noise(1), nll=1.2)
    c = compare_results(a, result(0.1 + window_noise(1), nll=1.2))
    assert c.identical and (c.kld.low, c.kld.high) == (0.0, 0.0) and c.kld.contains(0.0)


@pytest.mark.parametrize("other, message", [
    (dict(nll_ref=2.5), "not scored on the same tokens"),
    (dict(ctx=17), "different windows"),
    (dict(windows=3), "different windows"),
])
def test_refuses_results_from_other_tokens(other, message):
    with pytest.raises(DataError, match=message) as info:
        compare_results(result(0.1), result(0.1, **other))
    assert "\n" not in str(info.value)


def test_refuses_other_models():
    a, b = result(0.1), result(0.1)
    b.fingerprints["model_sha256"] = "x" * 64
    with pytest.raises(DataError, match="different models"):
        check_same_tokens(a, b)


def test_noise_floor_on_a_tiny_model():
    """Repeat: bit-identical on CPU. Backend: eager vs sdpa differ by float reordering only."""
    model = tiny_loaded().model
    ids = torch.randint(0, VOCAB, (2 * 24,), generator=torch.Generator().manual_seed(1))
    windows = make_windows(ids, ctx=24, n_tokens=48, bos_id=None)
    specs = ([WeightSpec.parse("none"), WeightSpec.parse("int4-g32")], [KVSpec.parse("fp16"), KVSpec.parse("int4")])
    ref, _, _, wc = run_grid(model, windows, *specs, model_name="tiny", data_name="random")
    again = run_grid(model, windows, [specs[0][1]], [specs[1][1]], model_name="tiny", data_name="random")[0]
    repeat = compare_results(wc, again, b_label="again")
    assert repeat.identical and repeat.kld.estimate == 0.0

    assert other_backend(model) == "eager"
    eager = backend_result(model, windows, ref, "eager")
    assert model.config._attn_implementation == "sdpa"  # restored
    backend = compare_results(ref, eager, a_label="reference (sdpa)", b_label="reference (eager)")
    assert abs(backend.kld.estimate) < 1e-6 and backend.top1.estimate > -0.05
    assert wc.kld["mean"] > 100 * abs(backend.kld.estimate)  # quantization is far above the arithmetic noise
    floor = NoiseFloor(repeat, backend)
    assert NoiseFloor.from_dict(json.loads(json.dumps(floor.to_dict()))).to_dict() == floor.to_dict()
    assert any("bit-identical" in line for line in floor.lines())


def test_one_window_gives_no_interval_and_no_verdict():
    """Too few windows to resample: the difference is printed, its interval and "significant" are not."""
    a, b = result(0.10, windows=1), result(0.50, windows=1, kv="other")
    c = compare_results(a, b)
    assert c.kld.estimate == pytest.approx(0.4) and not c.kld.decided and not c.kld.excludes_zero
    assert "no interval: 1 < 8 windows" in format(c.kld, ".4f")  # results without documents: windows are the units
