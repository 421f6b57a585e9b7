"""Per-image columns that a large build keeps in a file instead of in memory.

A build lists, probes and plans every image before it writes one: a million small images give a
million paths, headers and codes. Held as NumPy columns they cost about 70 bytes per image for
the whole build, so its peak memory grew with the image count. A :class:`Column` keeps its rows
in memory while they are few (:data:`SPILL_BYTES`), then moves them to an anonymous file (one
that has no name, so nothing is left behind however the process ends) and reads them back a part
at a time. Readers walk the rows in order, so each :data:`PART` rows are read once.

A column is filled either by appending rows in order, or (made with its ``length``) by writing
rows at any position (:meth:`Column.write`), as a build's per-sample records are when its blocks
land out of order; rows never written read as zeros.

The files go where :func:`spilling_to` says (a build puts them beside its output, on the disk the
store is written to), else into the system's temporary folder.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import tempfile
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from ..errors import StoreError

__all__ = ["Column", "PART", "SPILL_BYTES", "spilling_to", "give_back_freed"]

#: A column's bytes kept in memory before it moves to a file: 1 MiB (a build of 40,000 images
#: keeps its paths in memory; a build of 300,000 spills every column), so the columns of a build
#: hold a few MiB in memory whatever its count.
SPILL_BYTES = 1 << 20

#: Rows read back from a file at once (and the rows a reader's cache holds): 65,536 rows of the
#: widest column (two 8-byte integers) are 1 MiB.
PART = 65536

_where: contextvars.ContextVar[str | None] = contextvars.ContextVar("dlpack_spill_dir", default=None)


@contextlib.contextmanager
def spilling_to(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Columns made inside this block spill into ``folder`` (it must exist)."""
    token = _where.set(os.fspath(folder))
    try:
        yield
    finally:
        _where.reset(token)


def _anonymous_file(folder: str | None) -> BinaryIO:
    where = folder or tempfile.gettempdir()
    try:
        return tempfile.TemporaryFile(dir=where)
    except OSError as exc:
        raise StoreError(
            f"cannot make a file in {where} for the build's per-image records: {exc.strerror or exc}; "
            "make room there or build into another folder"
        ) from exc


class Column:
    """Rows of one dtype and row shape, appended in order or written by position, read back by slices.

    In memory until they exceed :data:`SPILL_BYTES`, then in an anonymous file made in the folder
    :func:`spilling_to` names where the column was made. ``length`` rows (zeros) exist from the
    start, for :meth:`write`; ``spill`` puts the rows in a file from the first one (a column known
    to be large), ``in_memory`` never (a small column that travels between processes).
    """

    __slots__ = ("dtype", "row", "_n", "_parts", "_file", "_where", "_part", "_part_at", "_in_memory")

    def __init__(
        self, dtype: Any, row: tuple[int, ...] = (), *, length: int = 0, spill: bool = False, in_memory: bool = False
    ) -> None:
        self.dtype = np.dtype(dtype)
        self.row = tuple(row)
        self._n = length
        self._in_memory = in_memory
        self._where = _where.get()
        big = not in_memory and (spill or length * self.row_nbytes > SPILL_BYTES)
        self._file: BinaryIO | None = _anonymous_file(self._where) if big else None
        self._parts: list[np.ndarray] = []
        if self._file is not None and length:
            try:
                self._file.truncate(length * self.row_nbytes)  # sparse: unwritten rows read as zeros
            except OSError as exc:
                raise self._failed(exc) from exc
        elif length:
            self._parts.append(np.zeros((length, *self.row), dtype=self.dtype))
        #: the part of rows last read (its first row in ``_part_at``), for :meth:`at`
        self._part: np.ndarray | None = None
        self._part_at = -1

    @classmethod
    def of(cls, values: Any, dtype: Any, row: tuple[int, ...] = ()) -> Column:
        """A column holding ``values`` (anything NumPy takes as rows of ``dtype``)."""
        col = cls(dtype, row)
        col.append(values)
        return col

    @property
    def shape(self) -> tuple[int, ...]:
        """``(rows, *row)``, as NumPy's."""
        return (self._n, *self.row)

    @property
    def ndim(self) -> int:
        """1 plus the row's dimensions."""
        return 1 + len(self.row)

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row."""
        return int(self.dtype.itemsize * int(np.prod(self.row, dtype=np.int64)))

    @property
    def spilled(self) -> bool:
        """Whether the rows are in a file."""
        return self._file is not None

    def __len__(self) -> int:
        return self._n

    def append(self, rows: Any) -> None:
        """Add ``rows`` after the last row."""
        data = np.ascontiguousarray(np.asarray(rows, dtype=self.dtype).reshape(-1, *self.row))
        if not len(data):
            return
        if self._file is None and not self._in_memory and (self._n + len(data)) * self.row_nbytes > SPILL_BYTES:
            self._file = _anonymous_file(self._where)
            held, self._parts = self._parts, []
            at = 0
            for part in held:
                self._write(at, part)
                at += len(part)
        if self._file is None:
            self._parts.append(data)
        else:
            self._write(self._n, data)
        self._n += len(data)
        self._part, self._part_at = None, -1

    def write(self, start: int, rows: Any) -> None:
        """Rows ``start .. start + len(rows)``, in place of those there (all within the column's length)."""
        data = np.ascontiguousarray(np.asarray(rows, dtype=self.dtype).reshape(-1, *self.row))
        if start < 0 or start + len(data) > self._n:
            raise IndexError(f"rows {start} .. {start + len(data)} of a column of {self._n}")
        if self._file is None:
            self._whole()[start : start + len(data)] = data
        elif len(data):
            self._write(start, data)
        self._part, self._part_at = None, -1

    def _whole(self) -> np.ndarray:
        """The rows in memory as one array."""
        if len(self._parts) > 1:
            self._parts = [np.concatenate(self._parts)]
        if not self._parts:
            self._parts = [np.zeros((0, *self.row), dtype=self.dtype)]
        return self._parts[0]

    def _write(self, start: int, data: np.ndarray) -> None:
        """``data`` into the file from row ``start``."""
        assert self._file is not None
        view = data.data.cast("B")
        at = start * self.row_nbytes
        try:
            while view:  # a regular file writes short only when full; the next call then says why
                done = os.pwrite(self._file.fileno(), view, at)
                view, at = view[done:], at + done
        except OSError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: OSError) -> StoreError:
        where = self._where or tempfile.gettempdir()
        return StoreError(
            f"cannot write the build's per-image records in {where}: {exc.strerror or exc}; "
            "make room there or build into another folder"
        )

    def read(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start .. stop`` (clipped to the column): a view of the rows in memory, a new array from a file."""
        start, stop = max(0, start), max(0, min(stop, self._n))
        stop = max(start, stop)
        if self._file is None:
            return self._whole()[start:stop]
        size = self.row_nbytes
        want = (stop - start) * size
        data = os.pread(self._file.fileno(), want, start * size) if want else b""
        if len(data) != want:  # a regular file reads short only at its end
            raise StoreError(f"the build's per-image records end early ({len(data)} of {want} bytes)")
        return np.frombuffer(bytearray(data), dtype=self.dtype).reshape(stop - start, *self.row)

    def __getitem__(self, k: slice) -> np.ndarray:
        if not isinstance(k, slice) or k.step not in (None, 1):
            raise TypeError(f"a column is read by a plain slice, got {k!r}")
        start, stop, _ = k.indices(self._n)
        return self.read(start, stop)

    def at(self, k: int) -> Any:
        """Row ``k`` (``0 <= k < len``), from a cached part of :data:`PART` rows: cheap when read in order."""
        first = k - k % PART
        if first != self._part_at:
            self._part, self._part_at = self.read(first, first + PART), first
        assert self._part is not None
        return self._part[k - first]

    def parts(self, step: int = PART) -> Iterator[np.ndarray]:
        """Every row, ``step`` rows at a time."""
        for a in range(0, self._n, step):
            yield self.read(a, a + step)

    def take(self, idx: Any) -> np.ndarray:
        """Rows at the ascending positions ``idx`` (a range or integer array), read a part at a time."""
        if isinstance(idx, range) and idx.step == 1:
            return np.array(self.read(idx.start, idx.stop))
        where = np.asarray(idx, dtype=np.int64).reshape(-1)
        out = np.empty((len(where), *self.row), dtype=self.dtype)
        bounds = np.searchsorted(where, np.arange(0, self._n + PART, PART))
        for p in range(len(bounds) - 1):
            a, b = int(bounds[p]), int(bounds[p + 1])
            if a < b:
                out[a:b] = self.read(p * PART, (p + 1) * PART)[where[a:b] - p * PART]
        return out

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = np.array(self.read(0, self._n))
        return whole if dtype is None else whole.astype(dtype)

    def tobytes(self) -> bytes:
        """Every row's bytes, in order (as NumPy's ``tobytes`` of the whole column)."""
        return np.asarray(self).tobytes()

    def close(self) -> None:
        """Give the file back now (it goes by itself when the column is collected)."""
        if self._file is not None:
            self._file.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # A spilled column travels as its rows (its file is this process's).
        return (_rebuilt, (np.asarray(self), self.dtype.str, self.row, self._in_memory))


def _rebuilt(rows: np.ndarray, dtype: str, row: tuple[int, ...], in_memory: bool) -> Column:
    col = Column(dtype, row, in_memory=in_memory)
    col.append(rows)
    return col


def give_back_freed() -> None:
    """Return the memory a stage freed to the system, where the C library keeps it for reuse.

    glibc keeps freed heap memory in the process: a scan of a million paths leaves about 20 MiB
    of it, which the build's later stages (whose large blocks are mapped, not taken from the heap)
    never reuse, so it stayed in the peak. ``malloc_trim`` hands it back; elsewhere this does nothing.
    """
    from .._maps import libc

    lib = libc()
    trim = getattr(lib, "malloc_trim", None) if lib is not None else None
    if trim is not None:
        trim(0)
