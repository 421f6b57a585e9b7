"""What is measured: each bench target (a store or a folder of images) resolved to its files and shape."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OptionError, StoreError, StoreNotFoundError
from ..options import BenchOptions
from ..storage.location import is_url
from .folder import FolderReader, FolderSpec
from .pagecache import files_under

if TYPE_CHECKING:
    from ..read.dataset import Dataset

__all__ = ["Target", "resolve_target", "reference_spec", "unique_names", "DECODED_KINDS"]

#: Target kinds whose images are decoded and resized on the fly (the scattered baseline).
DECODED_KINDS = ("folder", "dldataset")


@dataclass
class Target:
    """One bench target: its files (what eviction drops) and the facts the report shows."""

    name: str
    path: Path | str  # a store on object storage: its URL (never a Path)
    kind: str  # a backend name, "folder", or "dldataset" (a HALCON DLDataset's images, read in place)
    count: int
    files: list[Path]
    bytes_on_disk: int
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    resize_mode: str | None = None
    rels: list[str] = field(default_factory=list)
    sizes: np.ndarray | None = None  # folders: bytes of each file
    root: Path | None = None  # a DLDataset's image folder (``path`` is its JSON file)
    #: Stores: bytes on disk of the arrays a batch reads (not the checksums, source paths or
    #: augmentation variants, which a plain read never touches); None: every byte counts.
    read_bytes: int | None = None
    #: A store on object storage: no files here, so no page cache to evict or measure; its cache is
    #: the reader's shard cache (cold: emptied, warm: filled by one untimed epoch).
    remote: bool = False

    @property
    def is_folder(self) -> bool:
        """Whether the images are decoded on the fly (a folder, or a DLDataset's image files)."""
        return self.kind in DECODED_KINDS

    def disk_bytes(self, indices: np.ndarray) -> float:
        """Bytes on disk behind the samples ``indices``: their files, or a store's mean per image
        of the arrays a batch reads."""
        if self.sizes is not None:
            return float(self.sizes[indices].sum())
        return len(indices) * self.read_bytes_per_image

    @property
    def read_bytes_per_image(self) -> float:
        """Bytes on disk a plain read fetches per image (a folder's mean file size)."""
        read = self.bytes_on_disk if self.read_bytes is None else self.read_bytes
        return read / max(1, self.count)

    def open(self, spec: FolderSpec | None) -> FolderReader | Dataset:
        """A fresh reader of the target; a folder needs the ``spec`` its images are decoded to."""
        if self.remote:
            return _open_remote(str(self.path))
        if not self.is_folder:
            from ..read.dataset import Dataset

            return Dataset(self.path)
        if spec is None:
            raise OptionError(f"folder target {str(self.path)!r} needs a resolution to resize to (--size WxH)")
        return FolderReader(self.root or self.path, self.rels, spec)

    def info(self, spec: FolderSpec | None) -> dict[str, Any]:
        """The target's entry in the report's ``targets`` list."""
        shape = list(self.shape) if self.shape else None
        if self.is_folder and spec is not None:
            shape = [spec.size[1], spec.size[0], spec.channels]
        return {
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "count": self.count,
            "files": len(self.files),
            "bytes_on_disk": self.bytes_on_disk,
            "disk_bytes_per_image": self.read_bytes_per_image,
            "read_bytes_on_disk": self.bytes_on_disk if self.read_bytes is None else self.read_bytes,
            "image_shape": shape,
            "dtype": (spec.dtype if spec else None) if self.is_folder else self.dtype,
            "decoded_on_the_fly": self.is_folder,
            "remote": self.remote,
        }


def _dldataset_target(p: Path) -> Target:
    """A HALCON DLDataset: its image files, read as a folder's are (every sample must be usable)."""
    from ..halcon.view import DLDatasetView

    view = DLDatasetView(p)
    rels = [it.rel for it in view.items]
    sizes = np.array([os.path.getsize(view.root / r) for r in rels], dtype=np.int64)
    return Target(
        name=view.path.resolve().parent.name if p.is_dir() else view.path.name,
        path=view.path.resolve(),
        kind="dldataset",
        count=len(rels),
        files=[view.root / r for r in rels],
        bytes_on_disk=int(sizes.sum()),
        rels=rels,
        sizes=sizes,
        root=view.root.resolve(),
    )


def resolve_target(path: str | os.PathLike[str]) -> Target:
    """Classify ``path`` as a dlpack store, a HALCON DLDataset or a folder of images and list its
    files; a URL is a store on object storage (no files: its cache is the reader's shard cache)."""
    if is_url(path):
        return _remote_target(os.fspath(path))
    from ..backends import detect_backend
    from ..halcon.view import is_dldataset
    from ..read.dataset import Dataset

    p = Path(path)
    if not p.exists():
        raise StoreNotFoundError(
            f"bench target {os.fspath(path)!r} does not exist; give a dlpack store (DIR.zarr, FILE.h5), a HALCON "
            "DLDataset (its folder or .json file) or a folder of images"
        )
    if is_dldataset(p):
        return _dldataset_target(p)
    try:
        backend = detect_backend(p)
    except StoreError:
        if not p.is_dir():
            raise StoreError(
                f"bench target {os.fspath(path)!r} is neither a dlpack store (Zarr folder, HDF5 file) nor a folder of images"
            ) from None
        backend = None
    if backend is None:
        from ..sources.folder import FolderSource

        rels = [it.rel for it in FolderSource(p, labels="none").scan().items]
        sizes = np.array([os.path.getsize(p / r) for r in rels], dtype=np.int64)
        return Target(
            name=p.resolve().name or str(p),
            path=p.resolve(),
            kind="folder",
            count=len(rels),
            files=[p / r for r in rels],
            bytes_on_disk=int(sizes.sum()),
            rels=rels,
            sizes=sizes,
        )
    with Dataset(p) as ds:
        return _store_target(ds, p.resolve().name or str(p), p.resolve(), files_under(p))


def _remote_target(url: str) -> Target:
    """A store on object storage, opened as ``dlpack.open`` opens it (a handful of requests)."""
    with _open_remote(url) as ds:
        return _store_target(ds, url.rstrip("/").rsplit("/", 1)[-1] or url, url, [], remote=True)


def _open_remote(url: str) -> Dataset:
    """The store at ``url``, opened by ``dlpack.open`` (what training reads it with)."""
    from ..read.dataset import Dataset, open

    ds = open(url)
    if not isinstance(ds, Dataset):
        raise StoreError(f"bench target {url!r} is not a dlpack store")
    return ds


def _store_target(ds: Dataset, name: str, where: Path | str, files: list[Path], *, remote: bool = False) -> Target:
    """The target of an open store: its size as the backend counts it (shards, index, manifest)
    and the bytes of the arrays a batch reads."""
    m = ds.manifest
    return Target(
        name=name,
        path=where,
        kind=ds.backend,
        count=m.count,
        files=files,
        bytes_on_disk=ds.reader.nbytes_on_disk(),
        read_bytes=sum(ds.reader.array_nbytes_on_disk(n) for n in ds.batch_arrays()),
        shape=m.image.shape,
        dtype=m.image.dtype,
        resize_mode=str(m.resize.get("mode")) if m.resize else None,
        remote=remote,
    )


def reference_spec(targets: Sequence[Target], options: BenchOptions) -> FolderSpec | None:
    """The batch shape folder targets are decoded to: the first fixed-size store's, or --size."""
    store = next((t for t in targets if not t.is_folder and t.shape is not None and t.dtype is not None), None)
    channels, dtype, mode = 3, "|u1", "stretch"
    size = options.size
    if store is not None and store.shape is not None and store.dtype is not None:
        h, w, channels = store.shape
        dtype = store.dtype
        mode = store.resize_mode if store.resize_mode in ("stretch", "fit") else "stretch"
        size = size or (w, h)
    if size is None:
        if any(t.is_folder for t in targets):
            raise OptionError(
                "a folder target needs a resolution to resize to, as training would: pass --size WxH "
                "(size=(W, H)) or also bench a fixed-size store, whose resolution is then used"
            )
        return None
    return FolderSpec(size=size, channels=channels, dtype=dtype, mode=mode)


def unique_names(targets: list[Target]) -> None:
    """Name targets by their full path where two share a folder or file name."""
    names = [t.name for t in targets]
    for t in targets:
        if names.count(t.name) > 1:
            t.name = str(t.path)
