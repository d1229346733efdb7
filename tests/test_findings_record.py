"""scripts/findings_record.py: a re-analysis keeps the provenance of the run that measured its store."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "findings_record.py"


def _load():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("findings_record", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_filled_by_keeps_the_measuring_runs_command_commit_wall_and_load(tmp_path):
    record = _load()
    earlier = {"command": "wkvlab findings methods --model default --store out/findings.db --threads 1 --tokens 8192",
               "commit": "cc1540d", "date": "2026-12-03", "wall_s": 4052.0, "load_min": 0.32, "load_max": 4.03, "threads": 1,
               "weight_cache": "empty (every quantization inside the wall time)", "markdown": "| x |", "data": {}}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    kept = record.filled_by_words(path)
    assert kept == {k: earlier[k] for k in ("command", "commit", "date", "wall_s", "load_min", "load_max", "threads", "weight_cache")}

    path.write_text(json.dumps({"command": "wkvlab demo"}))  # a demo record is not a finding's
    with pytest.raises(SystemExit, match="a run record has commit, date, wall_s"):
        record.filled_by_words(path)
    path.write_text("{not json")
    with pytest.raises(SystemExit, match="not a readable run record"):
        record.filled_by_words(path)


def test_the_search_record_says_what_the_on_disk_cache_held_at_the_start(tmp_path):
    record = _load()
    assert record.search_cache_state(tmp_path) == "empty (every profile and held-out score inside the wall time)"
    (tmp_path / "search-profiles").mkdir()
    (tmp_path / "findings-search").mkdir()
    for i in range(3):
        (tmp_path / "search-profiles" / f"p{i}.json").write_text("{}")
    (tmp_path / "findings-search" / "s.npz").write_bytes(b"")
    assert record.search_cache_state(tmp_path).startswith("3 profile(s) and 1 held-out score(s) cached")


def test_only_the_grid_findings_count_the_store_as_resumed(tmp_path):
    """A search or depth run in a store that holds the methods grid measured all of its own work; the caption said
    "56 configs already in the store" for it (depth says which prefix lengths it read back itself)."""
    import sqlite3

    record = _load()
    store = tmp_path / "findings.db"
    with sqlite3.connect(store) as conn:
        conn.execute("CREATE TABLE results (config_id TEXT)")
        conn.executemany("INSERT INTO results VALUES (?)", [(str(i),) for i in range(56)])
    assert [record.resumed_configs(n, store) for n in ("methods", "calibration", "search", "depth", "depth-long")] == [56, 56, 0, 0, 0]
    assert record.resumed_configs("methods", tmp_path / "new.db") == 0


def test_carry_takes_an_interrupted_runs_measurements_to_the_next_machine(tmp_path, monkeypatch):
    """The search finding outlives one machine (~6 h of two cores; machines here live 3 h): --carry copies what a run
    measured into a folder in the repository, finished or not, and the next machine's run starts from it."""
    import os
    import time

    record = _load()
    carry, first, second = tmp_path / "carry", tmp_path / "machine1", tmp_path / "machine2"
    (first / "search-profiles").mkdir(parents=True)
    old = first / "search-profiles" / "someone-elses.json"  # a profile the user's cache held before: not carried
    old.write_text("{}")
    os.utime(old, (time.time() - 3600,) * 2)

    def interrupted(_command, _env, capture):  # measures one profile, one score and half a score, then is killed
        (first / "search-profiles" / "p1.json").write_text('{"a": 1}')
        time.sleep(0.5)  # the periodic sync has copied the profile while the run goes on (a machine may end now)
        during = json.loads((carry / "runs.json").read_text())
        assert (carry / "search-profiles" / "p1.json").is_file() and [(r["exit"], r["files_added"]) for r in during] == [(None, 1)]
        (first / "findings-search").mkdir()
        (first / "findings-search" / "s1.npz").write_bytes(b"npz")
        (first / "findings-search" / "s2.tmp.npz").write_bytes(b"half")
        return -9, "", 125.0, [1.5, 2.5], 42.0

    monkeypatch.setenv("WKVLAB_CACHE", str(first))
    monkeypatch.setattr(record.findings_carry, "SYNC_SECONDS", 0.1)
    monkeypatch.setattr(record, "sampled_run", interrupted)
    monkeypatch.setattr(record, "_commit", lambda: "abc1234")
    with pytest.raises(SystemExit, match=f"failed \\(exit -9\\); nothing recorded; its measurements so far are in {carry}"):
        record.run("search", "default", tmp_path / "f.db", [], 2, carry)
    assert sorted(p.name for p in carry.rglob("*") if p.is_file()) == ["p1.json", "runs.json", "s1.npz"]
    runs = json.loads((carry / "runs.json").read_text())
    assert [(r["commit"], r["wall_s"], r["paused_s"], r["load_min"], r["load_max"], r["exit"], r["files_added"]) for r in runs] == \
        [("abc1234", 125.0, 42.0, 1.5, 2.5, -9, 2)]

    seen = {}

    def resumed(_command, _env, capture):  # the next machine: the carried files are in its cache before it starts
        seen["files"] = sorted(p.name for p in second.rglob("*") if p.is_file())
        return 1, "", 60.0, [1.0], 0.0

    monkeypatch.setenv("WKVLAB_CACHE", str(second))
    monkeypatch.setattr(record, "sampled_run", resumed)
    with pytest.raises(SystemExit):
        record.run("search", "default", tmp_path / "f.db", [], 2, carry)
    assert seen["files"] == ["p1.json", "s1.npz"]
    assert [(r["files_added"], r["exit"]) for r in json.loads((carry / "runs.json").read_text())] == [(2, -9), (0, 1)]
    assert record.carried_words([*json.loads((carry / "runs.json").read_text())[:1], {**runs[0], "exit": None}]) == (
        "continues 2 earlier run(s) on other machines whose measurements were carried in the repository "
        "(abc1234 on " + runs[0]["date"] + ", wall 2 min (1 of them paused), load 1.5–2.5, 2 file(s); abc1234 on " + runs[0]["date"]
        + ", wall 2 min (1 of them paused), load 1.5–2.5, 2 file(s), ended with its machine; 0.1 h in all)")


def test_carry_is_refused_for_findings_that_resume_from_the_store_and_a_broken_manifest_before_anything_runs(tmp_path):
    record = _load()
    with pytest.raises(SystemExit, match="--carry is for search, depth, depth-long"):
        record.main(["methods", "--store", str(tmp_path / "f.db"), "--out", str(tmp_path / "r.json"), "--carry", str(tmp_path)])
    (tmp_path / "runs.json").write_text("{oops")
    with pytest.raises(SystemExit, match="runs.json is not JSON"):
        record.main(["search", "--store", str(tmp_path / "f.db"), "--out", str(tmp_path / "r.json"), "--carry", str(tmp_path)])


def test_a_carried_run_stopped_from_outside_keeps_what_it_measured(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM to the script (a session's end, `timeout`) used to leave the finding running and copy nothing."""
    record = _load()
    carry, cache = tmp_path / "carry", tmp_path / "cache"

    import itertools
    import os
    import time

    def stopped(_command, _env, capture):
        (cache / "findings-depth").mkdir(parents=True)
        (cache / "findings-depth" / "d1.npz").write_bytes(b"npz")
        time.sleep(0.5)  # the sync samples the load a few times while the run goes on
        raise KeyboardInterrupt

    samples = itertools.count(1.0)
    monkeypatch.setattr(os, "getloadavg", lambda: (next(samples), 0.0, 0.0))
    # the load (and the pause clock) sampled as often as the run's own sampler, not only at each 5-minute sync:
    # no copy is due during this run, and the samples are there all the same
    monkeypatch.setattr(record.findings_carry, "SYNC_SECONDS", 60)
    monkeypatch.setattr(record.output_record, "SAMPLE_SECONDS", 0.1)
    monkeypatch.setenv("WKVLAB_CACHE", str(cache))
    monkeypatch.setattr(record, "sampled_run", stopped)
    with pytest.raises(KeyboardInterrupt):
        record.run("depth", "default", tmp_path / "f.db", [], 2, carry)
    assert (carry / "findings-depth" / "d1.npz").is_file()
    [entry] = json.loads((carry / "runs.json").read_text())
    assert (entry["exit"], entry["files_added"]) == ("interrupted", 1)
    # The loads the sync sampled during the run, not one sample at its end (it used to say "load 2.0–2.0")
    assert entry["load_before"] == entry["load_min"] == 1.0 and entry["load_max"] == entry["load_after"] >= 4.0


def test_a_run_stopped_from_outside_is_measured_as_paused(tmp_path):
    """SIGSTOP frees the cores for another measurement; the record's wall time then holds the pause, and says how much.
    The sampler wakes late by the time it stood still (real signals on a child Python running the sampler)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    _load()
    import output_record

    assert output_record.paused_since(100.0, 130.4, 30) == 0.0  # scheduling, not a pause
    assert output_record.paused_since(100.0, 175.0, 30) == 45.0
    ready = tmp_path / "running"  # the measured command has started, so the sampler is running (imports take seconds on a loaded machine)
    measured = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(4)"
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent.parent / 'scripts')!r}); import output_record as o; "
              "o.SAMPLE_SECONDS = 0.2; o.PAUSE_SLACK_SECONDS = 0.5; "
              f"code, _, wall, _, paused = o.sampled_run([sys.executable, '-c', {measured!r}], {{}}, capture=False); "
              "print(round(wall, 1), paused)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(2.0)
    os.kill(proc.pid, signal.SIGCONT)
    wall, paused = map(float, proc.communicate(timeout=60)[0].split())
    assert 3.9 <= wall and 1.5 <= paused <= 2.5
