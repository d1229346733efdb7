"""plan --probe (issue #27 item 1) and the outlier screen (item 3): measured on the user's model, ranked by that."""
from __future__ import annotations

import re

import numpy as np
import pytest
import typer
from rich.console import Console
from typer.testing import CliRunner

from tests.plan.conftest import PLANTED_PAIR
from wkvlab.kv.spec import KVSpec
from wkvlab.plan import plan
from wkvlab.plan.cli import optional_probe_value, plan_command
from wkvlab.plan.guard import UNMEASURED
from wkvlab.plan.measured import Measurement
from wkvlab.plan.probe import DEFAULT_TOKENS, Probe, probe_ctx
from wkvlab.plan.render import render
from wkvlab.weights.spec import WeightSpec


def test_probe_alone_means_the_default_token_count():
    assert optional_probe_value(["plan", "-m", "x", "--probe"]) == ["plan", "-m", "x", "--probe", str(DEFAULT_TOKENS)]
    assert optional_probe_value(["plan", "--probe", "-g", "H100"]) == ["plan", "--probe", str(DEFAULT_TOKENS), "-g", "H100"]
    assert optional_probe_value(["plan", "--probe", "512"]) == ["plan", "--probe", "512"]
    assert optional_probe_value(["eval", "--kv", "int4"]) == ["eval", "--kv", "int4"]


def _measured(model: str, weights: str, kv: str, kld: float, top1: float, kind: str, tokens: int = 2040) -> Measurement:
    w, k = WeightSpec.parse(weights), KVSpec.parse(kv)
    return Measurement(model, "default", 256, tokens, w.label, k.label, kld, kld / 10, "test", w.to_dict(), k.to_dict(), top1=top1,
                       low=kld * 0.8, high=kld * 1.2, kind=kind)


def test_the_probe_gets_the_plans_candidates_and_the_users_own_results_win(model_dir):
    calls = []

    def fake_probe(model, source, kv, weights, context):
        calls.append(([k.label for k in kv], [w.label for w in weights], context))
        return [_measured("tinyplan", "none", "int8", 0.003, 0.97, "probe"), _measured("tinyplan", "none", "int4", 0.02, 0.93, "probe")]

    mine = [_measured("tinyplan", "none", "int4", 0.9, 0.5, "results", tokens=500)]  # fewer tokens, but the user's: it wins
    result = plan(str(model_dir), "RTX-4090", 4, 1024, engine="vllm", measurements=mine, probe=fake_probe)
    assert calls == [(["fp8_e4m3", "int8", "int4"], [], 1024)]  # a config.json without weights: nothing served to probe weights on
    rows = {(r.weights, r.kv): r for r in result.rows}
    assert rows[("bf16", "bf16")].rank == 1 and rows[("bf16", "bf16")].quality.exact  # the checkpoint itself fits: most faithful first
    assert rows[("bf16", "int8")].quality.label == "measured (probe, 2,040 tokens)" and rows[("bf16", "int8")].rank == 2
    assert "[0.0024, 0.0036]" in rows[("bf16", "int8")].quality.shown
    assert rows[("bf16", "int4")].quality.label.startswith("measured (500 tokens") and rows[("bf16", "int4")].quality.unsafe


@pytest.fixture(scope="module")
def planted_plan(planted_folder):
    probe = Probe(2048, say=lambda line: None)
    result = plan(str(planted_folder), "RTX-4090", 1, 1024, weights=["bf16"], kv=["int4", "kivi4", "int8"], probe=probe)
    return result, probe


def test_planted_key_outlier_per_token_4bit_collapses_per_channel_passes(planted_plan):
    result, probe = planted_plan
    rows = {r.kv: r for r in result.rows}
    assert probe_ctx(2048, 1024, result.model) == 256 and probe.cost.windows == 8 and probe.cost.seconds > 0
    per_token, kivi = rows["int4"].quality, rows["kivi4"].quality
    assert per_token.label == "measured (probe, 2,040 tokens)" and per_token.low is not None and per_token.low <= per_token.kld <= per_token.high
    assert per_token.unsafe and per_token.kld > 0.1 and per_token.top1 < 0.5  # collapsed
    assert rows["int4"].rank is None and not any(r.kv == "int4" for r in result.recommendations)
    assert kivi.is_measured and not kivi.unsafe and kivi.kld < 0.01 and kivi.top1 > 0.95  # per-channel keys do not care
    assert UNMEASURED not in per_token.shown


def test_the_probe_keeps_each_units_values_for_the_tolerance_decision(planted_plan):
    """plan --tolerance decides on per-unit values: the probe keeps them, and they give back its mean KLD and top-1."""
    result, _ = planted_plan
    for row in result.rows:
        q = row.quality
        if not q.is_measured:
            continue
        u = q.units
        assert u is not None and sum(u.tokens) == 2040 and len(u.tokens) >= 8, row.kv
        weight = np.asarray(u.tokens) / sum(u.tokens)
        assert float(weight @ np.asarray(u.kld)) == pytest.approx(q.kld, rel=1e-6)
        assert float(weight @ np.asarray(u.top1)) == pytest.approx(q.top1, rel=1e-6)


def test_the_screen_flags_the_planted_layers_from_the_weights(planted_folder):
    from wkvlab.plan.screen import SPREAD_LIMIT, screen_model
    from wkvlab.plan.source import resolve_source

    found = screen_model(*resolve_source(str(planted_folder)))
    assert found.flagged == (0, 1)
    assert all(s.head == 0 and s.channels == PLANTED_PAIR and s.spread > 4 * SPREAD_LIMIT and s.bias_share > 0.99 for s in found.layers)
    assert "kivi4" in found.summary() and "2 of 2 layers flagged (0-1)" in found.summary()


def test_the_screen_does_not_flag_a_model_without_outliers(tmp_path):
    import torch

    from tests.conftest import tiny_llama
    from wkvlab.plan.screen import screen_model
    from wkvlab.plan.source import resolve_source

    model = tiny_llama()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.k_proj.weight.normal_(0, 0.02)
    model.save_pretrained(tmp_path / "plain")
    assert screen_model(*resolve_source(str(tmp_path / "plain"))).flagged == ()


def test_probe_on_the_packaged_default_ranks_probed_rows_first():
    app = typer.Typer()
    app.command("plan")(plan_command)
    app.callback()(lambda: None)
    out = CliRunner().invoke(app, ["plan", "--model", "default", "--gpu", "rtx-4090", "--batch", "8", "--context", "8192", "--probe", "256"])
    assert out.exit_code == 0, out.output
    text = out.output
    assert re.search(r"probe: 5 configuration\(s\) measured in \d+ s on 1 CPU thread", text)  # the cost
    table = [line for line in text.splitlines() if re.match(r"│ *(\d+|—) *│", line)]
    ranked = [line for line in table if re.match(r"│ *\d+ *│", line)]
    assert "Q4_1 (the file as it is)" in ranked[0] and "exact" in ranked[0]  # serve the GGUF as it is: the first row
    good = [i for i, line in enumerate(ranked) if "measured (probe, 248 tokens) [" in line or "exact" in line]
    assert len(good) > 2 and good == list(range(len(good)))  # exact and probed rows first, each probed one with its interval
    assert "weight formats were not probed: the launch lines load HuggingFaceTB/SmolLM2-135M-Instruct" in text


def test_plan_screen_names_the_flagged_layers_in_the_unmeasured_rows(planted_folder):
    result = plan(str(planted_folder), "RTX-4090", 1, 1024, weights=["bf16"], kv=["int4", "int8"], screen=True)
    assert result.screen is not None and result.screen.flagged == (0, 1)
    rows = {r.kv: r for r in result.rows}
    assert rows["int4"].quality.caution.startswith(UNMEASURED) and "outlier screen flags 2 of 2 layers" in rows["int4"].quality.caution
    assert rows["int8"].quality.caution == UNMEASURED  # unmeasured like every prior, but the screen is about per-token 4-bit keys
    console = Console(width=400, record=True)
    render(result, console)
    assert "2 of 2 layers flagged (0-1)" in console.export_text()
    import json

    from wkvlab.plan import PlanResult

    assert PlanResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result  # --json carries the screen


def test_the_plan_says_what_context_was_probed_and_what_is_extrapolated(planted_plan):
    """The probe measures 256-token windows of a plan for 1,024 tokens: the output says so (issue 41, Done-when)."""
    result, probe = planted_plan
    console = Console(record=True, width=400)
    render(result, console)
    text = console.export_text()
    assert "probed context: every measured KLD is over windows of 256 tokens; the plan is for 1,024, which is extrapolated" in text


def test_a_context_past_the_models_own_is_refused_in_one_line_before_the_probe_runs(planted_folder):
    from wkvlab.errors import ConfigError

    calls = []
    with pytest.raises(ConfigError) as err:
        plan(str(planted_folder), "RTX-4090", 8, 4096, probe=lambda *a: calls.append(a) or [])
    assert calls == [] and "\n" not in str(err.value)
    assert "--context 4,096 exceeds" in str(err.value) and "context of 1,024 tokens" in str(err.value)
    assert "plan at --context 1024 or less" in str(err.value) and "--model gemma3-270m (32,768)" in str(err.value)


def test_the_packaged_models_context_is_their_gguf_headers():
    """check_size names the packaged models that have a context; the number is the file's own, not a guess."""
    from wkvlab.models.packaged import PACKAGED_MODELS, packaged_gguf
    from wkvlab.plan.gguf import gguf_config

    for name, packaged in PACKAGED_MODELS.items():
        assert gguf_config(packaged_gguf(name))[0]["max_position_embeddings"] == packaged.context, name
