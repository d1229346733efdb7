"""Two processes writing one store at the same time lose nothing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from wkvlab.store import open_store

ROOT = Path(__file__).resolve().parents[2]
WRITER = """
import sys
sys.path.insert(0, {root!r})
from tests.store.helpers import fake_result
from wkvlab.store import open_store
name, n, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
sys.stdin.readline()  # start together, so the writes really contend
with open_store(path) as store:  # both processes may create the store: the schema lock sorts it out
    for i in range(n):
        store.put(f"{{name}}-{{i}}", {{"i": i}}, fake_result(i, windows=2))
        store.put(f"shared-{{i}}", {{"i": i}}, fake_result(i, windows=2))  # both write these: one row each
"""


def test_two_writers_lose_nothing(tmp_path):
    path = tmp_path / "r.db"
    script = WRITER.format(root=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", script, name, "40", str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        _, err = proc.communicate("go\n", timeout=120)
        assert proc.returncode == 0, err
    with open_store(path, create=False) as store:
        ids = {r.config_id for r in store.rows()}
        assert ids == {f"{n}-{i}" for n in ("a", "b", "shared") for i in range(40)}
        assert store._conn.execute("SELECT count(*) FROM arrays").fetchone()[0] == 7 * len(ids)
        assert store.get("b-39").weight_bytes == 1039
