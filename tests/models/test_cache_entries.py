"""The disk cache a user controls (issue #42): 'wkvlab cache list' and 'prune' on a fake cache folder,
least recently used first, never an entry being written or one a running wkvlab holds; the run header's
planned writes and the size warning."""
from __future__ import annotations

import fcntl
import json
import os
import time

import pytest
from typer.testing import CliRunner

from wkvlab.cli import app
from wkvlab.errors import ConfigError
from wkvlab.models import cache as cache_mod
from wkvlab.models.cache_entries import list_entries, parse_age, parse_size, plan_prune, pruning_lock

DAY = 86400
SHA = "ab" * 32


def _entry(path, size, age_days, now, folder=None):
    if not (folder if folder is not None else not path.suffix):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    else:
        path.mkdir(parents=True)
        (path / "data.bin").write_bytes(b"x" * size)
    os.utime(path, (now - age_days * DAY, now - age_days * DAY))
    return path


@pytest.fixture
def fake_cache(tmp_path):
    now = time.time()
    root = tmp_path / "cache"
    _entry(root / "models" / f"{SHA[:16]}-float32", 5000, 10, now)
    build = _entry(root / "quantized" / ("1" * 24), 3000, 3, now)
    (build / "meta.json").write_text(json.dumps({"model": SHA}))
    os.utime(build, (now - 3 * DAY, now - 3 * DAY))  # the file written into it moved its mtime
    _entry(root / "quantized" / ("2" * 24), 2000, 1, now)
    _entry(root / "quantized" / (("3" * 24) + ".k2j4"), 4000, 0.01, now, folder=True)  # a build being written (mkdtemp beside its target)
    _entry(root / "kv-stats" / "s.tmp", 100, 0.01, now)  # statistics being written
    _entry(root / "restore" / "weights-abc", 1000, 0.001, now)
    (root / "fingerprints").mkdir()
    (root / "fingerprints" / "m.json").write_text(json.dumps({"key": {"path": "/models/qwen2.5-coder-0.5b.gguf"}, "sha256": SHA}))
    return root, now


def test_entries_are_listed_least_recently_used_first_with_model_and_state(fake_cache):
    root, _ = fake_cache
    entries = list_entries(root)
    assert [e.path.name for e in entries][:3] == [f"{SHA[:16]}-float32", "1" * 24, "2" * 24]
    by_name = {e.path.name: e for e in entries}
    assert by_name[f"{SHA[:16]}-float32"].size == 5000 and by_name[f"{SHA[:16]}-float32"].model == SHA[:16]
    assert by_name["1" * 24].model == SHA and by_name["1" * 24].size == 3000 + len(json.dumps({"model": SHA}))
    assert {e.path.name for e in entries if e.partial} == {"3" * 24 + ".k2j4", "s.tmp"}


def test_prune_orders_by_last_use_and_keeps_what_is_being_written(fake_cache):
    root, now = fake_cache
    entries = list_entries(root)
    old = plan_prune(entries, older_than=7 * DAY, now=now)
    assert [e.path.name for e in old.remove] == [f"{SHA[:16]}-float32"]  # fresh partial entries are never candidates
    assert {e.path.name for e in old.kept_in_use} == {"3" * 24 + ".k2j4", "s.tmp"}
    total = sum(e.size for e in entries)
    capped = plan_prune(entries, max_size=total - 6000, now=now)
    assert [e.path.name for e in capped.remove] == [f"{SHA[:16]}-float32", "1" * 24]  # LRU until under the cap
    by_model = plan_prune(entries, model="qwen2.5-coder", now=now, names={SHA: "/models/qwen2.5-coder-0.5b.gguf"})
    assert [e.path.name for e in by_model.remove] == [f"{SHA[:16]}-float32", "1" * 24]
    busy = plan_prune(entries, max_size=0, busy=True, now=now)  # a run holds the cache: restore/ and recent use stay too
    assert [e.path.name for e in busy.remove] == [f"{SHA[:16]}-float32", "1" * 24, "2" * 24]
    later = plan_prune(entries, older_than=7 * DAY, now=now + 2 * DAY)  # a killed run's partial entries, a day idle
    assert {"3" * 24 + ".k2j4", "s.tmp"} <= {e.path.name for e in later.remove}
    with pytest.raises(ConfigError, match="give --older-than"):
        plan_prune(entries)


def test_a_running_wkvlab_makes_prune_conservative(fake_cache):
    root, _ = fake_cache
    (root / ".lock").touch()
    with pruning_lock(root) as busy:
        assert busy is False
    with (root / ".lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # what start_run's hold_cache takes
        with pruning_lock(root) as busy:
            assert busy is True


def test_sizes_and_ages_parse_or_are_refused():
    assert parse_size("2G") == 2 * 2**30 and parse_size("500M") == 500 * 2**20 and parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_age("7d") == 7 * DAY and parse_age("12h") == 12 * 3600 and parse_age("2w") == 14 * DAY
    with pytest.raises(ConfigError, match="--max-size '2X'"):
        parse_size("2X")
    with pytest.raises(ConfigError, match="--older-than 'soon'"):
        parse_age("soon")


def test_cache_commands_list_and_prune(fake_cache):
    root, _ = fake_cache
    runner = CliRunner()
    listed = runner.invoke(app, ["cache", "list", "--cache-dir", str(root)])
    assert listed.exit_code == 0, listed.output
    assert "qwen2.5-coder-0.5b.gguf" in listed.output and "model copies" in listed.output and "(partial)" in listed.output
    dry = runner.invoke(app, ["cache", "prune", "--max-size", "0", "--cache-dir", str(root), "--dry-run"])
    assert dry.exit_code == 0 and (root / "models" / f"{SHA[:16]}-float32").is_dir()
    pruned = runner.invoke(app, ["cache", "prune", "--older-than", "2d", "--cache-dir", str(root)])
    assert pruned.exit_code == 0, pruned.output
    assert f"removed models/{SHA[:16]}-float32" in pruned.output and f"removed quantized/{'1' * 24}" in pruned.output
    assert not (root / "models" / f"{SHA[:16]}-float32").exists() and (root / "quantized" / ("2" * 24)).is_dir()
    assert not [p for p in (root / "models").iterdir()]  # nothing renamed aside is left


def test_header_states_planned_writes_and_warns_past_the_threshold(tmp_path, monkeypatch):
    from wkvlab.models.cache_writes import planned_writes
    from wkvlab.weights.spec import WeightSpec

    monkeypatch.setenv(cache_mod.ENV, str(tmp_path / "c"))
    specs = [WeightSpec.parse("gptq-int4-g128"), WeightSpec.parse("awq-int4-g128"), WeightSpec.parse("int8")]
    line = planned_writes("default", specs, "float32")
    # SmolLM2-135M: 134,515,008 values in the GGUF (4 bytes each); 30 layers of decoder linears (106,168,320 values)
    assert line == ("may write a float32 copy of SmolLM2-135M-Instruct.Q4_1.gguf 513 MiB (models/), "
                    "2 calibrated build(s) ≤ 405 MiB each unless cached (quantized/)")
    copy = tmp_path / "c" / "models" / f"{_sha_of_default()[:16]}-float32"
    copy.mkdir(parents=True)
    (copy / "wkvlab-source.json").write_text("{}")
    assert planned_writes("default", specs[2:], "float32") == "writes nothing large to the cache"
    (copy / "big.bin").write_bytes(b"x" * 3000)
    monkeypatch.setenv(cache_mod.WARN_ENV, str(2000 / 2**30))
    text, warning = cache_mod.describe_cache()
    assert text.startswith(f"cache {tmp_path / 'c'}: model copies 3 KiB") and "over 1.86265e-06 GiB" in warning
    monkeypatch.setenv(cache_mod.WARN_ENV, "0")
    assert cache_mod.describe_cache()[1] is None


def _sha_of_default() -> str:
    from wkvlab.models.fingerprint import file_sha256
    from wkvlab.models.packaged import packaged_gguf

    return file_sha256(packaged_gguf("smollm2"))
