"""Staleness guard: are the engine source lines wkvlab's presets were built from still there?

``src/wkvlab/kv/source_lines.json`` records, per engine preset (or format, or method), the
repository, the commit and the path it was read at, and the exact source lines the simulation
transcribes. Given newer sources — a fetched git repository (bare or not; ``@<rev>`` picks the
revision, HEAD by default), a checkout, or an unpacked/installed package folder — this reports for
every record whether each cited line is still in that file:

* ``unchanged``: every cited line is in the file at the cited path;
* ``changed``: the file is there, some cited lines are not (the nearest line now there is shown);
* ``moved``: the file is gone from that path, but another file holds every cited line;
* ``moved+changed``: the file is gone, another file holds some of the lines;
* ``missing``: neither the file nor the lines are anywhere in the tree;
* ``not checked``: no source was given for that repository.

Lines are compared with their whitespace collapsed (re-indenting is not a change). A package
folder holds ``sglang/srt/...`` where the repository holds ``python/sglang/srt/...``: a cited
path is also looked up with its leading folders dropped, one at a time.

    python scripts/source_staleness.py \\
        --source vllm-project/vllm=/tmp/vllm-0.34.0 \\
        --source turboderp-org/exllamav3=/work/.mirror/turboderp-org+exllamav3/repo@HEAD \\
        --json docs/runs/source-staleness.json --md docs/runs/source-staleness.md [--check]

``--check`` exits 1 when any checked record is not ``unchanged`` (for CI); otherwise the exit code
is 0 whenever the report was written. Every bad argument is a one-line error.
"""
from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / "src" / "wkvlab" / "kv" / "source_lines.json"
STATUSES = ("unchanged", "changed", "moved", "moved+changed", "missing", "not checked")


def norm(line: str) -> str:
    return " ".join(line.split())


class Tree:
    """Files of one source: read a path, list candidate files, say which revision it is."""

    def read(self, path: str) -> str | None:
        raise NotImplementedError

    def files(self, suffix: str) -> list[str]:
        raise NotImplementedError

    def candidates(self, lines: list[str], suffix: str) -> list[str]:
        """Files with ``suffix`` that may hold some of ``lines`` (all of them, unless overridden)."""
        return self.files(suffix)

    def has_dir(self, name: str) -> bool:
        """Whether the tree has a top-level folder ``name``."""
        raise NotImplementedError

    def describe(self) -> dict:
        raise NotImplementedError


@dataclass
class GitTree(Tree):
    git_dir: Path
    rev: str

    def _git(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "--git-dir", str(self.git_dir), *args], capture_output=True, text=True)

    def read(self, path: str) -> str | None:
        done = self._git("show", f"{self.rev}:{path}")
        return done.stdout if done.returncode == 0 else None

    def files(self, suffix: str) -> list[str]:
        done = self._git("ls-tree", "-r", "--name-only", self.rev)
        return [p for p in done.stdout.splitlines() if p.endswith(suffix)]

    def candidates(self, lines: list[str], suffix: str) -> list[str]:
        patterns = [arg for line in lines for arg in ("-e", line.strip())]
        done = self._git("grep", "-l", "-F", *patterns, self.rev, "--", f"*{suffix}")
        return [p.split(":", 1)[1] for p in done.stdout.splitlines() if ":" in p]

    def has_dir(self, name: str) -> bool:
        return self._git("cat-file", "-t", f"{self.rev}:{name}").stdout.strip() == "tree"

    def describe(self) -> dict:
        commit = self._git("rev-parse", self.rev).stdout.strip()
        date = self._git("show", "-s", "--format=%cI", self.rev).stdout.strip()
        return {"kind": "git", "path": str(self.git_dir), "rev": self.rev, "commit": commit, "commit_date": date}


@dataclass
class FolderTree(Tree):
    root: Path
    label: str = ""

    def read(self, path: str) -> str | None:
        file = self.root / path
        return file.read_text(encoding="utf-8", errors="replace") if file.is_file() else None

    def files(self, suffix: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob(f"*{suffix}") if p.is_file())

    def has_dir(self, name: str) -> bool:
        return (self.root / name).is_dir()

    def describe(self) -> dict:
        return {"kind": "folder", "path": str(self.root), "version": self.label}


def open_tree(text: str) -> Tree:
    """``<path>[@<rev>][#<label>]``: a git directory (bare or a checkout's .git) or a plain folder."""
    text, _, label = text.partition("#")
    path, _, rev = text.rpartition("@") if "@" in text else (text, "", "")
    if not Path(path).expanduser().is_dir() and Path(text).expanduser().is_dir():
        path, rev = text, ""  # an "@" inside the folder's own name
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise SystemExit(f"source folder not found: {folder}; give a git directory, a checkout or a package folder")
    for git_dir in (folder, folder / ".git"):
        if (git_dir / "HEAD").is_file() and (git_dir / "objects").is_dir():
            tree = GitTree(git_dir, rev or "HEAD")
            if tree._git("rev-parse", "--verify", f"{tree.rev}^{{commit}}").returncode != 0:
                raise SystemExit(f"{git_dir} has no revision {tree.rev!r}; name a commit, tag or branch after @")
            return tree
    if rev:
        raise SystemExit(f"{folder} is not a git directory, so @{rev} cannot be read; drop it or point at the .git folder")
    return FolderTree(folder, label)


def _lookup(tree: Tree, path: str) -> tuple[str, str] | None:
    """(path found, text) for ``path`` or, for package folders, the path with leading folders dropped."""
    parts = path.split("/")
    for start in range(len(parts) - 1):
        candidate = "/".join(parts[start:])
        text = tree.read(candidate)
        if text is not None:
            return candidate, text
    return None


def _missing(lines: list[str], text: str) -> list[dict]:
    present = {norm(line) for line in text.splitlines()}
    out = []
    for line in lines:
        if norm(line) not in present:
            near = difflib.get_close_matches(norm(line), list(present), n=1, cutoff=0.6)
            out.append({"line": line, "nearest": near[0] if near else None})
    return out


def check_record(record: dict, tree: Tree | None) -> dict:
    """The status of one record against ``tree`` (None: no source given for its repository)."""
    result = {key: record.get(key, "") for key in ("id", "presets", "repo", "commit", "release", "path")}
    if tree is None:
        return {**result, "status": "not checked", "why": "no source given for this repository"}
    lines = record["lines"]
    found = _lookup(tree, record["path"])
    if found is not None:
        at, text = found
        gone = _missing(lines, text)
        return {**result, "status": "changed" if gone else "unchanged", "at": at, "lines_missing": gone}
    best: tuple[int, str, list[dict]] | None = None
    suffix = Path(record["path"]).suffix
    parts = record["path"].split("/")
    if len(parts) > 1 and not any(tree.has_dir(part) for part in parts[:-1]):
        # a Python wheel ships no csrc/: it says nothing about the kernel, rather than that it is gone
        return {**result, "status": "not checked", "why": f"the source has no {parts[0]}/ (nor any folder of the cited path)"}
    wanted = {norm(line) for line in lines}
    for candidate in tree.candidates(lines, suffix):
        text = tree.read(candidate) or ""
        if not wanted & {norm(x) for x in text.splitlines()}:
            continue
        gone = _missing(lines, text)
        kept = len(lines) - len(gone)
        if best is None or kept > best[0]:
            best = (kept, candidate, gone)
    if best is None:
        return {**result, "status": "missing", "lines_missing": [{"line": line, "nearest": None} for line in lines]}
    kept, at, gone = best
    return {**result, "status": "moved" if not gone else "moved+changed", "at": at, "lines_missing": gone}


def load_records(path: Path = RECORD) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    records = data["records"]
    for record in records:
        missing = {"id", "presets", "repo", "commit", "path", "lines"} - set(record)
        if not missing and not (record["commit"] or record.get("release")):
            missing = {"commit (or release)"}
        if missing or not record["lines"]:
            raise SystemExit(f"{path}: record {record.get('id', '?')} lacks {', '.join(sorted(missing)) or 'lines'}")
    return records


def run(records: list[dict], trees: dict[str, Tree]) -> dict:
    checked = [check_record(record, trees.get(record["repo"])) for record in records]
    counts = {status: sum(1 for c in checked if c["status"] == status) for status in STATUSES}
    return {"sources": {repo: tree.describe() for repo, tree in trees.items()},
            "counts": {k: v for k, v in counts.items() if v}, "records": checked}


def markdown(report: dict) -> str:
    out = ["# Source staleness", "",
           "Written by `scripts/source_staleness.py` from `src/wkvlab/kv/source_lines.json` (see docs/engines.md).", "",
           "## Sources checked", "", "| repository | source | revision |", "|---|---|---|"]
    for repo, source in report["sources"].items():
        rev = source.get("commit", "")[:12] + (f" ({source['commit_date'][:10]})" if source.get("commit_date") else "")
        out.append(f"| {repo} | {source['kind']}: `{source['path']}` | {rev or source.get('version', '')} |")
    out += ["", "## Records", "", "| record | presets | cited at | status | where now |", "|---|---|---|---|---|"]
    for r in report["records"]:
        cited = f"{r['repo']}@{r['commit'][:8]}" if r["commit"] else f"{r['repo']} ({r['release']})"
        where = f"`{r['at']}`" if r.get("at") else r.get("why", "")
        out.append(f"| {r['id']} | {', '.join(r['presets'])} | {cited} `{r['path']}` | {r['status']} | {where} |")
    details = [r for r in report["records"] if r.get("lines_missing")]
    if details:
        out += ["", "## Lines no longer there", ""]
        for r in details:
            out.append(f"* **{r['id']}** ({r['status']}):")
            for miss in r["lines_missing"]:
                near = f" — nearest now: `{miss['nearest']}`" if miss["nearest"] else ""
                out.append(f"  * `{norm(miss['line'])}`{near}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", default=[], metavar="REPO=PATH[@REV][#LABEL]",
                        help="newer sources for a repository named in the record (owner/name)")
    parser.add_argument("--record", default=str(RECORD), help="the record of cited lines (default: the packaged one)")
    parser.add_argument("--json", help="write the report as JSON here")
    parser.add_argument("--md", help="write the report as Markdown here")
    parser.add_argument("--check", action="store_true", help="exit 1 when a checked record is not unchanged")
    args = parser.parse_args(argv)
    records = load_records(Path(args.record))
    known = {r["repo"] for r in records}
    trees: dict[str, Tree] = {}
    for item in args.source:
        repo, eq, where = item.partition("=")
        if not eq or repo not in known:
            raise SystemExit(f"--source {item!r}: write owner/name=PATH with a repository the record cites ({', '.join(sorted(known))})")
        trees[repo] = open_tree(where)
    report = run(records, trees)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    if args.md:
        Path(args.md).write_text(markdown(report), encoding="utf-8")
    for r in report["records"]:
        print(f"{r['status']:>13}  {r['id']}" + (f"  -> {r['at']}" if r.get("at") and r["at"] != r["path"] else ""))
    stale = any(r["status"] not in ("unchanged", "not checked") for r in report["records"])
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
