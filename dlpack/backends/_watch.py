"""Telling in one system call that no mapped store file was written since it was mapped (Linux inotify).

A reader checks before each copy out of its maps that no file it touches shrank under the map
(touching a page past a file's end is a SIGBUS): a ``stat`` per shard a batch touches. With many
arrays (cached views: the originals and K variant arrays) or small shards that is tens of ``stat``
calls a batch. Here each mapped file gets an inotify watch for writes, truncation and attribute
changes; a batch then reads the process's one inotify descriptor (non-blocking: nothing to read is
the common case) and only the files that had an event are looked at again, by ``stat`` as before.

The watch is only a shortcut: where inotify is missing (not Linux), its watches run out, its
queue overflowed, or the process is a fork of the one that made the watches (a fork shares the
descriptor's queue with its parent, so an event read by one is lost to the other), every file is
looked at by ``stat``, as without it.
"""

from __future__ import annotations

import array
import ctypes
import os
import struct
import threading
from typing import Any

__all__ = ["WATCH", "FileWatch"]

_IN_MODIFY, _IN_ATTRIB, _IN_CLOSE_WRITE = 0x2, 0x4, 0x8
_IN_Q_OVERFLOW, _IN_IGNORED = 0x4000, 0x8000
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_MASK = _IN_MODIFY | _IN_ATTRIB | _IN_CLOSE_WRITE
_EVENT = struct.Struct("iIII")
try:  # POSIX only: elsewhere there is no inotify either
    import fcntl
    import termios
except ImportError:  # pragma: no cover - not POSIX
    fcntl = termios = None  # type: ignore[assignment]  # wd, mask, cookie, len (then len bytes of name)


class FileWatch:
    """One inotify descriptor per process, made on first use; files watched by reference count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._fd = -1
        self._libc: Any = None
        self._counts: dict[int, int] = {}
        #: Watches that had an event since they were made (their files are looked at by stat from then on).
        self._changed: set[int] = set()
        self._lost = False  # the queue overflowed: any file may have changed
        self._pending = array.array("i", [0])  # FIONREAD's answer: bytes queued

    def _ready(self) -> bool:
        """A descriptor of this process (made now if none); False where inotify cannot be used."""
        if self._pid == os.getpid():
            return self._fd >= 0
        self._pid, self._fd, self._counts, self._changed, self._lost = os.getpid(), -1, {}, set(), False
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = int(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
        except (OSError, AttributeError):
            return False
        if fcntl is None:
            return False
        if fd >= 0:
            self._libc, self._fd = libc, fd
        return fd >= 0

    def watch(self, path: str) -> tuple[int, int] | None:
        """``(process id, watch)`` of ``path``'s file, or None where it cannot be watched."""
        with self._lock:
            if not self._ready():
                return None
            wd = int(self._libc.inotify_add_watch(self._fd, os.fsencode(path), _MASK))
            if wd < 0:  # out of watches (ENOSPC), or the file is gone
                return None
            self._counts[wd] = self._counts.get(wd, 0) + 1
            return self._pid, wd

    def unwatch(self, token: tuple[int, int]) -> None:
        """Drop one reference to a watch of :meth:`watch` (the watch goes with its last)."""
        pid, wd = token
        with self._lock:
            if pid != self._pid or self._fd < 0 or wd not in self._counts:
                return
            self._counts[wd] -= 1
            if not self._counts[wd]:
                del self._counts[wd]
                self._changed.discard(wd)
                self._libc.inotify_rm_watch(self._fd, wd)

    def changed(self, pid: int) -> set[int] | None:
        """The watches (made by process ``pid``) whose files had an event since they were made, after
        reading what is queued; None where that cannot be told (another process's watches, an
        overflowed queue): every file must then be looked at."""
        with self._lock:
            if pid != self._pid or pid != os.getpid() or self._fd < 0 or self._lost:
                return None
            while True:
                try:  # nothing queued, the common case: asked without a read that fails (an exception costs more)
                    fcntl.ioctl(self._fd, termios.FIONREAD, self._pending, True)
                    data = os.read(self._fd, 65536) if self._pending[0] > 0 else b""
                except BlockingIOError:
                    data = b""
                except OSError:
                    self._lost = True
                    return None
                if not data:
                    break
                at = 0
                while at + _EVENT.size <= len(data):
                    wd, mask, _, size = _EVENT.unpack_from(data, at)
                    at += _EVENT.size + size
                    if mask & _IN_Q_OVERFLOW:
                        self._lost = True
                        return None
                    if not mask & _IN_IGNORED:  # a watch removed: no news of its file
                        self._changed.add(wd)
            return self._changed


#: The process's watch (each process makes its own descriptor on first use).
WATCH = FileWatch()
