"""``dlpack.open``: random access to a store, whatever its backend."""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .backends import StoreReader, detect_backend, get_backend
from .errors import SampleIndexError
from .loader import Loader, LoaderOptions
from .manifest import Manifest

__all__ = ["Dataset", "open"]


class Dataset:
    """A read-only, random-access view of one store.

    Picklable: only the path travels, and each process opens its own handles on first use.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        backend = get_backend(detect_backend(self.path).name, random_access=True)
        self.backend = backend.name
        self._reader: StoreReader = backend.open_reader(self.path)
        _ = self._reader.manifest  # fail now, not at the first sample, on incomplete or newer stores

    @property
    def reader(self) -> StoreReader:
        """The backend reader (for the loader and benchmarks)."""
        return self._reader

    @property
    def manifest(self) -> Manifest:
        return self._reader.manifest

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; a sample's ``label`` indexes this tuple (-1 means unlabelled)."""
        return self.manifest.classes

    def __len__(self) -> int:
        return self.manifest.count

    def _index(self, i: int) -> int:
        n = len(self)
        j = int(i)
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise SampleIndexError(f"sample index {i} is out of range for {self.path} with {n} samples")
        return j

    def __getitem__(self, i: int) -> dict[str, Any]:
        """``{"image": HxWxC, "label": int, "index": i, "source": "relative/path.png"}``."""
        j = self._index(i)
        r = self._reader
        return {
            "image": r.read_image(j),
            "label": int(r.meta("labels")[j]),
            "index": j,
            "source": r.source(j),
        }

    def get_batch(self, indices: Sequence[int] | np.ndarray, out: np.ndarray | None = None) -> dict[str, Any]:
        """Samples ``indices`` stacked: ``image`` is B x H x W x C (a list for variable-size stores)."""
        n = len(self)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        idx = np.where(idx < 0, idx + n, idx)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise SampleIndexError(
                f"sample index {np.asarray(indices).reshape(-1)[bad][0]} is out of range for {self.path} with {n} samples"
            )
        r = self._reader
        shape = self.manifest.image.shape
        positions = idx.tolist()
        images: Any
        if shape is None:
            images = [r.read_image(j) for j in positions]
        else:
            if out is None:
                out = np.empty((len(idx), *shape), dtype=self.manifest.image.dtype)
            images = r.read_into(positions, out)
        return {
            "image": images,
            "label": r.meta("labels")[idx],
            "index": idx,
            "source": [r.source(j) for j in positions],
        }

    def loader(
        self,
        options: LoaderOptions | None = None,
        *,
        transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> Loader:
        """A batch loader over this store; keyword arguments are :class:`~dlpack.LoaderOptions` fields.

        ``ds.loader(batch_size=32, shuffle=True, seed=0, prefetch=4, workers=2, drop_last=True,
        rank=0, world_size=1)``; ``transform(batch) -> batch`` runs on the worker threads.
        """
        opts = replace(options or LoaderOptions(), **kwargs) if kwargs else (options or LoaderOptions())
        return Loader(self, opts, transform)

    def __iter__(self) -> Any:
        for i in range(len(self)):
            yield self[i]

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        m = self.manifest
        size = f"{m.image.width}x{m.image.height}" if m.image.shape else "variable size"
        return f"<dlpack.Dataset {str(self.path)!r}: {m.count} images, {size}x{m.image.channels}, {self.backend}>"

    def verify(self) -> list[tuple[int, str]]:
        """Re-read every image and compare its CRC-32 with the stored checksum.

        Returns ``(index, source)`` of each mismatch; an empty list means the store is intact.
        Structural damage (a missing or truncated shard) raises :class:`~dlpack.StoreError`.
        """
        r = self._reader
        expected = r.meta("checksum")
        bad = []
        for i in range(len(self)):
            img = np.ascontiguousarray(r.read_image(i))
            if zlib.crc32(img.data) != int(expected[i]):
                bad.append((i, r.source(i)))
        return bad

    def info(self) -> dict[str, Any]:
        """Facts for ``dlpack info``."""
        m = self.manifest
        nbytes = self._reader.nbytes_on_disk()
        return {
            "path": str(self.path),
            "backend": self.backend,
            "format_version": m.format_version,
            "count": m.count,
            "classes": list(m.classes),
            "layout": m.image.layout,
            "resolution": [m.image.width, m.image.height] if m.image.shape else None,
            "channels": m.image.channels,
            "dtype": m.image.dtype,
            "compression": m.compression,
            "shard_images": m.shard_images,
            "bytes_on_disk": nbytes,
            "skipped": [{"path": e.path, "reason": e.reason} for e in m.skipped],
            "conversions": m.conversions,
            "resize": m.resize,
        }


def open(path: str | os.PathLike[str]) -> Dataset:  # noqa: A001 - the public name is dlpack.open
    """Open a store (Zarr folder or HDF5 file) for reading."""
    return Dataset(path)
