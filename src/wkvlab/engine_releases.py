"""Engine releases as data: which release of vLLM, SGLang or llama.cpp a preset or a launch line means.

The one table is ``versions:`` of each engine in ``src/wkvlab/plan/data/engines.yaml`` (the planner's
engine matrix, read here and by :mod:`wkvlab.plan.engines`): per release its full version, the commit
its source was read at, the features that gate flags, and ``kv_formats`` — the KV formats a release
stores differently (vLLM 0.23.0's int8 store truncates where 0.24.0 on round; SGLang 0.5.20 multiplies
an uncalibrated model's NVFP4 scale by 6 on SM100, 0.5.21 on does not).

KV presets name a release after ``@``: ``vllm:int8_per_token_head`` is the newest modelled release
(``default_version``), ``vllm@0.23:int8_per_token_head`` the older store. Torch-free and planner-free:
importing it reads one YAML file.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from wkvlab.errors import ConfigError

TABLE_FILE = Path(__file__).parent / "plan" / "data" / "engines.yaml"
# KV preset engines -> the engine whose releases they follow (presets of other engines and papers
# cite one commit in their source and take no @version)
PRESET_ENGINES = {"vllm": "vllm", "vllm-fa3": "vllm", "sglang": "sglang", "llamacpp": "llama.cpp", "llamacpp-x86": "llama.cpp",
                  "exl3-fa": "exllamav3"}


@functools.lru_cache(maxsize=1)
def engine_table() -> dict[str, Any]:
    """``engines:`` of the table: per engine its display name, versions, weight rules and KV dtypes."""
    return yaml.safe_load(TABLE_FILE.read_text(encoding="utf-8"))["engines"]


@dataclass(frozen=True)
class Release:
    """One release of one engine, as the table records it."""

    engine: str  # the table's engine name: vllm, sglang, llama.cpp, trtllm, exllamav3
    key: str  # what --engine-version and @ take: "0.34", "0.5.23", "main"
    label: str
    release: str = ""  # the full version: 0.34.0
    commit: str = ""
    date: str = ""
    checked: str = ""
    features: tuple[str, ...] = ()
    kv_formats: tuple[tuple[str, str], ...] = field(default=())  # (preset's format, this release's format)

    @property
    def is_default(self) -> bool:
        return self.key == str(engine_table()[self.engine]["default_version"])

    def kv_format(self, fmt: str) -> str:
        """The format this release stores where a preset's newest release stores ``fmt``."""
        return dict(self.kv_formats).get(fmt, fmt)

    def describe(self) -> str:
        """``vLLM 0.34.0 @62d4bc3c7`` — what ``wkvlab presets`` prints in front of a preset's source."""
        if not self.commit:
            return self.label
        return f"{self.label} @{self.commit}" if " " not in self.commit else f"{self.label}, {self.commit}"


def releases(engine: str) -> list[Release]:
    """Every release of ``engine`` the table holds, in table order (newest first)."""
    return [_release(engine, key) for key in engine_table()[engine]["versions"]]


def _release(engine: str, key: str) -> Release:
    facts = engine_table()[engine]["versions"][key]
    return Release(engine, str(key), facts["label"], str(facts.get("release", "")), str(facts.get("commit", "")), str(facts.get("date", "")),
                   facts.get("checked", ""), tuple(facts.get("features", ())), tuple((facts.get("kv_formats") or {}).items()))


def find_release(engine: str, version: str | None = None) -> Release:
    """The release ``version`` names (its key or full version: ``0.23`` or ``0.23.0``), the newest modelled
    one when None; a one-line ConfigError listing the known ones otherwise."""
    entry = engine_table()[engine]
    if version is None:
        return _release(engine, str(entry["default_version"]))
    for key, facts in entry["versions"].items():
        if version in (str(key), str(facts.get("release", ""))):
            return _release(engine, str(key))
    raise ConfigError(f"{entry['display']} version {version!r} is not modelled; use one of: "
                      + ", ".join(str(k) for k in entry["versions"]) + f" (default {entry['default_version']})")


def split_preset_engine(engine: str) -> tuple[str, str | None]:
    """``"vllm@0.23"`` -> ("vllm", "0.23"); ``"vllm"`` -> ("vllm", None)."""
    name, sep, version = engine.partition("@")
    if sep and not version:
        raise ConfigError(f"{engine!r}: write <engine>@<release>:<dtype>, e.g. vllm@0.23:int8_per_token_head")
    return name, (version if sep else None)


def preset_release(engine: str) -> Release | None:
    """The release a KV preset's engine part (``vllm``, ``vllm@0.23``) resolves to; None for presets that
    follow no release table (exl3, kivi, hf-quanto, ...), which refuse an ``@``."""
    name, version = split_preset_engine(engine)
    table_engine = PRESET_ENGINES.get(name)
    if table_engine is None:
        if version is not None:
            raise ConfigError(f"{name}: presets take @<release> for {', '.join(sorted(PRESET_ENGINES))} only; write {name}:<...>")
        return None
    return find_release(table_engine, version)
