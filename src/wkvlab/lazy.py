"""Package namespaces whose names are imported on first use (PEP 562).

Importing any submodule runs its package's ``__init__``; when that ``__init__`` re-exports the
torch-heavy parts, ``wkvlab --help`` or a one-line input error pays seconds of imports for nothing.
A package lists its public names and the submodule each lives in; ``from wkvlab.kv import KVSpec``
keeps working, and imports only what it names.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``; ``exports`` maps each name to its submodule."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(exports) | set(vars(sys.modules[package])))

    return __getattr__, __dir__


def names(module: str, *attrs: str) -> dict[str, str]:
    """``{attr: module}`` for each attr: the table :func:`lazy_exports` reads, one line per submodule."""
    return dict.fromkeys(attrs, module)
