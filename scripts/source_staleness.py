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

Records of engine presets name the release they model (``"models": "vllm@0.34"``), a key of the
``versions:`` table of ``src/wkvlab/plan/data/engines.yaml`` (:mod:`wkvlab.engine_releases`): the
commit (or, for a release with no commit, the release) comes from that table, so the record and the
table cannot name two sources. A record that cites another commit says why in ``read_elsewhere``
(the release's source was not at hand). Loading the record fails, in one line, when a record names
no release for an engine preset, a release the table lacks, a release other than the one its
presets resolve to (``vllm:...`` the table's default, ``vllm@0.23:...`` 0.23), or a commit that is
not the release's without a reason: a new default release makes every record of the old one fail
until its lines are re-read.

``--check`` exits 1 when any checked record of a current release is not ``unchanged`` (for CI; a
record of an older release, kept reachable by ``@version``, is expected to differ from the newest
source); otherwise the exit code is 0 whenever the report was written. Every bad argument is a
one-line error.
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
sys.path.insert(0, str(RECORD.parents[2]))  # wkvlab's release table, also when run from a clone without an install
from wkvlab.engine_releases import PRESET_ENGINES, engine_table, find_release  # noqa: E402
from wkvlab.errors import ConfigError  # noqa: E402
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
    result = {key: record.get(key, "") for key in ("id", "presets", "models", "repo", "commit", "release", "path", "read_elsewhere")}
    result = {key: value for key, value in result.items() if value or key in ("commit", "release")}
    if record.get("models") and not record["models"].endswith("@" + str(engine_table()[record["models"].partition("@")[0]]["default_version"])):
        result["older_release"] = True  # kept reachable by @version: the newest source need not hold its lines
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


def _preset_release_key(preset: str) -> str | None:
    """``vllm@0.23:int8_per_token_head`` -> "vllm@0.23", ``vllm:fp8`` -> "vllm@0.34" (the default), None for
    presets that follow no release table (exl3, kivi, ...)."""
    engine, sep, _ = preset.strip().lower().partition(":")
    name, _, version = engine.partition("@")
    if not sep or name not in PRESET_ENGINES:
        return None
    table = PRESET_ENGINES[name]
    release = find_release(table, version or None)
    return f"{table}@{release.key}"


def _follow_table(record: dict, path: Path) -> dict:
    """``record`` with the commit (or release) of the release it models, or a one-line SystemExit where the
    record and the release table disagree."""
    where = f"{path}: record {record['id']}"
    try:
        wanted = {key for key in map(_preset_release_key, record["presets"]) if key}
    except ConfigError as exc:
        raise SystemExit(f"{where}: {exc}") from None
    models = record.get("models")
    if not models:
        if wanted:
            raise SystemExit(f"{where} lists engine presets but no \"models\": add \"models\": \"{sorted(wanted)[0]}\" "
                             "(the release of engines.yaml whose source its lines were read from)")
        return record
    engine, _, key = models.partition("@")
    if engine not in engine_table() or not key:
        raise SystemExit(f"{where}: models {models!r} is not <engine>@<release> of engines.yaml ({', '.join(engine_table())})")
    try:
        release = find_release(engine, key)
    except ConfigError as exc:
        raise SystemExit(f"{where}: {exc}") from None
    if release.key != key:
        raise SystemExit(f"{where}: write models {engine}@{release.key}, the table's key")
    if wanted != {models}:
        raise SystemExit(f"{where} models {models} but its presets resolve to {', '.join(sorted(wanted)) or 'no release'}: "
                         "re-read the lines in the release the presets now model, or split the record")
    table_commit = release.commit if release.commit and all(c in "0123456789abcdef" for c in release.commit) else ""
    cited = record.get("commit", "")
    if not cited:
        return {**record, "commit": table_commit, "release": record.get("release") or (release.label if not table_commit else "")}
    if not (table_commit and (cited.startswith(table_commit) or table_commit.startswith(cited))) and not record.get("read_elsewhere"):
        raise SystemExit(f"{where} cites @{cited[:10]} but models {release.describe()}: drop \"commit\" after re-reading the lines "
                         "in that release, or say in \"read_elsewhere\" why they were read at another commit")
    return record


def load_records(path: Path = RECORD) -> list[dict]:
    data = json.loads(path.read_text(encoding="utf-8"))
    records = []
    for record in data["records"]:
        missing = {"id", "presets", "repo", "path", "lines"} - set(record)
        if missing or not record["lines"]:
            raise SystemExit(f"{path}: record {record.get('id', '?')} lacks {', '.join(sorted(missing)) or 'lines'}")
        record = _follow_table({"commit": "", **record}, path)
        if not (record["commit"] or record.get("release")):
            raise SystemExit(f"{path}: record {record['id']} lacks a commit (or release, or models)")
        records.append(record)
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
    out += ["", "## Records", "",
            "`models`: the release of engines.yaml the presets model; an older release (kept by `@version`) is expected to differ "
            "from the newest source. `*`: read at another commit than the release's (see the JSON's `read_elsewhere`).", "",
            "| record | presets | models | cited at | status | where now |", "|---|---|---|---|---|---|"]
    for r in report["records"]:
        cited = f"{r['repo']}@{r['commit'][:9]}" if r["commit"] else f"{r['repo']} ({r['release']})"
        cited += "*" if r.get("read_elsewhere") else ""
        where = f"`{r['at']}`" if r.get("at") else r.get("why", "")
        status = r["status"] + (" (older release)" if r.get("older_release") and r["status"] != "unchanged" else "")
        out.append(f"| {r['id']} | {', '.join(r['presets'])} | {r.get('models', '')} | {cited} `{r['path']}` | {status} | {where} |")
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
    stale = any(r["status"] not in ("unchanged", "not checked") and not r.get("older_release") for r in report["records"])
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
