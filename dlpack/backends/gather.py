"""Copying rows out of a store's memory-mapped shards into a batch: the hot path of every read.

One ``np.take`` over a map where it can, piece by piece where rows are large; destinations placed
so that no load waits on an unrelated store (see the constants).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import OptionError

_SCRATCH = threading.local()
#: Rows at least this large are copied one by one when a batch spans several shards: the interpreter's
#: microsecond per row is then under 2 % of the copy, and a second pass through a scratch buffer
#: (which a 25 MB batch of 512x512x3 images does not fit in the cache) would cost more.
_LARGE_ROW = 64 * 2**10
_PAGE = 4096
#: Where a copy's destination sits in its page relative to its source: a destination a few bytes past
#: its source modulo 4096 (``np.empty`` gives 16) makes every load wait on an unrelated store
#: (4K aliasing); a 64x64x3 gather from a shard's map ran 5x slower into such a buffer than here.
_ALIAS_GAP = 2048
#: :class:`RowSpan` copies a row as this many equal pieces at most (more cost more than the span saves).
_SPAN_PIECES = 8
#: A :class:`RowSpan` of whole rows and at most this many rows keeps each row's place in a table (8
#: bytes a row, 32 MiB at most): one small take finds a batch's rows, where the arithmetic over
#: shards and its range check cost 25 us a batch of 32, as much as copying 32 64x64x3 images.
_LOOKUP_ROWS = 2**22


def _scratch(shape: tuple[int, ...], dtype: np.dtype[Any], near: int) -> np.ndarray:
    """A per-thread buffer of at least ``shape[0]`` rows placed :data:`_ALIAS_GAP` bytes past address
    ``near`` (the source) in its page (a fresh multi-MB array per batch costs its page faults); kept
    for the thread's life, sized by the largest batch seen."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    got: np.ndarray | None = getattr(_SCRATCH, "block", None)
    if got is None or len(got) < nbytes + _PAGE:
        got = _SCRATCH.block = np.empty(nbytes + _PAGE, dtype=np.uint8)
    at = (near + _ALIAS_GAP - got.__array_interface__["data"][0]) % _PAGE
    buf: np.ndarray = got[at : at + nbytes].view(dtype).reshape(shape)
    return buf


def _start(view: np.ndarray) -> int:
    return int(view.__array_interface__["data"][0])


class _Span:
    """What NumPy sees of an address range: ``__array_interface__``, and the views it must outlive."""

    def __init__(self, interface: dict[str, Any], keep: Sequence[np.ndarray]) -> None:
        self.__array_interface__ = interface
        self.keep = keep


def _units(views: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, int] | None:
    """One byte array over C-contiguous ``views`` of one dtype and row shape, in units of the largest
    piece that divides a row and every view's offset: ``(units, each view's first unit, units a
    row)``; None where a row would be copied in more than :data:`_SPAN_PIECES` pieces (in more than
    one from :data:`_LARGE_ROW` on), or the views differ."""
    like = views[0]
    rb = like[0].nbytes
    if any(v.dtype != like.dtype or v.shape[1:] != like.shape[1:] or not v.flags.c_contiguous for v in views):
        return None
    addrs = [_start(v) for v in views]
    lo = min(addrs)
    unit = math.gcd(rb, *(a - lo for a in addrs))
    if rb // unit > (1 if rb >= _LARGE_ROW else _SPAN_PIECES):
        return None
    hi = max(a + v.nbytes for a, v in zip(addrs, views, strict=True))
    face = {"shape": ((hi - lo) // unit, unit), "typestr": "|u1", "data": (lo, True), "version": 3}
    units = np.asarray(_Span(face, list(views)))
    return units, np.array([(a - lo) // unit for a in addrs], dtype=np.int64), rb // unit


class RowSpan:
    """The rows of several views (one store array's shard maps) gathered by one ``np.take``.

    A batch of small rows spans many shards (a random batch of 256 64x64x3 images touches all 8 of
    a 20,000-image store), and gathering it shard by shard needs a second pass to put the rows in
    batch order, which cost as much as the gather. Here one array covers the address range from the
    lowest view to the end of the highest, in units of ``unit`` bytes (the largest that divides the
    row size and every view's distance from the lowest); row ``j`` of view ``s`` is ``step``
    consecutive units from ``first[s] + j * step``, so the whole batch is one take straight into place.

    The range holds gaps between the maps that are not readable: the array is never used but for
    that take, always of indices checked here first, and it keeps the views (so their maps) alive.

    Other memory can lie in those gaps where the maps were made one by one (opened after an earlier
    store's were closed, they scatter over the holes those left, and new allocations land between
    them; Zarr shards are mapped end to end in one range where the platform allows, see
    :mod:`dlpack._maps`, so there are no gaps then). NumPy's ``take``
    only compares address ranges to decide whether ``out`` may overlap its input, and where it may
    it takes into a temporary array and copies that into ``out``: a fresh allocation and a second
    copy per batch (a loader's batch blocks in such gaps read 64x64x3 batches at half the speed).
    :meth:`gather` refuses such an ``out`` instead, and the caller gathers view by view.
    """

    __slots__ = ("_units", "_first", "_pieces", "_per", "_step", "_unit", "_rows", "_dtype", "_row", "_at", "_whole")

    def __init__(self, units: np.ndarray, first: np.ndarray, per: int, step: int, rows: int, like: np.ndarray) -> None:
        self._units, self._first, self._per, self._step = units, first, per, step
        self._unit, self._rows = int(units.shape[1]), rows
        self._pieces = np.arange(step, dtype=np.int64)
        self._dtype, self._row = like.dtype, like.shape[1:]
        self._at: np.ndarray | None = None  # row -> unit, for whole rows (see _LOOKUP_ROWS)
        self._whole = units
        if step == 1 and rows <= _LOOKUP_ROWS:
            # int64, as take wants its indices (int32 cost a cast per batch); the range in rows of
            # the views' shape, so the take writes straight into the batch as it is.
            self._at = np.repeat(first, per)[:rows] + np.tile(np.arange(per, dtype=np.int64), len(first))[:rows]
            self._whole = units.view(like.dtype).reshape(len(units), *like.shape[1:])

    @classmethod
    def of(cls, views: Sequence[np.ndarray], rows_per_view: int) -> RowSpan | None:
        """The span of ``views`` (row ``i`` is ``views[i // rows_per_view][i % rows_per_view]``), or
        None where one take would not pay: a single view, or rows that would be copied in more than
        :data:`_SPAN_PIECES` pieces, or in more than one when they are :data:`_LARGE_ROW` or larger
        (whole rows: the views lie a whole number of rows apart, as :mod:`dlpack._maps` places a
        Zarr store's shards)."""
        if len(views) < 2 or not len(views[0]):
            return None
        if any(len(v) != rows_per_view for v in views[:-1]) or not 0 < len(views[-1]) <= rows_per_view:
            return None
        got = _units(views)
        if got is None:
            return None
        units, first, step = got
        rows = rows_per_view * (len(views) - 1) + len(views[-1])
        return cls(units, first, rows_per_view, step, rows, views[0])

    def gather(self, idx: np.ndarray, out: np.ndarray) -> bool:
        """Rows ``idx`` (int64) into ``out[:len(idx)]`` in ``idx`` order; False (nothing written) when
        ``out`` is not a C-contiguous array of the views' dtype and row shape. An index outside the
        rows is an OptionError: it would read memory between the maps (with the table of whole
        rows, a negative index down to ``-rows`` counts from the end instead, as NumPy's)."""
        k = len(idx)
        dest = out[:k]
        if dest.dtype != self._dtype or dest.shape[1:] != self._row or not dest.flags.c_contiguous:
            return False
        if k == 0:
            return True
        if np.may_share_memory(dest, self._units):  # inside the range: NumPy would take into a copy
            return False
        if self._at is not None:
            # Every entry of the table is a stored row, so no index can read between the maps: one
            # past the rows raises here, before anything is read, and a negative one counts from
            # the end, as NumPy's do (callers pass checked indices; the check cost 2 us a batch).
            try:
                at = self._at.take(idx)
            except IndexError:
                bad = idx[(idx < -self._rows) | (idx >= self._rows)][0]
                raise OptionError(
                    f"sample index {int(bad)} is out of range for an array of {self._rows} rows"
                ) from None
            self._whole.take(at, axis=0, out=dest, mode="clip")
            return True
        into = dest.reshape(-1).view(np.uint8).reshape(-1, self._unit)
        if int(idx.min()) < 0 or int(idx.max()) >= self._rows:
            bad = idx[(idx < 0) | (idx >= self._rows)][0]
            raise OptionError(f"sample index {int(bad)} is out of range for an array of {self._rows} rows")
        shard = idx // self._per
        at = np.take(self._first, shard) + (idx - shard * self._per) * self._step
        if self._step > 1:
            at = (at[:, None] + self._pieces).reshape(-1)
        np.take(self._units, at, axis=0, out=into, mode="clip")
        return True


class MixSpan:
    """Rows of several arrays of one row shape (an image array and its augmentation variants)
    gathered by one ``np.take``, row ``i`` of array ``u`` being key ``u * n + i``.

    A batch of cached views mixes the arrays row by row; copying each row in Python costs about a
    microsecond, as much as copying a 64x64x3 image, where the originals take the batch at once.
    As :class:`RowSpan`, one array covers the address range of every array's views in units of
    the largest size dividing the row and every view's distance from the lowest, and a table finds
    each key's first unit (arithmetic over the views where the table would be large). NumPy copies
    into a temporary where ``out`` lies in that range (between the arrays' maps, each of which is
    one range of its own): :meth:`gather` then takes into a per-thread buffer beside the span and
    copies it into ``out``; it refuses an ``out`` that is rows of the arrays themselves.
    """

    __slots__ = (
        "_units", "_whole", "_at", "_first", "_base", "_per", "_step", "_pieces", "_n", "_dtype", "_row", "_ranges",
    )  # fmt: skip

    def __init__(
        self,
        units: np.ndarray,
        first: np.ndarray,
        base: np.ndarray,
        per: np.ndarray,
        step: int,
        n: int,
        like: np.ndarray,
        ranges: Sequence[tuple[int, int]] = (),
    ) -> None:
        self._units, self._first, self._base, self._per = units, first, base, per
        self._step, self._n = step, n
        self._pieces = np.arange(step, dtype=np.int64)
        self._dtype, self._row = like.dtype, like.shape[1:]
        self._whole = units.view(like.dtype).reshape(len(units), *like.shape[1:]) if step == 1 else units
        #: Each array's address range, from its first view's start to its last view's end.
        self._ranges = ranges
        self._at: np.ndarray | None = None
        if len(per) * n <= _LOOKUP_ROWS:
            keys = np.arange(len(per) * n, dtype=np.int64)
            self._at = self._units_of(keys // n, keys % n)

    @classmethod
    def of(cls, sources: Sequence[tuple[Sequence[np.ndarray], int]], n: int) -> MixSpan | None:
        """The span of arrays ``sources`` (each ``(views, rows per view)`` of ``n`` rows, as
        :meth:`RowSpan.of` takes one), or None where one take would not pay (as there: rows in more
        than :data:`_SPAN_PIECES` pieces, or in more than one from :data:`_LARGE_ROW` on)."""
        views = [v for vs, _ in sources for v in vs]
        if len(sources) < 2 or not views or not len(views[0]):
            return None
        for vs, rows in sources:
            if not vs or any(len(v) != rows for v in vs[:-1]) or sum(len(v) for v in vs) != n:
                return None
        got = _units(views)
        if got is None:
            return None
        units, first, step = got
        base = np.cumsum([0, *(len(vs) for vs, _ in sources[:-1])], dtype=np.int64)
        per = np.array([p for _, p in sources], dtype=np.int64)
        ranges = [(min(map(_start, vs)), max(_start(v) + v.nbytes for v in vs)) for vs, _ in sources]
        return cls(units, first, base, per, step, n, views[0], ranges)

    def _units_of(self, which: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """The first unit of row ``idx[k]`` of array ``which[k]``."""
        per = self._per.take(which)
        view = idx // per
        at: np.ndarray = self._first.take(self._base.take(which) + view) + (idx - view * per) * self._step
        return at

    def gather(self, which: np.ndarray, idx: np.ndarray, out: np.ndarray) -> bool:
        """Row ``idx[k]`` of array ``which[k]`` into ``out[k]`` (int64 arrays the caller checked:
        ``0 <= which < arrays``, ``0 <= idx < n``); False (nothing written) when ``out`` is not a
        C-contiguous array of the rows' dtype and shape, or is rows of the arrays themselves."""
        k = len(idx)
        dest = out[:k]
        if dest.dtype != self._dtype or dest.shape[1:] != self._row or not dest.flags.c_contiguous:
            return False
        if k == 0:
            return True
        into = dest
        if np.may_share_memory(dest, self._units):
            # ``out`` lies in a gap between the arrays' ranges (a batch block allocated after one
            # array was mapped and before the next): rows under :data:`_LARGE_ROW` are taken into
            # a buffer beside the span and copied (row by row in Python, a batch of 64x64x3 views
            # took three times the originals' time); larger ones go row by row (the caller).
            if dest[0].nbytes >= _LARGE_ROW:
                return False
            lo = _start(dest)
            hi = lo + dest.nbytes
            if any(lo < end and start < hi for start, end in self._ranges):
                return False  # within an array's own range: rows of the arrays themselves
            into = _scratch(dest.shape, dest.dtype, _start(self._units))
            if np.may_share_memory(into, self._units):
                return False  # no buffer outside the span either
        at = self._at.take(which * self._n + idx) if self._at is not None else self._units_of(which, idx)
        if self._step == 1:
            self._whole.take(at, axis=0, out=into, mode="clip")
        else:
            at = (at[:, None] + self._pieces).reshape(-1)
            np.take(self._units, at, axis=0, out=into.reshape(-1).view(np.uint8).reshape(len(at), -1), mode="clip")
        if into is not dest:
            dest[...] = into
        return True


def _no_check(idx: np.ndarray) -> None:
    """For arrays not read from maps: nothing can shrink under them."""


def gather_rows(
    views: Sequence[np.ndarray], rows_per_view: int, idx: np.ndarray, out: np.ndarray, span: RowSpan | None = None
) -> np.ndarray:
    """Rows ``idx`` (int64, already range-checked) of the raw in-memory ``views`` (row ``i`` is
    ``views[i // rows_per_view][i % rows_per_view]``) into ``out[:len(idx)]``, in ``idx`` order.

    Vectorised: one ``np.take(mode="clip")`` for a batch within one view, or through ``span`` (the
    views' :class:`RowSpan`) for small rows across views, instead of one Python copy per row (a row
    copy costs about 1 us of interpreter time, as much as copying a 64x64x3 image). ``mode="clip"``
    because the indices are checked once beforehand: ``mode="raise"`` takes a slower path (2x at
    32x32). Without a span, a batch of small rows spanning several views is gathered view by view
    into a per-thread scratch buffer in sorted order (sequential reads when the page cache is cold),
    then put in batch order by one more take of that (cache-warm) buffer; rows of :data:`_LARGE_ROW`
    or more are copied into place one by one, in sorted order. Index arrays of any length work.
    """
    k = len(idx)
    dest = out[:k]
    if k == 0:
        return out
    if len(views) == 1:
        np.take(views[0], idx, axis=0, out=dest, mode="clip")
        return out
    if span is not None and span.gather(idx, out):
        return out
    shard = idx // rows_per_view
    lo, hi = int(shard.min()), int(shard.max())
    if lo == hi:
        np.take(views[lo], idx - lo * rows_per_view, axis=0, out=dest, mode="clip")
        return out
    order = np.argsort(idx)  # grouped by view (shard = idx // rows_per_view rises with idx), sorted within
    if dest[0].nbytes >= _LARGE_ROW:  # a row copy dwarfs its interpreter cost: copy rows straight into place
        at_view, within = shard.tolist(), (idx - shard * rows_per_view).tolist()
        for j in order.tolist():
            dest[j] = views[at_view[j]][within[j]]
        return out
    counts = np.bincount(shard, minlength=hi + 1).tolist()
    local = idx[order] - shard[order] * rows_per_view
    tmp = _scratch(dest.shape, dest.dtype, _start(views[lo]))
    at = 0
    for s in range(lo, hi + 1):
        c = counts[s]
        if c:
            np.take(views[s], local[at : at + c], axis=0, out=tmp[at : at + c], mode="clip")
            at += c
    back = np.empty(k, dtype=np.int64)
    back[order] = np.arange(k, dtype=np.int64)
    np.take(tmp, back, axis=0, out=dest, mode="clip")
    return out
