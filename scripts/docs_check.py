"""``make docs-check``: which measured numbers in README.md and docs/ are older than the code they describe.

A measurement names the commit it was taken at. Two forms are read:

* a marker, ``<!-- measured: commit=<sha> covers=src/wkvlab/kv,scripts/kv_preset_table.py -->``, on or
  before the table it stamps: ``covers`` are the paths whose changes can change its numbers;
* the prose stamps the docs already carry (``... at commit 035d6c1``, ``main at 6489846``): a commit
  this clone knows, taken to cover all of ``src/wkvlab``.

For each, ``git log <commit>..HEAD -- <covers>`` says whether the code moved since; the listing names
the doc, the line, the commit, how many later commits touch what it covers and the newest one. It exits
0 (a listing, not a verdict: a refactor that changes no number also counts) unless ``--strict`` — or
unless a ``git show <commit>:<path>`` pointer in the docs does not resolve in this clone (exit 1 always).
Needs only git and Python: no venv.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"<!--\s*measured:\s*(.*?)\s*-->")
STAMP = re.compile(r"\b(?:commit|at) `?([0-9a-f]{7,40})`?")
DEFAULT_COVERS = ("src/wkvlab",)


@dataclass(frozen=True)
class Stamp:
    doc: str
    line: int
    commit: str
    covers: tuple[str, ...]
    table: str = ""  # the scripts/doc_tables.py table the stamp is in, if any: the listing names its command


TABLE = re.compile(r"<!--\s*doc-table:\s*(\S+)\s*-->")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def _known(root: Path, sha: str) -> bool:
    return _git(root, "rev-parse", "--verify", "--quiet", f"{sha}^{{commit}}").returncode == 0


def stamps(root: Path, doc: Path) -> list[Stamp]:
    """The measurement stamps of one Markdown file (markers first; prose stamps on other lines)."""
    found, table = [], ""
    name = str(doc.relative_to(root))
    for number, text in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        opened = TABLE.search(text)
        if opened:
            table = opened.group(1)
        elif "<!-- /doc-table -->" in text:
            table = ""
        marker = MARKER.search(text)
        if marker and text[:marker.start()].endswith("`"):  # a marker quoted as an example (`<!-- measured: ... -->`)
            continue
        if marker:
            fields = dict(part.split("=", 1) for part in marker.group(1).split() if "=" in part)
            covers = tuple(p for p in fields.get("covers", "").split(",") if p) or DEFAULT_COVERS
            found.append(Stamp(name, number, fields.get("commit", ""), covers, table))
            continue
        for match in STAMP.finditer(text):
            if _known(root, match.group(1)):  # a hex word that is no commit of this clone is not a stamp
                found.append(Stamp(name, number, match.group(1), DEFAULT_COVERS))
    return found


def later_commits(root: Path, stamp: Stamp) -> list[str] | None:
    """Commits after the stamp's that touch what it covers (newest first); None when the commit is unknown."""
    if not stamp.commit or not _known(root, stamp.commit):
        return None
    out = _git(root, "log", "--no-merges", "--format=%h %s", f"{stamp.commit}..HEAD", "--", *stamp.covers)
    return [line for line in out.stdout.splitlines() if line.strip()]


def documents(root: Path) -> list[Path]:
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def regenerate(table: str) -> str:
    """How a generated table is measured again: a finding or a command output from its own record's
    command (hours for a finding), everything else from a fresh demo record (minutes)."""
    if table.startswith(("findings-", "output-")):
        script = "findings_record.py" if table.startswith("findings-") else "output_record.py"
        return (f"rerun scripts/{script} with the command in docs/runs/{table}.json (the caption's 'Measured again by' for a finding), "
                f"then python scripts/doc_tables.py --write {table}")
    return f"python scripts/doc_tables.py --save docs/runs/demo.json --write {table}"


def check(root: Path) -> tuple[list[str], int]:
    """(one line per stamp older than its code or unknown, number of stamps read)."""
    lines, total = [], 0
    for doc in documents(root):
        for stamp in stamps(root, doc):
            total += 1
            later = later_commits(root, stamp)
            where = f"{stamp.doc}:{stamp.line}"
            if later is None:
                lines.append(f"{where}: measured at {stamp.commit or '(no commit)'}, a commit this clone does not have; cannot tell")
            elif later:
                redo = f"; regenerate: {regenerate(stamp.table)}" if stamp.table else ""
                lines.append(f"{where}: measured at {stamp.commit}; {len(later)} later commit(s) change {', '.join(stamp.covers)} "
                             f"(newest: {later[0][:100]}){redo}")
    return lines, total


POINTER = re.compile(r"git show ([0-9a-f]{7,40}):([^\s`'\")]+)")


def invalid_pointers(root: Path) -> list[str]:
    """One line per ``git show <commit>:<path>`` in README.md and docs/ that this clone cannot show (no such
    commit, or no such file at it): a reader told to look there would get an error."""
    lines = []
    for doc in documents(root):
        for number, text in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for match in POINTER.finditer(text):
                if _git(root, "cat-file", "-e", f"{match.group(1)}:{match.group(2)}").returncode != 0:
                    what = "no such commit" if not _known(root, match.group(1)) else "no such file at that commit"
                    lines.append(f"{doc.relative_to(root)}:{number}: `git show {match.group(1)}:{match.group(2)}` fails ({what}); "
                                 "point at a commit that has the file (git log --oneline -- PATH)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--strict", action="store_true", help="exit 1 when any measurement is older than its code")
    args = parser.parse_args(argv)
    lines, total = check(args.root)
    for line in lines:
        print(line)
    print(f"{len(lines)} of {total} stamped measurements in README.md and docs/ are older than the code they describe (or unknown)")
    broken = invalid_pointers(args.root)
    for line in broken:
        print(line)
    if broken:  # a pointer is a fact about this history, not a listing: always an error
        print(f"{len(broken)} `git show` pointer(s) in README.md and docs/ do not resolve")
    return 1 if broken or (args.strict and lines) else 0


if __name__ == "__main__":
    sys.exit(main())
