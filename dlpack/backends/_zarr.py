"""Zarr v3 backend: a group folder with sharded arrays and ``manifest.json`` (docs/format.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..errors import IncompleteStoreError, StoreError, StoreNotFoundError
from ..manifest import Manifest
from ._shard import ShardedArray, crc32c
from .base import Backend, StorePlan, StoreReader, StoreWriter

__all__ = ["ZarrBackend", "ZarrReader", "ZarrWriter"]

MANIFEST = "manifest.json"
#: Inner chunk of the flat variable-size pixel array, in elements.
VARIABLE_CHUNK = 2**18


def _compressors(name: str, itemsize: int) -> Any:
    import zarr.codecs as zc

    if name == "none":
        return None
    if name == "lz4":
        # Bitshuffle is what makes LZ4 compress image bytes at all (plain LZ4: 0.94-0.98x).
        return zc.BloscCodec(cname="lz4", clevel=5, shuffle=zc.BloscShuffle.bitshuffle, typesize=itemsize)
    if name == "zstd":
        return zc.ZstdCodec(level=3)
    raise ValueError(f"unknown compression {name!r}")


class ZarrWriter(StoreWriter):
    """Writes a Zarr v3 group. Each ``write_block`` is exactly one shard, so worker processes can
    write disjoint shards concurrently (concurrent writes into one shard lose data)."""

    parallel_safe = True

    def __init__(self, path: str | Path, plan: StorePlan) -> None:
        super().__init__(path, plan)
        self._images: Any = None
        # Whole shards only, so no shard file is ever written twice.
        self.flush_elems = VARIABLE_CHUNK * max(1, plan.shard_images)

    def _group(self, mode: Literal["r", "r+", "a", "w", "w-"]) -> Any:
        import zarr

        return zarr.open_group(str(self.path), mode=mode, zarr_format=3)

    def create(self) -> None:
        plan, spec = self.plan, self.plan.image
        g = self._group("w-")
        g.attrs["dlpack"] = {"format": "dlpack", "complete": False}
        dtype = np.dtype(spec.dtype)
        cfg = {"write_empty_chunks": True}
        if spec.layout == "fixed":
            shape = spec.shape
            assert shape is not None
            g.create_array(
                "images",
                shape=(plan.count, *shape),
                dtype=dtype,
                chunks=(1, *shape),
                shards=(max(1, plan.shard_images), *shape),
                compressors=_compressors(plan.compression, dtype.itemsize),
                fill_value=0,
                config=cfg,
            )
        else:
            per_shard = max(1, plan.shard_images)
            g.create_array(
                "image_data",
                shape=(0,),
                dtype=dtype,
                chunks=(VARIABLE_CHUNK,),
                shards=(VARIABLE_CHUNK * per_shard,),
                compressors=_compressors(plan.compression, dtype.itemsize),
                fill_value=0,
                config=cfg,
            )

    def _array(self, name: str) -> Any:
        import zarr

        arr = zarr.open_array(str(self.path / name), mode="r+", zarr_format=3)
        # The creation-time config is not stored: without this, zarr compares every chunk with the
        # fill value before writing it (measured: 2-4x slower shard writes).
        return arr.with_config({"write_empty_chunks": True})  # type: ignore[call-overload]

    def write_block(self, start: int, images: np.ndarray) -> None:
        per = max(1, self.plan.shard_images)
        if self.plan.compression == "none" and start % per == 0 and len(images) <= per:
            self._write_raw_shard(start // per, images)
            return
        if self._images is None:
            self._images = self._array("images")
        self._images[start : start + len(images)] = images

    def _write_raw_shard(self, s: int, images: np.ndarray) -> None:
        """Write shard ``s`` of uncompressed images directly in the sharding format: the images in
        order, then the index of (offset, nbytes) pairs and its CRC-32C. zarr-python's codec
        pipeline spent a fifth of a build's time on the same bytes."""
        per = max(1, self.plan.shard_images)
        data = np.ascontiguousarray(images, dtype=np.dtype(self.plan.image.dtype).newbyteorder("<"))
        nb = self.plan.image_nbytes
        index = np.full((per, 2), 2**64 - 1, dtype="<u8")  # chunks past the array's end stay missing
        index[: len(images), 0] = np.arange(len(images), dtype="<u8") * np.uint64(nb)
        index[: len(images), 1] = nb
        path = self.path / "images" / "c" / str(s)
        for _ in range(len(self.plan.image.shape or ())):
            path = path / "0"
        path.parent.mkdir(parents=True, exist_ok=True)
        table = index.tobytes()
        with open(path, "wb") as f:
            f.write(data.data)
            f.write(table)
            f.write(crc32c(table).to_bytes(4, "little"))

    def _write_flat(self, start: int, flat: np.ndarray) -> None:
        if self._images is None:
            self._images = self._array("image_data")
        self._images.resize((start + len(flat),))
        self._images[start:] = flat

    def write_meta(self, arrays: dict[str, np.ndarray]) -> None:
        g = self._group("r+")
        for name, arr in arrays.items():
            chunk0 = max(1, min(len(arr), (16 * 2**20) // max(1, arr[:1].nbytes or 1)))
            a = g.create_array(
                name,
                shape=arr.shape,
                dtype=arr.dtype,
                chunks=(chunk0, *arr.shape[1:]),
                compressors=None,
                fill_value=0,
            )
            if arr.size:
                a[...] = arr

    def finalize(self, manifest: Manifest) -> None:
        self._flush(final=True)
        g = self._group("r+")
        g.attrs["dlpack"] = {"format": "dlpack", "format_version": manifest.format_version, "complete": True}
        (self.path / MANIFEST).write_text(manifest.to_json(), encoding="utf-8")

    def __getstate__(self) -> dict[str, Any]:
        if self._buf:
            raise RuntimeError("a ZarrWriter with buffered appends cannot be pickled")
        return super().__getstate__()


class ZarrReader(StoreReader):
    """Reads images through :class:`ShardedArray` (direct shard access), metadata through zarr-python."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path)
        self._manifest: Manifest | None = None
        self._images: ShardedArray | None = None
        self._offsets: np.ndarray | None = None

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            self._manifest = read_manifest(self.path)
        return self._manifest

    @property
    def images(self) -> ShardedArray:
        """The sharded image array (``images`` or ``image_data``), opened on first use."""
        if self._images is None:
            name = "images" if self.manifest.image.layout == "fixed" else "image_data"
            self._images = ShardedArray(self.path / name, strict=True)
            if self._images.shape[0] < (self.manifest.count if name == "images" else 0):
                raise StoreError(f"{self.path / name}: fewer images than the manifest's {self.manifest.count}")
        return self._images

    def read_image(self, index: int) -> np.ndarray:
        if self.manifest.image.layout == "fixed":
            img: np.ndarray = self.images.chunk(index)[0]
            return img
        if self._offsets is None:
            self._offsets = self.meta("image_offsets")
        shape = tuple(int(v) for v in self.meta("image_shapes")[index])
        return self.images.read_range(int(self._offsets[index]), int(self._offsets[index + 1])).reshape(shape)

    def read_into(self, indices: Any, out: np.ndarray) -> np.ndarray:
        arr = self.images
        if arr.chunk_len != 1:
            return super().read_into(indices, out)
        views, per = arr.shard_views(), arr.chunks_per_shard
        positions = [int(i) for i in indices]
        # Sorted reads are sequential within shards when the page cache is cold, and cost nothing warm.
        for k in sorted(range(len(positions)), key=positions.__getitem__):
            i = positions[k]
            view = views[i // per]
            if view is not None:
                out[k] = view[i % per]
            else:
                arr.chunk_into(i, out[k : k + 1])
        return out

    def warm(self) -> None:
        super().warm()
        self.images.warm()
        if self.manifest.image.layout == "variable":
            self.meta("image_offsets")
            self.meta("image_shapes")

    def _read_meta(self, name: str) -> np.ndarray:
        import zarr

        try:
            return np.asarray(zarr.open_array(str(self.path / name), mode="r", zarr_format=3)[...])
        except (FileNotFoundError, KeyError, ValueError) as exc:
            raise StoreError(f"store {self.path} has no readable array {name!r}: {exc}") from exc

    def close(self) -> None:
        super().close()
        if self._images is not None:
            self._images.close()
        self._images = None
        self._offsets = None


def read_manifest(path: Path) -> Manifest:
    """The manifest of a Zarr store, with errors that say what is wrong."""
    mpath = path / MANIFEST
    if not mpath.exists():
        if (path / "zarr.json").exists():
            raise IncompleteStoreError(
                f"{path} is an incomplete dlpack store (no {MANIFEST}: the build failed or was killed); "
                "run dlpack build again with --overwrite"
            )
        raise StoreNotFoundError(f"{path} is not a dlpack store (no {MANIFEST})")
    try:
        text = mpath.read_text(encoding="utf-8")
    except OSError as exc:
        raise StoreError(f"cannot read {mpath}: {exc}") from exc
    return Manifest.from_json(text, str(path))


class ZarrBackend(Backend):
    name = "zarr"
    suffixes = (".zarr",)

    @classmethod
    def detect(cls, path: Path) -> bool:
        return path.is_dir() and ((path / "zarr.json").exists() or (path / MANIFEST).exists())

    @classmethod
    def open_reader(cls, path: Path) -> StoreReader:
        return ZarrReader(path)

    @classmethod
    def create_writer(cls, path: Path, plan: StorePlan) -> StoreWriter:
        return ZarrWriter(path, plan)
