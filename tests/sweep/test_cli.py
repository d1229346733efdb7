"""``wkvlab sweep`` and ``wkvlab results`` as a user runs them: plans, one-line errors, exit 2."""
from __future__ import annotations

import os
import subprocess
import sys


def _wkvlab(*args):
    return subprocess.run([sys.executable, "-m", "wkvlab.cli", *args], capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})


def test_dry_run_prints_the_plan_and_creates_nothing(tmp_path):
    spec = tmp_path / "grid.yaml"
    spec.write_text("ctx: 64\ntokens: 128\nweights: [none, int8, int4-g128]\nkv: [fp16, fp8_e4m3, int8, int4]\n")
    proc = _wkvlab("sweep", str(spec), "--store", str(tmp_path / "r.db"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "12 configs, 0 done, 12 to run in 1 grid(s)" in proc.stdout and proc.stdout.count("to run") == 13
    assert not (tmp_path / "r.db").exists()


def test_a_foreign_store_is_a_one_line_error_and_stays_untouched(tmp_path):
    spec = tmp_path / "grid.yaml"
    spec.write_text("kv: [q4_0]\n")
    proc = _wkvlab("sweep", str(spec), "--store", str(spec))  # the classic slip: the spec given as the store
    assert proc.returncode == 2 and "not a wkvlab results store" in proc.stderr and "Traceback" not in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
    assert spec.read_text() == "kv: [q4_0]\n"
