"""Opening files that may not be what their name says: regular files only, never blocking.

A named pipe blocks its reader until a writer comes (forever, for a build or a ``verify``), and
opening a device can have side effects. Every file dlpack reads, an input image or a file of a
store, is opened here: its kind is checked before the open and again on the open descriptor
(``O_NONBLOCK`` keeps that open from blocking), in case the path was swapped in between.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator

from .errors import OptionError, StoreError

__all__ = [
    "FileTooLargeError",
    "NotRegularFileError",
    "file_kind",
    "fsync_dir",
    "irregular_entries",
    "open_regular",
    "read_regular",
    "refuse_url",
    "writing",
]

_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symbolic link",
}
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


class NotRegularFileError(OSError):
    """A path that is not a regular file; ``str()`` says what it is (the caller names the path)."""

    def __init__(self, kind: str, path: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", path)
        self.kind = kind

    def __str__(self) -> str:
        return str(self.strerror)


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` is, in words ("a named pipe", ...)."""
    return "a regular file" if stat.S_ISREG(mode) else _KINDS.get(stat.S_IFMT(mode), "not a plain file")


def _accepted(mode: int, pipes: bool) -> bool:
    return stat.S_ISREG(mode) or (pipes and stat.S_ISFIFO(mode))


def open_regular(
    path: str | os.PathLike[str], *, dir_fd: int | None = None, follow_symlinks: bool = True, pipes: bool = False
) -> int:
    """A read-only descriptor on ``path`` (relative to ``dir_fd`` when given), if it is a regular file.

    Raises ``FileNotFoundError`` as ``os.open`` does, :class:`NotRegularFileError` for anything
    that is not a regular file (a symbolic link too, when ``follow_symlinks`` is false), and other
    ``OSError`` for what the system refuses. With ``pipes`` a pipe is accepted too; its descriptor
    is non-blocking (see :func:`read_regular`).
    """
    shown = os.fspath(path)
    mode = os.stat(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks).st_mode
    if not _accepted(mode, pipes):
        raise NotRegularFileError(file_kind(mode), shown)
    flags = _FLAGS | (0 if follow_symlinks else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:  # swapped for a link after the check
            raise NotRegularFileError("a symbolic link", shown) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not _accepted(mode, pipes):
            raise NotRegularFileError(file_kind(mode), shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


class FileTooLargeError(OSError):
    """A file larger than its reader's limit; ``str()`` says both sizes (the caller names the path)."""

    def __init__(self, limit: int, path: str, size: int | None = None) -> None:
        got = f"{size:,} bytes" if size is not None else "more"
        super().__init__(errno.EFBIG, f"too large to read: {got}, the limit is {limit:,} bytes", path)

    def __str__(self) -> str:
        return str(self.strerror)


def read_regular(
    path: str | os.PathLike[str],
    *,
    dir_fd: int | None = None,
    follow_symlinks: bool = True,
    limit: int | None = None,
    pipes: bool = False,
) -> bytes:
    """The bytes of regular file ``path`` (see :func:`open_regular`), at most ``limit`` of them.

    With ``pipes``, a pipe is read too, as ``<(command)`` gives one: what its writer wrote until
    it closed. A pipe nothing has been written to and no writer holds (a forgotten ``mkfifo``)
    is :class:`NotRegularFileError` at once rather than a wait for a writer that never comes.
    More than ``limit`` bytes is :class:`FileTooLargeError`, before the read for a regular file.
    """
    fd = open_regular(path, dir_fd=dir_fd, follow_symlinks=follow_symlinks, pipes=pipes)
    shown = os.fspath(path)
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if limit is not None and stat.S_ISREG(st.st_mode) and st.st_size > limit:
            raise FileTooLargeError(limit, shown, st.st_size)
        if limit is None and not stat.S_ISFIFO(st.st_mode):
            return f.readall()
        chunks: list[bytes] = []
        if stat.S_ISFIFO(st.st_mode):
            try:
                first = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer holds it and has not written yet: wait for it
                first = None
            if first == b"":
                raise NotRegularFileError("a named pipe that nothing writes to", shown)
            os.set_blocking(fd, True)
            chunks.append(first or b"")
        total = len(chunks[0]) if chunks else 0
        while limit is None or total <= limit:
            chunk = os.read(fd, 1 << 24 if limit is None else min(1 << 24, limit + 1 - total))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            total += len(chunk)
        raise FileTooLargeError(limit, shown)


def irregular_entries(path: str | os.PathLike[str], limit: int = 3) -> list[str]:
    """Up to ``limit`` entries of folder ``path`` (not below it) that are neither regular files nor
    folders, as "NAME is a named pipe": why a folder that may be a store is not recognised."""
    found = []
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(f"{entry.path} is {file_kind(mode)}")
                if len(found) == limit:
                    break
    return sorted(found)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a new directory entry durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: errno values that mean the file system has no room left for a write.
NO_SPACE = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a full disk while writing ``path`` into a :class:`~dlpack.errors.StoreError` naming it.

    The OS error of a full disk names no file ("[Errno 28] No space left on device"): which store
    could not be written, and what to do, is said here.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in NO_SPACE or isinstance(exc, StoreError):
            raise
        raise StoreError(
            f"cannot write {os.fspath(path)}: the disk is full (no space left on device); "
            "free some space and run the command again"
        ) from exc


#: ``scheme://rest``: a URL, never a local path (Python would make ``s3:`` a folder of the current one).
URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$", re.DOTALL)


def refuse_url(path: object, what: str, instead: str | None = None) -> None:
    """Refuse a URL where a local path is read or written, before anything is made (``instead``:
    what to do instead, when the caller knows better than the general advice).

    ``s3://bucket/x.zarr`` as a path is a folder ``s3:`` in the current one: writing there would
    say "done" and leave the bucket empty, and reading it would open that folder.
    """
    if isinstance(path, (str, os.PathLike)) and not isinstance(path, bytes):
        text = os.fspath(path)
        if isinstance(text, str) and URL.match(text):
            raise OptionError(
                f"{what} {text!r} is a URL: "
                + (
                    instead
                    or "this version of dlpack reads and writes local paths only; give a local path (a bucket "
                    "mounted as a folder works), or copy the store to local disk first"
                )
            )
