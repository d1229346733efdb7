"""The command line as a user runs it: one-line errors, exit status 2, no traceback."""
import json
import os
import subprocess
import sys

import pytest

WKVLAB = [sys.executable, "-m", "wkvlab.cli"]


def _run(*args, **kw):
    return subprocess.run([*WKVLAB, *args], capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"}, **kw)


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "--kv", "int9"], "unknown KV format"),
        (["eval", "--weights", "int4-gx"], "unknown weight config"),
        (["eval", "--model", "/no/such/model.gguf", "--kv", "q4_0"], "model not found"),
        (["eval", "--data", "/no/such/file.txt", "--kv", "q4_0"], "data file not found"),
    ],
)
def test_bad_input_is_one_line(args, message):
    proc = _run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1


@pytest.mark.slow
def test_eval_writes_the_documented_json(tmp_path):
    out = tmp_path / "out.json"
    proc = _run("eval", "--ctx", "64", "--tokens", "128", "--weights", "int8", "--kv", "q8_0", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["weights"] == "int8" and data["kv"] == "q8_0" and data["tokens"] == 2 * 63
    assert "KLD mean" in proc.stdout


@pytest.mark.slow
def test_short_text_and_group_errors(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("just a few words")
    proc = _run("eval", "--data", str(short), "--kv", "q8_0", "--ctx", "64", "--tokens", "64")
    assert proc.returncode == 2 and "fewer than one window" in proc.stderr
    proc = _run("eval", "--kv", "int4-g48", "--ctx", "64", "--tokens", "64")
    assert proc.returncode == 2 and "does not divide head_dim 64" in proc.stderr and "Traceback" not in proc.stderr


def test_presets_lists_weights_and_kv():
    proc = _run("presets")
    assert proc.returncode == 0, proc.stderr
    for name in ("gptq-int4-g128", "llamacpp:q4_0", "kvquant:3-1%", "qserve:kv4", "q5_1"):
        assert name in proc.stdout


def test_an_unexpected_error_is_not_masked_by_the_abort_clause(monkeypatch):
    """An exception no clause handles must surface as itself: naming typer's missing click Abort in the
    except tuple turned every such error into AttributeError."""
    import pytest

    from wkvlab import cli

    def boom(**_):
        raise RuntimeError("the real error")

    monkeypatch.setattr(cli, "app", boom)
    with pytest.raises(RuntimeError, match="the real error"):
        cli.main()


def test_eval_help_names_the_grammar_presets_lists():
    """--weights/--kv help is built from wkvlab.listing (what 'wkvlab presets' prints): '+' options, checkpoint:, every preset."""
    from typer.testing import CliRunner

    from wkvlab import listing
    from wkvlab.cli import app
    from wkvlab.weights.parse import PRESETS

    text = " ".join(CliRunner().invoke(app, ["eval", "--help"], env={"COLUMNS": "400"}).output.split())
    assert "options after '+'" in text and "after ';'" not in text and "checkpoint:<folder|file.gguf>" in text
    for name in [*PRESETS, "+a=", "+wo", "+skip=", "+override=", "+rot", "+sinks=", "+residual="]:
        assert name in text, name
    assert all(form.pattern in text for form in listing.WEIGHT_NAMES)


@pytest.mark.slow
def test_tokens_beyond_the_text_are_said_before_the_first_pass(tmp_path):
    """Issue #42: --tokens more than the text holds (but fewer than its bytes) ran what the text held while
    the header still said the number asked; now one note says what runs, before the progress starts."""
    text = tmp_path / "short.txt"
    text.write_text(" ".join(f"word{i} and some more prose, number {i}." for i in range(80)))
    assert 2016 < len(text.read_bytes())  # the preflight's byte bound lets --tokens 2048 through
    proc = _run("eval", "--data", str(text), "--kv", "q8_0", "--ctx", "64", "--tokens", "2048", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    note = next(line for line in proc.stderr.splitlines() if "the text holds" in line)
    windows = int(note.split("the text holds ")[1].split(" ")[0])
    assert 1 <= windows < 32 and f"not the 32 that --tokens 2,048 asks for: evaluating {windows * 64:,} tokens" in note
    import re

    first_progress = re.search(r"\d\d:\d\d:\d\d eval: [\d.]+ steps", proc.stderr).start()
    assert proc.stderr.index("the text holds") < first_progress  # said before the progress starts
