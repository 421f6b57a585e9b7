"""Page-cache control without root: evict files, prime them, and measure how much of them is cached.

Eviction is ``posix_fadvise(POSIX_FADV_DONTNEED)`` per file, after ``fdatasync`` (the kernel keeps
dirty pages, so a store just built would otherwise stay cached). The kernel also keeps pages that
some process still maps: close readers (unmap) before evicting. Residency is measured with
``mincore(2)`` on a fresh read-only mapping, which looks at the cache without faulting pages in.
Neither sees a cache below this kernel (a VM host's page cache, a SAN or disk cache): see
docs/bench.md.

Both are POSIX: ``ctypes`` and ``mmap`` are imported only where residency is measured, and on a
platform without ``posix_fadvise`` or ``mincore`` (Windows) :func:`evict` returns False and
:func:`resident_fraction` None, and the report says that cold runs were not cold or not verified.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .._maps import _MAP_SHARED, _PROT_READ, libc

__all__ = ["evict", "resident_fraction", "prime", "files_under"]

_PRIME_CHUNK = 4 * 2**20


def files_under(path: str | os.PathLike[str]) -> list[Path]:
    """``path`` itself if it is a file, else every regular file below it (sorted, symlinks not followed)."""
    p = Path(path)
    if p.is_file():
        return [p]
    return sorted(q for q in p.rglob("*") if q.is_file() and not q.is_symlink())


def evict(paths: Iterable[str | os.PathLike[str]]) -> bool:
    """Ask the kernel to drop every file in ``paths`` from the page cache.

    Returns True when the advice was accepted for every file; False when the platform has no
    ``posix_fadvise`` or a file could not be opened or advised. True does not prove the pages are
    gone (mapped or locked pages stay, tmpfs files live in memory): check :func:`resident_fraction`.
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return False
    ok = True
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            ok = False
            continue
        try:
            try:
                os.fdatasync(fd)
            except OSError:
                pass  # some file systems refuse sync on a read-only descriptor; clean pages still go
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            ok = False
        finally:
            os.close(fd)
    return ok


def prime(paths: Iterable[str | os.PathLike[str]]) -> int:
    """Read every file in ``paths`` once, so its pages are cached; returns the bytes read."""
    buf = bytearray(_PRIME_CHUNK)
    view = memoryview(buf)
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(view)
                if not n:
                    break
                total += n
    return total


def _resident_pages(lib: Any, path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(resident pages, total pages) of one file, or None when it cannot be measured."""
    import ctypes
    import mmap

    try:
        size = os.path.getsize(path)
        if size == 0:
            return (0, 0)
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        addr = lib.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if lib.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return None
            # Bit 0 is "resident" on Linux, macOS and the BSDs; other bits mean other things.
            resident = int(np.count_nonzero(np.frombuffer(memoryview(vec).cast("B"), dtype=np.uint8) & 1))
            return (resident, pages)
        finally:
            lib.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def resident_fraction(paths: Iterable[str | os.PathLike[str]]) -> float | None:
    """The fraction of the pages of ``paths`` now in this kernel's page cache (0..1).

    None when it cannot be measured: no ``mincore`` on this platform, a file that cannot be
    mapped, or no bytes at all.
    """
    lib = libc()
    if lib is None:
        return None
    resident = total = 0
    for path in paths:
        counts = _resident_pages(lib, path)
        if counts is None:
            return None
        resident += counts[0]
        total += counts[1]
    return resident / total if total else None
