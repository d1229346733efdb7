"""benchmarks/gpu_check.py: its CPU part runs (and can fail), and its GPU-only code runs on small shapes on the CPU, so neither rots."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _one_thread_own_cache(one_torch_thread, monkeypatch, tmp_path):
    monkeypatch.setenv("WKVLAB_CACHE", str(tmp_path))  # main() points it at a fresh folder; restored after


def test_the_cpu_part_runs_passes_on_llama_and_says_the_rest_needs_a_gpu(gc, capsys):
    assert gc.main(["--cpu", "--models", "llama"]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["failed"] == [] and report["cuda"] is False
    names = [row["check"] for row in report["checks"]]
    for expected in ("b: llama: chunked logits == whole", "b: llama: identity KLD exactly 0", "b: llama: calibrated KV specs twice",
                     "b: llama: int4-g32 quantizes the decoder", "forward calls per chunk (tiny-llama)",
                     "b: llama: bfloat16: identity KLD exactly 0", "m: meta audit, copies plan: no host sync per chunk",
                     "m: meta audit, one-model plan: no host sync per chunk",
                     "m: meta build audit, llama-awq: peak within ±15% of the estimate, flat per layer"):
        assert expected in names
    finite = next(r for r in report["checks"] if r["check"].endswith("configs give a finite KLD above 0") and "bfloat16" not in r["check"])
    assert finite["configs"] == len(gc.KV_SPECS) + len(gc.WEIGHT_SPECS)
    assert len(out.err.strip().splitlines()) == 1 and "need a CUDA GPU" in out.err


def test_a_failed_check_fails_the_run(gc, monkeypatch, capsys):
    monkeypatch.setattr(gc, "model_checks", lambda checks, *a: checks.check("planted", False))
    monkeypatch.setattr(gc, "meta_audit", lambda checks: None)  # runs (and passes) in the test above
    monkeypatch.setattr(gc, "meta_build_audit", lambda checks: None)
    assert gc.main(["--cpu", "--models", "llama"]) == 1
    assert json.loads(capsys.readouterr().out)["failed"] == ["planted"]


def test_the_quantized_fraction_sees_skipped_layers_and_experts(gc):
    model = gc.tiny_model("llama", "cpu")
    assert gc.quantized_fraction(model, "int4-g32")["fraction"] >= gc.MIN_QUANTIZED
    assert gc.quantized_fraction(model, "int4-g32;skip=0")["fraction"] < gc.MIN_QUANTIZED  # one layer of two kept: ~0.5
    moe = gc.quantized_fraction(gc.tiny_model("mixtral", "cpu"), "int4-g32")
    # whatever main does with fused experts, the check reports it: all quantized, or the 3-D tensors left untouched
    assert (moe["fraction"] >= gc.MIN_QUANTIZED) == (moe["n_untouched_3d"] == 0)


def test_the_gpu_only_code_runs_on_small_shapes_on_the_cpu(gc):
    checks = gc.Checks()
    gc.format_checks(checks, "cpu")  # CPU against CPU: bit-exact by construction, but every format's code runs
    assert checks.rows and not checks.failed
    small = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 vocab_size=256, max_position_embeddings=1100)
    out = gc.big_model_checks(checks, "cpu", shape=small, ctx=256, grid_ctx=128, slice_shape=small, samples=4, length=32)
    rows = {row["check"]: row for row in checks.rows}
    assert not [r for r in rows.values() if "error" in r]
    assert rows["forward calls per chunk (llama-shaped)"]["ok"]
    memory = [r for name, r in rows.items() if "estimate" in name]
    assert len(memory) == 4 and all(r["ok"] is False and r.get("measured_gib", r.get("peak_gib")) is None for r in memory)  # CUDA measures peaks
    assert all("reserved_gib" in r and r["reserved_gib"] is None for r in memory)  # the reserved peak is compared too
    assert set(out["calibrated_build"]) == {"gptq-int4-g128", "awq-int4-g128"}
    assert torch.get_default_dtype() == torch.float32  # the bf16 build restored it


def test_the_reserved_peak_is_measured_and_must_be_within_the_estimate_too(gc, monkeypatch):
    """On CUDA both of torch's peaks are read after a reset: an allocated peak within the band with
    a reserved peak 20% above the estimate (a fragmented allocator) fails the check."""
    calls = []
    stats = {"allocated": 0, "reserved": 0}
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(gc.torch.cuda, name, lambda name=name: calls.append(name))
    monkeypatch.setattr(gc.torch.cuda, "max_memory_allocated", lambda: stats["allocated"])
    monkeypatch.setattr(gc.torch.cuda, "max_memory_reserved", lambda: stats["reserved"])
    gc._reset_peak("cuda:0")
    assert calls == ["synchronize", "empty_cache", "reset_peak_memory_stats"]
    estimate = 10 * 2**30
    stats.update(allocated=int(9.6 * 2**30), reserved=12 * 2**30)
    ok, measured = gc._peaks_within(gc._peaks("cuda:0"), estimate, gc.MEMORY_MARGIN)
    assert not ok and measured == {"measured_gib": 9.6, "reserved_gib": 12.0}
    stats.update(reserved=int(10.8 * 2**30))
    assert gc._peaks_within(gc._peaks("cuda:0"), estimate, gc.MEMORY_MARGIN) == (True, {"measured_gib": 9.6, "reserved_gib": 10.8})
    assert gc._peaks_within(gc._peaks("cuda:0"), estimate, gc.MEMORY_MARGIN / 2)[0] is False  # 10.8 is 8% above: outside ±5%
    assert gc._peaks("cpu") is None and gc._peaks_within(None, estimate, gc.BUILD_MARGIN) == (False, {"measured_gib": None, "reserved_gib": None})


def _model_checks(gc, monkeypatch, kv=("q4_0",), weights=("int8", "gptq-int4-g32")):
    """(b) on the tiny llama with short lists (the full ones run in the test above)."""
    monkeypatch.setattr(gc, "CALIBRATED_KV", ["int4+smooth"])
    checks = gc.Checks()
    gc.model_checks(checks, "llama", "cpu", list(kv), list(weights), None)
    return {row["check"]: row for row in checks.rows}


def _refuse_gptq(gc, monkeypatch):
    """A planted regression: every grid with a GPTQ config refused in one line."""
    real = gc.run_grid

    def refuse_gptq(model, windows, weights, *args, **kwargs):
        if any(w.method == "gptq" for w in weights):
            raise gc.ConfigError("gptq-int4-g32: planted refusal")
        return real(model, windows, weights, *args, **kwargs)

    monkeypatch.setattr(gc, "run_grid", refuse_gptq)


def test_a_refused_method_that_should_run_fails(gc, monkeypatch):
    _refuse_gptq(gc, monkeypatch)
    rows = _model_checks(gc, monkeypatch)
    runs = rows["b: llama: every weight method runs (or is refused where wkvlab states it cannot)"]
    assert runs["ok"] is False and list(runs["refused_unexpectedly"]) == ["gptq-int4-g32"]


def test_a_stated_refusal_does_not_fail(gc, monkeypatch):
    monkeypatch.setitem(gc.EXPECTED_REFUSALS, "llama", frozenset({"gptq-int4-g32"}))
    _refuse_gptq(gc, monkeypatch)
    rows = _model_checks(gc, monkeypatch, weights=("gptq-int4-g32",))
    runs = rows["b: llama: every weight method runs (or is refused where wkvlab states it cannot)"]
    assert runs["ok"] is True and runs["refused_as_stated"] == ["gptq-int4-g32"]


def test_a_kv_hook_that_never_fires_fails(gc, monkeypatch):
    """The candidate runs with a plain cache and no attention hook: its KLD is exactly 0, in float32 and in bf16."""
    import contextlib

    from transformers.cache_utils import DynamicCache

    import wkvlab.eval.chunks as chunks

    monkeypatch.setattr(chunks, "kv_quantization", lambda *a, **k: contextlib.nullcontext())
    monkeypatch.setattr(chunks, "ChunkedKVCache", lambda model, spec, stores: DynamicCache(config=model.config))
    rows = _model_checks(gc, monkeypatch, weights=("int8",))
    for name in ("b: llama: 2 KV/weight configs give a finite KLD above 0", "b: llama: bfloat16: 1 KV configs give a finite KLD above 0"):
        assert rows[name]["ok"] is False and rows[name]["not_above_zero"] == ["kv q4_0"], name
    assert rows["b: llama: bfloat16: identity KLD exactly 0"]["ok"] and rows["b: llama: bfloat16: logits are float32, chunked == whole"]["ok"]


def test_calibrated_twice_counts_the_files_of_its_own_folder(gc, monkeypatch):
    monkeypatch.setattr(gc, "CALIBRATED_KV", ["int4+smooth"])
    checks = gc.Checks()
    model = gc.tiny_model("llama", "cpu")
    gc._calibrated_twice(checks, "b: llama", model, "llama")
    first = checks.rows[-1]
    assert first["ok"] and first["cache_files_first"] == first["cache_files_second"] >= 1
    monkeypatch.setattr(gc, "_grid", lambda *a, **k: [])  # a "calibration" that writes nothing: no file in its folder
    gc._calibrated_twice(checks, "b: llama", model, "llama")
    assert checks.rows[-1]["ok"] is False and checks.rows[-1]["cache_files_first"] == 0


def test_the_budget_skips_what_it_cannot_start_and_exits_2(gc, monkeypatch, capsys):
    monkeypatch.setattr(gc, "meta_audit", lambda checks: checks.check("m: planted", True))
    monkeypatch.setattr(gc, "meta_build_audit", lambda checks: checks.check("m: planted build", True))
    monkeypatch.setattr(gc, "model_checks", lambda checks, *a: checks.check("b: planted", True))
    monkeypatch.setattr(gc, "forward_calls", lambda checks, *a: checks.check("f: planted", True))
    assert gc.main(["--cpu", "--models", "llama,qwen2", "--budget", "0"]) == 2
    out = capsys.readouterr()
    report = json.loads(out.out)
    assert report["failed"] == [] and report["skipped"] == ["m: meta audit", "m: meta build audit", "b: llama", "b: qwen2", "forward calls per chunk (tiny llama)"]
    assert "left 5 group(s) unrun" in out.err


def test_the_meta_audit_fails_on_a_per_chunk_host_copy(gc, monkeypatch):
    """It passes on this code (the CPU-part test above); planted, the old per-chunk copy of the ids fails it."""
    import wkvlab.eval.chunks as chunks

    real = chunks.WindowPass.step  # ids from the host on every chunk and pass, as before issue 40
    monkeypatch.setattr(chunks.WindowPass, "step", lambda self, tokens, rows=None: real(self, tokens.cpu(), rows))
    checks = gc.Checks()
    gc.meta_audit(checks, plans=("one-model",))
    sync = checks.rows[0]
    assert sync["ok"] is False and sync["extra_chunks"] == 2 and sync["per_chunk"] >= 1, sync
    assert any(site.startswith("host to device at eval/chunks.py") for site in sync["sites"]), sync["sites"]


def test_the_meta_build_audit_fails_on_a_planted_extra_hessian(gc, monkeypatch):
    """It passes on this code (the CPU-part test above); planted, a second Hessian kept per input group
    (what a linear keeping its own did before issue 40) puts the GPTQ build past +15% of its estimate."""
    from wkvlab.weights import gptq

    real, kept = gptq.hessian_of, []

    def keeping_a_copy(layer, hidden, kwargs, module):
        hessian = real(layer, hidden, kwargs, module)
        kept.append(hessian.clone())
        return hessian

    monkeypatch.setattr(gptq, "hessian_of", keeping_a_copy)
    checks = gc.Checks()
    gc.meta_build_audit(checks, cases=("llama-gptq",))
    row = checks.rows[0]
    assert row["ok"] is False and row["ratio"] > 1.15 and kept, row
