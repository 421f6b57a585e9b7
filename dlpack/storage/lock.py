"""The build lock: an OS file lock that a build holds on its output path for its whole duration.

The kernel releases the lock when the holding process ends, however it ends, so a lock that can be
taken means no live build owns the output: a partial store found then is stale. The lock lives in a
sibling file ``.NAME.dlpack-lock`` (not in the store or the partial, which are created, renamed and
removed while the lock is held); its text names the holder for the message a second build shows.

The lock file is opened without following links and written only when this build created it, or
when it is recognisably a dlpack lock file (empty, or a holder record): a link, a file with other
hard links, or anyone else's file at that name is refused and left as it is.

On a file system shared by several hosts (NFS, Lustre, GPFS) the lock keeps out builds on other
hosts only where that file system carries ``flock`` locks between hosts (NFS with its lock
service, Lustre mounted with ``-o flock``, GPFS); where it keeps them only within one host (Lustre's
``localflock``, NFS mounted ``nolock``) one build per OUT is the user's rule, and the lock file names
the holding host and pid. A file system that refuses the lock outright is a
:class:`~dlpack.errors.StoreError`, never a build without a lock (docs/reliability.md).

The holder removes the lock file while still holding the lock. A process that opened the old file
just before may then lock a file no longer on disk, so every acquisition checks that the locked
file is still the one at the path, and retries otherwise.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import socket
import stat
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from ..errors import StoreError, StoreLockedError

__all__ = [
    "BuildLock",
    "sibling",
    "lock_path",
    "partial_path",
    "old_path",
    "journal_path",
    "augment_stage_path",
    "augment_journal_path",
]

# msvcrt locks byte ranges, mandatory on Windows: lock one byte far past the holder text so that
# a second process can still read who holds it.
_WINDOWS_LOCK_OFFSET = 2**30


def sibling(out: str | os.PathLike[str], kind: str) -> Path:
    """The file or folder of ``kind`` dlpack keeps for the output ``out``: ``.NAME.dlpack-KIND`` next to it."""
    p = Path(out)
    return p.parent / f".{p.name}.dlpack-{kind}"


def lock_path(out: str | os.PathLike[str]) -> Path:
    """The lock file of builds into ``out``: ``.NAME.dlpack-lock`` next to it."""
    return sibling(Path(out), "lock")


def partial_path(out: str | os.PathLike[str]) -> Path:
    """Where a build of ``out`` writes before publishing: ``.NAME.dlpack-partial`` next to it."""
    return sibling(Path(out), "partial")


def old_path(out: str | os.PathLike[str]) -> Path:
    """Where an overwritten store waits while the new one is moved into place: ``.NAME.dlpack-old``."""
    return sibling(Path(out), "old")


def journal_path(out: str | os.PathLike[str]) -> Path:
    """The journal of builds into ``out``: ``.NAME.dlpack-journal``, beside the partial store."""
    p = Path(out)
    return p.parent / f".{p.name}.dlpack-journal"


def augment_stage_path(out: str | os.PathLike[str]) -> Path:
    """Where ``dlpack augment`` prepares the next generation of a Zarr store: ``.NAME.dlpack-augment``."""
    return sibling(Path(out), "augment")


def augment_journal_path(out: str | os.PathLike[str]) -> Path:
    """The journal of ``dlpack augment`` runs on ``out``: ``.NAME.dlpack-augment-journal`` (a build's
    journal is another file, so neither ever takes the other's for its own)."""
    return sibling(Path(out), "augment-journal")


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


#: A holder record is a few hundred bytes; anything much larger was not written by dlpack.
_MAX_HOLDER = 64 * 1024
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _is_holder_text(data: bytes) -> bool:
    """Whether ``data`` is a holder record as :func:`_holder_text` writes it."""
    try:
        info = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(info, dict) and set(info) == {"host", "pid", "since", "command"}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOSPC:
        return "the disk is full (no space left on device); free some space and build again"
    return exc.strerror or str(exc)


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
        """Take the lock, or raise :class:`~dlpack.errors.StoreLockedError` naming the holder.

        Raises :class:`~dlpack.errors.StoreError` when the lock path holds something that is not a
        dlpack lock file (a link, a file with other hard links, a file of someone else's): it is left
        as it is, never truncated or written.
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this BuildLock")
        while True:
            fd, created = self._open()
            try:
                locked = _try_lock(fd)
            except OSError as exc:
                os.close(fd)
                if created:
                    with contextlib.suppress(OSError):
                        self.path.unlink()
                raise self._no_locks(exc) from exc
            if not locked:
                os.close(fd)
                raise StoreLockedError(
                    f"{self.out} is being built by {_describe_holder(self.path)}; lock file {self.path}. "
                    "Wait for that build to finish or stop it (the lock is released when its process ends)"
                )
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            # The previous holder removed the file between our open and our lock: lock the new one.
            os.close(fd)
        self._fd = fd
        ours = created
        try:
            if not created:
                self._check_stale(fd)
                ours = True
            os.lseek(fd, 0, os.SEEK_SET)
            _write_all(fd, _holder_text().encode("utf-8"))
        except BaseException as exc:
            # Locked but not usable (a disk full, a file that is not ours): leave behind no lock file
            # of ours, and nothing of someone else's changed.
            self._fd = None
            if ours:
                with contextlib.suppress(OSError):
                    self.path.unlink()
            os.close(fd)
            if isinstance(exc, OSError) and not isinstance(exc, StoreError):
                raise StoreError(f"cannot write the build lock {self.path}: {_os_reason(exc)}") from exc
            raise

    def _open(self) -> tuple[int, bool]:
        """Open the lock file without following a link: (fd, whether this call created it)."""
        flags = os.O_RDWR | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
        for _attempt in range(100):
            try:
                return os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                pass
            except OSError as exc:
                raise StoreError(f"cannot create the build lock {self.path}: {_os_reason(exc)}") from exc
            try:
                fd = os.open(self.path, flags)
            except FileNotFoundError:
                continue  # its holder removed it just now: create it again
            except OSError as exc:
                if exc.errno == errno.ELOOP or self.path.is_symlink():
                    raise self._not_a_lock("it is a symbolic link") from exc
                raise StoreError(f"cannot open the build lock {self.path}: {_os_reason(exc)}") from exc
            st = os.fstat(fd)
            why = (
                "it is not a regular file" if not stat.S_ISREG(st.st_mode)
                else f"it has {st.st_nlink} hard links" if st.st_nlink != 1
                else None
            )  # fmt: skip
            if why is None:
                return fd, False
            os.close(fd)
            raise self._not_a_lock(why)
        raise StoreError(f"cannot create the build lock {self.path}: it keeps appearing and disappearing")

    def _check_stale(self, fd: int) -> None:
        """Refuse a stale lock file (one this process did not create) unless it is recognisably dlpack's:
        empty (its holder was killed before writing its name) or holding a holder record."""
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.read(fd, _MAX_HOLDER + 1)
        if data and (len(data) > _MAX_HOLDER or not _is_holder_text(data)):
            raise self._not_a_lock("it does not hold a dlpack lock record")
        os.ftruncate(fd, 0)

    def _no_locks(self, exc: OSError) -> StoreError:
        """A file system that takes no file locks (an NFS mount without its lock service, Lustre
        mounted without ``flock``): no build there can be kept from another, so none starts."""
        return StoreError(
            f"cannot lock {self.path}: its file system does not take file locks ({_os_reason(exc)}), so "
            f"nothing would keep a second build out of {self.out}; mount it with lock support (NFS: with "
            "its lock service, Lustre: with -o flock), or build onto a local disk and copy the store"
        )

    def _not_a_lock(self, why: str) -> StoreError:
        return StoreError(
            f"{self.path} is where builds of {self.out} keep their lock, but it is not a dlpack lock file ({why}); "
            "it was left untouched: remove or rename it, then build again"
        )

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
