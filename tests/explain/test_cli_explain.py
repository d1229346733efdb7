import functools
import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.explain.results_a import result, window_noise
from tests.explain.tiny_loaded import tiny_loaded

ENV = {**os.environ, "COLUMNS": "250"}


def _wkvlab(*args):
    return subprocess.run([sys.executable, "-m", "wkvlab.cli", *args], capture_output=True, text=True, timeout=600, env=ENV)


def test_explain_end_to_end_on_a_tiny_model(tmp_path, monkeypatch):
    """The command as a user runs it (tables, verdict, JSON), on a tiny random model instead of a packaged one."""
    import wkvlab.explain.run as explain_run
    from wkvlab.cli import app
    from wkvlab.explain.run import explain

    # the command imports explain from wkvlab.explain.run when it runs (after its checks)
    monkeypatch.setattr(explain_run, "explain", functools.partial(explain, loaded=tiny_loaded()))
    out = tmp_path / "explain.json"
    args = ["explain", "--weights", "int4-g32", "--kv", "int2", "--ctx", "32", "--tokens", "96", "--max-ctx", "256",
            "--context-docs", "2", "--json", str(out)]
    run = CliRunner().invoke(app, args, env=ENV)
    assert run.exit_code == 0, run.output
    for title in ("2×2 factorial", "noise floor", "cross term", "KLD by query position", "mitigations", "verdict", "model's own samples"):
        assert title in run.output
    data = json.loads(out.read_text())
    assert data["options"]["skip"] == [] and data["selfgen"]["data"] == "selfgen:48"
    assert data["selfgen"]["factorial"]["windows"] == 1  # 48 tokens of the model's own text: one window of 32
    assert data["generation"]["new_tokens"] == 32 and len(data["retrieval"]["per_depth"]) == 5
    assert data["factorial"]["windows"] == 3 and data["factorial"]["identity_kld_max"] == 0.0
    assert data["context"]["max_ctx"] == 256 and data["context"]["documents"] == 2
    assert data["noise"]["repeat"]["max_abs_kld_diff"] == 0.0
    assert len(data["attention"]["per_layer"]) == 4
    # the interventions on the (W, C) run: one diagnosis window, so every effect is undecided (never additive)
    cross = data["cross_term"]
    assert cross["windows"] == 1 and {v["outcome"] for v in cross["verdicts"].values()} == {"undecided"}
    assert "ε_q·ε_k,cᵀ removed" in run.output and "first 4 tokens at 16 bits" in run.output
    # 3 windows: no interval, never "additive"
    assert data["mitigations"]["results"] and data["verdict"][0].startswith("[factorial: 3 windows of 32, 93 tokens, 2 replicates] Undecided")
    assert data["factorial"]["kld"]["verdict"]["outcome"] == "undecided" and "undecided" in run.output
    # KLD and NLL interactions: one family of 2; PPL's and top-1's interactions are never decided (issue #38)
    assert all("margin ±" in line and "Holm over 2 tests" in line for line in data["verdict"][:2])
    assert "NLL (mean log-loss, nats) interaction" in data["verdict"][1] and "no interaction verdict on PPL" in data["verdict"][2]
    assert "no verdict" in data["verdict"][3]
    assert not any(w in line for line in data["verdict"][2:4] for w in ("compounds", "sub-additive", "additive within", "undecided"))
    assert set(data["seconds"]) >= {"factorial", "replicates", "noise", "attention", "hidden", "context", "mitigations"}
    # the factorial cells' per-unit values: its verdicts decided again from the JSON alone (wkvlab.findings.records)
    from wkvlab.findings.records import redecide_factorial

    # every replicate's cells (2 by default), pooled again as the run pooled them
    assert [(g["key"], g["replicate"]) for g in data["units"]["grids"]] == [([c], r) for r in (0, 1) for c in ("ref", "w", "c", "wc")]
    again = redecide_factorial(data["units"])
    assert again.replicates == 2 and again.kld.interaction.replicates == 2
    assert again.tokens == data["factorial"]["tokens"] and again.kld.verdict.outcome == data["factorial"]["kld"]["verdict"]["outcome"]
    assert again.kld.wc.estimate == pytest.approx(data["factorial"]["kld"]["wc"]["estimate"], rel=1e-9)


def test_explain_bad_skip_is_one_line():
    proc = _wkvlab("explain", "--weights", "int4-g128", "--kv", "int4", "--skip", "everything")
    assert proc.returncode == 2 and "unknown step(s) to skip: everything" in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


@pytest.mark.parametrize("command", [("explain", "--weights", "int4-g128", "--kv", "int4"), ("compare", "aaaa", "bbbb")])
def test_the_removed_resamples_option_is_one_line_saying_why(command):
    """Every interval is analytic since issue #38: an old command line with --resamples gets one line, no traceback,
    and the option is gone from the help."""
    proc = _wkvlab(*command, "--resamples", "2000")
    assert proc.returncode == 2 and "--resamples is gone: every interval is analytic" in proc.stderr
    assert "no Monte-Carlo error" in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
    assert "--resamples" not in _wkvlab(command[0], "--help").stdout


def test_compare_two_stored_results(tmp_path):
    from wkvlab.cli import app
    from wkvlab.store import open_store

    store = tmp_path / "r.db"
    n = window_noise(5)
    with open_store(store) as db:
        db.put("aaaa1111", {"score": "all"}, result(0.1 + n, kv="q8_0"))
        db.put("bbbb2222", {"score": "all"}, result(0.3 + n, kv="q4_0"))
        db.put("cccc3333", {"score": "all"}, result(0.3, nll_ref=1.0, kv="int4"))
    out = tmp_path / "cmp.json"
    run = CliRunner().invoke(app, ["compare", "aaaa", "bbbb", "--store", str(store), "--json", str(out)], env=ENV)
    assert run.exit_code == 0, run.output
    assert "w × q4_0 − w × q8_0" in run.output
    data = json.loads(out.read_text())
    assert data["kld"]["estimate"] == pytest.approx(0.2) and data["kld"]["low"] == pytest.approx(0.2)
    proc = _wkvlab("compare", "aaaa", "cccc", "--store", str(store))
    assert proc.returncode == 2 and "not scored on the same tokens" in proc.stderr and "Traceback" not in proc.stderr
    proc = _wkvlab("compare", "aaaa", "zzzz", "--store", str(store))
    assert proc.returncode == 2 and "no result 'zzzz'" in proc.stderr


@pytest.mark.slow
def test_explain_on_the_default_model(default_model):
    """Very few tokens: the packaged model through the factorial, decomposition, context and mitigations (the other steps run on the tiny model)."""
    from wkvlab.explain.run import explain

    report = explain("int4-g128", "int4", loaded=default_model, ctx=32, tokens=64, max_ctx=32, diag_windows=1,
                     skip=("noise", "hidden", "generation", "retrieval", "selfgen"))
    f = report.factorial
    assert f.identity_kld_max == 0.0 and f.kld.w.estimate > 0 and f.kld.c.estimate > 0
    assert report.attention.layers == 30 and report.context.max_ctx == 32
    names = {r.name for r in report.mitigations.results}
    assert {"first 4 tokens 16-bit", "K int8, V int4"} <= names and any(n.startswith("16-bit") for n in names)
    assert len(report.verdict) >= 6


def test_explain_tolerance_is_the_ship_decision_on_w_c_and_wc(tmp_path, monkeypatch):
    """explain --tolerance decides W, C and W+C against the user's tolerance as eval --tolerance does (one Holm family
    of three, the same lines), in the output and the JSON (issue 38 item 6)."""
    import wkvlab.explain.run as explain_run
    from wkvlab.cli import app
    from wkvlab.explain.run import explain
    from wkvlab.stats.tolerance import Tolerance, ship_lines

    loaded = tiny_loaded()
    monkeypatch.setattr(explain_run, "explain", functools.partial(explain, loaded=loaded))
    out = tmp_path / "explain.json"
    args = ["explain", "--weights", "int4-g32", "--kv", "int2", "--ctx", "32", "--tokens", "320", "--skip", ",".join(
        s for s in ("noise", "attention", "hidden", "context", "mitigations", "generation", "retrieval", "selfgen")),
            "--tolerance", "0.5", "--json", str(out)]
    run = CliRunner().invoke(app, args, env=ENV)
    assert run.exit_code == 0, run.output
    ship = json.loads(out.read_text())["tolerance"]
    assert [v["name"] for v in ship] == ["int4-g32 × fp16", "none × int2", "int4-g32 × int2"]
    assert {v["family_size"] for v in ship} == {3} and {v["family"] for v in ship} == {"W, C and W+C of this explain"}
    assert all(v["outcome"] in ("within tolerance", "exceeds it", "undecided") for v in ship)
    report = explain("int4-g32", "int2", ctx=32, tokens=320, skip=("noise", "attention", "hidden", "context", "mitigations",
                                                                    "generation", "retrieval", "selfgen"),
                     loaded=loaded, tolerance=Tolerance.parse("0.5"))
    assert [v.to_dict()["text"] for v in report.tolerance] == [v["text"] for v in ship]  # the same run, the same decision
    lines = ship_lines(report.tolerance, Tolerance.parse("0.5"))
    assert lines[0].startswith("against your tolerance (mean KLD ≤ 0.5 nats; one-sided non-inferiority, 3 configs")
    flat = " ".join(run.output.split())
    assert all(" ".join(line.split()) in flat for line in lines)


def test_explain_bad_tolerance_is_one_line_before_loading():
    proc = _wkvlab("explain", "--weights", "int4-g128", "--kv", "int4", "--tolerance", "top1=2")
    assert proc.returncode != 0 and "top-1 agreement is between 0 and 1" in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


def test_replicate_chunks_halve_within_the_caches_token_group_and_replicates_are_checked():
    from wkvlab.errors import ConfigError
    from wkvlab.explain.options import ExplainOptions, planned_steps, replicate_chunk

    assert [replicate_chunk(512, r) for r in range(3)] == [512, 256, 128]
    assert replicate_chunk(64, 1, 64) == 64 and replicate_chunk(512, 2, 96) == 96
    with pytest.raises(ConfigError, match="--replicates"):
        ExplainOptions("int4-g128", "int4", replicates=0)
    one, two = ExplainOptions("int4-g128", "int4", replicates=1), ExplainOptions("int4-g128", "int4")
    assert planned_steps(two, 4) - planned_steps(one, 4) == 8 * 5 + 2  # the factorial again at half the chunk: 2 passes a window


def test_explain_names_margin_family_replicates_monte_carlo_error_and_windows(tmp_path, monkeypatch):
    """Issue #38's done-when and #42 item 4, on a tiny random model: no PPL or top-1 interaction verdict; every
    decided line names its margin, its Holm family with its size, the replicates and the Monte-Carlo error (none:
    analytic); each line says which windows its numbers come from; one KLD(W)+KLD(C) behind every KLD margin."""
    import re

    import wkvlab.explain.run as explain_run
    from wkvlab.cli import app
    from wkvlab.explain.run import explain

    monkeypatch.setattr(explain_run, "explain", functools.partial(explain, loaded=tiny_loaded()))
    out = tmp_path / "explain.json"
    args = ["explain", "--weights", "int4-g32", "--kv", "int2", "--ctx", "32", "--tokens", "320", "--max-ctx", "32",
            "--skip", "noise,hidden,context,mitigations,generation,retrieval,selfgen", "--json", str(out)]
    run = CliRunner().invoke(app, args, env={**ENV, "COLUMNS": "400"})
    assert run.exit_code == 0, run.output
    lines = json.loads(out.read_text())["verdict"]
    factorial = [line for line in lines if line.startswith("[factorial: 10 windows of 32, 310 tokens, 2 replicates]")]
    kld, nll, ppl, top1, replicates = factorial
    verdicts = ("compounds", "sub-additive", "additive within", "undecided")
    for line in (kld, nll):
        assert "margin ±" in line and "Holm over 2 tests" in line and "analytic: no Monte-Carlo error" in line
        assert "2 replicates (between-replicate variance inside the interval, df" in line
        assert any(w in line for w in verdicts)
    assert "KLD interaction" in kld and nll.split("] ", 1)[1].startswith("NLL (mean log-loss, nats) interaction")
    for line in (ppl, top1):  # described only: the scales make an interaction of independent errors
        assert not any(w in line for w in verdicts)
    assert "no interaction verdict on PPL" in ppl and "no verdict" in top1 and "chunk sizes 32, 16 (float order)" in replicates
    assert "PPL" not in kld + nll  # the decided interactions are named for their scale, NLL, not PPL
    cross = [line for line in lines if line.startswith("[attention: the first 1 window of 32, 1 replicate]")]
    assert any("output KLD interaction" in line for line in cross)
    margins = set(re.findall(r"margin ±(\S+) \(10% of the (?:factorial's \(10 windows\) )?predicted total KLD\(W\)\+KLD\(C\) (\S+)\)",
                             "\n".join(lines)))
    assert len(margins) == 1, margins  # the cross-term step states the factorial's margin, not one from its own window
    table = " ".join(run.output.split())
    for words in ("Holm over 2 tests", "analytic: no Monte-Carlo error", "2 replicates", "(decided on NLL)",
                  "NLL interaction (nats)", "[factorial: 10 windows of 32, 310 tokens, 2 replicates]"):
        assert words in table, words
