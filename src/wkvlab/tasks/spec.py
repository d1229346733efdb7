"""What ``wkvlab tasks`` runs (tasks, limits, local task folders) and the lm-eval it needs, without torch:
the command refuses a bad request with these before anything heavy imports (wkvlab.tasks.run runs it)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from wkvlab.errors import ConfigError

LM_EVAL_PIN = "0.4.13"


@dataclass(frozen=True)
class TaskRunSpec:
    """Which lm-eval tasks, and how: what every config of the grid runs."""

    tasks: tuple[str, ...]
    include_path: str | None = None  # folder(s) of local task YAMLs (lm-eval's --include_path)
    limit: int | None = None  # examples per task (None: all)
    num_fewshot: int | None = None  # None: the task's own default
    bootstrap_iters: int = 1000  # for metrics whose stderr lm-eval bootstraps (mean-aggregated ones have a closed form)

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ConfigError("give at least one lm-eval task, e.g. --tasks arc_easy (or a local one with --include-path)")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be at least 1, got {self.limit}")
        if self.num_fewshot is not None and self.num_fewshot < 0:
            raise ConfigError(f"--num-fewshot must be 0 or more, got {self.num_fewshot}")
        if self.include_path is not None and not all(Path(p).expanduser().is_dir() for p in self.include_path.split(":")):
            raise ConfigError(f"--include-path {self.include_path!r} is not a folder of lm-eval task YAMLs")

    def to_dict(self) -> dict:
        # the include path's YAML contents identify local tasks better than its location
        return {"tasks": list(self.tasks), "limit": self.limit, "num_fewshot": self.num_fewshot,
                "include": _folder_digest(self.include_path) if self.include_path else None}


def _folder_digest(paths: str) -> str:
    digest = hashlib.sha256()
    for folder in paths.split(":"):
        for path in sorted(Path(folder).expanduser().rglob("*")):
            if path.is_file() and path.suffix in (".yaml", ".yml", ".py", ".jsonl", ".json", ".txt"):
                digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def lm_eval_version() -> str:
    try:
        return metadata.version("lm_eval")
    except metadata.PackageNotFoundError:
        raise ConfigError(f"wkvlab tasks needs lm-evaluation-harness: pip install 'wkvlab[tasks]' (lm-eval=={LM_EVAL_PIN})") from None
