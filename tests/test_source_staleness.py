"""scripts/source_staleness.py on a tiny synthetic git repository and package folder: a cited line
still there is unchanged, an edited one is reported with its nearest successor, a moved file is
found by its lines, a deleted one is missing; and the packaged record is well formed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import source_staleness as guard  # noqa: E402  (a script, not a package module)

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
        if r["commit"]:
            assert len(r["commit"]) == 40 and all(c in "0123456789abcdef" for c in r["commit"]), r["id"]
        else:
            assert r["release"], r["id"]  # no resolvable commit: the release it was read in
        assert "/" in r["repo"] and r["presets"] and all(line.strip() for line in r["lines"]), r["id"]
