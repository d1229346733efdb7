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
    assert data["mitigations"]["results"] and data["verdict"][0].startswith("Undecided")  # 3 windows: no interval, never "additive"
    assert data["factorial"]["kld"]["verdict"]["outcome"] == "undecided" and "undecided" in run.output
    # KLD and NLL (log PPL) interactions: one family of 2; top-1's interaction is never decided (issue #38)
    assert all("margin ±" in line and "Holm over 2 tests" in line for line in data["verdict"][:2])
    assert "log PPL" in data["verdict"][1] and "no verdict" in data["verdict"][2]
    assert not any(w in data["verdict"][2] for w in ("compounds", "sub-additive", "additive within"))
    assert set(data["seconds"]) >= {"factorial", "noise", "attention", "hidden", "context", "mitigations"}


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
