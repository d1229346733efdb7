"""Issue 41: the planner measures before it ranks, recommends nothing on a prior, and serves a GGUF as it is."""
from __future__ import annotations

import re

import typer
from rich.console import Console
from typer.testing import CliRunner

from wkvlab.kv.spec import KVSpec
from wkvlab.plan import plan
from wkvlab.plan.cli import plan_command
from wkvlab.plan.guard import unsafe_reason
from wkvlab.plan.measured import Measurement
from wkvlab.plan.render import render
from wkvlab.weights.spec import WeightSpec


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("plan")(plan_command)
    app.callback()(lambda: None)
    return app


def _text(result) -> str:
    console = Console(width=400, record=True)
    render(result, console)
    return console.export_text()


def test_a_model_known_by_name_only_gets_no_recommendation_on_a_prior():
    result = plan("Llama-3-8B", "RTX-4090", 8, 8192)
    rows = {(r.weights, r.kv): r for r in result.rows}
    assert all(rec.verified == rows[(rec.weights, rec.kv)].quality.exact for rec in result.recommendations)
    for row in result.rows:
        assert row.recommendable == row.quality.exact, (row.weights, row.kv)
    assert any(not rec.verified for rec in result.recommendations)  # an engine whose 16-bit row does not fit: unverified
    assert "huggingface-cli download meta-llama/Meta-Llama-3-8B" in result.measure_hint
    out = CliRunner().invoke(_app(), ["plan", "--model", "llama-3-8b", "--gpu", "rtx-4090", "--batch", "8", "--context", "8192"])
    assert out.exit_code == 0, out.output
    assert "UNVERIFIED ON THIS MODEL" in out.output and "to measure the unmeasured rows:" in out.output
    assert "probe" not in out.output.split("\n")[0]  # nothing to load: no probe ran


def test_the_default_plan_measures_and_drops_8bit_caches_on_large_key_outliers(large_outlier_folder, monkeypatch):
    """No flags: the probe runs (sized to --probe-budget) before ranking; a per-token 8-bit cache collapses on the
    planted outlier, so it is measured unsafe and never recommended; every recommended row is measured or exact."""
    # the budget counts the load and is sized on measured time (tests/plan/test_probe_budget.py): 60 s leaves room on a
    # busy machine, and a cap of 8 windows of 32 tokens keeps a quiet one from spending all of it on more tokens
    monkeypatch.setattr("wkvlab.plan.probe.MAX_TOKENS", 256)
    out = CliRunner().invoke(_app(), ["plan", "--model", str(large_outlier_folder), "--gpu", "rtx-4090", "--batch", "8",
                                      "--context", "1024", "-e", "vllm", "--probe-budget", "60", "--json", str(large_outlier_folder.parent / "p.json")])
    assert out.exit_code == 0, out.output
    import json

    data = json.loads((large_outlier_folder.parent / "p.json").read_text())
    rows = {(r["weights"], r["kv"]): r for r in data["rows"]}
    int8 = rows[("bf16", "int8")]["quality"]
    assert int8["label"].startswith("measured (probe") and unsafe_reason(int8["kld"], int8["top1"])  # collapsed: top-1 far below 90%
    assert rows[("bf16", "int8")]["rank"] is None
    assert data["probe_cost"]["seconds"] > 0 and data["probe_cost"]["configs"] >= 6  # 3 caches + 3 weight formats
    for rec in data["recommendations"]:
        row = rows[(rec["weights"], rec["kv"])]
        assert rec["verified"] and (row["quality"]["exact"] or row["quality"]["source"] == "measured")
        assert not unsafe_reason(row["quality"]["kld"], row["quality"]["top1"])
    assert "probe: budget 60 s, the model load counted in it" in out.output and re.search(r"probe: \d+ configuration\(s\) measured on [\d,]+ tokens", out.output)


def _m(weights: str, kv: str, kld: float, se: float) -> Measurement:
    w, k = WeightSpec.parse(weights), KVSpec.parse(kv)
    return Measurement("tinyplan", "default", 256, 4096, w.label, k.label, kld, se, "test", w.to_dict(), k.to_dict(), top1=0.97)


def test_room_to_spare_is_never_traded_for_a_worse_config_by_a_speed_tie(model_dir):
    """Issue 41: fp8 (0.0307) beat int8 (0.0121) on 'a tie within 2 SE, broken by speed' on a GPU with no memory pressure."""
    result = plan(str(model_dir), "H100", 8, 1024, engine="vllm", kv=["fp8_e4m3", "int8"], weights=["bf16"],
                  measurements=[_m("none", "fp8_e4m3", 0.0307, 0.010), _m("none", "int8", 0.0121, 0.003)])
    rows = {r.kv: r for r in result.rows}
    assert rows["int8"].rank < rows["fp8_e4m3"].rank
    assert rows["fp8_e4m3"].throughput.decode.tokens_per_s >= rows["int8"].throughput.decode.tokens_per_s  # the faster one loses
    rec = result.recommendations[0]
    assert rec.kv == "int8" and any("memory is not the constraint" in line for line in rec.why)


def test_a_gguf_is_served_as_it_is_first_with_the_bytes_llama_cpp_loads():
    from wkvlab.models.packaged import packaged_gguf
    from wkvlab.plan.gguf import tensor_bytes_by_part

    path = packaged_gguf("smollm2")
    parts = tensor_bytes_by_part(path)
    assert parts == {"linear": 66_355_200, "embedding": 30_081_024, "output": 0, "norm": 140_544}  # Q4_1 blocks of 32 in 20 B; tied output
    result = plan("default", "H100", 8, 4096)
    first = next(r for r in result.rows if r.rank == 1)
    assert first.weights == "Q4_1 (the file as it is)" and first.kv == "bf16" and first.quality.exact
    assert first.weight_bytes.total_bytes == first.gpu_weights_bytes == sum(parts.values())
    rec = next(r for r in result.recommendations if r.engine == "llama.cpp")
    assert rec.weights == first.weights and rec.command.model == str(path) and not rec.command.prepare
    assert any("KLD to the dequantized" in n and "0 means 'as the file'" in n for n in result.notes)
    assert "tied to the embedding" in _text(result)


def test_a_quantized_gguf_is_never_requantized_up():
    """Issue 41: a Q4_K_M file was planned as 'llama-quantize --allow-requantize ... Q8_0' with KLD 0.0002."""
    from wkvlab.models.packaged import packaged_gguf

    result = plan(str(packaged_gguf("gemma3-270m")), "H100", 8, 4096)  # the file alone: no 16-bit checkpoint to quantize from
    assert result.rows[0].weights == "Q4_K_M (the file as it is)"
    assert not any(r.weights in ("q8_0", "q4_0") for r in result.rows)
    assert any("not planned: q4_0, q8_0 — re-quantizing the Q4_K_M file" in n for n in result.notes)
    assert not any("--allow-requantize" in " ".join(rec.command.prepare) for rec in result.recommendations)


def test_a_combination_an_engine_would_launch_unmeasured_is_measured_too(model_dir):
    """The probe measures halves; where an engine is left with only an unmeasured product, that product is probed next."""
    calls = []

    class FakeProbe:
        notes: list = []

        def __call__(self, model, source, kv, weights, context):
            calls.append(("halves", [k.label for k in kv]))
            return [_m("none", "int8", 0.002, 0.0002)]

        def pairs(self, model, source, pairs, context):
            calls.append(("pairs", [(w.label, k.label) for w, k in pairs]))
            return [_m("int8", "int8", 0.004, 0.0003)]

    result = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", weights=["int8"], kv=["int8"], probe=FakeProbe())
    assert calls == [("halves", ["int8"]), ("pairs", [("int8", "int8")])]
    rec = result.recommendations[0]
    assert (rec.weights, rec.kv) == ("int8", "int8") and rec.verified
