"""The one interface every store backend implements.

A backend is a registry entry (:class:`Backend`) that can recognise a store on disk, open a
:class:`StoreReader` and create a :class:`StoreWriter`. Capability flags are checked in one place,
:func:`dlpack.backends.get_backend`; the build pipeline and the loader only see these classes.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..manifest import ImageSpec, Manifest

__all__ = ["Backend", "StorePlan", "StoreReader", "StoreWriter", "META_ARRAYS"]

#: Per-sample arrays every store has, besides the images: name -> (dtype, trailing shape).
META_ARRAYS: dict[str, tuple[str, tuple[int, ...]]] = {
    "labels": ("<i4", ()),
    "original_size": ("<i4", (2,)),
    "transform": ("<f8", (4,)),
    "checksum": ("<u4", ()),
    "source_offsets": ("<i8", ()),
    "source_data": ("|u1", ()),
}


@dataclass(frozen=True)
class StorePlan:
    """What a writer must lay out: sample count, image spec, codec and shard size."""

    count: int
    image: ImageSpec
    compression: str = "none"
    shard_images: int = 1

    @property
    def image_nbytes(self) -> int:
        shape = self.image.shape
        if shape is None:
            raise ValueError("variable-size stores have no fixed image size")
        return int(np.prod(shape)) * np.dtype(self.image.dtype).itemsize


class StoreReader(ABC):
    """Read side of a store. Holds no open handle until first use and drops handles on pickling,
    so a reader can be sent to worker processes, which then open their own."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._meta: dict[str, np.ndarray] = {}
        self._sources: tuple[bytes, list[int]] | None = None

    @property
    @abstractmethod
    def manifest(self) -> Manifest: ...

    def __len__(self) -> int:
        return self.manifest.count

    @abstractmethod
    def read_image(self, index: int) -> np.ndarray:
        """One image as H x W x C; ``index`` is already validated (0 <= index < len)."""

    def read_into(self, indices: Sequence[int], out: np.ndarray) -> np.ndarray:
        """Gather fixed-size images ``indices`` into ``out[:len(indices)]`` (B x H x W x C)."""
        for k, i in enumerate(indices):
            out[k] = self.read_image(int(i))
        return out

    @abstractmethod
    def _read_meta(self, name: str) -> np.ndarray: ...

    def meta(self, name: str) -> np.ndarray:
        """A whole per-sample array (labels, original_size, ...), read once and cached."""
        arr = self._meta.get(name)
        if arr is None:
            arr = self._meta[name] = self._read_meta(name)
        return arr

    def source(self, index: int) -> str:
        """The relative source path of sample ``index``."""
        if self._sources is None:
            # Plain bytes and ints: slicing NumPy arrays per batch item costs microseconds each.
            self._sources = (bytes(self.meta("source_data")), self.meta("source_offsets").tolist())
        data, off = self._sources
        return data[off[index] : off[index + 1]].decode("utf-8")

    def nbytes_on_disk(self) -> int:
        """Bytes the store takes on disk (every file of a folder store)."""
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def warm(self) -> None:
        """Open maps and read indexes now (thread-safe afterwards; the loader calls it before threads start)."""
        self.meta("labels")
        self.meta("checksum")
        self.source(0) if len(self) else None

    def close(self) -> None:
        """Release open handles and maps; the reader reopens lazily if used again."""
        self._meta.clear()
        self._sources = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StoreWriter(ABC):
    """Write side of a store being built at a temporary path.

    Fixed-size images are written in blocks at their final index (``write_block``); when
    ``parallel_safe`` is true, worker processes may write disjoint, block-aligned ranges
    (each block is a whole Zarr shard, so no two processes touch one file). Variable-size images
    are appended in order by one process (``append``). ``finalize`` writes the manifest last.
    """

    #: Whether worker processes may call ``write_block`` concurrently on disjoint blocks
    #: (valid after ``create``).
    parallel_safe: bool = False

    def __init__(self, path: str | os.PathLike[str], plan: StorePlan) -> None:
        self.path = Path(path)
        self.plan = plan
        self._buf: list[np.ndarray] = []
        self._buf_len = 0
        self._written = 0

    #: Elements per flat write of variable-size data (backends write whole multiples of it).
    flush_elems: int = 2**22

    @property
    def block_images(self) -> int:
        """Images per write block (a whole shard for Zarr)."""
        return max(1, self.plan.shard_images)

    @abstractmethod
    def create(self) -> None:
        """Create the empty store at ``path`` (main process, once)."""

    @abstractmethod
    def write_block(self, start: int, images: np.ndarray) -> None:
        """Write fixed-size ``images`` at indices ``start .. start + len(images)``."""

    def append(self, image: np.ndarray) -> None:
        """Append one variable-size image (main process only); written in ``flush_elems`` runs."""
        self._buf.append(np.ascontiguousarray(image).reshape(-1))
        self._buf_len += image.size
        if self._buf_len >= self.flush_elems:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        """Write buffered pixels: whole ``flush_elems`` runs, or everything when ``final``."""
        if not self._buf:
            return
        flat = np.concatenate(self._buf)
        n = len(flat) if final else (len(flat) // self.flush_elems) * self.flush_elems
        if n:
            self._write_flat(self._written, flat[:n])
            self._written += n
        rest = flat[n:]
        self._buf = [rest] if len(rest) else []
        self._buf_len = len(rest)

    def _write_flat(self, start: int, flat: np.ndarray) -> None:
        """Grow ``image_data`` and write ``flat`` at ``start``."""
        raise NotImplementedError(f"{type(self).__name__} does not store variable-size images")

    @abstractmethod
    def write_meta(self, arrays: dict[str, np.ndarray]) -> None:
        """Write the per-sample arrays."""

    @abstractmethod
    def finalize(self, manifest: Manifest) -> None:
        """Flush everything, then write the manifest: the store is complete after this returns."""

    def abort(self) -> None:  # noqa: B027 - optional hook
        """Close handles after a failure (the caller deletes the temporary path)."""

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "plan": self.plan}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["plan"])  # type: ignore[misc]


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
    def open_reader(cls, path: Path) -> StoreReader: ...

    @classmethod
    @abstractmethod
    def create_writer(cls, path: Path, plan: StorePlan) -> StoreWriter: ...
