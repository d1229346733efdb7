"""JSON round-trip for the planner's frozen dataclasses.

Every result the planner returns is a tree of frozen dataclasses whose fields are ints, floats,
strings, bools, ``None``, tuples, string-keyed dicts or further dataclasses. One generic
converter driven by the type hints keeps ``to_dict``/``from_dict`` of every class in step with
its fields, instead of a hand-written pair per class that silently drifts.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


def to_jsonable(obj: Any) -> Any:
    """Convert a dataclass tree into plain JSON types (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    return obj


def from_jsonable(cls: type[T], data: Any) -> T:
    """Rebuild ``cls`` (a dataclass) from what :func:`to_jsonable` produced."""
    return _convert(cls, data)  # type: ignore[return-value]


def _convert(tp: Any, value: Any) -> Any:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value) if len(args) == 1 else value
    if origin is tuple:
        args = get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in value)
        return tuple(_convert(a, v) for a, v in zip(args, value))
    if origin in (dict, typing.Mapping) or tp is dict:
        args = get_args(tp)
        val_tp = args[1] if len(args) == 2 else Any
        return {k: _convert(val_tp, v) for k, v in value.items()}
    if origin is typing.Literal:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = get_type_hints(tp)
        kwargs = {
            f.name: _convert(hints[f.name], value[f.name])
            for f in dataclasses.fields(tp)
            if f.init and f.name in value
        }
        return tp(**kwargs)
    if tp is float and isinstance(value, int):
        return float(value)
    return value


class JsonMixin:
    """Adds ``to_dict``/``from_dict`` to a frozen dataclass."""

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        return from_jsonable(cls, data)
