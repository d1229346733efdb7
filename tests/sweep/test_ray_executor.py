"""The Ray executor on a local Ray cluster: the same numbers as in-process, bit for bit; one-line
errors for a bad address, a missing install and a failing worker; what finished stays stored.

The model is a tiny random Llama saved as a Hugging Face folder with a character tokenizer, so
the workers spend their time on Ray and the sweep machinery, not on loading 135M parameters.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import tiny_llama
from wkvlab.errors import ConfigError, ModelError
from wkvlab.store import open_store
from wkvlab.sweep import InProcessExecutor, SweepSpec, plan_sweep, run_sweep

ray = pytest.importorskip("ray")
from wkvlab.sweep.ray_executor import ExecutorError, RayExecutor, _worker_failure  # noqa: E402

ARRAYS = ("kld", "nll", "nll_ref", "delta_p", "top1_agree", "position", "window")


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (startup takes seconds): 2 CPUs, an 80 MB object store."""
    ray.init(address="local", num_cpus=2, object_store_memory=80 * 1024**2, include_dashboard=False,
             log_to_driver=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def _tiny_folder(path, seed=0, **overrides):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {"<unk>": 0, "<s>": 1, **{c: i + 2 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # one token per character
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>").save_pretrained(path)
    tiny_llama(seed, vocab_size=128, **overrides).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _tiny_folder(tmp_path_factory.mktemp("tiny"))


def _spec(*models, **overrides):
    raw = {"models": list(models), "ctx": 32, "tokens": 64, "weights": ["none", "int8", "int4-g128"], "kv": ["fp16", "int8", "int4"], "grid": "weight"}
    return SweepSpec.from_dict({**raw, **overrides})


def _stored(path):
    with open_store(path, create=False) as store:
        return {r.config_id: store.get(r.config_id) for r in store.rows()}


def assert_same_numbers(a, b):
    """Every config in both stores, with bit-identical per-token arrays and the same summaries."""
    assert a.keys() == b.keys() and a
    for config_id, x in a.items():
        y = b[config_id]
        assert (x.model, x.data, x.weights, x.kv, x.weight_bytes, x.kv_bytes_per_token) == (y.model, y.data, y.weights, y.kv, y.weight_bytes, y.kv_bytes_per_token)
        for name in ARRAYS:
            u, v = getattr(x.arrays, name), getattr(y.arrays, name)
            assert u.dtype == v.dtype and np.array_equal(u, v, equal_nan=True), f"{x.weights} × {x.kv}: {name}"


# first: it starts its own cluster, before the module's cluster exists
def test_cli_starts_and_stops_a_local_cluster_for_the_sweep(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a relative model path: the workers resolve it in the driver's directory
    Path("grid.yaml").write_text(f"models: [{os.path.relpath(tiny)}]\nctx: 32\ntokens: 64\nweights: [int8]\nkv: [fp16, int4]\n")
    proc = subprocess.run([sys.executable, "-m", "wkvlab.cli", "sweep", "grid.yaml", "--store", "ray.db", "--executor", "ray"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "wrote 2 result(s) to ray.db" in proc.stderr
    run_sweep("grid.yaml", "local.db")
    assert_same_numbers(_stored("local.db"), _stored("ray.db"))


def test_ray_sweep_gives_the_in_process_numbers_bit_for_bit(cluster, tiny, tmp_path):
    spec = _spec(tiny)
    run_sweep(spec, tmp_path / "local.db", executor=InProcessExecutor())
    ticks = []
    # two 1-CPU workers run the three weight grids in parallel (one torch thread each, where the
    # in-process run uses every core: thread count does not change a bit here)
    report = run_sweep(spec, tmp_path / "ray.db", executor=RayExecutor(num_cpus_per_task=1), progress=lambda _d, n: ticks.append(n))
    assert report.written == 9 and report.raced == 0
    assert sum(ticks) == plan_sweep(spec, None).steps  # progress is forwarded from the workers, every step once
    assert_same_numbers(_stored(tmp_path / "local.db"), _stored(tmp_path / "ray.db"))
    again = run_sweep(spec, tmp_path / "ray.db", executor=RayExecutor())  # resumes: nothing left to run
    assert again.skipped == 9 and again.written == 0


def test_a_failing_worker_is_one_line_and_the_store_keeps_what_finished(cluster, tiny, tmp_path):
    # one layer: an HF folder's fingerprint hashes its config and file sizes, so it must differ from tiny's
    doomed = _tiny_folder(tmp_path / "doomed", seed=1, num_hidden_layers=1)
    spec = _spec(tiny, doomed, weights=["none"], kv=["fp16", "int4"])
    path = tmp_path / "r.db"
    with open_store(path) as store:
        plan = plan_sweep(spec, store)
        shutil.rmtree(doomed)  # the second group's model disappears between planning and running
        with pytest.raises(ModelError, match="model not found") as err:  # the worker's own error, as in-process
            run_sweep(spec, store, executor=RayExecutor(max_workers=1), plan=plan)
    assert "\n" not in str(err.value)
    assert {r.model for r in _stored(path).values()} == {Path(tiny).name} and len(_stored(path)) == 2


def test_worker_crashes_and_foreign_exceptions_become_one_executor_line(tiny):
    task = plan_sweep(_spec(tiny), None).tasks[0]
    died = _worker_failure(ray, ray.exceptions.RayActorError(), task)
    crashed = _worker_failure(ray, ray.exceptions.RayTaskError("run", "Traceback ...\nZeroDivisionError: boom", ZeroDivisionError("boom")), task)
    assert isinstance(died, ExecutorError) and "worker process died" in str(died)
    assert isinstance(crashed, ExecutorError) and "ZeroDivisionError: boom" in str(crashed)
    for err in (died, crashed):
        assert "\n" not in str(err) and "run the sweep again to resume" in str(err)


@pytest.mark.parametrize("args, message", [(["--executor", "ray", "--address", "127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1"),
                                           (["--address", "auto"], "--address is an option of the Ray executor; add --executor ray")])
def test_a_bad_address_fails_before_planning_and_creates_nothing(tmp_path, args, message):
    from typer.testing import CliRunner

    from wkvlab.cli import app

    spec = tmp_path / "grid.yaml"
    spec.write_text("kv: [int4]\n")
    result = CliRunner().invoke(app, ["sweep", str(spec), "--store", str(tmp_path / "r.db"), *args])
    assert isinstance(result.exception, ConfigError) and message in str(result.exception)  # main() prints it as one line
    assert "\n" not in str(result.exception) and not (tmp_path / "r.db").exists()


def test_a_missing_ray_install_and_bad_options_are_one_line(monkeypatch):
    with pytest.raises(ConfigError, match="not a Ray address"):
        RayExecutor("http://head:8265")
    with pytest.raises(ConfigError, match="--cpus-per-task must be positive"):
        RayExecutor(num_cpus_per_task=0)
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees without the package
    with pytest.raises(ConfigError, match=r"pip install 'wkvlab\[ray\]'"):
        list(RayExecutor().run([]))
