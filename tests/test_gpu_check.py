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
                     "b: llama: int4-g32 quantizes the decoder", "forward calls per chunk (tiny-llama)"):
        assert expected in names
    finite = next(r for r in report["checks"] if r["check"].endswith("give a finite KLD"))
    assert finite["configs"] == len(gc.KV_SPECS) + len(gc.WEIGHT_SPECS)
    assert len(out.err.strip().splitlines()) == 1 and "need a CUDA GPU" in out.err


def test_a_failed_check_fails_the_run(gc, monkeypatch, capsys):
    monkeypatch.setattr(gc, "model_checks", lambda checks, *a: checks.check("planted", False))
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
    assert set(out["calibrated_build"]) == {"gptq-int4-g128", "awq-int4-g128"}
    assert torch.get_default_dtype() == torch.float32  # the bf16 build restored it
