"""The journal of a partial store: one line per block of records that is completely written.

A build resumes from the journal of its partial store (docs/format.md, "Resume"): the journal sits
beside the partial as .NAME.dlpack-journal, its first line is a header (a build records its frozen
plan there), and each further line one block (a whole shard) that was completely written, with
the records of its samples. Nothing here knows what a record holds: anything with ``record()``
(a JSON list) and a function that rebuilds it can be journalled, so any writer of whole blocks
can reuse the journal.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from .._files import NotRegularFileError, fsync_dir, open_regular, read_regular, writing

__all__ = [
    "BuildJournal",
    "JOURNAL_KEY",
    "JOURNAL_VERSION",
    "Journal",
    "JournalState",
    "Record",
    "Restart",
    "is_journal",
    "read_journal",
]

#: The header's first key, with the format version as its value: how a journal is recognised.
JOURNAL_KEY = "dlpack_journal"
JOURNAL_VERSION = 1


class Record(Protocol):
    """What a journal line holds per sample: a JSON list that a reader's function turns back into it."""

    def record(self) -> list[Any]:
        """The JSON list a journal line holds for this sample."""
        ...


R = TypeVar("R", bound=Record)


class BuildJournal(Protocol):
    """A journal open for appending: :class:`Journal` (a file), or a site's own (objects in an object store)."""

    blocks: int

    def append_block(self, start: int, records: Sequence[Any]) -> None:
        """Record that the block at ``start`` is written, with its records."""
        ...

    def mark_commit(self) -> None:
        """Record that the commit began."""
        ...

    def close(self) -> None:
        """Close it."""
        ...


class Restart(Exception):
    """An earlier partial store cannot be continued; the message says why (for the summary)."""


def _line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


def _block_line(start: int, records: Sequence[Record]) -> dict[str, Any]:
    return {"start": start, "samples": [r.record() for r in records]}


class Journal(Generic[R]):
    """A journal open for appending: each line is written, flushed and fsync'd alone, so a kill
    leaves at most one torn last line, which reading drops."""

    def __init__(self, path: Path, blocks: int = 0) -> None:
        self.path = path
        self.blocks = blocks
        self._f = open(path, "ab")  # noqa: SIM115 - held for the build's life, closed by close()

    @classmethod
    def create(cls, path: Path, header: Mapping[str, Any], blocks: Mapping[int, Sequence[R]] = {}) -> Journal[R]:  # noqa: B006 - read only
        """Write a journal of ``header`` and ``blocks`` beside ``path`` and move it into place.

        The header is stored with :data:`JOURNAL_KEY` first, whatever else it holds.
        """
        tmp = path.with_name(path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        # A new file of ours, never one a link at that name points to.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
        with writing(path), os.fdopen(os.open(tmp, flags, 0o644), "wb") as f:
            f.write(_line({JOURNAL_KEY: JOURNAL_VERSION, **header}))
            for start, records in sorted(blocks.items()):
                f.write(_line(_block_line(start, records)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
        return cls(path, len(blocks))

    def append_block(self, start: int, records: Sequence[R]) -> None:
        """Record that samples ``start ..`` (a whole block) are written, with their records."""
        self._append(_block_line(start, records))
        self.blocks += 1

    def mark_commit(self) -> None:
        """Record that the metadata arrays and the manifest are being written."""
        self._append({"commit": True})

    def _append(self, record: Mapping[str, Any]) -> None:
        with writing(self.path):
            self._f.write(_line(record))
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        """Close the file; what was appended is already on disk (each line is fsynced)."""
        self._f.close()


@dataclass(frozen=True)
class JournalState(Generic[R]):
    """What a journal says: its header, the journalled blocks (first sample -> records), whether a commit began."""

    header: dict[str, Any]
    blocks: dict[int, list[R]]
    commit: bool


def is_journal(path: Path) -> bool:
    """Whether ``path`` is a dlpack journal, perhaps cut short by a kill while its first line was written."""
    if path.is_symlink() or not path.is_file() or path.lstat().st_nlink != 1:
        return False  # a link, or a file with other names: not a journal dlpack wrote
    marker = _line({JOURNAL_KEY: JOURNAL_VERSION})[:-2]
    try:
        fd = open_regular(path, follow_symlinks=False)
    except NotRegularFileError:  # swapped for a named pipe since the check: never block on it
        return False
    with os.fdopen(fd, "rb") as f:
        head = f.read(len(marker))
    return marker.startswith(head)


def read_journal(path: Path, from_record: Callable[[Sequence[Any]], R]) -> JournalState[R]:
    """Parse a journal, each record rebuilt by ``from_record``; :class:`Restart` when it is missing or unusable."""
    try:
        data = read_regular(path, follow_symlinks=False)
    except FileNotFoundError:
        raise Restart("the killed build left no journal") from None
    except OSError as exc:
        raise Restart(f"its journal cannot be read ({exc.strerror or exc})") from exc
    lines = data[: data.rfind(b"\n") + 1].splitlines()  # a torn last line is dropped
    try:
        header = json.loads(lines[0])
        if not isinstance(header, dict) or header.get(JOURNAL_KEY) != JOURNAL_VERSION:
            raise Restart("its journal is of another version")
        blocks: dict[int, list[R]] = {}
        commit = False
        for line in lines[1:]:
            record = json.loads(line)
            if record.get("commit"):
                commit = True
                continue
            blocks[int(record["start"])] = [from_record(r) for r in record["samples"]]
    except Restart:
        raise
    except (IndexError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Restart(f"its journal is damaged ({exc!r})") from exc
    return JournalState(header, blocks, commit)
