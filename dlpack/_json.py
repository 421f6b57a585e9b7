"""Reading the JSON files a user hands over (label files, augmentation configs): strictly, one way.

Python's :func:`json.loads` accepts what no label file means and fails on some valid files in
ways that are not a :class:`json.JSONDecodeError`: a key given twice is silently read last-wins,
``NaN``/``Infinity`` and ``1e999`` become non-finite floats, an integer of more than 4,300 digits
raises a plain ``ValueError``, one of 309 digits overflows the first ``float()`` that meets it,
and deep nesting raises ``RecursionError`` (or recurses later, in code that walks the value).
:func:`parse_json` refuses each of these as the caller's typed error, naming the file and, where
the parser knows it, the line and column.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

import numpy as np

from ._files import NotRegularFileError, read_regular

__all__ = ["MAX_DEPTH", "MAX_FILE_BYTES", "decode_text", "parse_json", "read_text_file"]

#: The deepest nesting of arrays and objects a file may have (label files need about 6).
MAX_DEPTH = 100
#: The largest label file or config read (a 2 GiB JSON parses into several times that in memory).
MAX_FILE_BYTES = 2 * 2**30
#: A JSON string (outside which every ``[``, ``{`` and digit run is the document's structure).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: A 3-digit exponent (``1e400``), which may take a float beyond its range.
_EXPONENT = re.compile(rb"[eE][+-]?\d{3}")
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\x00\x00")
_INT64 = 2**63


class _Refused(ValueError):
    """A value the strict reader refuses; ``literal`` locates it in the text where possible."""

    def __init__(self, message: str, literal: str | None = None) -> None:
        super().__init__(message)
        self.literal = literal


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            others = ", ".join(repr(k) for k in list(out)[:6] if k != key)
            raise _Refused(f"the key {key!r} appears twice in one object" + (f" (with {others})" if others else ""))
        seen.add(key)
    raise AssertionError("unreachable: a shorter dict has a repeated key")


def _long_integer(plain: bytes) -> bool:
    """Whether ``plain`` (strings removed) has a run of 19 digits or more that is not a fraction:
    an integer, or the integer part of a number, that may not fit 64 bits or a float."""
    digits = plain.translate(_DIGITS)
    run = b"0" * 19
    at = digits.find(run)
    while at >= 0:
        start = at
        while start > 0 and digits[start - 1] == 0x30:
            start -= 1
        if start == 0 or digits[start - 1] != 0x2E:  # not after a decimal point
            return True
        end = at + len(run)
        while end < len(digits) and digits[end] == 0x30:
            end += 1
        at = digits.find(run, end)
    return False


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a number a label or setting can have; give a finite number", name)


def _short(literal: str) -> str:
    return literal if len(literal) <= 24 else f"{literal[:12]}...{literal[-6:]} ({len(literal)} characters)"


def _int(literal: str) -> int:
    digits = literal.lstrip("-")
    if len(digits) > 19 or not -_INT64 <= int(literal) < _INT64:
        raise _Refused(f"the integer {_short(literal)} does not fit in 64 bits", literal)
    return int(literal)


def _float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _Refused(f"the number {_short(literal)} is beyond the range of a float", literal)
    return value


def _depth(plain: bytes) -> int:
    """The deepest nesting of valid JSON ``plain``, its strings removed (they hold no structure)."""
    brackets = plain.translate(_STEPS, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = np.frombuffer(brackets, np.int8).astype(np.int64)
    return int(np.cumsum(steps * 2 - 1).max())


def _where(text: str, literal: str | None) -> str:
    at = text.find(literal) if literal else -1
    if at < 0:
        return ""
    line = text.count("\n", 0, at) + 1
    return f"line {line}, column {at - (text.rfind(chr(10), 0, at) + 1) + 1}: "


def parse_json(text: str, name: str, error: type[Exception]) -> Any:
    """``text`` (the file ``name``) parsed strictly, or ``error`` saying why and where.

    Refused: malformed JSON (line and column), a key twice in one object, ``NaN``/``Infinity``,
    numbers beyond a float, integers beyond 64 bits and nesting deeper than :data:`MAX_DEPTH`.
    """
    text = text.removeprefix("\ufeff")
    data = text.encode("utf-8", "surrogatepass")
    # Without an escaped quote, every other piece between quotes is a string (twice as fast as the regex).
    plain = _STRING.sub(b"", data) if b'\\"' in data else b"".join(data.split(b'"')[::2])
    numbers: dict[str, Any] = {}
    suspect = b"N" in plain or b"I" in plain or _EXPONENT.search(plain) or _long_integer(plain)
    if suspect:  # the checks below cost a call per number: only where one may be wrong
        numbers = {"parse_int": _int, "parse_float": _float, "parse_constant": _constant}
    try:
        doc = json.loads(text, object_pairs_hook=_unique, **numbers)
    except json.JSONDecodeError as exc:
        raise error(f"{name} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
    except _Refused as exc:
        raise error(f"{name}: {_where(text, exc.literal)}{exc}") from None
    except RecursionError:
        raise error(f"{name} is nested more than {MAX_DEPTH} levels deep; no label file or config is") from None
    except ValueError as exc:  # e.g. Python's own limit on the digits of an integer
        raise error(f"{name} holds a value Python cannot read: {exc}") from None
    if isinstance(doc, (list, dict)) and _depth(plain) > MAX_DEPTH:
        raise error(f"{name} is nested more than {MAX_DEPTH} levels deep; no label file or config is")
    return doc


def read_text_file(
    path: str | os.PathLike[str],
    name: str,
    error: type[Exception],
    *,
    pipes: bool = False,
    missing: type[Exception] | None = None,
) -> str:
    """The UTF-8 text of ``path`` (a BOM is kept for :func:`parse_json` to drop), read as images are.

    Only a regular file is read (or, with ``pipes``, a pipe that something writes to, as
    ``<(command)`` gives), never more than :data:`MAX_FILE_BYTES`: a named pipe nobody writes to, a
    device or a huge file is ``error`` at once, not a hang or an exhausted memory; a missing file is
    ``missing`` (default: ``error``).
    """
    try:
        data = read_regular(path, limit=MAX_FILE_BYTES, pipes=pipes)
    except FileNotFoundError:
        raise (missing or error)(f"{name} does not exist") from None
    except IsADirectoryError:
        raise error(f"{name} is a folder, not a file") from None
    except NotRegularFileError as exc:
        if exc.kind == "a folder":
            raise error(f"{name} is a folder, not a file") from None
        raise error(f"{name} is {exc}; give a file") from None
    except OSError as exc:
        raise error(f"cannot read {name}: {exc.strerror or exc}") from None
    return decode_text(data, name, error)


def decode_text(data: bytes, name: str, error: type[Exception]) -> str:
    """``data`` as UTF-8 text (a BOM kept), or ``error`` naming ``name`` and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{name} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
