"""The simulated llamacpp: presets against llama.cpp itself: every ratio within ±15% (slow).

This is what backs the ``engine-checked`` label of ``wkvlab.kv.presets.ENGINE_CHECKED_LLAMACPP``.
How many tokens (docs/engines.md, "How many tokens the check needs"): ratios of single 1024-token
windows ranged 0.90–1.08 over 4 windows × 5 types, two 256-token windows 0.74–1.19; the first two
1024-token windows, used here, gave 0.95–1.05 — a margin of ~0.1 to the ±15% band.
"""
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed; make test-all installs the llamacpp extra")

from wkvlab.engines.compare import compare_engine  # noqa: E402
from wkvlab.engines.run import engine_workload  # noqa: E402
from wkvlab.kv.presets import ENGINE_CHECKED_LLAMACPP  # noqa: E402
from wkvlab.models.packaged import packaged_gguf  # noqa: E402

CTX, TOKENS = 1024, 2048


@pytest.mark.slow
def test_every_engine_checked_preset_is_within_15_percent_of_llama_cpp(default_model):
    work = engine_workload(default_model, "default", ctx=CTX, tokens=TOKENS, score="all")
    report = compare_engine(work, str(packaged_gguf("default")), list(ENGINE_CHECKED_LLAMACPP))
    assert [r.kv for r in report.rows] == list(ENGINE_CHECKED_LLAMACPP)
    assert (report.rows[0].preset, report.rows[0].sim_spec) == ("llamacpp:q8_0", "q8_0+rot+q=q8_0")
    assert report.sim_activations == "ggml-q8 on 211 linears"
    ratios = {r.kv: round(r.ratio, 3) for r in report.rows}
    assert all(0.85 <= ratio <= 1.15 for ratio in ratios.values()), ratios
    assert report.rows[1].engine_kld["mean"] > 5 * report.rows[0].engine_kld["mean"]  # q4_0 costs far more than q8_0
