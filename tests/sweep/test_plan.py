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
