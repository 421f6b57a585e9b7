"""How names from the file system appear in text meant for people.

A file or folder name may hold any character but ``/`` and NUL: a newline, an ANSI escape, a
bidirectional override. Printed as is, such a name fakes output lines, recolours the terminal or
reorders a line. :func:`shown` gives the one form every message, summary and listing uses.
Machine-readable output (``--json``, the manifest) keeps names exact.
"""

from __future__ import annotations

import unicodedata

__all__ = ["shown", "code_points", "normal_form"]


def _escape(ch: str) -> str:
    return ch.encode("unicode_escape", "backslashreplace").decode("ascii")


def shown(name: object) -> str:
    r"""``name`` with every character that is not printable as its escape (``\n``, ``\x1b``, ``\u202e``).

    A lone surrogate (a file name that is not UTF-8) becomes its ``\udcXX`` escape, so the text can
    always be printed.
    """
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in str(name))


def code_points(name: str) -> str:
    r"""``name`` with every character outside ASCII as its escape: ``caf\xe9`` and ``cafe\u0301`` differ visibly."""
    return "".join(ch if ch.isascii() and ch.isprintable() else _escape(ch) for ch in name)


def normal_form(name: str) -> str:
    """The key under which two names that differ only in Unicode normalisation (NFC vs NFD) collide."""
    return name if name.isascii() else unicodedata.normalize("NFC", name)
