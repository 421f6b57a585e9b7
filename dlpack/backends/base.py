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
import hashlib
import re
import shutil
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np

from ..errors import OptionError, StoreError
from ..manifest import ArraySpec, Manifest

if TYPE_CHECKING:
    from .reader import StoreReader
    from .writer import StoreWriter

__all__ = [
    "ArrayAccess", "ArrayChange", "ArraySpec", "Backend", "Mode", "StoreReader", "StoreWriter", "DEFAULT_SHARD_BYTES",
]  # fmt: skip

Mode = Literal["r", "r+", "a", "w-"]
WRITE_MODES: tuple[str, ...] = ("r+", "a", "w-")
#: "Tens of MB per shard" keeps a dataset at a few hundred files (docs/format.md).
DEFAULT_SHARD_BYTES = 32 * 2**20
#: Arrays whose samples are smaller than this are read whole once and indexed in memory.
_SMALL_SAMPLE = 4096
#: Attribute of every stored array's metadata (Zarr ``zarr.json`` attributes, HDF5 dataset
#: attribute): the SHA-256 of its bytes once committed, "" while it is being written.
DIGEST_ATTR = "dlpack_sha256"


#: How a store in an object store is opened, by kind ("writer": ``(where, mode, shard_bytes)``;
#: "reader": ``(where, mode)``): installed by :mod:`dlpack.storage`, which sits above the backends
#: and owns the object-store client (:func:`register_remote`).
_REMOTE: dict[str, Any] = {}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def register_remote(kind: str, opener: Any) -> None:
    """Install how stores in an object store are opened (``kind``: "writer" or "reader")."""
    _REMOTE[kind] = opener


def is_remote(where: object) -> bool:
    """Whether ``where`` names a store in an object store (an ``s3://`` URL, or such a Location)."""
    if hasattr(where, "is_local"):
        return not where.is_local
    return isinstance(where, str) and _URL.match(where) is not None


def remote_opener(kind: str, where: object) -> Any:
    """The installed opener of ``kind`` for the object-store ``where`` (a StoreError when none is)."""
    opener = _REMOTE.get(kind)
    if opener is None:
        raise StoreError(f"{where}: no {kind} of stores in an object store is installed; import dlpack.storage first")
    return opener


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


#: Prefix of a digest taken shard by shard (:func:`shard_digest`): what a store written to object
#: storage records, where the writer never reads its shards back (docs/format.md, "Checksums").
SHARD_DIGEST = "shards:"


def rows_sha256(rows: np.ndarray, dtype: str) -> bytes:
    """The SHA-256 (raw 32 bytes) of rows as :func:`array_digest` hashes them: C order, little-endian."""
    block = np.ascontiguousarray(rows, dtype=np.dtype(dtype).newbyteorder("<"))
    return hashlib.sha256(block.data.cast("B") if block.size else b"").digest()


def shard_digest(per_shard: Sequence[bytes]) -> str:
    """The digest of an array from its shards' :func:`rows_sha256` in shard order: ``shards:`` and the
    SHA-256 hex of their concatenation. Each shard's hash is taken where the shard is written, so no
    one process reads the whole array back; any one shard can be checked on its own."""
    return SHARD_DIGEST + hashlib.sha256(b"".join(per_shard)).hexdigest()


def digest_like(expected: str, read_rows: Any, rows: int, row_nbytes: int, dtype: str, shard_rows: int) -> str:
    """The digest of a stored array of the kind ``expected`` is (:func:`array_digest`, or
    :func:`shard_digest` over shards of ``shard_rows`` rows), to compare with it."""
    if not expected.startswith(SHARD_DIGEST):
        return array_digest(read_rows, rows, row_nbytes, dtype)
    step = max(1, shard_rows)
    return shard_digest([rows_sha256(read_rows(s, min(rows, s + step)), dtype) for s in range(0, rows, step)])


def checked_positions(idx: np.ndarray, n: int, where: object) -> None:
    """Refuse indices outside ``0..n-1`` (two reductions: the gathers then skip NumPy's own check)."""
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= n):
        bad = idx[(idx < 0) | (idx >= n)][0]
        raise OptionError(f"sample index {int(bad)} is out of range for {where} with {n} samples")


def stored_dtype(spec: ArraySpec, stored: str) -> str:
    """The dtype of stored array ``stored`` of ``spec`` (offsets are int64)."""
    return "<i8" if spec.ragged and stored.endswith("_offsets") else spec.dtype


def changed_error(path: object, detail: str) -> StoreError:
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

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start .. stop`` as a new array; a damaged chunk is a StoreError."""
        ...

    def read_into(self, positions: list[int], out: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        """Rows ``positions`` into ``out`` (row k, or ``rows[k]``), returning ``out``."""
        ...

    # Optional: ``row_source() -> (views, rows_per_view) | None``, where row ``i`` is
    # ``views[i // rows_per_view][i % rows_per_view]`` (raw, in-memory rows; None when not so), so
    # that :meth:`StoreReader.read_into_from` can mix arrays in one pass.

    def warm(self) -> None:
        """Open what reading needs now, so threads can share it (a no-op where nothing is lazy)."""
        ...

    def close(self) -> None:
        """Release what the array holds open (file handles, maps)."""
        ...

    def nbytes_on_disk(self) -> int:
        """Bytes the array takes in the store (compressed, as stored)."""
        ...


class ArrayChange(Protocol):
    """A change of a complete store's arrays as its backend's half sees it
    (:class:`~dlpack.storage.transaction.ArrayTransaction`): what it reads, and what it sets
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

    def attach(self, spec: ArraySpec) -> None:
        """Keep fixed array ``spec`` that a killed transaction of the same change left staged."""
        ...


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
    def open_reader(cls, path: Path, mode: Mode = "r") -> StoreReader:
        """A reader of the store at ``path``; ``mode`` can only be ``"r"``."""
        ...

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
    # of dlpack.storage.transaction, which holds what both share and publishes a staged store.

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
