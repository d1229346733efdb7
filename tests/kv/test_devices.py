"""KV statistics, stores and the hook follow the device of the data (GPU stood in for by ``meta``).

Each test runs a path with the model "on the device" under :func:`tests.fake_device.fake_accelerator`,
which fails on any op mixing CPU and device tensors — where CUDA would raise.
"""
from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_llama
from tests.fake_device import META, fake_accelerator, on_meta, split_model
from wkvlab.data.windows import make_windows
from wkvlab.eval.runner import RunOptions, run_grid
from wkvlab.kv.calibrate import KVStats, collect_kv_stats
from wkvlab.kv.hook import kv_quantization, layer_stores
from wkvlab.kv.spec import KVSpec
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec
from wkvlab.weights.spec import WeightSpec

CALIBRATED = ["int4+smooth", "qserve:kv4", "kvquant:4", "fp8_e5m2+scales=head"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_torch_thread):
    yield


def _grid(model, kv: str):
    torch.manual_seed(0)
    windows = make_windows(torch.randint(0, 128, (106,)), ctx=48, n_tokens=96, bos_id=None)
    calibration = CalibrationSet(CalibrationSpec(), torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1)), "c")
    return run_grid(model, windows, [WeightSpec.parse("none")], [KVSpec.parse(kv)], model_name="tiny", data_name="random",
                    fingerprints={"model_sha256": "tiny-devices", "data_sha256": "d"}, options=RunOptions(chunk=16), calibration=calibration)


@pytest.mark.parametrize("kv", CALIBRATED)
def test_calibrated_specs_run_twice_on_the_device(kv):
    """The second run reads the statistics back from the disk cache (CPU tensors): they must be
    moved to the layers' device, or every calibrated config crashes on a GPU from its second run."""
    for _ in range(2):
        with fake_accelerator():
            _grid(on_meta(tiny_llama()), kv)


def test_layer_stores_put_cpu_statistics_on_each_layers_device():
    stats = collect_kv_stats(tiny_llama(), torch.randint(0, 128, (2, 32)))  # real values, on the CPU
    model = split_model(tiny_llama(), {1})
    stores = layer_stores(model, KVSpec.parse("qserve:kv4"), stats)
    assert stores[0].smooth.device.type == "cpu" and stores[1].smooth.device == META


def test_statistics_of_a_model_split_over_two_devices_stay_on_their_layers():
    """Per-layer statistics on two devices cannot be stacked: they are kept per layer, and saved stacked on the CPU."""
    model = split_model(tiny_llama(), {1})
    with fake_accelerator():
        stats = collect_kv_stats(model, torch.randint(0, 128, (2, 32)))
    assert stats.k_absmax[0].device.type == "cpu" and stats.k_absmax[1].device == META
    assert stats.hidden_peak_median[1].device == META  # where layer 1 runs, not where its input was recorded


def test_detected_sinks_follow_the_layers_device():
    """``sinks=auto`` reads the residual at the decoder layer's input, before accelerate moves it to
    the layer's device: the detection mask must be moved to where the keys are."""
    reference = tiny_llama()
    stats = collect_kv_stats(reference, torch.randint(0, 128, (2, 32)))
    assert float(stats.hidden_peak_median[1]) > 0  # the detection really runs on layer 1
    model = split_model(tiny_llama(), {1})
    with fake_accelerator(), torch.no_grad(), kv_quantization(model, KVSpec.parse("int4+sinks=auto"), stats=stats):
        model(input_ids=torch.randint(0, 128, (1, 16)), use_cache=False)


def test_saved_statistics_round_trip_from_per_layer_tensors(tmp_path):
    stats = collect_kv_stats(tiny_llama(), torch.randint(0, 128, (2, 32)))
    per_layer = KVStats(**{n: tuple(getattr(stats, n)) for n in ("k_absmax", "v_absmax", "k_pair_absmax", "k_pre_samples",
                                                                  "v_samples", "hidden_peak_median", "q_absmax")})
    per_layer.save(tmp_path / "s.safetensors")
    again = KVStats.load(tmp_path / "s.safetensors")
    assert torch.equal(again.k_pre_samples, stats.k_pre_samples) and torch.equal(again.q_absmax, stats.q_absmax)
