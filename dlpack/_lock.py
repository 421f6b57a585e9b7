"""The build lock: an OS file lock that a build holds on its output path for its whole duration.

The kernel releases the lock when the holding process ends, however it ends, so a lock that can be
taken means no live build owns the output: a partial store found then is stale. The lock lives in a
sibling file ``.NAME.dlpack-lock`` (not in the store or the partial, which are created, renamed and
removed while the lock is held); its text names the holder for the message a second build shows.

The holder removes the lock file while still holding the lock. A process that opened the old file
just before may then lock a file no longer on disk, so every acquisition checks that the locked
file is still the one at the path, and retries otherwise.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from .errors import StoreError, StoreLockedError

__all__ = ["BuildLock", "lock_path", "partial_path", "old_path"]

# msvcrt locks byte ranges, mandatory on Windows: lock one byte far past the holder text so that
# a second process can still read who holds it.
_WINDOWS_LOCK_OFFSET = 2**30


def _sibling(out: Path, kind: str) -> Path:
    return out.parent / f".{out.name}.dlpack-{kind}"


def lock_path(out: str | os.PathLike[str]) -> Path:
    """The lock file of builds into ``out``: ``.NAME.dlpack-lock`` next to it."""
    return _sibling(Path(out), "lock")


def partial_path(out: str | os.PathLike[str]) -> Path:
    """Where a build of ``out`` writes before publishing: ``.NAME.dlpack-partial`` next to it."""
    return _sibling(Path(out), "partial")


def old_path(out: str | os.PathLike[str]) -> Path:
    """Where an overwritten store waits while the new one is moved into place: ``.NAME.dlpack-old``."""
    return _sibling(Path(out), "old")


def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on ``fd`` without waiting; False when another process holds it."""
    if sys.platform == "win32":
        import msvcrt

        os.lseek(fd, _WINDOWS_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder_text() -> str:
    """Who holds the lock, as JSON: host, pid, start time and command line."""
    return json.dumps(
        {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv) or sys.executable,
        },
        sort_keys=True,
    )


def _describe_holder(path: Path) -> str:
    """The holder recorded in a lock file, in words."""
    try:
        info: Any = json.loads(path.read_text(encoding="utf-8"))
        host, pid, since, command = info["host"], info["pid"], info["since"], info["command"]
    except (OSError, ValueError, KeyError, TypeError):
        # The holder took the lock a moment ago and has not written its name yet.
        return "another process (it has not recorded its name yet)"
    return f"pid {pid} on host {host} since {since} (command: {command})"


class BuildLock:
    """Exclusive, non-blocking lock on builds into ``out``; a context manager.

    Raises :class:`~dlpack.errors.StoreLockedError` at once when another process holds it.
    """

    def __init__(self, out: str | os.PathLike[str]) -> None:
        self.out = Path(out)
        self.path = lock_path(out)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock, or raise :class:`~dlpack.errors.StoreLockedError` naming the holder."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this BuildLock")
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StoreError(f"cannot create the build lock {self.path}: {exc.strerror or exc}") from exc
            if not _try_lock(fd):
                os.close(fd)
                raise StoreLockedError(
                    f"{self.out} is being built by {_describe_holder(self.path)}; lock file {self.path}. "
                    "Wait for that build to finish or stop it (the lock is released when its process ends)"
                )
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            # The previous holder removed the file between our open and our lock: lock the new one.
            os.close(fd)
        self._fd = fd
        text = _holder_text().encode("utf-8")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, text)

    def release(self) -> None:
        """Remove the lock file and release the lock (a no-op when not held)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        if sys.platform == "win32":
            # Windows cannot remove an open file: close (which unlocks) first, then remove.
            os.close(fd)
            with contextlib.suppress(OSError):
                self.path.unlink()
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(fd)

    def __enter__(self) -> BuildLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a BuildLock belongs to the process that took it and cannot be pickled")
