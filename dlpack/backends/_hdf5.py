"""HDF5 backend: one file with the same array names as the Zarr store (docs/format.md).

Uncompressed fixed arrays (images, labels, ...) are contiguous datasets allocated at creation:
readers memory-map them at the offset HDF5 reports (the memory-bandwidth ceiling, with a file any
HDF5 tool opens), and worker processes write their blocks there with ``os.pwrite``. Compressed
arrays use chunks and the hdf5plugin filters (extra ``[hdf5plugin]``); ragged data is chunked and
grows as it is appended.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._files import fsync_dir, open_regular, writing
from .._maps import huge_pages
from ..errors import (
    DlpackError,
    IncompleteStoreError,
    MissingExtraError,
    StoreDamagedError,
    StoreError,
    StoreExistsError,
    StoreNotFoundError,
)
from ..manifest import ArraySpec, Manifest, sha256_hex
from .base import DEFAULT_SHARD_BYTES, DIGEST_ATTR, ArrayAccess, ArrayChange, Backend, Mode, check_mode
from .reader import StoreReader
from .writer import StoreWriter

__all__ = ["Hdf5Backend", "Hdf5Reader", "Hdf5Writer"]

MANIFEST = "manifest"
_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Blocks written through h5py travel from workers to the main process by pickling: keep them small.
_PICKLED_BLOCK = 4 * 2**20
#: Free space kept in reserve on top of what a write needs: HDF5 crashes the process (SIGSEGV)
#: when the disk fills while it writes its own metadata, so dlpack refuses before that can happen.
SPACE_MARGIN = 64 * 2**20
_MANIFEST_ATTR = "dlpack_manifest_sha256"


#: Names a change of the arrays gives the arrays it writes or moves aside until its switch:
#: users' names never start so (dlpack.dataset refuses them).
STAGED_PREFIX = "dlpack_"


def _tag(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def staged_name(name: str) -> str:
    """The name a change writes array ``name`` under until the switch: ``dlpack_new_<tag>``."""
    return STAGED_PREFIX + "new_" + _tag(name)


def _retired_name(name: str) -> str:
    return STAGED_PREFIX + "old_" + _tag(name)


def ensure_space(path: Path, nbytes: int, what: str) -> None:
    """Raise a StoreError unless the file system of ``path`` has ``nbytes`` + the margin free."""
    free = shutil.disk_usage(path.parent if not path.is_dir() else path).free
    need = int(nbytes) + SPACE_MARGIN
    if free < need:
        raise StoreError(
            f"not enough free space for {what} in {path}: {need / 2**20:.0f} MiB needed "
            f"(with a {SPACE_MARGIN // 2**20} MiB margin), {free / 2**20:.0f} MiB free; free some space and build again"
        )


def _h5_error(path: Path, exc: OSError) -> StoreError:
    """An h5py open error as a StoreError; a lock held by a reader gets its own message."""
    text = str(exc)
    if "lock" in text.lower() or "already open" in text.lower():
        return StoreError(
            f"{path} is open elsewhere (HDF5 refuses to write a file a reader has open): "
            f"close its readers and try again ({text})"
        )
    return StoreError(f"cannot open {path} for writing: {text}")


def _filter_kwargs(name: str) -> dict[str, Any]:
    if name == "none":
        return {}
    try:
        import hdf5plugin
    except ImportError as exc:
        raise MissingExtraError("hdf5plugin", "hdf5plugin", f"HDF5 with compression={name}") from exc
    if name == "lz4":
        return dict(hdf5plugin.Blosc(cname="lz4", clevel=5, shuffle=hdf5plugin.Blosc.BITSHUFFLE))
    return dict(hdf5plugin.Zstd(clevel=3))


def _load_plugins() -> None:
    try:  # filters are found only once hdf5plugin registered them in this process
        import hdf5plugin  # noqa: F401
    except ImportError:
        pass


def _shard_rows(row_nbytes: int, raw: bool, rows: int, shard_bytes: int) -> int:
    """Rows per write block: a shard's worth for raw (pwrite) arrays, a few MB for h5py-written ones."""
    return max(1, min(max(1, rows), (shard_bytes if raw else _PICKLED_BLOCK) // max(1, row_nbytes)))


def _signed(path: Path, follow_symlinks: bool = True) -> bool:
    """Whether ``path`` is a regular file that starts with the HDF5 signature (never blocks on a pipe)."""
    try:
        fd = open_regular(path, follow_symlinks=follow_symlinks)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return f.read(8) == _SIGNATURE


def _h5_readable(path: Path) -> bool:
    """Whether HDF5 can open the file at ``path`` (a regular file, checked by the caller)."""
    import h5py

    try:
        with h5py.File(path, "r"):
            return True
    except Exception:  # whatever h5py raises, the file is not readable
        return False


@contextlib.contextmanager
def _damage(path: Path, what: str) -> Iterator[None]:
    """Turn what h5py raises on a damaged file into a StoreError naming the store and the object.

    Corrupt object headers raise KeyError, OSError, RuntimeError, ValueError, TypeError and more,
    depending on which field the damage hit.
    """
    try:
        yield
    except DlpackError:
        raise
    except Exception as exc:  # every h5py error here means a file it cannot read
        raise StoreError(
            f"{path}: {what} cannot be read, the file is damaged ({type(exc).__name__}: {exc}); rebuild it"
        ) from exc


#: dlpack's root attribute, as its name is stored in the root group's header near the file's start.
_MARKER_NAME = b"dlpack_format"
#: How much of the file's start is searched for it when HDF5 cannot open the file.
_HEAD_BYTES = 1 << 16


def _stored_eof(head: bytes) -> int | None:
    """The file size the HDF5 superblock at the start of ``head`` records, or None where it cannot be read."""
    if not head.startswith(_SIGNATURE) or len(head) < 16:
        return None
    version = head[8]
    if version in (0, 1):
        size, at = head[13], 24 + 4 * version  # version 1 adds indexed-storage K and 2 reserved bytes
        base, eof = at, at + 2 * size
    elif version in (2, 3):
        size = head[9]
        base, eof = 12, 12 + 2 * size
    else:
        return None
    if size not in (2, 4, 8) or len(head) < eof + size:
        return None
    return int.from_bytes(head[base : base + size], "little") + int.from_bytes(head[eof : eof + size], "little")


def _damaged_own(path: Path, fd: int, exc: Exception) -> StoreDamagedError | None:
    """The error for a file HDF5 cannot open that still starts as a dlpack store (the HDF5 signature,
    dlpack's root attribute in its header): damage, most often a copy cut short, not a foreign file."""
    try:
        head = os.pread(fd, _HEAD_BYTES, 0)
        size = os.fstat(fd).st_size
    except OSError:
        return None
    if not head.startswith(_SIGNATURE) or _MARKER_NAME not in head:
        return None
    eof = _stored_eof(head)
    if eof is not None and eof > size:
        what = (
            f"it is cut short: {size} bytes of the {eof} its HDF5 superblock records (a copy or transfer interrupted?)"
        )
    else:
        what = f"HDF5 cannot open it ({exc})"
    return StoreDamagedError(f"{path} is a damaged dlpack HDF5 store: {what}; copy it again or rebuild it")


def _has_marker(path: Path) -> bool:
    """Whether ``path`` is an HDF5 file carrying dlpack's root attribute."""
    if path.is_symlink() or not _signed(path, follow_symlinks=False):
        return False
    import h5py

    try:
        with h5py.File(path, "r") as h:
            return bool(h.attrs.get("dlpack_format") == "dlpack")
    except Exception:  # a damaged file is not provably dlpack's, whatever h5py raises
        return False


class Hdf5Writer(StoreWriter):
    """HDF5 has no safe concurrent writers through the library (two writers corrupt silently).

    Uncompressed fixed arrays are the exception that matters for speed: they are contiguous and
    allocated at creation, so worker processes write disjoint blocks of raw bytes straight to
    their byte range with ``os.pwrite``, while this process has the file closed. Everything else
    goes through h5py in the one main process.
    """

    def __init__(self, path: str | Path, mode: Mode = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        super().__init__(path, mode, shard_bytes)
        #: Stored array -> (byte offset of its contiguous data or None, row bytes, block rows).
        self._raw: dict[str, tuple[int | None, int, int]] = {}
        self._reset_handles()

    def _reset_handles(self) -> None:
        self._h_file: Any = None

    def _file(self) -> Any:
        if self._h_file is None:
            import h5py

            _load_plugins()
            try:
                self._h_file = h5py.File(self.path, "r+")
            except OSError as exc:
                raise _h5_error(self.path, exc) from exc
        return self._h_file

    def _close(self) -> None:
        if self._h_file is not None:
            try:
                self._h_file.close()
            finally:
                self._h_file = None

    def open(self) -> None:
        import h5py

        exists = self.path.exists() or self.path.is_symlink()
        if self.mode == "w-" or (self.mode == "a" and not exists):
            if exists:
                raise StoreExistsError(f"{self.path} already exists")
            ensure_space(self.path, 0, "a new HDF5 store")
            with h5py.File(self.path, "w-") as f:
                f.attrs["dlpack_format"] = "dlpack"
            return
        if not exists:
            raise StoreNotFoundError(f"no store at {self.path} to open with mode {self.mode!r}")
        if not _has_marker(self.path):
            raise StoreError(f"{self.path} is not a dlpack store; dlpack writes only into its own stores")
        _load_plugins()
        with h5py.File(self.path, "r") as f:
            if MANIFEST in f:  # a complete store; a partial one (resume) has its arrays attached later
                reader = Hdf5Reader(self.path)
                try:
                    self.arrays = dict(reader.manifest.arrays)
                    self.count = reader.manifest.count
                finally:
                    reader.close()
            for name in self._stored_names():
                ds = f[name]
                offset = ds.id.get_offset() if ds.chunks is None and ds.compression is None else None
                row = int(np.prod(ds.shape[1:], dtype=np.int64)) * ds.dtype.itemsize
                self._raw[name] = (
                    None if offset is None else int(offset),
                    row,
                    _shard_rows(row, offset is not None, ds.shape[0], self.shard_bytes),
                )

    def _stored_names(self) -> list[str]:
        return [n for spec in self.arrays.values() for n in spec.stored_names()]

    def _create_stored(self, name: str, spec: ArraySpec, rows: int, chunk: int, shard_rows: int) -> None:
        import h5py

        dtype = np.dtype(spec.dtype)
        ensure_space(self.path, rows * spec.item_nbytes, f"array {name!r}")
        f = self._file()
        filt = _filter_kwargs(spec.compression)
        offset: int | None = None
        if rows == 0 or filt:  # growing ragged data, or compressed: chunked
            maxshape = (None, *spec.shape) if rows == 0 else None
            f.create_dataset(
                name, shape=(rows, *spec.shape), maxshape=maxshape, dtype=dtype, chunks=(chunk, *spec.shape),
                track_times=False, **filt,
            )  # fmt: skip
        else:
            # Contiguous and allocated now, so readers can memory-map it at a fixed offset.
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            dcpl.set_obj_track_times(False)  # timestamps would make identical builds differ
            space = h5py.h5s.create_simple((rows, *spec.shape))
            dset = h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(dtype), space, dcpl=dcpl)
            got = dset.get_offset()
            offset = None if got is None else int(got)
        f[name].attrs[DIGEST_ATTR] = ""  # "being written": no committed manifest lists this array yet
        self._close()  # workers may now write raw blocks; the file reopens for the next h5py call
        self._raw[name] = (
            offset,
            spec.item_nbytes,
            _shard_rows(spec.item_nbytes, offset is not None, rows, self._shard_budgets.get(name, self.shard_bytes)),
        )

    def _attach_stored(self, name: str, spec: ArraySpec, rows: int) -> None:
        import h5py

        _load_plugins()
        try:
            with h5py.File(self.path, "r") as f:
                ds = f.get(name)
                if not isinstance(ds, h5py.Dataset):
                    raise StoreError(f"{self.path} has no array {name!r} to reopen")
                if tuple(ds.shape) != (rows, *spec.shape) or np.dtype(ds.dtype) != np.dtype(spec.dtype):
                    raise StoreError(
                        f"array {name!r} of {self.path} holds {list(ds.shape)} {ds.dtype}, "
                        f"expected {[rows, *spec.shape]} {spec.dtype}"
                    )
                got = ds.id.get_offset() if ds.chunks is None and ds.compression is None else None
        except StoreError:
            raise
        except (OSError, KeyError, ValueError) as exc:
            raise StoreError(f"{self.path} is not a readable HDF5 file: {exc}") from exc
        offset = None if got is None else int(got)
        self._raw[name] = (
            offset,
            spec.item_nbytes,
            _shard_rows(spec.item_nbytes, offset is not None, rows, self.shard_bytes),
        )

    def _read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        spec = self.arrays[name]
        offset, row_nbytes, _ = self._raw[name]
        if offset is None:
            return np.asarray(self._file()[name][start:stop])
        self._close()
        want = (stop - start) * row_nbytes
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, want, offset + start * row_nbytes)
        finally:
            os.close(fd)
        if len(data) != want:
            raise StoreError(f"array {name!r} of {self.path} ends before sample {stop}; the file is truncated")
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        return np.frombuffer(data, dtype=dtype).reshape(stop - start, *spec.shape)

    def _stored_layout(self, name: str) -> tuple[int, int]:
        _, _, block = self._raw[name]
        return 1, block

    def parallel_safe(self, name: str) -> bool:
        spec = self.arrays.get(name)
        return spec is not None and not spec.ragged and self._raw.get(name, (None, 0, 0))[0] is not None

    def _write_rows(self, name: str, start: int, rows: np.ndarray) -> None:
        offset, row_nbytes, _ = self._raw[name]
        if offset is None:
            ensure_space(self.path, rows.nbytes, f"array {name!r}")
            ds = self._file()[name]
            stop = start + len(rows)
            if stop > ds.shape[0]:
                ds.resize((stop, *ds.shape[1:]))
            ds[start:stop] = rows
            return
        self._close()
        data = np.ascontiguousarray(rows, dtype=rows.dtype.newbyteorder("<"))
        fd = os.open(self.path, os.O_WRONLY)
        try:
            view, pos = data.data.cast("B"), offset + start * row_nbytes
            with writing(self.path):
                while view:
                    n = os.pwrite(fd, view, pos)
                    view, pos = view[n:], pos + n
        finally:
            os.close(fd)

    def _delete_stored(self, name: str) -> None:
        f = self._file()
        if name in f:
            del f[name]  # HDF5 does not give the space back; a rebuild compacts the file
        self._raw.pop(name, None)

    def _rename_stored(self, old: str, new: str) -> None:
        self._file().move(old, new)
        self._raw[new] = self._raw.pop(old)

    def clear_debris(self) -> list[str]:
        import h5py

        listed = set(self._stored_names()) | {MANIFEST}
        f = self._file()
        found = []
        for name in list(f):
            node = f.get(name)
            if name in listed or not isinstance(node, h5py.Dataset):
                continue
            if isinstance(node.attrs.get(DIGEST_ATTR), (str, bytes)):  # a dlpack writer's, never committed
                del f[name]
                self._raw.pop(name, None)
                found.append(name)
        self._close()
        return found

    def _stored_rows(self, name: str) -> int:
        return int(self._file()[name].shape[0])

    def _read_stored(self, name: str, start: int, stop: int) -> np.ndarray:
        return np.asarray(self._file()[name][start:stop])

    def _set_digest(self, name: str, digest: str) -> None:
        ensure_space(self.path, 0, f"the checksum of {name!r}")
        self._file()[name].attrs[DIGEST_ATTR] = digest
        self._close()  # workers may write raw blocks next

    def _write_manifest(self, manifest: Manifest) -> None:
        import h5py

        text = manifest.to_json()
        ensure_space(self.path, 2 * len(text.encode("utf-8")), "the manifest")
        f = self._file()
        if MANIFEST in f:
            del f[MANIFEST]
        f.attrs[_MANIFEST_ATTR] = sha256_hex(text)
        f.create_dataset(MANIFEST, data=text, dtype=h5py.string_dtype("utf-8"))
        f.attrs["dlpack_format_version"] = manifest.format_version
        self._close()

    def abort(self) -> None:
        self._close()


class _MappedArray:
    """A contiguous dataset read through a memory map of the file (a plain ndarray view:
    np.memmap's subclass costs microseconds per index)."""

    def __init__(self, view: np.ndarray, nbytes: int, path: Path, fd: int, mapped: int) -> None:
        self.view = view
        self.shape = tuple(view.shape)
        self.dtype = view.dtype
        self._nbytes = nbytes
        self._path, self._fd, self._mapped = path, fd, mapped

    def check_rows(self, idx: Any = None) -> None:
        """Refuse to read when the file shrank under the map (another program rewrote it in place):
        a page past the file's end is a SIGBUS, which Python cannot catch. One ``fstat`` of the
        descriptor HDF5 reads through (the very file mapped), well under a microsecond."""
        try:
            size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise StoreError(f"{self._path} cannot be read any more: {exc}") from exc
        if size < self._mapped:
            raise StoreError(
                f"{self._path} shrank from {self._mapped} to {size} bytes while the store was open (another "
                "program rewrote it in place); reading it would crash the process; open the store again once "
                "it is complete, or rebuild it"
            )

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        self.check_rows()
        return np.array(self.view[start:stop])

    def row_source(self) -> tuple[list[np.ndarray], int]:
        return [self.view], max(1, len(self.view))

    def read_into(self, positions: list[int], out: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        self.check_rows()
        mm = self.view
        dest = range(len(positions)) if rows is None else rows
        for k in sorted(range(len(positions)), key=positions.__getitem__):
            out[dest[k]] = mm[positions[k]]
        return out

    def warm(self) -> None:
        pass

    def close(self) -> None:
        self.view = np.empty((0, *self.shape[1:]), dtype=self.dtype)

    def nbytes_on_disk(self) -> int:
        return self._nbytes


class _H5Array:
    """A chunked (compressed or growing) dataset read through h5py; a damaged chunk is a StoreError."""

    def __init__(self, ds: Any, path: Path, name: str) -> None:
        self.ds = ds
        self.shape = tuple(int(d) for d in ds.shape)
        self.dtype = np.dtype(ds.dtype)
        self._path = path
        self._name = name

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        with _damage(self._path, f"samples {start}..{stop} of array {self._name!r}"):
            return np.asarray(self.ds[start:stop])

    def read_into(self, positions: list[int], out: np.ndarray, rows: Sequence[int] | None = None) -> np.ndarray:
        dest = range(len(positions)) if rows is None else rows
        with _damage(self._path, f"samples of array {self._name!r}"):
            for k, i in enumerate(positions):
                self.ds.read_direct(out, np.s_[int(i)], np.s_[int(dest[k])])
        return out

    def warm(self) -> None:
        pass

    def close(self) -> None:
        pass

    def nbytes_on_disk(self) -> int:
        with _damage(self._path, f"the size of array {self._name!r}"):
            return int(self.ds.id.get_storage_size())


class Hdf5Reader(StoreReader):
    """Memory-maps contiguous uncompressed arrays; other layouts go through h5py."""

    def __init__(self, path: str | Path, mode: Mode = "r") -> None:
        super().__init__(path, mode)
        self._f: Any = None
        self._manifest: Manifest | None = None
        self._map: mmap.mmap | None = None

    def _file(self) -> Any:
        """The open file (one inode for the reader's life: a file renamed over the path later is
        not seen); opening it reads and pins the manifest."""
        if self._f is None:
            import h5py

            _load_plugins()
            # HDF5 opens by path and would block forever on a named pipe: the path must be a regular
            # file first, and the file HDF5 opened must be that one.
            try:
                fd = open_regular(self.path)
            except FileNotFoundError:
                raise StoreNotFoundError(f"{self.path} does not exist") from None
            except OSError as exc:
                raise StoreError(f"{self.path} is not a readable HDF5 file: {exc}") from exc
            try:
                checked = os.fstat(fd)
                try:
                    f = h5py.File(self.path, "r")
                except Exception as exc:  # OSError mostly; other types on some damaged superblocks
                    raise (
                        _damaged_own(self.path, fd, exc)
                        or StoreError(f"{self.path} is not a readable HDF5 file: {exc}")
                    ) from exc
            finally:
                os.close(fd)
            try:
                with _damage(self.path, "the manifest"):
                    opened = os.fstat(f.id.get_vfd_handle())
                    if (opened.st_dev, opened.st_ino) != (checked.st_dev, checked.st_ino):
                        raise StoreError(f"{self.path} was replaced while it was being opened; open it again")
                    manifest = self._read_manifest(f)
            except BaseException:
                with contextlib.suppress(Exception):
                    f.close()
                raise
            self._f = f
            if self._manifest is None:
                self._manifest = manifest
        return self._f

    def _read_manifest(self, f: Any) -> Manifest:
        import h5py

        if MANIFEST not in f:
            if f.attrs.get("dlpack_format") == "dlpack":
                raise IncompleteStoreError(
                    f"{self.path} is an incomplete dlpack store (no manifest: the build failed or was "
                    "killed); run dlpack build again with --overwrite"
                )
            raise StoreNotFoundError(f"{self.path} is an HDF5 file but not a dlpack store (no manifest)")
        node = f[MANIFEST]
        if not isinstance(node, h5py.Dataset) or node.shape != () or node.dtype.kind not in "OS":
            raise StoreError(f"{self.path}: /manifest is not a scalar string")
        raw = node[()]
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError as exc:
            raise StoreError(f"{self.path}: /manifest is not UTF-8: {exc}") from exc
        digest = f.attrs.get(_MANIFEST_ATTR)
        if isinstance(digest, bytes):
            digest = digest.decode("ascii", "replace")
        if digest is not None and not isinstance(digest, str):
            raise StoreError(f"{self.path}: {_MANIFEST_ATTR} must be a string")
        manifest = Manifest.from_json(text, str(self.path), sha256=digest)
        self._pin_manifest(text)
        return manifest

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._file()
        assert self._manifest is not None
        return self._manifest

    def _open_array(self, stored_name: str) -> ArrayAccess:
        f = self._file()
        with _damage(self.path, f"array {stored_name!r}"):
            return self._open_dataset(f, stored_name)

    def _open_dataset(self, f: Any, stored_name: str) -> ArrayAccess:
        import h5py

        if stored_name not in f:
            raise StoreError(f"store {self.path} has no array {stored_name!r}")
        ds = f[stored_name]
        if not isinstance(ds, h5py.Dataset):
            raise StoreError(f"{self.path}: {stored_name!r} is not a dataset")
        # Data kept outside the file could be any file on the system: a store is one file.
        if ds.external or ds.is_virtual:
            kind = "external storage" if ds.external else "a virtual dataset"
            raise StoreError(
                f"{self.path}: array {stored_name!r} uses {kind}; dlpack reads only data inside the store file"
            )
        found = ds.attrs.get(DIGEST_ATTR)
        self.check_generation(stored_name, found.decode("ascii", "replace") if isinstance(found, bytes) else found)
        if ds.dtype.kind not in "biuf" or ds.ndim < 1:
            raise StoreError(f"{self.path}: array {stored_name!r} has dtype {ds.dtype} and {ds.ndim} axes")
        offset = ds.id.get_offset()
        if ds.chunks is None and offset is not None and ds.size:
            if self._map is None:
                # The descriptor HDF5 itself reads through: the map is of the very file (inode)
                # whose manifest this reader pinned, even if another file was renamed over the path.
                handle = f.id.get_vfd_handle()
                if not isinstance(handle, int):
                    raise StoreError(f"{self.path}: the HDF5 file driver gives no file descriptor to map")
                self._map = mmap.mmap(handle, 0, access=mmap.ACCESS_READ)
                huge_pages(self._map)
            count = int(np.prod(ds.shape, dtype=np.int64))
            if int(offset) + count * ds.dtype.itemsize > len(self._map):
                raise StoreError(f"array {stored_name!r} of {self.path} reaches past the end of the file")
            view = np.frombuffer(self._map, dtype=ds.dtype, count=count, offset=int(offset)).reshape(ds.shape)
            return _MappedArray(view, count * ds.dtype.itemsize, self.path, f.id.get_vfd_handle(), len(self._map))
        return _H5Array(ds, self.path, stored_name)

    def close(self) -> None:
        super().close()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a caller still holds an image view; the map goes with it
            self._map = None
        if self._f is not None:
            f, self._f = self._f, None
            with _damage(self.path, "the file"):
                f.close()


class Hdf5Backend(Backend):
    name = "hdf5"
    suffixes = (".h5", ".hdf5")

    @classmethod
    def detect(cls, path: Path) -> bool:
        return _signed(path)

    @classmethod
    def is_own(cls, path: Path) -> bool:
        return _has_marker(path)

    @classmethod
    def shard_rows(cls, spec: ArraySpec, count: int, shard_bytes: int = DEFAULT_SHARD_BYTES) -> int:
        # Uncompressed fixed arrays are contiguous (raw blocks); others are written through h5py.
        raw = spec.compression == "none" and not spec.ragged and count > 0
        return _shard_rows(spec.item_nbytes, raw, count, shard_bytes)

    @classmethod
    def foreign_reason(cls, path: Path) -> str | None:
        """A build killed before its first byte leaves an empty file; one killed before HDF5 flushed
        its metadata leaves a superblock pointing past the end of the file, which nobody can open."""
        if not path.is_file():
            return super().foreign_reason(path)
        try:
            fd = open_regular(path, follow_symlinks=False)
        except OSError as exc:  # swapped for a named pipe since the check, or unreadable
            return f"it cannot be read ({exc})"
        with os.fdopen(fd, "rb") as f:
            head = f.read(len(_SIGNATURE))
        if not head or (head == _SIGNATURE and not _h5_readable(path)):
            return None
        return super().foreign_reason(path)

    @classmethod
    def open_reader(cls, path: Path, mode: Mode = "r") -> StoreReader:
        check_mode(mode, ("r",))
        return Hdf5Reader(path, mode)

    @classmethod
    def open_writer(cls, path: Path, mode: Mode = "w-", shard_bytes: int = DEFAULT_SHARD_BYTES) -> StoreWriter:
        return Hdf5Writer(path, mode, shard_bytes)

    # A change of the arrays: the new arrays are written into the store file under staged names,
    # without keys, and committed; then one session of the HDF5 library (which writes the file
    # when it closes it) renames the arrays they replace aside, the new ones into place, and writes
    # the manifest; the arrays replaced are deleted last. Whatever fails in that session is undone
    # in it.

    @classmethod
    def change_name(cls, name: str) -> str:
        return staged_name(name)

    @classmethod
    def begin_change(cls, change: ArrayChange, resume: Sequence[ArraySpec]) -> None:
        writer = change.opened = cls.open_writer(change.out, "r+", change.shard_bytes)
        writer.open()
        for spec in resume:
            change.attach(spec)
        writer.clear_debris()  # what killed writers left, but the arrays kept
        kept = {staged_name(name) for name in change.created}
        for leftover in [n for n in writer.arrays if n.startswith(STAGED_PREFIX) and n not in kept]:
            writer.delete_array(leftover)  # committed by a call killed before its switch
        writer.abort()  # closes the file: worker processes may read it and write raw blocks next

    @classmethod
    def commit_change(cls, change: ArrayChange, after: Manifest) -> Path | None:
        writer, out, before = change.opened, change.out, change.manifest
        assert writer is not None
        writer.commit(before)  # the staged arrays' checksums; no sample shows them (no key)
        change.committed = True
        ensure_space(out, 4 * len(after.to_json().encode("utf-8")) + 2**20, "the manifest")
        retired: dict[str, ArraySpec] = {}
        renamed: list[str] = []
        try:
            for name in change.drop:
                if name in writer.arrays:
                    writer.rename_array(name, _retired_name(name))
                    # No longer listed; deleted once the switch is written.
                    retired[name] = writer.arrays.pop(_retired_name(name))
            for name, spec in change.created.items():
                writer.rename_array(staged_name(name), name, spec.key)
                renamed.append(name)
            writer.commit(after)  # the switch
        except BaseException:
            for name in reversed(renamed):
                if name in writer.arrays and staged_name(name) not in writer.arrays:
                    writer.rename_array(name, staged_name(name))
            for name, old in retired.items():
                writer.arrays[_retired_name(name)] = old
                writer.rename_array(_retired_name(name), name, before.arrays[name].key)
            raise
        change.created = {}  # switched in: nothing of this change is left to undo
        for name, old in retired.items():
            writer.arrays[_retired_name(name)] = old
            writer.delete_array(_retired_name(name))  # listed by no manifest: a kill before this leaves debris
        writer.abort()
        if retired:
            # HDF5 never reuses the space of the arrays just deleted: without this, each replacement
            # would grow the file by the size of what it replaced.
            with writing(out):
                compact(out)
        return None

    @classmethod
    def abort_change(cls, change: ArrayChange, keep: bool) -> None:
        writer = change.opened
        if writer is None:
            return  # it failed before the writer opened: nothing of this change was written
        try:
            staged = [staged_name(n) for n in change.created if staged_name(n) in writer.arrays]
            if staged and (not keep or change.committed):
                with contextlib.suppress(Exception):
                    for name in staged:
                        writer.delete_array(name)
                    writer.commit(change.manifest)
        finally:
            writer.abort()

    @classmethod
    def carry_foreign(cls, store: Path, new: Path, manifest: Manifest) -> list[str]:
        """Copy every object of the store file's root that is not a stored array of ``manifest`` (a
        user's group or dataset), and every root attribute that is not dlpack's, into ``new``."""
        import h5py

        ours = {MANIFEST, *(n for spec in manifest.arrays.values() for n in spec.stored_names())}
        carried: list[str] = []
        try:
            with h5py.File(store, "r") as src:
                objects = [name for name in sorted(src.keys()) if name not in ours]
                attrs = [name for name in sorted(src.attrs.keys()) if not name.startswith("dlpack_")]
                if not objects and not attrs:
                    return []
                with h5py.File(new, "r+") as dst:
                    for name in objects:
                        if name in dst:
                            raise StoreError(
                                f"{name!r} in {store} is not dlpack's, and the update's new generation uses that "
                                "name; move it out of the store, then update again"
                            )
                        src.copy(src[name], dst, name=name)
                        carried.append(name)
                    for name in attrs:
                        dst.attrs[name] = src.attrs[name]
                        carried.append("@" + name)
        except OSError as exc:
            raise _h5_error(store, exc) from exc
        return carried


#: A file that holds more than this share of space no object uses is rewritten compactly.
_WASTE_SHARE = 0.2


def _used_bytes(f: Any) -> int:
    """The bytes the file's datasets store (their data, not HDF5's own small metadata)."""
    import h5py

    used = 0

    def visit(_: str, obj: Any) -> None:
        nonlocal used
        if isinstance(obj, h5py.Dataset):
            used += int(obj.id.get_storage_size())

    f.visititems(visit)
    return used


def compact_path(path: Path) -> Path:
    """Where :func:`compact` writes the compact copy of ``path`` before it replaces it."""
    return path.with_name(f".{path.name}.dlpack-compact")


def clear_compact_copy(path: Path) -> bool:
    """Remove the compact copy of ``path`` that a killed :func:`compact` left (only one carrying
    dlpack's marker); False when something else holds that name, which is left alone."""
    tmp = compact_path(path)
    if not (tmp.exists() or tmp.is_symlink()):
        return True
    if not _has_marker(tmp):
        return False
    tmp.unlink()
    return True


def compact(path: Path) -> bool:
    """Rewrite the HDF5 store ``path`` without the space of deleted arrays, when that space is a
    large share of the file; returns whether it did.

    HDF5 does not give back or (in a later session) reuse the space of a deleted dataset, so every
    change that replaces arrays (``augment --replace``, ``add_array(..., replace=True)``) would grow
    the file by what it replaced. The copy (every object and root attribute, each dataset with its
    layout, so contiguous arrays stay memory-mappable) is written beside the store, synced and
    renamed over it: a reader sees the old file or the new one. Call only under the store's build
    lock. Without the free space for the copy, the file is left as it is (it stays correct, only
    larger).
    """
    import h5py

    if path.is_symlink():
        return False  # the rename would replace the link, not the file it names
    if not clear_compact_copy(path):
        return False  # something not dlpack's holds the copy's name: left alone
    tmp = compact_path(path)
    _load_plugins()
    try:
        with h5py.File(path, "r") as src:
            used = _used_bytes(src)
            size = path.stat().st_size
            if size - used <= max(_WASTE_SHARE * size, 2**16):
                return False
            if shutil.disk_usage(path.parent).free < used + SPACE_MARGIN:
                return False
            with h5py.File(tmp, "w-") as dst:
                for name, value in src.attrs.items():
                    dst.attrs[name] = value
                for name in src:
                    src.copy(src[name], dst, name=name)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)
    return True
