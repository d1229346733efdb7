"""The runner's memory plans: one model quantized in place and restored exactly, the copies plan as
its special case, forward calls counted, and out-of-memory keeping what finished."""
import copy

import numpy as np
import pytest
import torch

from tests.conftest import tiny_gemma3, tiny_llama
from wkvlab.data.windows import make_windows
from wkvlab.errors import ConfigError, OutOfMemory
from wkvlab.eval.chunks import WindowPass
from wkvlab.eval.runner import RunOptions, memory_plan, run_grid
from wkvlab.kv import KVSpec
from wkvlab.weights.calibration import CalibrationSet, CalibrationSpec
from wkvlab.weights.spec import WeightSpec

KV = ["fp16", "int4", "int2+residual=8"]


def _windows(ctx=48, n=2, seed=1):
    torch.manual_seed(seed)
    return make_windows(torch.randint(0, 128, (ctx * n + 10,)), ctx=ctx, n_tokens=ctx * n, bos_id=None)


def _calibration():
    return CalibrationSet(CalibrationSpec(samples=2, length=32), torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(3)), "c")


def _run(model, weights, kv=KV, windows=None, calibration=None, **options):
    return run_grid(model, windows or _windows(), [WeightSpec.parse(w) for w in weights], [KVSpec.parse(k) for k in kv],
                    model_name="tiny", data_name="random", fingerprints={"model_sha256": "plan-tests", "data_sha256": "d"},
                    options=RunOptions(chunk=16, **options), calibration=calibration)


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


@pytest.mark.parametrize("interleave", [1, 3])
def test_one_model_plan_measures_what_the_copies_plan_does(interleave):
    """The same candidates, built in place and compared with the per-token record: NLL, top-1 and Δp
    bit-identical to the exact copies plan, KLD within its own sampling error."""
    weights = ["none", "int4-g32", "int8"]
    copies = _run(tiny_llama(), weights, plan="copies")
    model = tiny_llama()
    one = _run(model, weights, plan="one-model", interleave=interleave)
    assert [r.run["plan"] for r in (copies[0], one[0])] == ["copies", "one-model"] and one[0].run["interleave"] == interleave
    for c, o in zip(copies, one):
        assert (c.weights, c.kv) == (o.weights, o.kv)
        assert np.array_equal(c.arrays.nll, o.arrays.nll) and np.array_equal(c.arrays.top1_agree, o.arrays.top1_agree)
        assert np.array_equal(c.arrays.nll_ref, o.arrays.nll_ref)
        info = o.run["reference"]
        assert info["kind"] == "stored" and info["path"] is None  # kept in memory, no file
        assert abs(o.kld["mean"] - c.kld["mean"]) <= 4 * info["sampling_se"] + 1e-7
    assert one[0].kld["max"] == 0.0 and copies[0].kld["max"] == 0.0
    assert _same_state(model, tiny_llama())  # the grid left the loaded model as it came


def test_in_place_builds_are_restored_exactly():
    """Every method that changes more than the linears' weights — SmoothQuant and AWQ fold scales
    into norms, emb/head untie and quantize the ends, static activations hook the linears — is
    undone before the next weight config, so each is measured from the original weights."""
    weights = ["w8a8-int8", "awq-int4-g32", "int4-g32;head", "gptq-int4-g32", "none"]
    calibration = _calibration()
    copies = _run(tiny_llama(), weights, kv=["fp16"], calibration=calibration, plan="copies")
    model = tiny_llama()
    one = _run(model, weights, kv=["fp16"], calibration=calibration, plan="one-model")
    for c, o in zip(copies, one):
        assert np.array_equal(c.arrays.nll, o.arrays.nll), c.weights
    fresh = tiny_llama()
    assert _same_state(model, fresh) and _hooks(model) == _hooks(fresh)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == \
        (fresh.get_output_embeddings().weight is fresh.get_input_embeddings().weight)


def test_tied_embeddings_are_tied_again_after_a_head_config():
    model = tiny_gemma3()  # Gemma ties lm_head to the embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    _run(model, ["int4-g32;head", "none"], kv=["fp16"], plan="one-model")
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert _same_state(model, tiny_gemma3())


def test_an_error_mid_run_still_restores_the_model(monkeypatch):
    model = tiny_llama()
    calls = []

    def failing(self, tokens, rows=None):
        calls.append(1)
        if len(calls) > 12:
            raise RuntimeError("boom")
        return original(self, tokens, rows)

    original = WindowPass.step
    monkeypatch.setattr(WindowPass, "step", failing)
    with pytest.raises(RuntimeError, match="boom"):
        _run(model, ["int4-g32", "int8"], kv=["fp16"], plan="one-model")
    assert _same_state(model, tiny_llama()) and _hooks(model) == 0


def test_a_stored_reference_run_holds_one_model(tmp_path, monkeypatch):
    """--reference used to deep-copy each weight config (and keep the previous copy alive in a loop
    variable while the next was built): now no copy of the model is ever made."""
    import wkvlab.weights.apply as apply

    real_deepcopy = copy.deepcopy

    def no_model_copy(value, *args, **kwargs):
        if isinstance(value, torch.nn.Module):
            raise AssertionError("the one-model plan copied the model")
        return real_deepcopy(value, *args, **kwargs)

    monkeypatch.setattr(apply.copy, "deepcopy", no_model_copy)
    results = _run(tiny_llama(), ["int4-g32", "int8", "none"], kv=["fp16", "int4"], reference=tmp_path / "r.safetensors")
    assert results[0].run["plan"] == "one-model" and results[0].run["reference"]["path"].endswith("r.safetensors")


def test_lossless_configs_are_found_without_a_clone(monkeypatch):
    """A checkpoint already on a config's grid is lossless by construction; that is read from the
    weights the build replaces (the reference's, or the snapshot's), never from cloned weights."""
    from wkvlab.weights.apply import build_quantized, quantize_model_weights

    on_grid = quantize_model_weights(tiny_llama(), WeightSpec.parse("q4_0")).model  # weights now lie on llama.cpp's q4_0 grid
    clones = []
    real_clone = torch.Tensor.clone

    def counting(self, *a, **k):
        import sys

        if sys._getframe(1).f_code.co_filename.endswith("apply.py"):  # the build's own clones (deepcopy makes the copy)
            clones.append(self.shape)
        return real_clone(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "clone", counting)
    built = build_quantized(on_grid, WeightSpec.parse("q4_0"))
    assert built.lossless and any("lossless" in n for n in built.notes)
    assert not [s for s in clones if len(s) == 2]  # no weight matrix was cloned
    monkeypatch.setattr(torch.Tensor, "clone", real_clone)
    results = _run(on_grid, ["q4_0", "int4-g32"], kv=["fp16"], plan="one-model")
    assert any("lossless" in n for n in results[0].notes) and not any("lossless" in n for n in results[1].notes)
    assert results[0].kld["max"] == 0.0


@pytest.mark.parametrize("plan", ["copies", "one-model"])
def test_forward_calls_are_one_reference_pass_plus_one_per_config(plan):
    windows = _windows()
    results = _run(tiny_llama(), ["none", "int8"], windows=windows, plan=plan)
    chunks = windows.n_windows * 3  # 48 tokens in chunks of 16
    assert all(r.run["forward_calls"] == chunks for r in results)
    assert all(r.run["reference_forward_calls"] == chunks for r in results)  # the reference ran once, not per config


def _out_of_memory_after(monkeypatch, n_calls: int):
    calls = []
    original = WindowPass.step

    def step(self, tokens, rows=None):
        calls.append(1)
        if len(calls) > n_calls:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, tokens, rows)

    monkeypatch.setattr(WindowPass, "step", step)


def test_out_of_memory_keeps_every_finished_result(monkeypatch):
    model = tiny_llama()
    chunks = _windows().n_windows * 3
    # the reference's record (6 chunk forwards), then none × fp16 and none × int4 (6 each), then int8 runs out
    _out_of_memory_after(monkeypatch, 3 * chunks + 2)
    with pytest.raises(OutOfMemory) as caught:
        _run(model, ["none", "int8"], kv=["fp16", "int4"], plan="one-model", interleave=1)
    error = caught.value
    assert [(r.weights, r.kv) for r in error.results] == [("none", "fp16"), ("none", "int4")]
    message = str(error)
    assert "\n" not in message and "2 of 4 result(s) had finished" in message and "--chunk 8" in message
    assert "int8 × fp16" in message
    assert _same_state(model, tiny_llama())


def test_out_of_memory_in_the_copies_plan_names_the_one_model_plan(monkeypatch):
    _out_of_memory_after(monkeypatch, 3)
    with pytest.raises(OutOfMemory, match="no result had finished; rerun with --chunk 8 or --memory-plan one-model"):
        _run(tiny_llama(), ["none", "int8"], kv=["fp16"], plan="copies")


def test_the_plan_follows_the_memory_the_run_may_use():
    model, windows = tiny_llama(), _windows()
    weights, kv = [WeightSpec.parse(w) for w in ("none", "int8", "int4")], [KVSpec.parse(k) for k in KV]
    roomy = memory_plan(model, windows, weights, kv, RunOptions(chunk=16, max_memory=1 << 34))
    assert roomy.plan == "copies"
    one = memory_plan(model, windows, weights, kv, RunOptions(chunk=16, plan="one-model", max_memory=1 << 34))
    squeezed = memory_plan(model, windows, weights, kv, RunOptions(chunk=16, max_memory=roomy.device_bytes - 1))
    assert squeezed.plan == "one-model" and squeezed.interleave == len(kv) and squeezed.device_bytes == one.device_bytes
    with pytest.raises(ConfigError, match="even one model with one cache needs about"):
        memory_plan(model, windows, weights, kv, RunOptions(chunk=16, max_memory=1 << 20))
    with pytest.raises(ConfigError, match="copies plan needs about .*--memory-plan one-model fits"):
        memory_plan(model, windows, weights, kv, RunOptions(chunk=16, plan="copies", max_memory=roomy.device_bytes - 1))


def test_a_loaded_run_keeps_a_reserve_of_the_free_memory_it_measured(monkeypatch):
    """Without --max-memory the budget is the free memory plus the loaded model, less 15% of that
    (at least 0.5 GiB, which a tiny model's budget is below); given as --max-memory it is used whole."""
    from wkvlab.eval.memory import MIN_RESERVE_BYTES

    model, windows = tiny_llama(), _windows()
    weights, kv = [WeightSpec.parse(w) for w in ("none", "int8")], [KVSpec.parse(k) for k in KV]
    copies = memory_plan(model, windows, weights, kv, RunOptions(chunk=16, max_memory=1 << 34))
    resident = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = int(copies.device_bytes / 0.96)
    monkeypatch.setattr("wkvlab.eval.runner.available_memory", lambda where: budget - resident)
    with pytest.raises(ConfigError, match=r"GiB available on cpu, 0.5 kept in reserve; "):
        memory_plan(model, windows, weights, kv, RunOptions(chunk=16))
    assert memory_plan(model, windows, weights, kv, RunOptions(chunk=16, max_memory=budget)).plan == "copies"
    monkeypatch.setattr("wkvlab.eval.runner.available_memory", lambda where: copies.device_bytes + MIN_RESERVE_BYTES - resident)
    assert memory_plan(model, windows, weights, kv, RunOptions(chunk=16)).plan == "copies"
    monkeypatch.setattr("wkvlab.eval.runner.available_memory", lambda where: copies.device_bytes + MIN_RESERVE_BYTES - resident - 1)
    assert memory_plan(model, windows, weights, kv, RunOptions(chunk=16)).plan == "one-model"


def test_copies_plan_and_a_stored_reference_are_refused_together(tmp_path):
    with pytest.raises(ConfigError, match="drop one of them"):
        _run(tiny_llama(), ["none"], kv=["fp16"], plan="copies", reference=tmp_path / "r.safetensors")


def test_model_left_unchanged_by_the_copies_plan_too():
    model = tiny_llama()
    before = copy.deepcopy(model)
    _run(model, ["int4-g32"], kv=["int4"], plan="copies")
    assert _same_state(model, before)


def test_a_calibrated_build_is_cached_and_applied_in_place(tmp_path, monkeypatch):
    """The disk cache of calibrated weights works in place too: the first run stores what the build
    changed (compared with the snapshot of the originals), the next applies it to the one model."""
    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path))
    model, calibration = tiny_llama(), _calibration()
    first = _run(model, ["awq-int4-g32", "none"], kv=["fp16"], calibration=calibration, plan="one-model")
    assert len(list((tmp_path / "quantized").iterdir())) == 1
    again = _run(model, ["awq-int4-g32", "none"], kv=["fp16"], calibration=calibration, plan="one-model")
    copied = _run(tiny_llama(), ["awq-int4-g32"], kv=["fp16"], calibration=calibration, plan="copies")
    assert np.array_equal(first[0].arrays.nll, again[0].arrays.nll) and np.array_equal(first[0].arrays.nll, copied[0].arrays.nll)
    assert _same_state(model, tiny_llama())
