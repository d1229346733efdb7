"""Real sweeps on the default model, as a user runs them: kill -9 and resume, two sweeps at once."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

from wkvlab import api
from wkvlab.store import open_store
from wkvlab.sweep import expand, load_spec

pytestmark = pytest.mark.slow
WEIGHTS, KV = ["none", "int8", "int4-g128"], ["fp16", "fp8_e4m3", "int8", "int4"]


def _sweep(spec, store, **kw):
    return subprocess.Popen([sys.executable, "-m", "wkvlab.cli", "sweep", str(spec), "--store", str(store)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"}, **kw)


def _count(path) -> int:
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as conn:
            return conn.execute("SELECT count(*) FROM results").fetchone()[0]
    except sqlite3.Error:  # not created yet, or the schema is being written
        return 0


def test_kill_9_mid_sweep_then_resume_gives_the_uninterrupted_results(tmp_path, default_model):
    spec = tmp_path / "grid.yaml"
    # grid: weight stores each weight config's four results as soon as its grid ends
    spec.write_text(f"models: [default]\nctx: 64\ntokens: 128\nweights: {WEIGHTS}\nkv: {KV}\ngrid: weight\n")
    store = tmp_path / "r.db"
    proc = _sweep(spec, store)
    deadline = time.monotonic() + 300
    while _count(store) < 4 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)  # mid-sweep: the second weight config is being built or run
    proc.communicate()
    with open_store(store, create=False) as db:
        before = {r.config_id: r.created_at for r in db.rows()}
        assert 4 <= len(before) < 12
        for config_id in before:  # every stored result is whole: row, config and all seven arrays
            assert db.get(config_id).tokens == 126 and db.config(config_id)["ctx"] == 64

    proc = _sweep(spec, store)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert f"{len(before)} already in" in err and f"wrote {12 - len(before)} result(s)" in err

    uninterrupted = api.evaluate(default_model, ctx=64, tokens=128, weights=WEIGHTS, kv=KV)
    configs = expand(load_spec(spec))
    with open_store(store, create=False) as db:
        rows = {r.config_id: r.created_at for r in db.rows()}
        assert len(rows) == 12 and all(rows[i] == t for i, t in before.items())  # finished configs were not redone
        for config, expected in zip(configs, uninterrupted):
            stored = db.get(config.config_id)
            assert (stored.weights, stored.kv) == (expected.weights, expected.kv)
            for name in ("kld", "nll", "nll_ref", "delta_p", "top1_agree", "position", "window"):
                a, b = getattr(stored.arrays, name), getattr(expected.arrays, name)
                assert a.dtype == b.dtype
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=f"{config.label}: {name}")


def test_two_sweeps_into_one_store_lose_nothing(tmp_path, default_model):
    # a tiny random Llama with the default model's tokenizer: the processes spend their time on
    # the store, not on loading 135M parameters
    from tests.conftest import tiny_llama

    folder = tmp_path / "tiny"
    tiny_llama(vocab_size=len(default_model.tokenizer), head_dim=64, num_attention_heads=1, num_key_value_heads=1).save_pretrained(folder)
    default_model.tokenizer.save_pretrained(folder)
    store = tmp_path / "shared.db"
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(f"models: ['{folder}']\nctx: 64\ntokens: 128\nweights: [none, int8]\nkv: [fp16, int8, int4]\n")
    b.write_text(f"models: ['{folder}']\nctx: 64\ntokens: 128\nweights: [none, int8]\nkv: [int4, q8_0, fp8_e4m3]\n")  # int4 in both
    procs = [_sweep(a, store), _sweep(b, store)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    expected = {c.config_id for spec in (a, b) for c in expand(load_spec(spec))}
    with open_store(store, create=False) as db:
        assert {r.config_id for r in db.rows()} == expected and len(expected) == 10
        assert {(db.get(i).weights, db.get(i).kv) for i in expected} == {(w, k) for w in ("none", "int8") for k in ("fp16", "int8", "int4", "q8_0", "fp8_e4m3")}
