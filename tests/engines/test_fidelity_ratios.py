"""The simulated llamacpp: presets against llama.cpp itself: the engine-checked labels measured again (slow).

This re-measures the SmolLM2 checks of ``src/wkvlab/kv/fidelity_checks.json`` that the rule decided
(``scripts/fidelity_table.py --record``) on the windows docs/engines.md uses and the records name:
32 windows of 512 tokens (8, the fewest with an interval, left four of the five undecided), about 25
minutes on two cores; ratio = simulated / engine mean KLD, decided by the one rule against the
±15% band with Holm over the same cache types (:func:`wkvlab.engines.compare.fidelity_verdicts`, what
``wkvlab engine compare`` prints). A point ratio inside the band is not enough: every check that backs
an ``engine-checked`` label must be decided *equivalent within ±0.15* again, and every ratio must be
the recorded one (the numbers are in docs/engines.md, "Fidelity on the default model").
"""
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed; make test-all installs the llamacpp extra")

from wkvlab.engines.compare import compare_engine, fidelity_verdicts  # noqa: E402
from wkvlab.engines.run import engine_workload  # noqa: E402
from wkvlab.kv.presets import recorded_checks  # noqa: E402
from wkvlab.models.packaged import packaged_gguf  # noqa: E402

DECIDED = {c["preset"].split(":", 1)[1]: c for c in recorded_checks()[1]
           if c["preset"].startswith("llamacpp:") and c["model"].startswith("SmolLM2") and "outcome" in c}
CTX, WINDOWS = 512, 32  # the design the records name (their "windows")
TOKENS = CTX * WINDOWS


def test_the_recorded_checks_name_the_windows_this_test_runs_and_the_rule_that_decided_them():
    assert {"q8_0", "q4_0", "q4_1", "q5_0", "q8_0/q4_0"} == set(DECIDED)
    for c in DECIDED.values():
        assert c["windows"].startswith(f"{WINDOWS} x {CTX} tokens") and c["interval"][0] <= c["ratio"] <= c["interval"][1], c
        assert c["family"].startswith(f"Holm over {len(DECIDED)} tests") and "±0.15" in c["family"], c
        if c["outcome"] == "within":  # the adjusted interval that backs the label lies inside the band
            assert 0.85 <= c["adjusted"][0] and c["adjusted"][1] <= 1.15, c


@pytest.mark.slow
def test_every_engine_checked_smollm2_preset_is_decided_equivalent_to_llama_cpp_again(default_model):
    work = engine_workload(default_model, "default", ctx=CTX, tokens=TOKENS, score="all")
    report = compare_engine(work, str(packaged_gguf("default")), list(DECIDED))
    assert [r.kv for r in report.rows] == list(DECIDED)
    assert (report.rows[0].preset, report.rows[0].sim_spec) == (DECIDED[report.rows[0].kv]["preset"], DECIDED[report.rows[0].kv]["spec"])
    assert report.sim_activations == "ggml-q8 on 211 linears"
    verdicts = {r.kv: v for r, v in zip(report.rows, fidelity_verdicts(report.rows))}
    assert all(v.raw.n_units == WINDOWS for v in verdicts.values()), verdicts
    outcomes = {kv: v.outcome for kv, v in verdicts.items()}
    assert outcomes == {kv: c["outcome"] for kv, c in DECIDED.items()}, {kv: v.describe() for kv, v in verdicts.items()}
    # the same windows, the same engine build: the ratio is the recorded one to its printed digits (float order aside)
    assert {r.kv: round(r.ratio, 2) for r in report.rows} == pytest.approx({kv: c["ratio"] for kv, c in DECIDED.items()}, abs=0.011)
