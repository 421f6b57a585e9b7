"""A recording stand-in for HALCON's Python binding (``import halcon``), for tests only.

It checks values the way the real binding is documented to (builtin int, float and str, or
tuples of them or of dict handles; bool and NumPy scalars are refused), records every call in
``CALLS``, and ``write_dict`` writes the recorded dict as JSON with every value's type spelled
out, so a test can read back exactly what HALCON would have been given.
"""

from __future__ import annotations

import json
from typing import Any

CALLS: list[tuple[str, Any]] = []


class DictHandle:
    """What ``create_dict`` returns: the keys set on it, in order."""

    def __init__(self) -> None:
        self.items: dict[str, Any] = {}


def _check(value: Any) -> None:
    if isinstance(value, DictHandle):
        return
    if type(value) not in (int, float, str):  # exact types: bool and numpy scalars are refused
        raise TypeError(f"HALCON stand-in: {value!r} ({type(value).__name__}) is not a builtin int, float or str")


def create_dict() -> DictHandle:
    CALLS.append(("create_dict", None))
    return DictHandle()


def set_dict_tuple(d: DictHandle, key: str, value: Any) -> None:
    if not isinstance(d, DictHandle) or type(key) is not str:
        raise TypeError("HALCON stand-in: set_dict_tuple(dict_handle, str_key, value)")
    if isinstance(value, list):
        raise TypeError(f"HALCON stand-in: {key}: pass a tuple, not a list")
    for v in value if isinstance(value, tuple) else (value,):
        _check(v)
    CALLS.append(("set_dict_tuple", key))
    d.items[key] = value


def _typed(value: Any) -> Any:
    """A JSON form that keeps each value's type: ``{"tuple": [...]}``, ``{"int": 3}``, ``{"dict": {...}}``."""
    if isinstance(value, DictHandle):
        return {"dict": {k: _typed(v) for k, v in value.items.items()}}
    if isinstance(value, tuple):
        return {"tuple": [_typed(v) for v in value]}
    return {type(value).__name__: value}


def write_dict(d: DictHandle, path: str, names: Any, values: Any) -> None:
    if type(path) is not str or names != [] or values != []:
        raise TypeError("HALCON stand-in: write_dict(dict_handle, str_path, [], [])")
    CALLS.append(("write_dict", path))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_typed(d), f)
