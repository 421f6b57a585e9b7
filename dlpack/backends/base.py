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

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from ..errors import OptionError, StoreError
from ..manifest import ArraySpec, Manifest

__all__ = ["ArrayAccess", "ArraySpec", "Backend", "Mode", "StoreReader", "StoreWriter", "DEFAULT_SHARD_BYTES"]

Mode = Literal["r", "r+", "a", "w-"]
WRITE_MODES: tuple[str, ...] = ("r+", "a", "w-")
#: "Tens of MB per shard" keeps a dataset at a few hundred files (docs/format.md).
DEFAULT_SHARD_BYTES = 32 * 2**20
#: Arrays whose samples are smaller than this are read whole once and indexed in memory.
_SMALL_SAMPLE = 4096
_SMALL_ARRAY = 64 * 2**20


def check_mode(mode: str, allowed: Sequence[str]) -> None:
    if mode not in allowed:
        raise OptionError(f"mode must be one of {', '.join(allowed)} (as in h5py), got {mode!r}")


def rows_per_shard(item_nbytes: int, count: int, shard_bytes: int, chunk: int = 1) -> int:
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
    return rows_per_shard(spec.item_nbytes, rows, shard_bytes, chunk_rows(spec, count))


class ArrayAccess(Protocol):
    """Backend-specific read access to one stored (physical) array, N rows first."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    def read_rows(self, start: int, stop: int) -> np.ndarray: ...

    def read_into(self, positions: list[int], out: np.ndarray) -> np.ndarray: ...

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
        self._sources: tuple[bytes, list[int]] | None = None

    # ------------------------------------------------------------------ backend hooks

    @property
    @abstractmethod
    def manifest(self) -> Manifest: ...

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
            acc = self._access[stored_name] = self._open_array(stored_name)
        return acc

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
        """A whole fixed array ``[N, *shape]``, read once and cached (for small per-sample arrays)."""
        arr = self._whole.get(name)
        if arr is None:
            spec = self._fixed(name)
            acc = self._stored(name)
            n = len(self)
            if acc.shape[0] < n or tuple(acc.shape[1:]) != spec.shape:
                raise StoreError(
                    f"array {name!r} of {self.path} has shape {list(acc.shape)}, the manifest says "
                    f"{[n, *spec.shape]}; the store is damaged, rebuild it"
                )
            arr = self._whole[name] = acc.read_rows(0, n)
        return arr

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

    def read_into(self, name: str, indices: Sequence[int] | np.ndarray, out: np.ndarray) -> np.ndarray:
        """Gather samples ``indices`` of fixed array ``name`` into ``out[:len(indices)]``."""
        spec = self._fixed(name)
        if self._small(spec):
            np.take(self.read_all(name), np.asarray(indices, dtype=np.int64), axis=0, out=out[: len(indices)])
            return out
        return self._stored(name).read_into([int(i) for i in indices], out)

    def _ragged_offsets(self, name: str) -> list[int]:
        off = self._offsets.get(name)
        if off is None:
            acc = self._stored(name + "_offsets")
            raw = acc.read_rows(0, acc.shape[0])
            n = len(self)
            if len(raw) != n + 1 or (n and (raw[0] != 0 or np.any(np.diff(raw) < 0))):
                raise StoreError(f"{name}_offsets of {self.path} is damaged (not {n + 1} rising offsets); rebuild it")
            if n and int(raw[-1]) > self._stored(name + "_data").shape[0]:
                raise StoreError(f"{name}_offsets of {self.path} points past {name}_data; rebuild it")
            off = self._offsets[name] = raw.tolist()  # plain ints: indexing NumPy per item costs microseconds
        return off

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
        return self._stored(name + "_data").read_rows(off[index], off[index + 1])

    # ------------------------------------------------------------------ images and sources

    def read_image(self, index: int) -> np.ndarray:
        """One image as H x W x C; ``index`` is already validated (0 <= index < len)."""
        image = self.manifest.image
        if image.layout == "fixed":
            return self.read("images", index)
        shape = tuple(int(v) for v in self.read_all("image_shapes")[index])
        return self.read("image", index).reshape(shape)

    def source(self, index: int) -> str:
        """The relative source path of sample ``index``."""
        if self._sources is None:
            off = self._ragged_offsets("source")
            acc = self._stored("source_data")
            self._sources = (acc.read_rows(0, acc.shape[0]).tobytes(), off)
        data, off = self._sources
        return data[off[index] : off[index + 1]].decode("utf-8")

    # ------------------------------------------------------------------ lifecycle

    def nbytes_on_disk(self) -> int:
        """Bytes the store takes on disk (every file of a folder store)."""
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def warm(self) -> None:
        """Open maps and read indexes now (thread-safe afterwards; the loader calls it before threads start)."""
        for name, spec in self.arrays.items():
            if spec.ragged:
                self._ragged_offsets(name)
                self._stored(name + "_data").warm()
            elif self._small(spec):
                self.read_all(name)
            else:
                self._stored(name).warm()
        if len(self) and "source" in self.arrays:
            self.source(0)

    def close(self) -> None:
        """Release open handles and maps; the reader reopens lazily if used again."""
        for acc in self._access.values():
            acc.close()
        self._access.clear()
        self._whole.clear()
        self._offsets.clear()
        self._sources = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "mode": self.mode}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["mode"])  # type: ignore[misc]

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoreWriter(ABC):
    """Write side of a store: create named arrays, stream them in blocks, commit the manifest last.

    Fixed arrays are written at their final sample index by ``write_block(name, start, values)``.
    When ``parallel_safe(name)`` is true, worker processes may write disjoint ranges aligned to
    ``block_len(name)`` samples concurrently (a block is a whole Zarr shard, so no two processes
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

    # ------------------------------------------------------------------ arrays

    def create_array(self, spec: ArraySpec, count: int) -> None:
        """Create array ``spec`` for ``count`` samples (every array of a store has the same count)."""
        if self.count is not None and count != self.count:
            raise OptionError(f"array {spec.name!r} has {count} samples, the store has {self.count}")
        if spec.name in self.arrays:
            raise OptionError(f"store {self.path} already has an array {spec.name!r}; delete_array it first")
        for other in self.arrays.values():
            clash = set(spec.stored_names()) & set(other.stored_names())
            if clash:
                raise OptionError(f"array {spec.name!r} would overwrite {sorted(clash)} of array {other.name!r}")
        self.count = count
        chunk, rows = chunk_rows(spec, count), shard_rows(spec, count, self.shard_bytes)
        if spec.ragged:
            self._create_stored(spec.name + "_data", spec, 0, chunk, rows)
            off = ArraySpec(spec.name + "_offsets", "<i8")
            self._create_stored(spec.name + "_offsets", off, count + 1, *_offsets_layout(count, self.shard_bytes))
            self._ragged[spec.name] = _RaggedBuffer(rows)
        else:
            self._create_stored(spec.name, spec, count, chunk, rows)
        self.arrays[spec.name] = spec

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

    def undo_commit(self, keep: Sequence[str]) -> bool:
        """Take a partial store killed while committing back to holding only arrays ``keep``.

        Removes every other stored array and the manifest, as if they had never been written, so a
        resumed build commits again and ends with the same bytes. False when the backend cannot
        (the store is then to be discarded).
        """
        return False

    def share_block(self, name: str, start: int, other: Path) -> bool:
        """Make block ``start`` (a ``block_len`` multiple) of fixed array ``name`` the same block of the
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
        for stored in spec.stored_names():
            self._delete_stored(stored)
        self._ragged.pop(name, None)

    def block_len(self, name: str) -> int:
        """Samples per aligned write block of fixed array ``name`` (a whole shard)."""
        return self._stored_layout(name)[1]

    def parallel_safe(self, name: str) -> bool:
        """Whether worker processes may write disjoint ``block_len`` blocks of ``name`` concurrently."""
        return False

    def write_block(self, name: str, start: int, values: np.ndarray | Sequence[np.ndarray]) -> None:
        """Write samples ``start .. start + len(values)`` of array ``name``.

        Fixed arrays take an array ``[B, *shape]``; ragged arrays a sequence of ``[rows_i, *shape]``
        arrays, appended in order (``start`` must be the number of samples written so far).
        """
        spec = self.arrays.get(name)
        if spec is None:
            raise StoreError(f"store {self.path} has no array {name!r}; create_array it first")
        assert self.count is not None
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
        for v in values:
            a = np.asarray(v, dtype=np.dtype(spec.dtype))
            if spec.shape == ():
                a = a.reshape(-1)
            elif a.shape[1:] != spec.shape:
                raise OptionError(f"ragged array {name!r} holds rows of shape {spec.shape}, got {a.shape[1:]}")
            buf.add(a)
        self._flush_ragged(name, final=False)

    def _flush_ragged(self, name: str, final: bool) -> None:
        buf = self._ragged[name]
        rows = buf.take(final)
        if rows is not None:
            self._write_rows(name + "_data", buf.written, rows)
            buf.written += len(rows)

    def commit(self, manifest: Manifest) -> None:
        """Write buffered data and ragged offsets, then the manifest (listing this writer's arrays)."""
        from dataclasses import replace

        for name, buf in self._ragged.items():
            if buf.samples != self.count:
                raise StoreError(f"ragged array {name!r} has {buf.samples} of {self.count} samples written")
            self._flush_ragged(name, final=True)
            self._write_rows(name + "_offsets", 0, np.asarray(buf.offsets, dtype="<i8"))
        self._write_manifest(replace(manifest, arrays=dict(sorted(self.arrays.items()))))

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


def _offsets_layout(count: int, shard_bytes: int) -> tuple[int, int]:
    chunk = min(2**17, count + 1)
    return chunk, rows_per_shard(8, count + 1, shard_bytes, chunk)


class _RaggedBuffer:
    """Rows of a ragged array waiting to be written in whole shards, and its offsets so far."""

    def __init__(self, shard_rows: int) -> None:
        self.shard_rows = shard_rows
        self.parts: list[np.ndarray] = []
        self.pending = 0
        self.written = 0
        self.samples = 0
        self.offsets = [0]

    def add(self, rows: np.ndarray) -> None:
        self.parts.append(rows)
        self.pending += len(rows)
        self.samples += 1
        self.offsets.append(self.offsets[-1] + len(rows))

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
    def block_rows(cls, spec: ArraySpec, count: int, shard_bytes: int = DEFAULT_SHARD_BYTES) -> int:
        """Samples per aligned write block of a fixed array (rows of data per shard for a ragged
        one): what its writer's ``block_len`` will be, known before any store exists (for plans)."""
        return shard_rows(spec, count, shard_bytes)

    @classmethod
    @abstractmethod
    def open_reader(cls, path: Path, mode: Mode = "r") -> StoreReader: ...

    @classmethod
    @abstractmethod
    def open_writer(cls, path: Path, mode: Mode = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> StoreWriter:
        """A writer for ``path``; call its ``open()`` once in the main process before writing."""
