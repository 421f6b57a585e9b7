"""The one interface every store backend implements.

A store is a group of named per-sample arrays (:class:`~dlpack.manifest.ArraySpec`) plus a
manifest written last. ``images`` is one of those arrays; ``labels``, ``checksum``, masks, boxes and
augmented variants are others, written and read the same way:

- :class:`StoreWriter` creates arrays and streams them in blocks by sample index
  (``write_block(name, start, values)``), then ``commit(manifest)`` writes the manifest last.
- :class:`StoreReader` gathers samples of any array (``read_into(name, indices, out)``,
  ``read(name, index)``).

Both open with h5py's mode letters: ``r`` read only, ``r+`` read/write an existing store, ``a``
read/write, creating the store if missing, ``w-`` create, failing if it exists. A
:class:`Backend` is a registry entry; the registry (:mod:`dlpack.backends`) routes formats by
name and suffix and checks capability flags in one place.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import shutil
import threading
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, cast

import numpy as np

from .. import schema
from ..errors import OptionError, StoreError
from ..manifest import ArraySpec, Manifest, sha256_hex, store_generation
from ..ragged import RaggedBatch

__all__ = [
    "ArrayAccess", "ArrayChange", "ArraySpec", "Backend", "Mode", "SourceList", "StoreReader", "StoreWriter", "DEFAULT_SHARD_BYTES",
]  # fmt: skip

Mode = Literal["r", "r+", "a", "w-"]
WRITE_MODES: tuple[str, ...] = ("r+", "a", "w-")
#: "Tens of MB per shard" keeps a dataset at a few hundred files (docs/format.md).
DEFAULT_SHARD_BYTES = 32 * 2**20
#: Arrays whose samples are smaller than this are read whole once and indexed in memory.
_SMALL_SAMPLE = 4096
_SMALL_ARRAY = 64 * 2**20
#: Attribute of every stored array's metadata (Zarr ``zarr.json`` attributes, HDF5 dataset
#: attribute): the SHA-256 of its bytes once committed, "" while it is being written.
DIGEST_ATTR = "dlpack_sha256"
#: :meth:`StoreReader.read_into_from` over arrays it cannot read in one pass.
_NO_PLAN = object()
#: Rows hashed per read when checksumming a whole array (bounded memory).
_HASH_BYTES = 32 * 2**20


def array_digest(read_rows: Any, rows: int, row_nbytes: int, dtype: str) -> str:
    """SHA-256 hex of a stored array's bytes (C order, little-endian), read in bounded blocks."""
    h = hashlib.sha256()
    step = max(1, _HASH_BYTES // max(1, row_nbytes))
    le = np.dtype(dtype).newbyteorder("<")
    for start in range(0, rows, step):
        block = np.ascontiguousarray(read_rows(start, min(rows, start + step)), dtype=le)
        h.update(block.data.cast("B") if block.size else b"")
    return h.hexdigest()


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


class _Span:
    """What NumPy sees of an address range: ``__array_interface__``, and the views it must outlive."""

    def __init__(self, interface: dict[str, Any], keep: Sequence[np.ndarray]) -> None:
        self.__array_interface__ = interface
        self.keep = keep


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
        like = views[0]
        rb = like[0].nbytes
        if any(v.dtype != like.dtype or v.shape[1:] != like.shape[1:] or not v.flags.c_contiguous for v in views):
            return None
        if any(len(v) != rows_per_view for v in views[:-1]) or not 0 < len(views[-1]) <= rows_per_view:
            return None
        addrs = [int(v.__array_interface__["data"][0]) for v in views]
        lo = min(addrs)
        unit = math.gcd(rb, *(a - lo for a in addrs))
        if rb // unit > (1 if rb >= _LARGE_ROW else _SPAN_PIECES):
            return None
        hi = max(a + v.nbytes for a, v in zip(addrs, views, strict=True))
        face = {"shape": ((hi - lo) // unit, unit), "typestr": "|u1", "data": (lo, True), "version": 3}
        units = np.asarray(_Span(face, list(views)))
        first = np.array([(a - lo) // unit for a in addrs], dtype=np.int64)
        rows = rows_per_view * (len(views) - 1) + len(views[-1])
        return cls(units, first, rows_per_view, rb // unit, rows, like)

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
    tmp = _scratch(dest.shape, dest.dtype, int(views[lo].__array_interface__["data"][0]))
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


def checked_positions(idx: np.ndarray, n: int, where: object) -> None:
    """Refuse indices outside ``0..n-1`` (two reductions: the gathers then skip NumPy's own check)."""
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= n):
        bad = idx[(idx < 0) | (idx >= n)][0]
        raise OptionError(f"sample index {int(bad)} is out of range for {where} with {n} samples")


def stored_dtype(spec: ArraySpec, stored: str) -> str:
    """The dtype of stored array ``stored`` of ``spec`` (offsets are int64)."""
    return "<i8" if spec.ragged and stored.endswith("_offsets") else spec.dtype


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


def changed_error(path: Path, detail: str) -> StoreError:
    """The error a reader raises when its store is no longer the one it opened."""
    return StoreError(f"store {path} changed while it was open ({detail}); reopen it")


def check_mode(mode: str, allowed: Sequence[str]) -> None:
    if mode not in allowed:
        raise OptionError(f"mode must be one of {', '.join(allowed)} (as in h5py), got {mode!r}")


def shard_rows_for(item_nbytes: int, count: int, shard_bytes: int, chunk: int = 1) -> int:
    """Rows per shard: about ``shard_bytes``, a whole number of ``chunk``-row inner chunks, at most the array."""
    rows = max(1, shard_bytes // max(1, item_nbytes))
    rows = min(rows, max(1, count))
    return max(chunk, (rows // chunk) * chunk)


def chunk_rows(spec: ArraySpec, count: int) -> int:
    """Rows per inner chunk: one sample for images and other per-sample planes (so one sample
    is read without decoding its neighbours), about 1 MiB of small values otherwise."""
    if spec.ragged:
        return max(1, 2**18 * max(1, np.dtype(spec.dtype).itemsize) // max(1, spec.item_nbytes))
    if len(spec.shape) >= 2 or spec.item_nbytes >= _SMALL_SAMPLE:
        return 1
    return max(1, min(max(1, count), 2**20 // max(1, spec.item_nbytes)))


def shard_rows(spec: ArraySpec, count: int, shard_bytes: int) -> int:
    """Rows per shard of an array (of its data, for a ragged one): a whole number of inner chunks."""
    rows = 2**62 if spec.ragged else count
    return shard_rows_for(spec.item_nbytes, rows, shard_bytes, chunk_rows(spec, count))


class ArrayAccess(Protocol):
    """Backend-specific read access to one stored (physical) array, N rows first."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def read_rows(self, start: int, stop: int) -> np.ndarray: ...

    def read_into(self, positions: list[int], out: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray: ...

    # Optional: ``row_source() -> (views, rows_per_view) | None``, where row ``i`` is
    # ``views[i // rows_per_view][i % rows_per_view]`` (raw, in-memory rows; None when not so), so
    # that :meth:`StoreReader.read_into_from` can mix arrays in one pass.

    def warm(self) -> None: ...

    def close(self) -> None: ...

    def nbytes_on_disk(self) -> int: ...


class StoreReader(ABC):
    """Read side of a store. Holds no open handle until first use and drops handles on pickling,
    so a reader can be sent to worker processes, which then open their own."""

    def __init__(self, path: str | os.PathLike[str], mode: Mode = "r") -> None:
        check_mode(mode, ("r",))
        self.path = Path(path)
        self.mode: Mode = mode
        self._access: dict[str, ArrayAccess] = {}
        self._whole: dict[str, np.ndarray] = {}
        self._offsets: dict[str, list[int]] = {}
        #: The same offsets as int64 arrays, for gathering a batch's rows in one step.
        self._offsets_np: dict[str, np.ndarray] = {}
        self._offsets_twin: dict[str, str] = {}
        self._row_sources: dict[str, tuple[ArrayAccess, Any, RowSpan | None]] = {}
        self._mixes: dict[tuple[str, ...], Any] = {}
        #: Per fixed array, how :meth:`gather` reads it (looked up once: this runs for every batch).
        self._gathers: dict[str, tuple[str, Any, int]] = {}
        self._sources: tuple[bytes, list[int]] | None = None
        #: What :meth:`warm` last skipped (None: not warm): a loader warms at every pass, and a
        #: second warm over every array costs 0.1 ms, 3 % of a 32x32 epoch that fits the CPU cache.
        self._warmed: frozenset[str] | None = None
        #: SHA-256 of the manifest text this reader opened: every later (re)open must find the same.
        self._pin: str | None = None
        #: Refuse labels outside the classes (False only to repair such a store: ``add_array``, ``--update``).
        self.check_labels = True

    # ------------------------------------------------------------------ backend hooks

    @property
    @abstractmethod
    def manifest(self) -> Manifest: ...

    def _pin_manifest(self, text: str | bytes) -> None:
        """Record the manifest this reader sees, or refuse one that differs from what it pinned."""
        got = sha256_hex(text)
        if self._pin is not None and got != self._pin:
            raise changed_error(self.path, f"manifest {self._pin[:12]}, found {got[:12]}")
        self._pin = got

    def expected_digest(self, stored_name: str) -> str | None:
        """The SHA-256 the manifest records for stored array ``stored_name`` (None: not recorded)."""
        for spec in self.manifest.arrays.values():
            if stored_name in spec.stored_names():
                return spec.sha256.get(stored_name)
        return None

    def check_generation(self, stored_name: str, found: object) -> None:
        """Refuse a stored array whose metadata digest is not the one the opened manifest lists."""
        want = self.expected_digest(stored_name)
        if want is not None and found != want:
            shown = found[:12] if isinstance(found, str) and found else "none"
            raise changed_error(
                self.path, f"array {stored_name!r} is generation {shown}, the manifest opened lists {want[:12]}"
            )

    @abstractmethod
    def _open_array(self, stored_name: str) -> ArrayAccess:
        """Open one stored array (``NAME``, ``NAME_data`` or ``NAME_offsets``) for reading."""

    # ------------------------------------------------------------------ arrays

    @property
    def arrays(self) -> dict[str, ArraySpec]:
        """Every per-sample array of the store, by name."""
        return self.manifest.arrays

    def spec(self, name: str) -> ArraySpec:
        try:
            return self.arrays[name]
        except KeyError:
            raise StoreError(
                f"store {self.path} has no array {name!r} (it has: {', '.join(sorted(self.arrays)) or 'none'})"
            ) from None

    def _stored(self, stored_name: str) -> ArrayAccess:
        acc = self._access.get(stored_name)
        if acc is None:
            acc = self._open_array(stored_name)
            self._check_layout(stored_name, acc)
            self._access[stored_name] = acc
        return acc

    def _check_layout(self, stored_name: str, acc: ArrayAccess) -> None:
        """The stored array's shape and dtype must be what the manifest says (checked once, at open)."""
        n = len(self)
        for spec in self.arrays.values():
            if stored_name not in spec.stored_names():
                continue
            if spec.ragged and stored_name.endswith("_offsets"):
                want: tuple[int, ...] | None = (n + 1,)
            elif spec.ragged:
                want = None  # any number of rows; the offsets bound them
            else:
                want = (n, *spec.shape)
            dtype = np.dtype(stored_dtype(spec, stored_name))
            shape_ok = tuple(acc.shape) == want if want is not None else tuple(acc.shape[1:]) == spec.shape
            if not shape_ok or len(acc.shape) < 1 or np.dtype(acc.dtype).newbyteorder("<") != dtype.newbyteorder("<"):
                expect = list(want) if want is not None else ["rows", *spec.shape]
                raise StoreError(
                    f"array {stored_name!r} of {self.path} is {acc.dtype} {list(acc.shape)}, the manifest says "
                    f"{dtype} {expect}; the store is damaged, rebuild it"
                )
            return

    def __len__(self) -> int:
        return self.manifest.count

    def _fixed(self, name: str) -> ArraySpec:
        spec = self.spec(name)
        if spec.ragged:
            raise StoreError(f"array {name!r} of {self.path} is ragged; read its samples with read(name, index)")
        return spec

    def _small(self, spec: ArraySpec) -> bool:
        return spec.item_nbytes <= _SMALL_SAMPLE and spec.item_nbytes * len(self) <= _SMALL_ARRAY

    def read_all(self, name: str) -> np.ndarray:
        """A whole fixed array ``[N, *shape]``, read once, checked against its checksum, and cached
        (for small per-sample arrays). Codes (``labels``, ``split``, ``defect``: :data:`dlpack.schema.CODED`)
        are also checked against the manifest list they index."""
        arr = self._whole.get(name)
        if arr is None:
            self._fixed(name)
            arr = self._stored(name).read_rows(0, len(self))
            if name in schema.CODED:
                self._check_codes(name, arr)
            self._check_digest(name, arr)
            self._whole[name] = arr
        return arr

    def _ragged_codes(self, name: str) -> np.ndarray:
        """All rows of ragged code array ``name`` (``box_labels``), read once, checked against the
        manifest list they index and the array's checksum, and cached."""
        stored = name + "_data"
        arr = self._whole.get(stored)
        if arr is None:
            off = self._ragged_offsets(name)
            arr = self._stored(stored).read_rows(0, off[-1])
            self._check_codes(name, arr, off)
            self._check_digest(stored, arr)
            self._whole[stored] = arr
        return arr

    def _check_digest(self, stored_name: str, arr: np.ndarray) -> None:
        want = self.expected_digest(stored_name)
        if want is None or stored_name in schema.PIXEL_ARRAYS:
            return  # pixels have per-image CRCs, which verify compares sample by sample
        got = sha256_hex(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes())
        if got != want:
            raise StoreError(
                f"array {stored_name!r} of {self.path} does not match its checksum (sha256 {got[:12]}..., "
                f"recorded {want[:12]}...); the store is damaged, rebuild it"
            )

    def _check_codes(self, name: str, codes: np.ndarray, offsets: list[int] | None = None) -> None:
        """Codes index a manifest list (``labels`` the classes, ``split`` the splits, ...; -1 means none
        where the schema allows it); any other value is damage. ``offsets`` are a ragged array's."""
        if not self.check_labels:
            return
        role = schema.CODED[name]
        assert role.codes is not None
        k = len(getattr(self.manifest, role.codes))
        bad = np.flatnonzero((codes < role.lowest) | (codes >= k))
        if len(bad):
            i = int(bad[0])
            where = f"sample {i}"
            if offsets is not None:
                sample = int(np.searchsorted(offsets, i, side="right")) - 1
                where = f"sample {sample} (row {i - offsets[sample]})"
            what = "rows" if offsets is not None else "samples"
            raise StoreError(
                f"array {name!r} of {self.path} holds {int(codes[i])} at {where}, outside {role.lowest}..{k - 1} "
                f"for {k} {role.codes} ({len(bad)} such {what}); the store is damaged, rebuild it"
            )

    def code_problems(self) -> list[tuple[str, str]]:
        """``(array, reason)`` for each array of codes outside the manifest list it indexes (or unreadable)."""
        problems = []
        for name in schema.CODED:
            spec = self.arrays.get(name)
            if spec is None:
                continue
            try:
                if spec.ragged:
                    self._ragged_codes(name)
                else:
                    self.read_all(name)
            except StoreError as exc:
                problems.append((name, str(exc)))
        return problems

    def meta(self, name: str) -> np.ndarray:
        """A whole per-sample array by its stored name (``labels``, ``checksum``, ``source_offsets`` ...)."""
        if name in self.arrays:
            return self.read_all(name)
        for spec in self.arrays.values():
            if spec.ragged and name in spec.stored_names():
                if name.endswith("_offsets"):
                    return np.asarray(self._ragged_offsets(spec.name), dtype=np.int64)
                acc = self._stored(name)
                return acc.read_rows(0, acc.shape[0])
        raise StoreError(f"store {self.path} has no array {name!r}")

    def read_into(
        self, name: str, indices: Sequence[int] | np.ndarray, out: np.ndarray, rows: Sequence[int] | None = None
    ) -> np.ndarray:
        """Gather samples ``indices`` of fixed array ``name`` into ``out[:len(indices)]``, or, with
        ``rows``, sample ``indices[k]`` into ``out[rows[k]]`` (how a batch of mixed views fills
        one batch array from several arrays without a copy)."""
        spec = self._fixed(name)
        if rows is not None and len(rows) != len(indices):
            raise OptionError(f"read_into got {len(indices)} indices but {len(rows)} rows of out to fill")
        picked = np.asarray(indices, dtype=np.int64).reshape(-1)
        checked_positions(picked, len(self), f"array {name!r} of {self.path}")
        if self._small(spec):
            if rows is None:
                np.take(self.read_all(name), picked, axis=0, out=out[: len(picked)], mode="clip")
            else:
                out[np.asarray(rows, dtype=np.int64)] = self.read_all(name).take(picked, axis=0, mode="clip")
            return out
        if rows is None:
            views = self._row_source(name)  # raw in-memory rows (uncompressed shards, a mapped dataset)
            if views is not None:
                self._map_check(name)(picked)
                return gather_rows(views[0], views[1], picked, out, self._row_span(name))
        positions = picked.tolist()
        return self._stored(name).read_into(positions, out, None if rows is None else list(rows))

    def gather(self, name: str, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
        """:meth:`read_into` for a batch: ``idx`` are int64 sample indices the caller has checked
        (``0 <= i < len``), gathered into ``out[:len(idx)]`` in their order.

        The way each array is read is found once: a small array from its in-memory copy and raw
        rows from their memory maps by :func:`gather_rows` (one ``np.take`` over every shard the
        batch touches, through the maps' :class:`RowSpan`); compressed arrays through the backend,
        image by image. ``idx`` may be of any length (several batches at once). A 32x32 batch of 256 takes a few microseconds,
        so the per-batch lookups and checks that :meth:`read_into` makes would double it.
        """
        plan = self._gathers.get(name)
        if plan is None:
            spec = self._fixed(name)
            if self._small(spec):
                plan = ("whole", self.read_all(name), 0)
            else:
                views = self._row_source(name)
                plan = (
                    ("views", (views[0], self._row_span(name), self._map_check(name)), views[1])
                    if views is not None
                    else ("access", None, 0)
                )
            self._gathers[name] = plan
        kind, data, per = plan
        data = cast(Any, data)
        if kind == "whole":
            np.take(data, idx, axis=0, out=out[: len(idx)], mode="clip")
            return out
        if kind == "views":
            data[2](idx)  # the maps' files have not shrunk under them (a SIGBUS otherwise)
            return gather_rows(data[0], per, idx, out, data[1])
        return self.read_into(name, idx, out)

    def read_into_from(
        self,
        names: Sequence[str],
        which: Sequence[int] | np.ndarray,
        indices: Sequence[int] | np.ndarray,
        out: np.ndarray,
    ) -> np.ndarray:
        """Gather row ``k`` of ``out`` from sample ``indices[k]`` of fixed array ``names[which[k]]``
        (arrays of one sample shape and dtype): one pass over the batch, however many arrays it mixes.

        How cached augmentation views fill a batch of originals and variants in place at the cost
        of a batch of originals (rows are read in array, then sample order).
        """
        plan = self._mixes.get(tuple(names))
        if plan is None:  # checked and looked up once per list of arrays: this runs for every batch
            plan = self._mix_plan(names)
        src = np.asarray(which, dtype=np.int64).reshape(-1)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(src) != len(idx):
            raise OptionError(f"read_into_from got {len(idx)} indices but {len(src)} array choices")
        lo, hi = (int(src.min()), int(src.max())) if len(src) else (0, 0)
        if lo < 0 or hi >= len(names):
            raise OptionError(f"read_into_from: array choices must be 0..{len(names) - 1}")
        if plan is _NO_PLAN or lo == hi:
            used = np.flatnonzero(np.bincount(src, minlength=len(names))).tolist()
            if len(used) == 1:
                return self.read_into(names[used[0]], idx, out)
            for u in used:  # array by array, each into its rows of out
                rows = np.flatnonzero(src == u)
                self.read_into(names[u], idx[rows], out, rows=rows.tolist())
            return out
        flat, first, per, checks = plan
        for u in np.flatnonzero(np.bincount(src, minlength=len(names))).tolist():
            checks[u](idx[src == u])
        step = per[src]
        at, within = (first[src] + idx // step).tolist(), (idx % step).tolist()
        for k in np.argsort(src * (len(self) + 1) + idx, kind="stable").tolist():
            out[k] = flat[at[k]][within[k]]
        return out

    def _mix_plan(self, names: Sequence[str]) -> Any:
        """For :meth:`read_into_from`: every array's in-memory views in one list (row ``i`` of array
        ``u`` is ``flat[first[u] + i // per[u]][i % per[u]]``), or ``_NO_PLAN`` when some array has
        no such views (small arrays, read from a cached copy, or compressed ones)."""
        specs = [self._fixed(n) for n in names]
        if any((s.shape, np.dtype(s.dtype)) != (specs[0].shape, np.dtype(specs[0].dtype)) for s in specs):
            raise OptionError(f"read_into_from mixes arrays of different sample shapes or dtypes: {list(names)}")
        plan: Any = _NO_PLAN
        sources = [None if self._small(s) else self._row_source(n) for s, n in zip(specs, names, strict=True)]
        if all(src is not None for src in sources):
            flat: list[np.ndarray] = []
            first = np.zeros(len(names), dtype=np.int64)
            per = np.ones(len(names), dtype=np.int64)
            for u, (views, rows_per_view) in enumerate(sources):  # type: ignore[misc]
                first[u], per[u] = len(flat), rows_per_view
                flat.extend(views)
            plan = (flat, first, per, [self._map_check(n) for n in names])
        self._mixes[tuple(names)] = plan
        return plan

    def _row_source(self, name: str) -> Any:
        """The stored array's ``row_source()`` (None when it has none), kept while the array is open."""
        acc = self._stored(name)
        got = self._row_sources.get(name)
        if got is None or got[0] is not acc:
            src = getattr(acc, "row_source", lambda: None)()
            got = self._row_sources[name] = (acc, src, None if src is None else RowSpan.of(*src))
        return got[1]

    def _map_check(self, name: str) -> Callable[[np.ndarray], None]:
        """The stored array's ``check_rows(idx)``: before rows are copied out of its maps, it raises a
        StoreError where a file mapped shrank since (touching a page past its end is a SIGBUS)."""
        return getattr(self._stored(name), "check_rows", _no_check)

    def _row_span(self, name: str) -> RowSpan | None:
        """The :class:`RowSpan` of the array's row source (None where it has none), kept with it."""
        self._row_source(name)
        span: RowSpan | None = self._row_sources[name][2]
        return span

    def _ragged_offsets(self, name: str) -> list[int]:
        off = self._offsets.get(name)
        if off is None:
            acc = self._stored(name + "_offsets")
            raw = acc.read_rows(0, acc.shape[0])
            n = len(self)
            if len(raw) != n + 1 or raw[0] != 0 or np.any(np.diff(raw) < 0):
                raise StoreError(f"{name}_offsets of {self.path} is damaged (not {n + 1} rising offsets); rebuild it")
            if int(raw[-1]) != self._stored(name + "_data").shape[0]:
                raise StoreError(
                    f"{name}_offsets of {self.path} ends at {int(raw[-1])}, {name}_data has "
                    f"{self._stored(name + '_data').shape[0]} rows; the store is damaged, rebuild it"
                )
            self._check_digest(name + "_offsets", raw)
            arr = np.asarray(raw, dtype=np.int64)
            # The first array read with the same offsets: batches of both share one offsets lookup.
            self._offsets_twin[name] = next((k for k, v in self._offsets_np.items() if np.array_equal(v, arr)), name)
            self._offsets_np[name] = arr
            off = self._offsets[name] = raw.tolist()  # plain ints: indexing NumPy per item costs microseconds
        return off

    def _ragged_whole(self, name: str) -> np.ndarray | None:
        """All rows of ragged array ``name`` when they are small (boxes, box labels: at most
        ``_SMALL_ARRAY`` bytes), read once, checked and cached; None for larger ones (pixels)."""
        if name in schema.CODED:
            return self._ragged_codes(name)
        stored = name + "_data"
        arr = self._whole.get(stored)
        if arr is None:
            if stored in schema.PIXEL_ARRAYS:
                return None
            off = self._ragged_offsets(name)
            if off[-1] * self.spec(name).item_nbytes > _SMALL_ARRAY:
                return None
            arr = self._stored(stored).read_rows(0, off[-1])
            self._check_digest(stored, arr)
            self._whole[stored] = arr
        return arr

    def read_ragged(self, name: str, indices: Sequence[int] | np.ndarray) -> Sequence[np.ndarray]:
        """Samples ``indices`` of ragged array ``name``: one array of rows per sample, as :meth:`read`
        gives them (views of one copy, so changing one changes no other sample). See :meth:`read_ragged_batch`."""
        return self.read_ragged_batch((name,), indices)[name]

    def read_ragged_batch(
        self, names: Sequence[str], indices: Sequence[int] | np.ndarray
    ) -> dict[str, Sequence[np.ndarray]]:
        """:meth:`read_ragged` of several ragged arrays for one batch.

        A small array (:meth:`_ragged_whole`) is gathered for the whole batch at once: one offsets
        lookup, one take of the rows, then cut at the samples' bounds; arrays with the same offsets
        (``boxes`` and ``box_labels``) share the lookup. Reading sample by sample cost a few
        microseconds each, most of a batch's time at 64x64 (docs/benchmarks.md, "Labels")."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        plans: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        got: dict[str, Sequence[np.ndarray]] = {}
        for name in names:
            self.spec(name)
            off = self._ragged_offsets(name)
            data = self._ragged_whole(name)
            if data is None:
                acc = self._stored(name + "_data")
                got[name] = [acc.read_rows(off[j], off[j + 1]) for j in idx.tolist()]
                continue
            twin = self._offsets_twin.get(name, name)
            plan = plans.get(twin)
            if plan is None:
                offsets = self._offsets_np[name]
                starts = offsets.take(idx)
                counts = offsets.take(idx + 1) - starts
                bounds = np.zeros(len(idx) + 1, dtype=np.int64)
                np.cumsum(counts, out=bounds[1:])
                rows = np.repeat(starts - bounds[:-1], counts)  # each row's shift from its place in the batch
                rows += np.arange(len(rows), dtype=np.int64)
                plan = plans[twin] = (rows, bounds)
            rows, bounds = plan
            # One copy of the batch's rows; a sample's rows are cut out only when asked for.
            got[name] = RaggedBatch(data.take(rows, axis=0), bounds)
        return got

    def read(self, name: str, index: int) -> np.ndarray:
        """Sample ``index`` of any array: its trailing shape (fixed) or its rows (ragged)."""
        spec = self.spec(name)
        if not spec.ragged:
            if self._small(spec):
                return np.array(self.read_all(name)[index])
            out = np.empty((1, *spec.shape), dtype=spec.dtype)
            got: np.ndarray = self._stored(name).read_into([int(index)], out)[0]
            return got
        off = self._ragged_offsets(name)
        whole = self._ragged_whole(name)
        if whole is not None:
            return np.array(whole[off[index] : off[index + 1]])
        return self._stored(name + "_data").read_rows(off[index], off[index + 1])

    # ------------------------------------------------------------------ images and sources

    def read_image(self, index: int) -> np.ndarray:
        """One image as H x W x C; ``index`` is already validated (0 <= index < len)."""
        layout = self.manifest.image.layout
        if layout == "fixed":
            return self.read(schema.image_array(layout), index)
        shape = tuple(int(v) for v in self.read_all(schema.IMAGE_SHAPES)[index])
        return self.read(schema.image_array(layout), index).reshape(shape)

    def source(self, index: int) -> str:
        """The relative source path of sample ``index``."""
        if self._sources is None:
            off = self._ragged_offsets(schema.SOURCE)
            raw = self._stored(schema.SOURCE + "_data").read_rows(0, off[-1])
            self._check_digest(schema.SOURCE + "_data", raw)
            self._sources = (raw.tobytes(), off)
        data, off = self._sources
        return data[off[index] : off[index + 1]].decode("utf-8")

    def sources(self, indices: Sequence[int] | np.ndarray) -> list[str]:
        """The relative source paths of samples ``indices`` (validated), for a batch: the paths of
        :meth:`lazy_sources`, decoded now (one decoding path for both)."""
        return list(self.lazy_sources(np.asarray(indices, dtype=np.int64).reshape(-1)))

    def lazy_sources(self, indices: np.ndarray) -> SourceList:
        """:meth:`sources` made only when read: what a loader batch carries as ``source``."""
        if self._sources is None and len(indices):
            self.source(int(indices[0]))
        data, off = self._sources if self._sources is not None else (b"", [0])
        return SourceList(data, off, indices)

    def shard_len(self, name: str) -> int | None:
        """Rows per shard of fixed array ``name`` as stored, or None where the backend has no shards
        (how ``build --update`` writes a carried array with its layout, so it can share its shards)."""
        rows = getattr(self._stored(self._fixed(name).name), "shard_rows", None)
        return int(rows) if isinstance(rows, int) else None

    def verify_arrays(self, skip: Sequence[str] = ()) -> list[str]:
        """Re-read every stored array (but those in ``skip``) and compare it with its recorded
        checksum and the manifest's count; returns one line per problem (empty: all intact)."""
        return [reason for _, reason in self.array_problems(skip)]

    def array_problems(self, skip: Sequence[str] = ()) -> list[tuple[str | None, str]]:
        """As :meth:`verify_arrays`, as ``(stored array, reason)`` pairs; the array is None for a
        problem of the store as a whole (its generation)."""
        problems: list[tuple[str | None, str]] = []
        n = len(self)
        for spec in self.arrays.values():
            for stored in spec.stored_names():
                if stored in skip:
                    continue
                want = spec.sha256.get(stored)
                try:
                    acc = self._stored(stored)
                    if spec.ragged and stored.endswith("_offsets"):
                        self._offsets.pop(spec.name, None)
                        self._ragged_offsets(spec.name)
                    if want is None:
                        continue
                    row = int(np.prod(acc.shape[1:], dtype=np.int64)) * np.dtype(acc.dtype).itemsize
                    got = array_digest(acc.read_rows, acc.shape[0], row, stored_dtype(spec, stored))
                except StoreError as exc:
                    problems.append((stored, str(exc)))
                    continue
                if got != want:
                    problems.append(
                        (
                            stored,
                            f"array {stored!r} does not match its checksum (sha256 {got[:12]}..., recorded {want[:12]}...)",
                        )
                    )
        if self.manifest.generation and all(s.sha256 for s in self.arrays.values()):
            digests = {k: v for s in self.arrays.values() for k, v in s.sha256.items()}
            if store_generation(n, digests) != self.manifest.generation:
                problems.append((None, "the manifest's generation does not match its arrays' checksums"))
        elif self.manifest.generation:
            problems.append((None, "the manifest has a generation but not every array has a checksum"))
        return problems

    # ------------------------------------------------------------------ lifecycle

    def nbytes_on_disk(self) -> int:
        """Bytes the store takes on disk (every file of a folder store)."""
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def array_nbytes_on_disk(self, name: str) -> int:
        """Bytes the per-sample array ``name`` takes on disk (its data and offsets, if ragged)."""
        return sum(self._stored(stored).nbytes_on_disk() for stored in self.spec(name).stored_names())

    def warm(self, skip: Collection[str] = ()) -> None:
        """Open maps and read indexes now (thread-safe afterwards; the loader calls it before threads
        start), of every array but those named in ``skip``."""
        skipped = frozenset(skip)
        if self._warmed is not None and self._warmed <= skipped:
            return
        for name, spec in self.arrays.items():
            if name in skip:
                continue
            variant = schema.variant_of(name)
            if variant is not None and variant[0] == schema.AUGMENT:
                continue  # the records of what made each variant: read one by one, never by a loader
            if spec.ragged:
                self._ragged_offsets(name)
                self._stored(name + "_data").warm()
                self._ragged_whole(name)
            elif self._small(spec):
                self.read_all(name)
            else:
                self._stored(name).warm()
        if len(self) and schema.SOURCE in self.arrays:
            self.source(0)
        self._warmed = skipped

    def close(self) -> None:
        """Release open handles and maps; the reader reopens lazily if used again."""
        self._warmed = None
        self._row_sources.clear()  # they hold views of the maps closed next
        self._mixes.clear()
        self._gathers.clear()
        for acc in self._access.values():
            acc.close()
        self._access.clear()
        self._whole.clear()
        self._offsets.clear()
        self._offsets_np.clear()
        self._offsets_twin.clear()
        self._sources = None

    def __getstate__(self) -> dict[str, Any]:
        if self._pin is None:
            _ = self.manifest  # pin what this reader sees, so the copy reads the same store or refuses
        return {"path": self.path, "mode": self.mode, "pin": self._pin}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["mode"])  # type: ignore[misc]
        self._pin = state.get("pin")

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoreWriter(ABC):
    """Write side of a store: create named arrays, stream them in blocks, commit the manifest last.

    Fixed arrays are written at their final sample index by ``write_block(name, start, values)``.
    When ``parallel_safe(name)`` is true, worker processes may write disjoint ranges aligned to
    ``shard_rows(name)`` samples concurrently (a block is a whole Zarr shard, so no two processes
    touch one file); send them the pickled writer after every ``create_array``. Ragged arrays are
    appended in sample order by one process (``start`` must be the next sample), buffered and
    written in whole shards. ``commit`` writes everything still buffered, then the manifest.
    """

    def __init__(self, path: str | os.PathLike[str], mode: Mode = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        check_mode(mode, WRITE_MODES)
        if not isinstance(shard_bytes, int) or shard_bytes < 2**16:
            raise OptionError(f"shard_bytes must be at least 65536, got {shard_bytes!r}")
        self.path = Path(path)
        self.mode: Mode = mode
        self.shard_bytes = shard_bytes
        #: Arrays of the store as this writer will commit them: name -> (spec, sample count).
        self.arrays: dict[str, ArraySpec] = {}
        self.count: int | None = None
        self._ragged: dict[str, _RaggedBuffer] = {}
        #: stored arrays created with their own ``shard_bytes`` (create_array), by stored name
        self._shard_budgets: dict[str, int] = {}
        #: Stored arrays this writer created or wrote into: ``commit`` checksums them.
        self._touched: set[str] = set()
        #: Checksums of whole stored arrays taken while they were written (:meth:`set_written_digest`).
        self._written_digests: dict[str, str] = {}

    # ------------------------------------------------------------------ backend hooks

    @abstractmethod
    def open(self) -> None:
        """Create or open the store as ``mode`` says (main process, once); loads existing arrays."""

    @abstractmethod
    def _create_stored(self, name: str, spec: ArraySpec, rows: int, chunk: int, shard_rows: int) -> None:
        """Create one stored array of ``rows`` rows of ``spec.shape`` (``rows`` 0 for growing data)."""

    @abstractmethod
    def _write_rows(self, name: str, start: int, rows: np.ndarray) -> None:
        """Write ``rows`` at row ``start`` of stored array ``name`` (growing it if needed)."""

    @abstractmethod
    def _delete_stored(self, name: str) -> None: ...

    @abstractmethod
    def _write_manifest(self, manifest: Manifest) -> None:
        """Write the manifest: after this the store is complete."""

    @abstractmethod
    def _stored_layout(self, name: str) -> tuple[int, int]:
        """``(chunk, shard_rows)`` of stored array ``name``: rows per inner chunk and per shard."""

    @abstractmethod
    def _read_stored(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of stored array ``name`` as written (to checksum them at commit)."""

    @abstractmethod
    def _stored_rows(self, name: str) -> int:
        """Rows of stored array ``name`` as written."""

    @abstractmethod
    def _set_digest(self, name: str, digest: str) -> None:
        """Record ``digest`` in stored array ``name``'s own metadata (attribute :data:`DIGEST_ATTR`)."""

    # ------------------------------------------------------------------ arrays

    def create_array(
        self, spec: ArraySpec, count: int, rows: int | None = None, shard_bytes: int | None = None
    ) -> None:
        """Create array ``spec`` for ``count`` samples (every array of a store has the same count).

        ``rows`` fixes the rows per shard of a fixed array (a multiple of its inner chunk), so that
        arrays written in the same blocks (``images`` and ``mask``) share one block layout.
        ``shard_bytes`` sizes this array's shards (and a ragged array's offsets') instead of the
        writer's: a whole shard is what a writer holds of an array before writing it.
        """
        if self.count is not None and count != self.count:
            raise OptionError(f"array {spec.name!r} has {count} samples, the store has {self.count}")
        if spec.name in self.arrays:
            raise OptionError(f"store {self.path} already has an array {spec.name!r}; delete_array it first")
        for other in self.arrays.values():
            clash = set(spec.stored_names()) & set(other.stored_names())
            if clash:
                raise OptionError(f"array {spec.name!r} would overwrite {sorted(clash)} of array {other.name!r}")
        self.count = count
        chunk = chunk_rows(spec, count)
        budget = self.shard_bytes if shard_bytes is None else max(1, shard_bytes)
        if rows is None or spec.ragged:
            rows = shard_rows(spec, count, budget)
        elif rows < 1 or rows % chunk:
            raise OptionError(f"array {spec.name!r}: {rows} rows per shard is not a multiple of its {chunk}-row chunks")
        if shard_bytes is not None:
            self._shard_budgets.update(dict.fromkeys(spec.stored_names(), budget))
        if spec.ragged:
            self._create_stored(spec.name + "_data", spec, 0, chunk, rows)
            off = ArraySpec(spec.name + "_offsets", "<i8")
            self._create_stored(spec.name + "_offsets", off, count + 1, *_offsets_layout(count, budget))
            self._ragged[spec.name] = _RaggedBuffer(rows)
        else:
            self._create_stored(spec.name, spec, count, chunk, rows)
        self.arrays[spec.name] = spec
        self._touched.update(spec.stored_names())

    def attach_array(self, spec: ArraySpec, count: int) -> None:
        """Register fixed array ``spec`` that ``create_array`` already made in this store, keeping its data.

        How a resumed build reopens (mode ``r+``) the partial store it was writing when it was
        killed: the stored array must have ``count`` rows of ``spec``'s shape and dtype.

        Raises
        ------
        OptionError
            ``spec`` is ragged (ragged arrays are appended in one pass and cannot be continued), or
            its count differs from the store's.
        StoreError
            The store holds no such array, or one of another shape or dtype.
        """
        if spec.ragged:
            raise OptionError(f"array {spec.name!r} is ragged; only fixed arrays can be attached")
        if self.count is not None and count != self.count:
            raise OptionError(f"array {spec.name!r} has {count} samples, the store has {self.count}")
        if spec.name in self.arrays:
            raise OptionError(f"store {self.path} already has an array {spec.name!r}")
        self._attach_stored(spec.name, spec, count)
        self.count = count
        self.arrays[spec.name] = spec
        # Being written again: its checksum is taken at commit (and worker copies never touch it).
        self._touched.update(spec.stored_names())

    def read_block(self, name: str, start: int, stop: int) -> np.ndarray:
        """Samples ``start .. stop`` of fixed array ``name`` as written so far (to check a partial store's blocks).

        Raises
        ------
        StoreError
            The rows cannot be read back (a missing, truncated or corrupt block).
        """
        spec = self.arrays.get(name)
        if spec is None or spec.ragged:
            raise StoreError(f"store {self.path} has no fixed array {name!r} to read back")
        assert self.count is not None
        if not 0 <= start <= stop <= self.count:
            raise OptionError(f"samples {start}..{stop} are outside array {name!r} of {self.count}")
        return self._read_rows(name, start, stop)

    def read_written(self, name: str, start: int, stop: int) -> np.ndarray:
        """Samples ``start .. stop`` of fixed array ``name``, a block this writer (or a worker's copy
        of it) has just written, for the build's checksum of the array; the same rows as
        :meth:`read_block`, which formats may read faster than their library does."""
        return self.read_block(name, start, stop)

    def undo_commit(self, keep: Sequence[str]) -> bool:
        """Take a partial store killed while committing back to holding only arrays ``keep``.

        Removes every other stored array and the manifest, as if they had never been written, so a
        resumed build commits again and ends with the same bytes. Afterwards no array is attached:
        the caller attaches the ones it kept. False when the backend cannot (the store is then to be
        discarded).
        """
        return False

    def remove_temp_files(self) -> int:
        """Remove the temporary files of writes a kill cut short (only names this backend's writer
        gives them, inside this store); returns how many. How a resumed partial store ends with
        exactly the files of a build that was never interrupted."""
        return 0

    def share_block(self, name: str, start: int, other: Path) -> bool:
        """Make block ``start`` (a ``shard_rows`` multiple) of fixed array ``name`` the same block of the
        complete store ``other``, whose array has the same layout, by sharing its file (a hard link).

        False when the backend cannot share blocks or the two layouts differ; the caller then writes
        the block itself. How ``build --update`` writes only the shards that change.
        """
        return False

    def _attach_stored(self, name: str, spec: ArraySpec, rows: int) -> None:
        """Load the layout of stored array ``name``, checking it holds ``rows`` rows of ``spec``."""
        raise StoreError(f"{type(self).__name__} cannot reopen array {name!r} of a partial store")

    def _read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of stored fixed array ``name``."""
        raise StoreError(f"{type(self).__name__} cannot read back array {name!r} while writing")

    def delete_array(self, name: str) -> None:
        """Remove array ``name`` (to replace it with ``create_array``)."""
        spec = self.arrays.pop(name, None)
        if spec is None:
            raise StoreError(f"store {self.path} has no array {name!r}")
        self._written_digests.pop(name, None)
        for stored in spec.stored_names():
            self._delete_stored(stored)
            self._touched.discard(stored)
        self._ragged.pop(name, None)

    def rename_array(self, old: str, new: str, key: str | None = None) -> None:
        """Give array ``old`` the name ``new`` (which must be free) and the sample key ``key``.

        How ``add_array`` switches in an array it built aside under a temporary name, once the
        array is complete, so that a failure before then leaves the array it replaces untouched.
        """
        spec = self.arrays.get(old)
        if spec is None:
            raise StoreError(f"store {self.path} has no array {old!r}")
        self._written_digests.pop(old, None)
        if new in self.arrays:
            raise OptionError(f"store {self.path} already has an array {new!r}; delete_array it first")
        names = dict(zip(spec.stored_names(), replace(spec, name=new, sha256={}).stored_names(), strict=True))
        renamed = replace(spec, name=new, key=key, sha256={names[k]: v for k, v in spec.sha256.items()})
        for a, b in names.items():
            self._rename_stored(a, b)
            if a in self._touched:
                self._touched.discard(a)
                self._touched.add(b)
        del self.arrays[old]
        self.arrays[new] = renamed
        if old in self._ragged:
            self._ragged[new] = self._ragged.pop(old)

    def _rename_stored(self, old: str, new: str) -> None:
        """Rename stored array ``old`` to ``new``."""
        raise StoreError(f"{type(self).__name__} cannot rename array {old!r}")

    def clear_debris(self) -> list[str]:
        """Remove what a killed writer left in this store that is provably dlpack's and listed by no
        committed manifest (stored arrays still marked "being written"); returns their names."""
        return []

    def shard_rows(self, name: str) -> int:
        """Samples per aligned write block of fixed array ``name`` (a whole shard)."""
        return self._stored_layout(name)[1]

    def parallel_safe(self, name: str) -> bool:
        """Whether worker processes may write disjoint ``shard_rows`` blocks of ``name`` concurrently."""
        return False

    def set_written_digest(self, name: str, digest: str) -> None:
        """Record ``digest``, the SHA-256 of fixed array ``name``'s bytes as :func:`array_digest`
        defines it, taken by whoever wrote every row: ``commit`` then uses it instead of reading the
        array back (a build hashes its images block by block as they land). Any later write of the
        array forgets it."""
        spec = self.arrays.get(name)
        if spec is None or spec.ragged:
            raise StoreError(f"store {self.path} has no fixed array {name!r}")
        self._written_digests[name] = digest

    def write_block(self, name: str, start: int, values: np.ndarray | Sequence[np.ndarray]) -> None:
        """Write samples ``start .. start + len(values)`` of array ``name``.

        Fixed arrays take an array ``[B, *shape]``; ragged arrays a sequence of ``[rows_i, *shape]``
        arrays, appended in order (``start`` must be the number of samples written so far).
        """
        spec = self.arrays.get(name)
        if spec is None:
            raise StoreError(f"store {self.path} has no array {name!r}; create_array it first")
        self._written_digests.pop(name, None)
        assert self.count is not None
        if name not in self._touched and not spec.ragged:
            # Written in place after a commit: readers that opened the committed store must see it
            # as changed from now on, not a mix of old and new rows.
            self._set_digest(name, "")
            self._touched.add(name)
        if not spec.ragged:
            arr = np.asarray(values)
            if arr.shape[1:] != spec.shape:
                raise OptionError(f"array {name!r} holds samples of shape {spec.shape}, got {arr.shape[1:]}")
            if start < 0 or start + len(arr) > self.count:
                raise OptionError(f"samples {start}..{start + len(arr)} are outside array {name!r} of {self.count}")
            self._write_rows(name, start, np.ascontiguousarray(arr, dtype=np.dtype(spec.dtype)))
            return
        buf = self._ragged[name]
        if start != buf.samples:
            raise OptionError(f"ragged array {name!r} is written in order: next sample is {buf.samples}, got {start}")
        if start + len(values) > self.count:
            raise OptionError(f"samples {start}..{start + len(values)} are outside array {name!r} of {self.count}")
        rows: list[np.ndarray] = []
        for v in values:
            a = np.asarray(v, dtype=np.dtype(spec.dtype))
            if spec.shape == ():
                a = a.reshape(-1)
            elif a.shape[1:] != spec.shape:
                raise OptionError(f"ragged array {name!r} holds rows of shape {spec.shape}, got {a.shape[1:]}")
            rows.append(a)
        buf.add(rows)
        self._flush_ragged(name, final=False)

    def _flush_ragged(self, name: str, final: bool) -> None:
        buf = self._ragged[name]
        rows = buf.take(final)
        if rows is not None:
            self._write_rows(name + "_data", buf.written, rows)
            buf.written += len(rows)
        offsets = buf.take_offsets(self._stored_layout(name + "_offsets")[1], final)
        if offsets is not None:
            self._write_rows(name + "_offsets", *offsets)

    def commit(self, manifest: Manifest) -> None:
        """Write buffered data and ragged offsets, checksum every array this writer wrote (and any
        without a checksum), record each in its array's metadata, then write the manifest (listing
        this writer's arrays, their checksums and the store's generation)."""
        if self.count is not None and manifest.count != self.count:
            raise StoreError(f"the manifest says {manifest.count} samples, the arrays of {self.path} have {self.count}")
        for name, buf in self._ragged.items():
            if buf.samples != self.count:
                raise StoreError(f"ragged array {name!r} has {buf.samples} of {self.count} samples written")
            self._flush_ragged(name, final=True)
        self._ragged.clear()  # written: a later commit of this writer does not write them again
        arrays: dict[str, ArraySpec] = {}
        for name, spec in sorted(self.arrays.items()):
            digests = dict(spec.sha256)
            for stored in spec.stored_names():
                if stored in self._touched or stored not in digests:
                    dtype = stored_dtype(spec, stored)
                    row = spec.item_nbytes if dtype == spec.dtype else 8
                    digest = self._written_digests.pop(stored, "") or array_digest(
                        partial_rows(self, stored), self._stored_rows(stored), row, dtype
                    )
                    self._set_digest(stored, digest)
                    digests[stored] = digest
            arrays[name] = replace(spec, sha256=digests)
        self.arrays = arrays
        self._touched.clear()
        every = {k: v for spec in arrays.values() for k, v in spec.sha256.items()}
        generation = store_generation(manifest.count, every)
        self._write_manifest(replace(manifest, arrays=arrays, generation=generation))

    def abort(self) -> None:  # noqa: B027 - optional hook
        """Close handles after a failure (the caller deletes a store it created)."""

    def __getstate__(self) -> dict[str, Any]:
        if any(b.pending for b in self._ragged.values()):
            raise StoreError("a writer with buffered ragged rows cannot be pickled; write ragged arrays in one process")
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_h_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_handles()

    def _reset_handles(self) -> None:  # noqa: B027 - optional hook
        """Set up the (unpickled) handle attributes, named ``_h_*``, of a copy in a worker process."""


class SourceList(Sequence[str]):
    """The ``source`` paths of a batch, decoded only when read.

    Decoding 256 paths took a fifth of a 32x32 batch's time, for a key most training steps never
    read. It is a read-only sequence of str: ``len``, indexing, slicing (a list), iteration, and
    ``==`` with a list or tuple of the same paths; ``list(batch["source"])`` gives a plain list
    (for ``json.dumps``, ``+``).
    """

    __slots__ = ("_data", "_off", "_idx", "_list")

    def __init__(self, data: bytes, offsets: list[int], indices: np.ndarray) -> None:
        self._data, self._off, self._idx = data, offsets, indices
        self._list: list[str] | None = None

    def _paths(self) -> list[str]:
        if self._list is None:
            data, off = self._data, self._off
            self._list = [data[off[j] : off[j + 1]].decode("utf-8") for j in self._idx.tolist()]
        return self._list

    def __len__(self) -> int:
        return len(self._idx)

    def take_rows(self, start: int, stop: int) -> SourceList:
        """The paths of samples ``start..stop``, still undecoded (how the loader cuts a batch out
        of several read at once)."""
        return SourceList(self._data, self._off, self._idx[start:stop])

    def __getitem__(self, i: Any) -> Any:
        return self._paths()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SourceList):
            return self._paths() == other._paths()
        if isinstance(other, (list, tuple)):
            return self._paths() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like a list

    def __repr__(self) -> str:
        return repr(self._paths())


def partial_rows(writer: StoreWriter, stored: str) -> Any:
    """``read_rows(start, stop)`` of one stored array of ``writer``."""
    return lambda start, stop: writer._read_stored(stored, start, stop)


def _offsets_layout(count: int, shard_bytes: int) -> tuple[int, int]:
    chunk = min(2**17, count + 1)
    return chunk, shard_rows_for(8, count + 1, shard_bytes, chunk)


class _RaggedBuffer:
    """Rows of a ragged array waiting to be written in whole shards, and its offsets so far.

    A call's samples are kept as one array and the offsets as 8-byte integers: a build of a
    million images passes a million ``source`` paths through here, and one array and one Python
    int per sample cost about 145 bytes more until the commit (190 against 44 bytes a 19-byte path).
    The offsets too are written a whole shard of them at a time (:meth:`take_offsets`), so neither
    holds more than a shard, whatever the count."""

    def __init__(self, shard_rows: int) -> None:
        self.shard_rows = shard_rows
        self.parts: list[np.ndarray] = []
        self.pending = 0
        self.written = 0
        self.samples = 0
        #: the offsets not written yet; the first of them is offset row ``offsets_written``
        self.offsets = array("q", [0])
        self.offsets_written = 0
        self.end = 0

    def add(self, samples: Sequence[np.ndarray]) -> None:
        """Append ``samples`` (one array of rows each, in sample order)."""
        if not samples:
            return
        counts = np.fromiter((len(a) for a in samples), dtype=np.int64, count=len(samples))
        self.parts.append(samples[0] if len(samples) == 1 else np.concatenate(samples))
        self.pending += int(counts.sum())
        self.samples += len(samples)
        ends = np.cumsum(counts) + self.end
        self.end = int(ends[-1])
        self.offsets.frombytes(ends.astype(np.int64).tobytes())

    def take_offsets(self, shard_rows: int, final: bool) -> tuple[int, np.ndarray] | None:
        """Whole shards of ``shard_rows`` held offsets (all of them when ``final``) and the offset row
        they start at, or None."""
        n = len(self.offsets) if final else (len(self.offsets) // shard_rows) * shard_rows
        if not n:
            return None
        rows = np.frombuffer(self.offsets, dtype=np.int64)[:n].astype("<i8")
        start = self.offsets_written
        del self.offsets[:n]
        self.offsets_written += n
        return start, rows

    def take(self, final: bool) -> np.ndarray | None:
        """Whole shards of buffered rows (everything when ``final``), or None."""
        if not self.parts:
            return None
        n = self.pending if final else (self.pending // self.shard_rows) * self.shard_rows
        if not n:
            return None
        flat = np.concatenate(self.parts) if len(self.parts) > 1 else self.parts[0]
        rows, rest = flat[:n], flat[n:]
        self.parts = [rest] if len(rest) else []
        self.pending = len(rest)
        return rows


class ArrayChange(Protocol):
    """A change of a complete store's arrays as its backend's half sees it
    (:class:`~dlpack.pack.transaction.ArrayTransaction`): what it reads, and what it sets
    (``opened``, ``committed``, ``own_stage``)."""

    out: Path
    manifest: Manifest
    drop: tuple[str, ...]
    stage: Path
    shard_bytes: int
    created: dict[str, ArraySpec]
    opened: StoreWriter | None
    committed: bool
    own_stage: bool

    def attach(self, spec: ArraySpec) -> None: ...


class Backend(ABC):
    """A registry entry: recognises, opens and creates one kind of store."""

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]] = ()
    supports_write: ClassVar[bool] = True
    supports_random_access: ClassVar[bool] = True

    @classmethod
    @abstractmethod
    def detect(cls, path: Path) -> bool:
        """True when ``path`` looks like this backend's store (complete or not)."""

    @classmethod
    @abstractmethod
    def is_own(cls, path: Path) -> bool:
        """True when ``path`` carries dlpack's marker (a complete or partial dlpack store of this backend)."""

    @classmethod
    def shard_rows(cls, spec: ArraySpec, count: int, shard_bytes: int = DEFAULT_SHARD_BYTES) -> int:
        """Samples per aligned write block of a fixed array (rows of data per shard for a ragged
        one): what its writer's ``shard_rows`` will be, known before any store exists (for plans)."""
        return shard_rows(spec, count, shard_bytes)

    @classmethod
    @abstractmethod
    def open_reader(cls, path: Path, mode: Mode = "r") -> StoreReader: ...

    @classmethod
    def remove(cls, path: Path) -> None:
        """Remove a store of this backend at ``path``, complete or partial (or whatever is there):
        a file or link is unlinked, a folder removed with everything in it."""
        if not path.is_dir() or path.is_symlink():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
        shutil.rmtree(path, ignore_errors=True)

    @classmethod
    def foreign_reason(cls, path: Path) -> str | None:
        """Why ``path`` (a folder, or a regular file with one name, without dlpack's marker) is not
        what a build of this backend leaves when killed while creating its store; None when it is.

        A build removes such a leftover of its own; anything else at its paths is someone else's.
        """
        return f"it is a {'folder' if path.is_dir() else 'file'} without dlpack's marker"

    @classmethod
    def carry_foreign(cls, store: Path, new: Path, manifest: Manifest) -> list[str]:
        """Copy what a user put into the complete store ``store`` that is not dlpack's (not listed by
        its ``manifest``) into ``new``, its next generation, unchanged; returns what was carried.

        How ``build --update`` replaces a store without deleting anything that is not dlpack's.
        A backend whose stores hold nothing but dlpack's own data carries nothing.
        """
        return []

    @classmethod
    @abstractmethod
    def open_writer(cls, path: Path, mode: Mode = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> StoreWriter:
        """A writer for ``path``; call its ``open()`` once in the main process before writing."""

    # A change of a complete store's arrays (dlpack.add_array, dlpack augment): the backend's half
    # of dlpack.pack.transaction, which holds what both share and publishes a staged store.

    @classmethod
    def change_name(cls, name: str) -> str:
        """The name new array ``name`` has in a change's writer until the change is switched in."""
        return name

    @classmethod
    def begin_change(cls, change: ArrayChange, resume: Sequence[ArraySpec]) -> None:
        """Open ``change.opened`` for writing the new arrays, the arrays ``change.drop`` gone from
        what it lists, the fixed arrays ``resume`` of a killed change attached and whatever else
        that change left removed (a StoreError when they cannot be kept)."""
        raise StoreError(f"{cls.name} stores cannot change their arrays")

    @classmethod
    def check_new_array(cls, change: ArrayChange, spec: ArraySpec) -> None:
        """Refuse new array ``spec`` where something not the store's already takes its place."""
        return None

    @classmethod
    def commit_change(cls, change: ArrayChange, after: Manifest) -> Path | None:
        """Switch the new arrays in with manifest ``after``: the staged store the caller publishes
        at ``change.out``, or None when the store itself was switched (it is then the new one)."""
        raise StoreError(f"{cls.name} stores cannot change their arrays")

    @classmethod
    def abort_change(cls, change: ArrayChange, keep: bool) -> None:
        """Undo a change that failed: the store stays as it was (``keep``: the new arrays written
        so far stay for a resumed change to attach)."""
        if change.opened is not None:
            change.opened.abort()
