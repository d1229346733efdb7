"""make docs-check (scripts/docs_check.py) lists a measurement once the code it covers changes after its commit."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "scripts" / "docs_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("docs_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _git(root, *args):
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


def test_a_stamp_is_listed_once_its_code_changes(tmp_path):
    docs_check = _load()
    (tmp_path / "src" / "wkvlab" / "kv").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "src" / "wkvlab" / "kv" / "a.py").write_text("X = 1\n")
    (tmp_path / "src" / "wkvlab" / "b.py").write_text("Y = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "code")
    measured = _git(tmp_path, "rev-parse", "--short", "HEAD")
    (tmp_path / "docs" / "kv.md").write_text(f"<!-- doc-table: demo -->\n<!-- measured: commit={measured} covers=src/wkvlab/kv -->\n<!-- /doc-table -->\n"
                                            f"prose measured at commit {measured}; a hex word deadbeef is no stamp\n")
    (tmp_path / "README.md").write_text("<!-- measured: commit=0123456 covers=src -->\n"
                                        "quoted as an example: `<!-- measured: commit=… covers=… -->` is no stamp\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "docs")
    lines, total = docs_check.check(tmp_path)
    assert total == 3 and lines == ["README.md:1: measured at 0123456, a commit this clone does not have; cannot tell"]

    (tmp_path / "src" / "wkvlab" / "b.py").write_text("Y = 2\n")  # outside what the marker covers
    _git(tmp_path, "commit", "-qam", "b changes")
    lines, _ = docs_check.check(tmp_path)
    assert [line.split(":")[:2] for line in lines] == [["README.md", "1"], ["docs/kv.md", "4"]]  # only the prose stamp covers all of src

    (tmp_path / "src" / "wkvlab" / "kv" / "a.py").write_text("X = 2\n")
    _git(tmp_path, "commit", "-qam", "kv changes")
    lines, _ = docs_check.check(tmp_path)
    assert any(line.startswith("docs/kv.md:2: measured at") and "1 later commit(s) change src/wkvlab/kv (newest:" in line and "kv changes" in line
               and line.endswith("regenerate: python scripts/doc_tables.py --save docs/runs/demo.json --write demo") for line in lines), lines
    assert docs_check.main(["--root", str(tmp_path), "--strict"]) == 1


def test_a_findings_table_is_measured_again_from_its_own_record_not_the_demo():
    docs_check = _load()
    assert docs_check.regenerate("findings-depth-default") == (
        "rerun scripts/findings_record.py with the command in docs/runs/findings-depth-default.json (the caption's "
        "'Measured again by' for a finding), then python scripts/doc_tables.py --write findings-depth-default")
    assert docs_check.regenerate("output-explain-default-int4").startswith("rerun scripts/output_record.py with the command in "
                                                                           "docs/runs/output-explain-default-int4.json")
    assert docs_check.regenerate("report-demo") == "python scripts/doc_tables.py --save docs/runs/demo.json --write report-demo"


def test_a_git_show_pointer_that_does_not_resolve_fails(tmp_path):
    docs_check = _load()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "runs.json").write_text("{}\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "record")
    sha = _git(tmp_path, "rev-parse", "--short", "HEAD")
    (tmp_path / "docs" / "a.md").write_text(f"the record: `git show {sha}:docs/runs.json`\n")
    assert docs_check.invalid_pointers(tmp_path) == []
    (tmp_path / "docs" / "a.md").write_text(f"`git show {sha}:docs/other.json` and (git show 0123456:docs/runs.json)\n")
    broken = docs_check.invalid_pointers(tmp_path)
    assert len(broken) == 2 and "docs/a.md:1" in broken[0]
    assert "no such file at that commit" in broken[0] and "no such commit" in broken[1]
    assert docs_check.main(["--root", str(tmp_path)]) == 1


def test_every_git_show_pointer_in_the_docs_resolves():
    """Every `git show <commit>:<path>` that README.md and docs/ tell a reader to run works in this clone."""
    docs_check = _load()
    assert docs_check.invalid_pointers(Path(__file__).parents[1]) == []
