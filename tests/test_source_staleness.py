"""scripts/source_staleness.py on a tiny synthetic git repository and package folder: a cited line
still there is unchanged, an edited one is reported with its nearest successor, a moved file is
found by its lines, a deleted one is missing; and the packaged record is well formed."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import source_staleness as guard  # noqa: E402  (a script, not a package module)

from wkvlab.engine_releases import find_release  # noqa: E402
from wkvlab.kv.presets import describe_preset, preset_names  # noqa: E402
from wkvlab.listing import KV_PRESET_EXAMPLES  # noqa: E402

KERNEL = "def store(x, s):\n    q = clamp(x * (1.0 / s), -128, 127)\n    return q\n"
SCALE = "def scale(x):\n    return max(abs(x)) / 127.0\n"


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin:/usr/local/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout.strip()


def _commit(repo: Path, files: dict[str, str | None], message: str) -> str:
    for path, text in files.items():
        target = repo / path
        if text is None:
            _git(repo, "rm", "-q", path)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        _git(repo, "add", path)
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _records(commit: str) -> list[dict]:
    return [
        {"id": "store", "presets": ["eng:int8"], "repo": "o/eng", "commit": commit, "path": "ops/store.py",
         "lines": ["q = clamp(x * (1.0 / s), -128, 127)"]},
        {"id": "scale", "presets": ["eng:int8"], "repo": "o/eng", "commit": commit, "path": "ops/scale.py",
         "lines": ["return max(abs(x)) / 127.0"]},
        {"id": "other", "presets": ["x:y"], "repo": "o/other", "commit": commit, "path": "a.py", "lines": ["pass"]},
    ]


@pytest.fixture()
def repo(tmp_path):
    repo = tmp_path / "eng"
    repo.mkdir()
    _git(repo, "init", "-q")
    first = _commit(repo, {"ops/store.py": KERNEL, "ops/scale.py": SCALE}, "first")
    return repo, first


def _statuses(report: dict) -> dict[str, str]:
    return {r["id"]: r["status"] for r in report["records"]}


def test_unchanged_changed_moved_missing_in_a_git_repository(repo):
    repo, first = repo
    records = _records(first)
    same = guard.run(records, {"o/eng": guard.open_tree(f"{repo}@{first}")})
    assert _statuses(same) == {"store": "unchanged", "scale": "unchanged", "other": "not checked"}
    assert same["sources"]["o/eng"]["commit"] == first

    # vLLM 0.33's kind of edit: rounding added before the clamp, and the file moved to a subfolder
    edited = KERNEL.replace("q = clamp(x * (1.0 / s), -128, 127)", "q = x * (1.0 / s)\n    q = clamp(round(q), -128, 127)")
    second = _commit(repo, {"ops/store.py": edited}, "round")
    third = _commit(repo, {"ops/scale.py": None, "ops/quant/scale.py": SCALE}, "move")
    report = guard.run(records, {"o/eng": guard.open_tree(f"{repo}@{third}")})
    assert _statuses(report) == {"store": "changed", "scale": "moved", "other": "not checked"}
    store = next(r for r in report["records"] if r["id"] == "store")
    assert store["lines_missing"] == [{"line": "q = clamp(x * (1.0 / s), -128, 127)", "nearest": "q = clamp(round(q), -128, 127)"}]
    assert next(r for r in report["records"] if r["id"] == "scale")["at"] == "ops/quant/scale.py"
    # at the middle commit the scale file is still where it was cited
    assert _statuses(guard.run(records, {"o/eng": guard.open_tree(f"{repo}/.git@{second}")}))["scale"] == "unchanged"

    fourth = _commit(repo, {"ops/quant/scale.py": None}, "gone")
    assert _statuses(guard.run(records, {"o/eng": guard.open_tree(f"{repo}@{fourth}")}))["scale"] == "missing"


def test_package_folder_drops_the_repository_prefix_and_ignores_indentation(tmp_path):
    package = tmp_path / "site-packages"
    (package / "ops").mkdir(parents=True)
    (package / "ops" / "store.py").write_text(KERNEL.replace("    q = clamp", "        q  =  clamp"))
    records = [{"id": "store", "presets": ["eng:int8"], "repo": "o/eng", "commit": "abc", "path": "python/ops/store.py",
                "lines": ["q = clamp(x * (1.0 / s), -128, 127)"]}]
    report = guard.run(records, {"o/eng": guard.open_tree(f"{package}#eng 1.0")})
    assert report["records"][0]["status"] == "unchanged" and report["records"][0]["at"] == "ops/store.py"
    assert report["sources"]["o/eng"] == {"kind": "folder", "path": str(package), "version": "eng 1.0"}


def test_command_line_writes_both_reports_and_check_fails_on_a_change(repo, tmp_path):
    repo, first = repo
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"records": _records(first)}))
    out = [f"--record={record}", f"--json={tmp_path / 'r.json'}", f"--md={tmp_path / 'r.md'}"]
    assert guard.main(out + [f"--source=o/eng={repo}", "--check"]) == 0
    _commit(repo, {"ops/store.py": KERNEL.replace("127)", "127.0)")}, "edit")
    assert guard.main(out + [f"--source=o/eng={repo}", "--check"]) == 1
    assert json.loads((tmp_path / "r.json").read_text())["counts"] == {"unchanged": 1, "changed": 1, "not checked": 1}
    assert "| store | eng:int8 |" in (tmp_path / "r.md").read_text()
    kernel = [dict(_records(first)[0], path="csrc/kernels/store.cu")]  # a part the source does not ship
    assert guard.run(kernel, {"o/eng": guard.open_tree(str(repo))})["records"][0]["status"] == "not checked"
    for bad, says in ((f"--source=o/nope={repo}", "write owner/name=PATH"), (f"--source=o/eng={tmp_path / 'no'}", "not found"),
                      (f"--source=o/eng={repo}@nosuchrev", "has no revision")):
        with pytest.raises(SystemExit, match=says):
            guard.main(out + [bad])


def test_the_packaged_record_names_commits_paths_and_lines():
    records = guard.load_records()
    assert len({r["id"] for r in records}) == len(records)
    for r in records:
        if r["commit"]:  # a full hash, or the release table's short one
            assert len(r["commit"]) >= 9 and all(c in "0123456789abcdef" for c in r["commit"]), r["id"]
        else:
            assert r["release"], r["id"]  # no resolvable commit: the release it was read in
        assert "/" in r["repo"] and r["presets"] and all(line.strip() for line in r["lines"]), r["id"]
    by_id = {r["id"]: r for r in records}
    # the commit of a record that models a release comes from the release table, not from the record
    assert by_id["vllm-per-token-head-store"]["commit"] == find_release("vllm", "0.34").commit == "62d4bc3c7"
    assert by_id["vllm-0.23-int8-truncating-store"]["commit"] == "91df0fad4"
    assert by_id["vllm-0.27-calculate-kv-scales"]["commit"] == "6e448d0ea"
    assert by_id["sglang-nvfp4-scale-rule"]["release"] == "SGLang 0.5.23" and not by_id["sglang-nvfp4-scale-rule"]["commit"]
    # the lines of the release now modelled: vLLM 0.34's rounding store, SGLang 0.5.23's conditional x6
    assert "k_q = tl.where(k_q >= 0, k_q + 0.5, k_q - 0.5)" in by_id["vllm-per-token-head-store"]["lines"]
    assert "k_q = tl.clamp(k_h * (1.0 / k_scale), QUANT_MIN, QUANT_MAX)" in by_id["vllm-0.23-int8-truncating-store"]["lines"]
    assert "if get_platform().is_sm100 and k_scale != 1.0:" in by_id["sglang-nvfp4-scale-rule"]["lines"]


def _listed_engine_presets() -> dict[str, str]:
    """Every preset ``wkvlab presets`` lists (a pattern row by its example) that resolves against the release
    table -> "engine@release"."""
    out = {}
    for name in preset_names():
        name = KV_PRESET_EXAMPLES.get(name, name)
        if "<" in name:
            continue
        preset = describe_preset(name.split("+")[0])
        if preset is not None and preset.release is not None:
            out[name] = f"{preset.release.engine}@{preset.release.key}"
    return out


def test_every_engine_preset_of_the_table_has_a_record_of_its_release_and_back():
    records = guard.load_records()
    listed = _listed_engine_presets()
    assert listed["vllm:int8_per_token_head"] == "vllm@0.34" and listed["vllm@0.23:int8_per_token_head"] == "vllm@0.23"
    assert listed["vllm@0.27:fp8_e4m3+scales=calculate"] == "vllm@0.27" and listed["sglang:nvfp4"] == "sglang@0.5.23"
    named: dict[str, set[str]] = {}
    for r in records:
        for preset in r["presets"]:
            named.setdefault(preset, set()).add(r.get("models", ""))
    # a listed preset (or the preset its options are appended to) is cited by a record of the release it resolves to
    uncovered = {name: release for name, release in listed.items()
                 if release not in named.get(name, set()) | named.get(name.split("+")[0], set())}
    assert not uncovered, f"engine presets without a record of their release: {uncovered}"
    assert listed["exl3-fa:k4v4"] == "exllamav3@1.6.5" and listed["exl3-fa@0.0.28:k4v4"] == "exllamav3@0.0.28"
    # and back: every preset a record of a release names is a preset of that release
    of_releases = {preset for r in records if r.get("models") for preset in r["presets"]}
    assert set(listed) & of_releases
    for preset in of_releases:
        resolved = describe_preset(preset.split("+")[0])
        assert resolved is not None and resolved.release is not None, preset
        assert named[preset] == {f"{resolved.release.engine}@{resolved.release.key}"}, (preset, named[preset])


ENGINE_RECORD = {"id": "pth", "presets": ["vllm:int8_per_token_head"], "models": "vllm@0.34", "repo": "vllm-project/vllm",
                 "path": "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py", "lines": ["k_q = tl.clamp(k_q, QUANT_MIN, QUANT_MAX)"]}


@pytest.mark.parametrize("change, says", [
    ({"models": None}, 'no "models": add "models": "vllm@0.34"'),
    ({"models": "vllm@0.99"}, "vLLM version '0.99' is not modelled"),
    ({"models": "vllm@0.23"}, "models vllm@0.23 but its presets resolve to vllm@0.34"),
    ({"presets": ["vllm@0.23:int8_per_token_head"]}, "models vllm@0.34 but its presets resolve to vllm@0.23"),
    ({"models": "nosuch@1"}, "is not <engine>@<release> of engines.yaml"),
    ({"commit": "f51ccb3e03634773babf356c896bb101ac5d696a"}, "cites @f51ccb3e03 but models vLLM 0.34.0 @62d4bc3c7"),
])
def test_a_record_that_disagrees_with_the_release_table_fails_in_one_line(tmp_path, change, says):
    record = {k: v for k, v in {**ENGINE_RECORD, **change}.items() if v is not None}
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"records": [record]}))
    with pytest.raises(SystemExit, match=re.escape(says)):
        guard.load_records(path)


def test_a_record_of_the_release_takes_its_commit_and_older_releases_do_not_fail_check(tmp_path):
    elsewhere = dict(ENGINE_RECORD, id="elsewhere", commit="f51ccb3e03634773babf356c896bb101ac5d696a", read_elsewhere="not in the wheel")
    older = dict(ENGINE_RECORD, id="old", presets=["vllm@0.23:int8_per_token_head"], models="vllm@0.23",
                 lines=["k_q = tl.clamp(k_h * (1.0 / k_scale), QUANT_MIN, QUANT_MAX)"])
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"records": [ENGINE_RECORD, elsewhere, older]}))
    loaded = {r["id"]: r for r in guard.load_records(path)}
    assert loaded["pth"]["commit"] == "62d4bc3c7" and loaded["elsewhere"]["commit"].startswith("f51ccb3e")
    source = tmp_path / "vllm-pkg" / "vllm" / "v1" / "attention" / "ops"
    source.mkdir(parents=True)
    (source / "triton_reshape_and_cache_flash.py").write_text("    k_q = tl.clamp(k_q, QUANT_MIN, QUANT_MAX)\n")
    report = guard.run(list(loaded.values()), {"vllm-project/vllm": guard.open_tree(str(tmp_path / "vllm-pkg"))})
    assert _statuses(report) == {"pth": "unchanged", "elsewhere": "unchanged", "old": "changed"}
    assert [r.get("older_release", False) for r in report["records"]] == [False, False, True]
    # the 0.23 store is not in the newest source, as expected: --check still passes; the markdown says why
    out = [f"--record={path}", f"--source=vllm-project/vllm={tmp_path / 'vllm-pkg'}", f"--md={tmp_path / 'r.md'}"]
    assert guard.main(out + ["--check"]) == 0
    assert "| changed (older release) |" in (tmp_path / "r.md").read_text()
    assert "vllm-project/vllm@f51ccb3e0* `" in (tmp_path / "r.md").read_text()
