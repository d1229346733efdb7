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
