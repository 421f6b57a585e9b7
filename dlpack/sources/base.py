"""What a build reads: the :class:`Source` protocol and the items a source lists.

A source turns the user's input (a folder tree, later a COCO file, a CSV, a mask folder or a
DLDataset) into an ordered list of :class:`SourceItem`. The build reads each item's file through
the source's :class:`SourceFiles` (:func:`files_of`: a :class:`LocalFiles` on ``source.root``
unless the source gives its own) and stores the samples in the order the source gives; it knows
nothing else about where the items came from, so a new source plugs in without touching the build
(:mod:`dlpack.pack`).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, Protocol, runtime_checkable

from .._files import NotRegularFileError, open_regular
from ..errors import InputFileError

__all__ = [
    "FileStat",
    "LocalFiles",
    "Source",
    "SourceFiles",
    "SourceItem",
    "SourceScan",
    "files_of",
    "open_input",
    "reading_ahead",
]


@dataclass(frozen=True)
class SourceItem:
    """One input sample.

    Attributes
    ----------
    rel : str
        The image file's path relative to the source root, with ``/`` separators.
    label : str or None
        The sample's class name (one of :attr:`SourceScan.classes`), or None when unlabelled.
    annotations : Mapping or None
        Per-sample annotations of label sources (boxes, mask paths, ...); None for folders.
    split : str or None
        The split the source assigns (``"train"``, ``"test"``, ...), or None.
    """

    rel: str
    label: str | None = None
    # Excluded from hashing: a mapping is not hashable, and items are compared, not hashed.
    annotations: Mapping[str, Any] | None = field(default=None, hash=False)
    split: str | None = None


@dataclass(frozen=True)
class SourceScan:
    """The result of :meth:`Source.scan`.

    Attributes
    ----------
    items : sequence of SourceItem
        Every usable input, in sample order: a tuple, or (for a folder) an
        :class:`~dlpack.sources._items.ItemTable` that keeps them as columns and makes each item
        when it is read, so a million-image scan does not hold a million objects.
    classes : tuple of str
        Class names; a stored label ``k`` means ``classes[k]``. Empty when unlabelled.
    errors : tuple of InputFileError
        Inputs the scan found but cannot use (the build fails on them or skips them, per ``on_error``).
    labels : str
        Where the labels come from, as recorded in the manifest: ``"folders"``, ``"none"``, ...
    excluded : tuple of str
        Paths left out by an exclude pattern (a folder with a trailing ``/``, for everything under it).
    ignored : tuple of str
        Files found that are not images (``.txt``, ``.pdf``, ...): not packed, listed for the summary.
    class_ids : tuple of int
        The original id of each class in ``classes`` (COCO category id, HALCON class id, mask pixel
        value), aligned with ``classes``. Empty means ``0 .. len(classes) - 1``.
    task : str
        ``"classification"``, ``"detection"``, ``"segmentation"``, ``"anomaly"`` or ``"none"``: which
        label arrays the build writes.
    label_root : str or None
        The folder the items' ``mask`` / ``anomaly_mask`` paths are relative to, when not ``root``.
    notes : tuple of str
        One line each for the summary about labels the source changed or did not use, e.g. "clipped
        3 boxes that stuck out of their image (...)"; nothing in a note stops the build.
    """

    items: Sequence[SourceItem]
    classes: tuple[str, ...] = ()
    errors: tuple[InputFileError, ...] = ()
    labels: str = "none"
    excluded: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    class_ids: tuple[int, ...] = ()
    task: str = "classification"
    label_root: str | None = None
    notes: tuple[str, ...] = ()


@runtime_checkable
class Source(Protocol):
    """What :func:`dlpack.build` reads.

    ``root`` is the folder that item paths are relative to; ``scan()`` lists the items. A scan
    raises :class:`~dlpack.errors.SourceError` when the input is unusable as a whole (missing,
    empty), and reports single unusable inputs in :attr:`SourceScan.errors`.
    """

    @property
    def root(self) -> Path | str:
        """The folder item paths are relative to (a bucket source: the prefix's URL, a str)."""
        ...

    def scan(self) -> SourceScan:
        """Every item, with the single inputs that could not be used in ``errors``."""
        ...


class FileStat(NamedTuple):
    """What tells one state of an input file from another: its size in bytes and its version (the
    modification time in nanoseconds for a local file), as the store records them for ``--update``
    and a resumed build."""

    size: int
    version: int


@runtime_checkable
class SourceFiles(Protocol):
    """How the build reads a source's files, by their path relative to the source root.

    Workers get a pickled copy (no open handles), so an implementation holds only what locates the
    files. An unreadable or irregular file raises ``OSError`` (its ``strerror`` says why). Label
    images are read by the label parsers of :mod:`dlpack.sources.labels`, from ``root``.
    """

    @property
    def root(self) -> str:
        """The folder relative label-file paths start from (the source's root)."""
        ...

    def read(self, rel: str) -> tuple[bytes, FileStat]:
        """The whole file, and its size and version as read."""
        ...

    def read_head(self, rel: str, n: int) -> tuple[bytes, int]:
        """The file's first ``n`` bytes (fewer when it is shorter) and its size."""
        ...

    def read_tail(self, rel: str, n: int) -> bytes:
        """The file's last ``n`` bytes (all of it when it is shorter)."""
        ...

    def stat(self, rel: str) -> FileStat:
        """The file's size and version, without reading it."""
        ...


def open_input(path: Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file; anything else raises OSError saying what it is.

    A named pipe blocks its reader until a writer comes (forever, in a build) and opening a device
    can have side effects: see :func:`dlpack._files.open_regular`.
    """
    try:
        fd = open_regular(path)
    except NotRegularFileError as exc:
        raise OSError(errno.EINVAL, f"{exc.strerror}; only regular files are packed", os.fspath(path)) from None
    return os.fdopen(fd, "rb")


@dataclass(frozen=True)
class LocalFiles:
    """The files of a local folder: each opened with :func:`open_input` (regular files only, never
    blocking on a named pipe), its size and version taken from the open descriptor."""

    root: str

    def read(self, rel: str) -> tuple[bytes, FileStat]:
        """The whole file, and its size and mtime (ns) from the descriptor it was read through."""
        with open_input(Path(self.root, rel)) as f:
            st = os.fstat(f.fileno())
            data = f.read()
        return data, FileStat(st.st_size, st.st_mtime_ns)

    def read_head(self, rel: str, n: int) -> tuple[bytes, int]:
        """The first ``n`` bytes and the file's size."""
        with open_input(Path(self.root, rel)) as f:
            head = f.read(n)
            size = os.fstat(f.fileno()).st_size
        return head, size

    def read_tail(self, rel: str, n: int) -> bytes:
        """The last ``n`` bytes."""
        with open_input(Path(self.root, rel)) as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - n))
            return f.read()

    def stat(self, rel: str) -> FileStat:
        """The size and mtime (ns) of the file (following a symbolic link, as the scan did)."""
        st = os.stat(Path(self.root, rel))
        return FileStat(st.st_size, st.st_mtime_ns)


def files_of(source: Source) -> SourceFiles:
    """How the build reads ``source``'s files: its own ``files`` when it has them, else the local
    folder ``source.root`` (every source that only lists items keeps working)."""
    files = getattr(source, "files", None)
    return files if isinstance(files, SourceFiles) else LocalFiles(os.fspath(source.root))


class _ReadAhead:
    """``files`` with the next ``ahead`` of ``rels`` being fetched by threads while the caller works
    on the current one: :meth:`read` of the next expected path takes its fetched result (bytes and
    stat, or the ``OSError`` of that file); any other call goes to ``files`` itself."""

    def __init__(self, files: SourceFiles, rels: Iterable[str], ahead: int) -> None:
        self.files = files
        self._rels = iter(rels)
        self._pool = ThreadPoolExecutor(ahead, thread_name_prefix="dlpack-read-ahead")
        self._queue: deque[tuple[str, Future[tuple[bytes, FileStat]]]] = deque()
        self._ahead = ahead
        self._fill()

    def _fill(self) -> None:
        while len(self._queue) < self._ahead:
            rel = next(self._rels, None)
            if rel is None:
                return
            self._queue.append((rel, self._pool.submit(self.files.read, rel)))

    @property
    def root(self) -> str:
        """The source's root."""
        return self.files.root

    def read(self, rel: str) -> tuple[bytes, FileStat]:
        """The fetched file when ``rel`` is the next one, else a read of its own."""
        if self._queue and self._queue[0][0] == rel:
            _, future = self._queue.popleft()
            self._fill()
            return future.result()
        return self.files.read(rel)

    def read_head(self, rel: str, n: int) -> tuple[bytes, int]:
        """The file's first bytes (not fetched ahead)."""
        return self.files.read_head(rel, n)

    def read_tail(self, rel: str, n: int) -> bytes:
        """The file's last bytes (not fetched ahead)."""
        return self.files.read_tail(rel, n)

    def stat(self, rel: str) -> FileStat:
        """The file's size and version (not fetched ahead)."""
        return self.files.stat(rel)

    def close(self) -> None:
        """Drop what was not taken and stop the threads."""
        self._queue.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def reading_ahead(files: SourceFiles, rels: Sequence[str]) -> Iterator[SourceFiles]:
    """``files`` for a loop that reads ``rels`` in order: files whose ``ahead`` attribute is above 0
    (a bucket's :class:`~dlpack.sources.remote.ObjectFiles`) are fetched that many ahead, by threads,
    while the loop decodes the current one; anything else (local files) is read as it is, no thread.
    The bytes, their order and each file's error are the same either way."""
    ahead = int(getattr(files, "ahead", 0) or 0)
    if ahead <= 0 or len(rels) < 2:
        yield files
        return
    view = _ReadAhead(files, rels, min(ahead, len(rels)))
    try:
        yield view
    finally:
        view.close()
