"""The store writer logic every backend shares: blocks written by sample index, digests as rows land,
ragged buffers, the sources list and the manifest written last, over the template methods a
backend implements (``_create_stored``, ``_write_rows``, ...)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from array import array
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import OptionError, StoreError
from ..manifest import ArraySpec, Manifest, store_generation
from .base import (
    DEFAULT_SHARD_BYTES,
    WRITE_MODES,
    Mode,
    array_digest,
    check_mode,
    chunk_rows,
    shard_rows,
    shard_rows_for,
    stored_dtype,
)


class StoreWriter(ABC):
    """Write side of a store: create named arrays, stream them in blocks, commit the manifest last.

    Fixed arrays are written at their final sample index by ``write_block(name, start, values)``.
    When ``parallel_safe(name)`` is true, worker processes may write disjoint ranges aligned to
    ``shard_rows(name)`` samples concurrently (a block is a whole Zarr shard, so no two processes
    touch one file); send them the pickled writer after every ``create_array``. Ragged arrays are
    appended in sample order by one process (``start`` must be the next sample), buffered and
    written in whole shards. ``commit`` writes everything still buffered, then the manifest.
    """

    #: Whether array digests are taken shard by shard where the shards are written (a store in an
    #: object store: :func:`~dlpack.backends.base.shard_digest`), never by reading the array back.
    shard_digests: ClassVar[bool] = False

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

    def take_landed(self) -> Any:
        """What this copy of the writer wrote since the last call that the driver must record
        (:meth:`note_landed`): a store in an object store's shard objects and their hashes; None here."""
        return None

    def note_landed(self, landed: Any) -> None:  # noqa: B027 - optional hook
        """Record what a worker's copy wrote (:meth:`take_landed`)."""

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
