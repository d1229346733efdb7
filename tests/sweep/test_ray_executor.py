"""The Ray executor on local Ray clusters: the same numbers as in-process, bit for bit; one-line
errors for a bad address, a missing install and a failing worker; what finished stays stored.

The model is a tiny random Llama saved as a Hugging Face folder with a character tokenizer, so
the workers spend their time on Ray and the sweep machinery, not on loading 135M parameters.
Ray startup takes seconds: one test starts (and must stop) its own cluster, the others share the
module's ``cluster``.
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import tiny_llama
from wkvlab.errors import ConfigError, ModelError
from wkvlab.store import open_store
from wkvlab.sweep import SweepSpec, plan_sweep, run_sweep

ray = pytest.importorskip("ray")
from wkvlab.sweep.ray_executor import ExecutorError, RayExecutor, _worker_failure  # noqa: E402

ARRAYS = ("kld", "nll", "nll_ref", "delta_p", "top1_agree", "position", "window")


@pytest.fixture(scope="module")
def _module_cluster():
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def cluster(_module_cluster):
    """The module's local cluster, started on first use: 2 CPUs, an 80 MB object store."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, object_store_memory=80 * 1024**2, include_dashboard=False,
                 log_to_driver=False, logging_level=logging.WARNING)


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


def test_a_failing_worker_is_one_line_the_store_keeps_what_finished_and_the_cluster_stops(_module_cluster, tiny, tmp_path):
    if ray.is_initialized():  # this test is about the executor's own cluster
        ray.shutdown()
    # one layer: an HF folder's fingerprint hashes its config and file sizes, so it must differ from tiny's
    doomed = _tiny_folder(tmp_path / "doomed", seed=1, num_hidden_layers=1)
    spec = _spec(tiny, doomed, weights=["none"], kv=["fp16", "int4"])
    path, ticks = tmp_path / "r.db", []
    with open_store(path) as store:
        plan = plan_sweep(spec, store)
        shutil.rmtree(doomed)  # the second group's model disappears between planning and running
        with pytest.raises(ModelError, match="model not found") as err:  # the worker's own error, as in-process
            run_sweep(spec, store, executor=RayExecutor(max_workers=1, object_store_bytes=80 * 1024**2), progress=lambda _d, n: ticks.append(n), plan=plan)
    assert "\n" not in str(err.value)
    assert {r.model for r in _stored(path).values()} == {Path(tiny).name} and len(_stored(path)) == 2
    assert sum(ticks) == plan.tasks[0].steps  # the finished grid's progress came back from the worker, every step once
    assert not ray.is_initialized()  # the local cluster the executor started is shut down, also on error


def test_cli_ray_sweep_gives_the_in_process_numbers_bit_for_bit(cluster, tiny, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from wkvlab.cli import app

    monkeypatch.chdir(tmp_path)
    # a relative model path: the workers resolve it in the driver's directory
    Path("grid.yaml").write_text(f"models: [{os.path.relpath(tiny)}]\nctx: 32\ntokens: 64\nweights: [none, int8, int4-g128]\n"
                                 "kv: [fp16, int8, int4]\ngrid: weight\n")
    # two 1-CPU workers run the three weight grids in parallel (one torch thread each, where the
    # in-process run uses every core: the thread count changes no bit here)
    args = ["sweep", "grid.yaml", "--store", "ray.db", "--executor", "ray", "--cpus-per-task", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.exception
    run_sweep("grid.yaml", "local.db")
    assert_same_numbers(_stored("local.db"), _stored("ray.db"))
    assert len(_stored("ray.db")) == 9
    assert CliRunner().invoke(app, args).exit_code == 0 and len(_stored("ray.db")) == 9  # resumed: nothing left to run


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


def test_a_missing_ray_install_and_bad_options_are_one_line(tiny, monkeypatch):
    with pytest.raises(ConfigError, match="not a Ray address"):
        RayExecutor("http://head:8265")
    with pytest.raises(ConfigError, match="--cpus-per-task must be positive"):
        RayExecutor(num_cpus_per_task=0)
    assert list(RayExecutor().run([])) == []  # nothing to run: no cluster is started
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` sees without the package
    with pytest.raises(ConfigError, match=r"pip install 'wkvlab\[ray\]'"):
        list(RayExecutor().run(plan_sweep(_spec(tiny), None).tasks))
