"""Specs, config ids and grid tasks: pure planning, no model is loaded."""
from __future__ import annotations

import json

import pytest

from wkvlab.errors import ConfigError, WkvlabError
from wkvlab.sweep import GridTask, SweepSpec, expand, load_spec, make_tasks

BASE = {"models": ["default"], "ctx": 64, "tokens": 128, "weights": ["none", "int8", "int4-g128"], "kv": ["fp16", "fp8_e4m3", "int8", "int4"]}


def test_expand_is_the_product_with_stable_ids():
    configs = expand(SweepSpec.from_dict(BASE))
    assert len(configs) == 12 and len({c.config_id for c in configs}) == 12
    again = expand(SweepSpec.from_dict({**BASE, "models": ["smollm2"], "name": "other"}))  # alias of the same file
    assert [c.config_id for c in configs] == [c.config_id for c in again]
    longer = expand(SweepSpec.from_dict({**BASE, "ctx": 32}))
    assert not {c.config_id for c in configs} & {c.config_id for c in longer}


def test_calibration_enters_the_id_only_where_it_is_read():
    spec = {**BASE, "weights": ["int8", "gptq-int4-g128"], "kv": ["fp16"]}
    a = expand(SweepSpec.from_dict(spec))
    b = expand(SweepSpec.from_dict({**spec, "calibration": {"data": "code"}}))
    assert a[0].calibration is None and a[0].config_id == b[0].config_id
    assert a[1].calibration["data"] == "prose" and a[1].config_id != b[1].config_id


def test_configs_and_tasks_round_trip_json():
    configs = expand(SweepSpec.from_dict(BASE))
    task = make_tasks(configs)[0]
    assert GridTask.from_dict(json.loads(json.dumps(task.to_dict()))) == task
    spec = SweepSpec.from_dict(BASE)
    assert SweepSpec.from_dict({k: v for k, v in spec.to_dict().items()}) == spec


def test_one_grid_per_group_and_rectangles_after_a_crash():
    configs = expand(SweepSpec.from_dict(BASE))
    tasks = make_tasks(configs)
    assert len(tasks) == 1 and len(tasks[0].weights) == 3 and len(tasks[0].kv) == 4
    assert [c.config_id for c in tasks[0].configs] == [c.config_id for c in configs]  # grid order = run_grid's order
    # none × everything and int8 × fp16 done: int8 misses 3 KV, int4 misses 4 → two rectangles, nothing done twice
    done = {c.config_id for c in configs[:5]}
    tasks = make_tasks(configs, done)
    assert sorted((len(t.weights), len(t.kv)) for t in tasks) == [(1, 3), (1, 4)]
    assert {c.config_id for t in tasks for c in t.configs} == {c.config_id for c in configs[5:]}
    assert len(make_tasks(configs, grid="weight")) == 3
    assert tasks[0].steps == 1 + 2 * (1 + 3)  # weight build, then per window: reference + 3 candidates


@pytest.mark.parametrize("raw, message", [
    ({"wieghts": ["int8"]}, "unknown key"),
    ({"ctx": "long"}, "positive integer"),
    ({"ctx": 128, "tokens": 64}, "less than one window"),
    ({"kv": ["int9"]}, "unknown KV format"),
    ({"weights": []}, "empty list"),
    ({"grid": "diagonal"}, "grid must be one of"),
    ({"score": "half"}, "unknown score"),
    ({"models": ["/no/such.gguf"]}, "model not found"),
])
def test_bad_specs_say_what_to_do(raw, message):
    with pytest.raises(WkvlabError, match=message):  # the CLI prints these as one line
        expand(SweepSpec.from_dict(raw))


def test_spec_file_name_and_yaml_errors(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("weights: [int8]\nkv: [q4_0]\n")
    assert load_spec(path).name == "grid"
    path.write_text("weights: [int8\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(path)
    with pytest.raises(ConfigError, match="not found"):
        load_spec(tmp_path / "missing.yaml")


# The ids of the findings' grids on the packaged model at --tokens 8192 (CPU, float32), computed by the code
# before replicates existed (commit 96d05a1): stores measured then must be reused as replicate 0.
FINDINGS_IDS_BEFORE_REPLICATES = {
    "additivity": (56, "c5716e0ab22f066a8922d826e63e79c98272ad160c772e859fc509a9e0ab9b5d"),
    "calibration": (24, "a55c8483ff48479305428120c69035746626d54bce9f550af0f8e835eb1f89e1"),
}


def _finding_specs(name: str, replicate: int = 0):
    from dataclasses import replace

    from wkvlab.findings import grids

    size = grids.size_for("default", tokens=8192)
    build = grids.additivity_sweeps if name == "additivity" else grids.calibration_sweeps
    return [replace(s, replicate=replicate) for s in build("default", size, device="cpu", dtype="float32")]


@pytest.mark.parametrize("name", sorted(FINDINGS_IDS_BEFORE_REPLICATES))
def test_replicate_0_keeps_the_config_ids_of_before_replicates(name):
    import hashlib

    ids = [c.config_id for s in _finding_specs(name) for c in expand(s)]
    assert (len(ids), hashlib.sha256(",".join(ids).encode()).hexdigest()) == FINDINGS_IDS_BEFORE_REPLICATES[name]
    assert "3e6d69aae57fe5296ef8e895bdc220422db770944e6c76e6b8f0e16973d3add5" in ids  # none × fp16, as stored then


def test_a_replicate_is_another_config_with_its_calibration_sample_and_chunk_in_the_id():
    first, again, third = (expand(s) for s in (_finding_specs("additivity", r)[0] for r in (0, 1, 2)))
    assert not {c.config_id for c in first} & {c.config_id for c in again}
    assert not {c.config_id for c in again} & {c.config_id for c in third}
    by_label = {(c.weight_spec.label, c.kv_spec.label): c for c in again}
    gptq = by_label[("gptq-int4-g128", "fp16")]
    # the measurement runs ctx-512 windows in one chunk (SmolLM2's logits fit): replicate r halves it r times
    assert gptq.identity()["replicate"] == {"index": 1, "chunk": 256, "calibration_sample": 1}
    assert by_label[("int4-g128", "int4")].identity()["replicate"] == {"index": 1, "chunk": 256, "calibration_sample": None}
    assert {c.chunk for c in third} == {128} and {c.chunk for c in first} == {0}
    assert "replicate" not in first[0].identity()
    # every config of a replicate, resumed or not, runs with one chunk: a multiple of every cache's token group (kivi4: 32)
    deep = expand(SweepSpec.from_dict({**BASE, "ctx": 64, "kv": ["fp16", "kivi4"], "replicate": 2}))
    assert {c.chunk for c in deep} == {32}
    task = make_tasks(again, grid="weight")[0]
    assert GridTask.from_dict(json.loads(json.dumps(task.to_dict()))) == task and task.first.replicate == 1


@pytest.mark.parametrize("value", [-1, "1", True])
def test_a_bad_replicate_in_a_spec_says_what_to_do(value):
    with pytest.raises(ConfigError, match="replicate must be 0"):
        SweepSpec.from_dict({**BASE, "replicate": value})
