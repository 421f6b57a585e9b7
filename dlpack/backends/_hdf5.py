"""HDF5 backend: one file with the same array names as the Zarr store (docs/format.md).

Uncompressed fixed-size images are one contiguous dataset, read through ``np.memmap`` at the
offset HDF5 reports: the memory-bandwidth ceiling, with a file any HDF5 tool opens.
Compressed images use one chunk per image and the hdf5plugin filters (extra ``[hdf5plugin]``).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import IncompleteStoreError, MissingExtraError, StoreError, StoreNotFoundError
from ..manifest import Manifest
from .base import Backend, StorePlan, StoreReader, StoreWriter

__all__ = ["Hdf5Backend", "Hdf5Reader", "Hdf5Writer"]

MANIFEST = "manifest"
VARIABLE_CHUNK = 2**18
_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _filter_kwargs(name: str, itemsize: int) -> dict[str, Any]:
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


class Hdf5Writer(StoreWriter):
    """HDF5 has no safe concurrent writers through the library (two writers corrupt silently).

    Uncompressed fixed-size images are the exception that matters for speed: the ``images``
    dataset is contiguous and allocated at creation, so after ``create`` closes the file, worker
    processes write their disjoint blocks of raw pixels straight to its byte range with
    ``os.pwrite``; no process has the file open through HDF5 meanwhile. Everything else is
    written by the one main process.
    """

    def __init__(self, path: str | Path, plan: StorePlan, images_offset: int | None = None) -> None:
        super().__init__(path, plan)
        self._f: Any = None
        self.flush_elems = 16 * VARIABLE_CHUNK
        self._images_offset = images_offset  # byte offset of the contiguous images dataset
        self.parallel_safe = images_offset is not None

    @property
    def block_images(self) -> int:
        if self.parallel_safe:
            return max(1, self.plan.shard_images)
        # Blocks travel from workers to this process by pickling: keep them a few MB.
        return max(1, min(self.plan.shard_images, 16))

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "plan": self.plan, "images_offset": self._images_offset}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["plan"], state["images_offset"])  # type: ignore[misc]

    def _file(self) -> Any:
        if self._f is None:
            import h5py

            self._f = h5py.File(self.path, "r+")
        return self._f

    def create(self) -> None:
        import h5py

        plan, spec = self.plan, self.plan.image
        dtype = np.dtype(spec.dtype)
        filt = _filter_kwargs(plan.compression, dtype.itemsize)
        self._f = f = h5py.File(self.path, "w-")
        f.attrs["dlpack_format"] = "dlpack"
        if spec.layout == "fixed":
            shape = spec.shape
            assert shape is not None
            if filt:
                f.create_dataset("images", shape=(plan.count, *shape), dtype=dtype, chunks=(1, *shape), **filt)
            else:
                # Contiguous and allocated now, so readers can memory-map it at a fixed offset.
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
                dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
                dcpl.set_obj_track_times(False)  # timestamps would make identical builds differ
                space = h5py.h5s.create_simple((plan.count, *shape))
                tid = h5py.h5t.py_create(dtype)
                dset = h5py.h5d.create(f.id, b"images", tid, space, dcpl=dcpl)
                offset = dset.get_offset()
                if offset is not None:
                    f.close()  # workers now write raw blocks; the file reopens for metadata
                    self._f = None
                    self._images_offset = int(offset)
                    self.parallel_safe = True
        else:
            f.create_dataset("image_data", shape=(0,), maxshape=(None,), dtype=dtype, chunks=(VARIABLE_CHUNK,), **filt)

    def write_block(self, start: int, images: np.ndarray) -> None:
        if self._images_offset is None:
            self._file()["images"][start : start + len(images)] = images
            return
        data = np.ascontiguousarray(images, dtype=np.dtype(self.plan.image.dtype).newbyteorder("<"))
        fd = os.open(self.path, os.O_WRONLY)
        try:
            view, pos = data.data.cast("B"), self._images_offset + start * self.plan.image_nbytes
            while view:
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
        finally:
            os.close(fd)

    def _write_flat(self, start: int, flat: np.ndarray) -> None:
        ds = self._file()["image_data"]
        ds.resize((start + len(flat),))
        ds[start:] = flat

    def write_meta(self, arrays: dict[str, np.ndarray]) -> None:
        f = self._file()
        for name, arr in arrays.items():
            f.create_dataset(name, data=arr)

    def finalize(self, manifest: Manifest) -> None:
        import h5py

        self._flush(final=True)
        f = self._file()
        f.create_dataset(MANIFEST, data=manifest.to_json(), dtype=h5py.string_dtype("utf-8"))
        f.attrs["dlpack_format_version"] = manifest.format_version
        f.close()
        self._f = None

    def abort(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            finally:
                self._f = None


class Hdf5Reader(StoreReader):
    """Memory-maps contiguous uncompressed images; other layouts go through h5py."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self._f: Any = None
        self._manifest: Manifest | None = None
        self._mm: np.ndarray | None = None
        self._map: mmap.mmap | None = None
        self._offsets: np.ndarray | None = None

    def _file(self) -> Any:
        if self._f is None:
            import h5py

            _load_plugins()
            if not self.path.exists():
                raise StoreNotFoundError(f"{self.path} does not exist")
            try:
                self._f = h5py.File(self.path, "r")
            except OSError as exc:
                raise StoreError(f"{self.path} is not a readable HDF5 file: {exc}") from exc
        return self._f

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            f = self._file()
            if MANIFEST not in f:
                if "dlpack_format" in f.attrs:
                    raise IncompleteStoreError(
                        f"{self.path} is an incomplete dlpack store (no manifest: the build failed or was "
                        "killed); run dlpack build again with --overwrite"
                    )
                raise StoreNotFoundError(f"{self.path} is an HDF5 file but not a dlpack store (no manifest)")
            raw = f[MANIFEST][()]
            self._manifest = Manifest.from_json(raw.decode("utf-8") if isinstance(raw, bytes) else raw, str(self.path))
        return self._manifest

    @property
    def mapped(self) -> np.ndarray | None:
        """The images as one memory-mapped [N, H, W, C] array, or None when not contiguous."""
        if self._mm is None and self.manifest.image.layout == "fixed":
            ds = self._file()["images"]
            offset = ds.id.get_offset()
            if ds.chunks is None and offset is not None and ds.size:
                # A plain ndarray over mmap: np.memmap's subclass costs microseconds per index.
                with open(self.path, "rb") as fh:
                    self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
                count = int(np.prod(ds.shape))
                self._mm = np.frombuffer(self._map, dtype=ds.dtype, count=count, offset=offset).reshape(ds.shape)
        return self._mm

    def read_image(self, index: int) -> np.ndarray:
        if self.manifest.image.layout == "fixed":
            mm = self.mapped
            if mm is not None:
                return np.array(mm[index])
            return np.asarray(self._file()["images"][index])
        if self._offsets is None:
            self._offsets = self.meta("image_offsets")
        shape = tuple(int(v) for v in self.meta("image_shapes")[index])
        data = self._file()["image_data"][int(self._offsets[index]) : int(self._offsets[index + 1])]
        return np.asarray(data).reshape(shape)

    def read_into(self, indices: Any, out: np.ndarray) -> np.ndarray:
        mm = self.mapped
        if mm is None:
            ds = self._file()["images"]
            for k, i in enumerate(indices):
                ds.read_direct(out, np.s_[int(i)], np.s_[k])
            return out
        positions = [int(i) for i in indices]
        for k in sorted(range(len(positions)), key=positions.__getitem__):
            out[k] = mm[positions[k]]
        return out

    def warm(self) -> None:
        super().warm()
        _ = self.mapped
        if self.manifest.image.layout == "variable":
            self.meta("image_offsets")
            self.meta("image_shapes")

    def _read_meta(self, name: str) -> np.ndarray:
        f = self._file()
        if name not in f:
            raise StoreError(f"store {self.path} has no array {name!r}")
        return np.asarray(f[name][()])

    def close(self) -> None:
        super().close()
        self._mm = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a caller still holds an image view; the map goes with it
            self._map = None
        self._offsets = None
        if self._f is not None:
            self._f.close()
            self._f = None


class Hdf5Backend(Backend):
    name = "hdf5"
    suffixes = (".h5", ".hdf5")

    @classmethod
    def detect(cls, path: Path) -> bool:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            return f.read(8) == _SIGNATURE

    @classmethod
    def open_reader(cls, path: Path) -> StoreReader:
        return Hdf5Reader(path)

    @classmethod
    def create_writer(cls, path: Path, plan: StorePlan) -> StoreWriter:
        return Hdf5Writer(path, plan)
