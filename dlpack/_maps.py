"""Read-only file maps laid end to end in one reserved address range.

A store's shard files are mapped one by one, and the kernel puts each map wherever a hole fits: in
a process that closed other maps before (another store, an earlier epoch's file), a store's shards
lie scattered over hundreds of MB of address space, and other allocations (the loader's batch
blocks) land in the gaps between them. The one-take gather over a store's shards
(:class:`~dlpack.backends.base.RowSpan`) then cannot take into such a block: NumPy judges overlap
by address ranges alone and would take into a temporary and copy it (half the speed at 64x64x3).

:func:`map_consecutive` reserves one range as large as all the files (page-rounded, no memory
committed) and maps each file into it in turn (``MAP_FIXED`` over its own reservation), so the
maps are one gap-free range that nothing else can be placed inside. The range is unmapped when the
last array that refers to it is gone, as Python's ``mmap`` objects would be.

An :class:`Arena` does the same for several arrays of one store (the images and their
augmentation variants): each array's range is carved from one reservation made for all of them,
so a batch that mixes their rows (``MixSpan``) spans no memory but theirs either.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["Arena", "huge_pages", "libc", "map_consecutive"]

_PROT_NONE, _PROT_READ = 0x0, 0x1
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED = 0x1, 0x2, 0x10
#: MAP_ANONYMOUS and MAP_NORESERVE differ between kernels; only those known here are used.
_ANON_NORESERVE = {"linux": 0x20 | 0x4000, "darwin": 0x1000 | 0x40}
#: The size of the kernel's huge pages (x86-64 and arm64 with 4 KiB pages): a file map whose start
#: is a multiple of it can be mapped by the kernel with one page-table entry per 2 MiB where the page
#: cache holds the file in 2 MiB pieces (Linux 6.x on ext4, xfs, tmpfs), instead of one per 4 KiB.
HUGE = 2 << 20
#: The most address space a file map's start is padded by to start on a huge page (never committed).
_MAX_HUGE_STEP = 1 << 26
#: Linux's MADV_HUGEPAGE: pages of a mapped file first touched through the map are read into the
#: page cache in 2 MiB pieces (and mapped so), where a ``read`` fills it in smaller ones, which the
#: kernel can then only map 4 KiB at a time (a store read once by ``read`` kept 0.6-2 % of its pages
#: in 2 MiB pieces; touched cold through such a map, 92-94 %).
_MADV_HUGEPAGE = 14


def huge_pages(m: mmap.mmap) -> None:
    """Ask the kernel to fill and map the file of ``m`` (a Python map) 2 MiB at a time where it
    can (Linux; a hint: refused or unsupported, nothing changes)."""
    advise = getattr(m, "madvise", None)
    if sys.platform.startswith("linux") and advise is not None and len(m) >= HUGE:
        try:
            advise(getattr(mmap, "MADV_HUGEPAGE", _MADV_HUGEPAGE))
        except (OSError, ValueError):
            pass


def _step(page: int, largest: int) -> int:
    """``page`` (a whole number of pages, whole rows), or its multiple that is also one of
    :data:`HUGE` where that multiple is not too large and a file (``largest`` bytes) spans a huge
    page at all: maps then start on a huge page."""
    huge = math.lcm(page, HUGE)
    return huge if huge <= _MAX_HUGE_STEP and largest >= HUGE else page


def _reserve_huge(lib: Any, anon: int, size: int) -> tuple[int, int] | None:
    """Reserve ``size`` bytes of address space (no memory) starting on a huge page: the start and
    the reservation's own address (the one to unmap), or None where the kernel refuses."""
    addr = lib.mmap(None, size + HUGE, _PROT_NONE, _MAP_PRIVATE | anon, -1, 0)
    if _failed(addr):
        return None
    return -(-addr // HUGE) * HUGE, addr


@functools.cache  # find_library runs ldconfig; once per process is enough
def libc() -> Any:
    """The C library with ``mmap``, ``munmap`` and ``mincore`` typed, or None where there is none."""
    if not (sys.platform.startswith("linux") or sys.platform == "darwin" or "bsd" in sys.platform):
        return None
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        lib.mmap.restype = ctypes.c_void_p
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.munmap.restype = ctypes.c_int
        lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        lib.mincore.restype = ctypes.c_int
        lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


def _failed(addr: int | None) -> bool:
    return addr is None or addr == 2**64 - 1 or addr == -1


class _Range:
    """One reserved address range, seen by NumPy through ``__array_interface__``; unmapped when
    garbage-collected, that is after the last array made from it (each keeps it as its base)."""

    def __init__(self, lib: Any, addr: int, size: int, own: tuple[int, int]) -> None:
        self._munmap, self._own = lib.munmap, own  # own: the whole reservation, from before its start was rounded
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (addr, True), "version": 3}

    def __del__(self) -> None:
        self._munmap(*self._own)


class _Slot:
    """An array's range carved from an :class:`Arena`: when garbage-collected its file maps are
    replaced by a reservation again (no unmap: nothing else may move into the arena), and the
    arena lives at least as long as it."""

    def __init__(self, arena: Arena, addr: int, size: int) -> None:
        self._arena, self._addr, self._size = arena, addr, size
        self.__array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (addr, True), "version": 3}

    def __del__(self) -> None:
        self._arena._reserve(self._addr, self._size)


class Arena:
    """One address range reserved for the maps of ``members`` arrays of equal size (a store's images
    and their variants), reserved when the first array is mapped: ``members`` times its size, plus an
    eighth (variants compressed differently may be larger). An array that no longer fits (larger
    than the rest, or mapped again after a change) gets a range of its own, as without an arena."""

    def __init__(self, members: int) -> None:
        self.members = max(1, int(members))
        self._lib = libc()
        self._base = 0
        self._size = 0
        self._own = (0, 0)
        self._next = 0
        self._anon = _kind() or 0
        self._failed = self._lib is None or not self._anon
        self._lock = threading.Lock()  # two threads mapping two arrays must never get one range

    def carve(self, size: int, step: int) -> int | None:
        """The start of ``size`` free bytes of the arena, a multiple of ``step`` bytes from its start
        (``step``: whole pages); None where there is no arena or no room left in it."""
        with self._lock:
            return self._carve(size, step)

    def _carve(self, size: int, step: int) -> int | None:
        if self._failed:
            return None
        if not self._size:
            want = -(-(size * self.members + size // 8) // step) * step
            got = _reserve_huge(self._lib, self._anon, want)
            if got is None:
                self._failed = True
                return None
            self._base, self._size, self._own = got[0], want, (got[1], want + HUGE)
        at = -(-self._next // step) * step
        if at + size > self._size:
            return None
        self._next = at + size
        return self._base + at

    def _reserve(self, addr: int, size: int) -> None:
        """Turn ``size`` bytes at ``addr`` (file maps of a dropped array) back into a reservation."""
        self._lib.mmap(addr, size, _PROT_NONE, _MAP_PRIVATE | _MAP_FIXED | self._anon, -1, 0)

    def __del__(self) -> None:
        if self._size:
            self._lib.munmap(*self._own)


def _kind() -> int | None:
    for prefix, flags in _ANON_NORESERVE.items():
        if sys.platform.startswith(prefix):
            return flags
    return None


def map_consecutive(
    sizes: Sequence[int], open_file: Callable[[int], int], align: int = 1, arena: Arena | None = None
) -> list[np.ndarray] | None:
    """Read-only uint8 arrays of ``len(sizes)`` files, ``sizes[k]`` bytes each (all > 0), mapped one
    after the other in one range, each starting a multiple of ``align`` bytes (rounded up to whole
    pages) after the first; None where this platform cannot (the caller maps them one by one).
    ``arena``: the range is carved from it where it has room (see :class:`Arena`), at a multiple of
    the same step from its start, so arrays of equal rows lie whole rows apart.

    ``open_file(k)`` gives a descriptor of file ``k`` that is ``sizes[k]`` bytes long (it checks: a
    map past a file's end faults when read); it is closed once mapped, so one is open at a time.
    An OSError when the kernel refuses a map; nothing stays mapped after any error.
    """
    lib, anon = libc(), _kind()
    if lib is None or anon is None or not sizes:
        return None
    import ctypes

    # The padding is address space only: never touched, never committed.
    page = _step(math.lcm(mmap.PAGESIZE, align), max(sizes))
    huge = page % HUGE == 0 and sys.platform.startswith("linux")
    spans = [-(-s // page) * page for s in sizes]
    total = sum(spans)
    carved = arena.carve(total, page) if arena is not None else None
    whole: _Range | _Slot
    if carved is not None and arena is not None:
        base = carved
        whole = _Slot(arena, base, total)  # a reservation again when dropped
    else:
        got = _reserve_huge(lib, anon, total)
        if got is None:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot reserve {total} bytes of address space: {os.strerror(err)}")
        base = got[0]
        whole = _Range(lib, base, total, (got[1], total + HUGE))  # unmaps the reservation and every map in it
    at = base
    starts = []
    for k, (size, span) in enumerate(zip(sizes, spans, strict=True)):
        fd = open_file(k)
        try:
            got = lib.mmap(at, size, _PROT_READ, _MAP_SHARED | _MAP_FIXED, fd, 0)
            err = ctypes.get_errno()
        finally:
            os.close(fd)
        if _failed(got) or got != at:
            raise OSError(err, f"cannot map a file of {size} bytes: {os.strerror(err)}")
        if huge and size >= HUGE:
            lib.madvise(at, size, _MADV_HUGEPAGE)  # a hint (see huge_pages): its answer changes nothing here
        starts.append(at - base)
        at += span
    arr = np.asarray(whole)
    return [arr[s : s + n] for s, n in zip(starts, sizes, strict=True)]
