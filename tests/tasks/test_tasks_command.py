"""``wkvlab tasks`` as a user runs it: a local lm-eval task over a small grid, accuracy next to KLD in the store and the report."""
import csv
import os
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed; pip install 'wkvlab[tasks]'")

from wkvlab.store import open_store  # noqa: E402

TASKS = os.path.join(os.path.dirname(__file__), "lmeval")
ENV = {**os.environ, "COLUMNS": "200", "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def _wkvlab(*args):
    return subprocess.run([sys.executable, "-m", "wkvlab.cli", *args], capture_output=True, text=True, timeout=900, env=ENV)


@pytest.mark.slow
def test_tasks_grid_lands_next_to_kld_and_resumes(tmp_path):
    db, rep = tmp_path / "r.db", tmp_path / "report"
    args = ["tasks", "--tasks", "wkvlab_facts", "--include-path", TASKS, "--weights", "none,int8", "--kv", "fp16,q4_0",
            "--limit", "4", "--ctx", "64", "--tokens", "64", "--store", str(db)]
    proc = _wkvlab(*args, "--report", str(rep))
    assert proc.returncode == 0, proc.stderr
    assert "4 configs scored, 0 already" in proc.stderr and "fatal:" not in proc.stderr
    with open_store(db, create=False) as store:
        scores = {(s.weights, s.kv): s for s in store.task_scores()}
        klds = {(r.weights, r.kv): r.kld["mean"] for r in store.results()}
    assert set(scores) == set(klds) == {("none", "fp16"), ("none", "q4_0"), ("int8", "fp16"), ("int8", "q4_0")}
    assert all(s.task == "wkvlab_facts" and s.metric == "acc,none" and s.samples == 4 and 0 <= s.value <= 1 for s in scores.values())
    assert klds[("none", "fp16")] == 0.0 and klds[("none", "q4_0")] > 0.01
    rows = {(r["weights"], r["kv"]): r for r in csv.DictReader((rep / "tasks.csv").open())}
    for key, score in scores.items():
        assert float(rows[key]["value"]) == score.value and float(rows[key]["kld_mean"]) == klds[key]
    assert 'id="downstream-tasks"' in (rep / "index.html").read_text()

    again = _wkvlab(*args)  # everything stored: nothing runs again
    assert again.returncode == 0, again.stderr
    assert "0 configs scored, 4 already" in again.stderr
    with open_store(db, create=False) as store:
        assert len(store.task_scores()) == 4 and len(store.results()) == 4


# The torch-free refusals (no task, a missing --include-path, a bad --kv) are in tests/test_cli_fuzz.py;
# an unknown task name needs lm-eval's task index (about 20 s to build here): the slow tier.
@pytest.mark.slow
@pytest.mark.parametrize("args, message", [(["--tasks", "no_such_task"], "lm-eval knows no task no_such_task")])
def test_bad_input_is_one_line(tmp_path, args, message):
    proc = _wkvlab("tasks", "--store", str(tmp_path / "r.db"), "--tokens", "0", *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1
