"""``dlpack.open``: random access to a store, whatever its backend; ``dlpack.add_array``."""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .backends import StoreReader, open_reader, open_writer
from .errors import DlpackError, OptionError, SampleIndexError, StoreError, StoreExistsError, StoreNotFoundError
from .loader import Loader, LoaderOptions
from .manifest import ArraySpec, Manifest

__all__ = ["Dataset", "open", "add_array"]

#: Keys every sample has; a stored array's ``key`` may not take them.
BASE_KEYS = ("image", "label", "index", "source")
#: Arrays that identify or protect the samples: add_array never replaces them.
PROTECTED_ARRAYS = frozenset({"images", "image", "image_shapes", "checksum", "source"})


@dataclasses.dataclass(frozen=True)
class VerifyReport:
    """What verifying a store found (``dlpack verify --json`` prints it).

    ``mismatched`` lists ``(index, source)`` of each image whose pixels do not match its CRC-32;
    ``damaged`` lists ``(array, reason)`` for every other problem, the array being the stored
    array's name, or None for the store as a whole (its manifest, or a store that does not open).
    ``count`` is None when the manifest cannot be read.
    """

    store: str
    count: int | None
    mismatched: list[tuple[int, str]]
    damaged: list[tuple[str | None, str]]

    @property
    def ok(self) -> bool:
        return not self.mismatched and not self.damaged


def verify_store(path: str | os.PathLike[str]) -> VerifyReport:
    """Verify the store at ``path`` (see :meth:`Dataset.check`), also when it does not open:
    then every array whose damage keeps it from opening is named where its manifest can be read."""
    try:
        ds = Dataset(path)
    except (StoreError, StoreNotFoundError) as exc:
        return _unopenable(Path(path), exc)
    with ds:
        return ds.check()


def _unopenable(path: Path, exc: DlpackError) -> VerifyReport:
    try:
        reader = open_reader(path)
        count = len(reader)
    except DlpackError:
        return VerifyReport(str(path), None, [], [(None, str(exc))])
    with reader:
        damaged = reader.array_problems()
        if "labels" in reader.arrays and not any(name == "labels" for name, _ in damaged):
            try:
                reader.read_all("labels")  # checked against the classes
            except StoreError as label_exc:
                damaged.append(("labels", str(label_exc)))
    return VerifyReport(str(path), count, [], damaged or [(None, str(exc))])


class Dataset:
    """A read-only, random-access view of one store; a :class:`~dlpack.loader.BatchSource`.

    A sample is ``{"image", "label", "index", "source"}`` plus every stored array that has a
    ``key`` (``masks``, ``boxes``, arrays added with :func:`add_array` ...). Picklable: only the
    path travels, and each process opens its own handles on first use.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._setup(Path(path), None)

    def _setup(self, path: Path, pin: str | None) -> None:
        self.path = path
        self._reader: StoreReader = open_reader(self.path)
        self._reader._pin = pin  # a copy must read the very store its original opened
        m = self._reader.manifest  # fail now, not at the first sample, on incomplete or newer stores
        image = "images" if m.image.layout == "fixed" else "image"
        missing = [n for n in (image, "labels", "checksum", "source") if n not in m.arrays]
        if missing:
            raise StoreError(
                f"store {self.path} lacks the array(s) {', '.join(missing)} every dlpack store has; rebuild it"
            )
        if m.image.layout == "variable" and "image_shapes" not in m.arrays:
            raise StoreError(f"store {self.path} lacks image_shapes, which a variable-size store needs; rebuild it")
        self._reader.read_all("labels")  # range-checked against the classes, and checksummed, now
        self.backend = m.backend
        self._keyed = [
            (spec.key, spec) for spec in m.arrays.values() if spec.key and spec.name not in ("images", "labels")
        ]

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "pin": self._reader.__getstate__()["pin"]}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(state["path"], state.get("pin"))

    @property
    def reader(self) -> StoreReader:
        """The backend reader (for benchmarks and tools that read arrays by name)."""
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
        try:
            j = operator.index(i)
        except TypeError:
            raise SampleIndexError(f"sample index must be an integer, got {i!r}") from None
        if j < 0:
            j += n
        if not 0 <= j < n:
            raise SampleIndexError(f"sample index {i} is out of range for {self.path} with {n} samples")
        return j

    def __getitem__(self, i: int) -> dict[str, Any]:
        """``{"image": HxWxC, "label": int, "index": i, "source": "relative/path.png", KEY: ...}``."""
        j = self._index(i)
        r = self._reader
        sample: dict[str, Any] = {
            "image": r.read_image(j),
            "label": int(r.read_all("labels")[j]),
            "index": j,
            "source": r.source(j),
        }
        for key, spec in self._keyed:
            sample[key] = r.read(spec.name, j)
        return sample

    # ------------------------------------------------------------------ BatchSource

    def get_batch(
        self, indices: Sequence[int] | np.ndarray, epoch: int = 0, out: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Samples ``indices`` stacked: ``image`` is B x H x W x C (a list for variable-size stores);
        ragged arrays come as lists. A store's samples do not depend on ``epoch``."""
        n = len(self)
        idx = np.asarray(indices).reshape(-1)
        if idx.dtype.kind not in "iu" and idx.size:
            raise SampleIndexError(f"sample indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
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
            images = r.read_into("images", positions, out)
        batch: dict[str, Any] = {
            "image": images,
            "label": r.read_all("labels")[idx],
            "index": idx,
            "source": [r.source(j) for j in positions],
        }
        for key, spec in self._keyed:
            if spec.ragged:
                batch[key] = [r.read(spec.name, j) for j in positions]
            else:
                batch[key] = r.read_into(spec.name, positions, np.empty((len(idx), *spec.shape), dtype=spec.dtype))
        return batch

    def warm(self) -> None:
        """Open maps and read indexes now (the loader calls it before its threads start)."""
        self._reader.warm()

    def fingerprint(self) -> str:
        """An id of the content: the sample count and every image's checksum."""
        h = hashlib.sha256(str(len(self)).encode())
        h.update(np.ascontiguousarray(self._reader.read_all("checksum")).tobytes())
        return h.hexdigest()[:16]

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        """``((H, W, C), dtype)`` of every image, or None for a variable-size store."""
        shape = self.manifest.image.shape
        return None if shape is None else (shape, self.manifest.image.dtype)

    # ------------------------------------------------------------------ training

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
        opts = dataclasses.replace(options or LoaderOptions(), **kwargs) if kwargs else (options or LoaderOptions())
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
        """Check the whole store: every array against its recorded checksum, the sample count of
        every array, the offsets of ragged arrays (rising, ending at their data's length), labels
        against the classes, and every image against its own CRC-32.

        The manifest's own checksum and the labels were checked when the store was opened.

        Returns
        -------
        list of (int, str)
            ``(index, source)`` of each image whose pixels do not match its CRC-32; empty when the
            store is intact.

        Raises
        ------
        StoreError
            Any damage outside the images (an array that does not match its checksum, a wrong
            count, broken offsets, a missing or truncated file), listing every problem found.
        """
        report = self.check()
        if report.damaged:
            lines = [reason for _, reason in report.damaged]
            if report.mismatched:
                lines.append(f"{len(report.mismatched)} image(s) do not match their checksum")
            raise StoreError(f"store {self.path} is damaged:\n  " + "\n  ".join(lines) + "\nrebuild it")
        return report.mismatched

    def check(self) -> VerifyReport:
        """What :meth:`verify` checks, as a report naming every damaged array instead of raising."""
        r = self._reader
        image_arrays = r.spec("images" if self.manifest.image.layout == "fixed" else "image").stored_names()
        damaged = r.array_problems(skip=image_arrays)
        broken = {name for name, _ in damaged}
        bad: list[tuple[int, str]] = []
        # Each image is compared with its CRC only while the CRCs, sources and shapes are intact.
        if not broken & {"checksum", "source_data", "source_offsets", "image_shapes", None}:
            try:
                expected = r.read_all("checksum")
                for i in range(len(self)):
                    img = np.ascontiguousarray(r.read_image(i))
                    if zlib.crc32(img.data) != int(expected[i]):
                        bad.append((i, r.source(i)))
            except StoreError as exc:
                damaged.append((image_arrays[0], str(exc)))
        if not bad and not damaged:
            # The images' own checksum covers bytes the per-image CRCs do not (none, today).
            damaged = r.array_problems(
                skip=[n for s in r.arrays.values() for n in s.stored_names() if n not in image_arrays]
            )
        return VerifyReport(str(self.path), len(self), bad, damaged)

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
            "arrays": {name: spec.to_dict() for name, spec in m.arrays.items()},
            "skipped": [{"path": e.path, "reason": e.reason} for e in m.skipped],
            "conversions": m.conversions,
            "resize": m.resize,
        }


def open(path: str | os.PathLike[str]) -> Dataset:  # noqa: A001 - the public name is dlpack.open
    """Open a store (Zarr folder or HDF5 file) for reading."""
    return Dataset(path)


def add_array(
    path: str | os.PathLike[str],
    name: str,
    values: np.ndarray | Sequence[np.ndarray],
    *,
    key: str | None = None,
    ragged: bool = False,
    replace: bool = False,
    compression: str = "none",
) -> ArraySpec:
    """Add a per-sample array to an existing store, whatever its backend.

    Parameters
    ----------
    path
        A complete dlpack store.
    name
        The array's name (lower case, digits, ``_``).
    values
        ``[N, ...]`` array with one value per sample, or, with ``ragged=True``, a sequence of ``N``
        arrays of ``[rows_i, ...]`` (boxes, polygons, variable-length data).
    key
        The key under which ``ds[i]`` and loader batches carry it; ``None`` means the name.
    replace
        Replace an existing array of that name (never the images, sources or checksums).

    Returns
    -------
    ArraySpec
        What was stored.
    """
    with open(path) as ds:
        n, taken = len(ds), {spec.key for spec in ds.manifest.arrays.values() if spec.key}
        manifest = ds.manifest
    key = name if key is None else key
    existing = manifest.arrays.get(name)
    if existing is not None and not replace:
        raise StoreExistsError(f"store {path} already has an array {name!r}; pass replace=True to replace it")
    if existing is not None and name in PROTECTED_ARRAYS:
        raise OptionError(f"array {name!r} identifies or protects the samples and cannot be replaced")
    own_key = existing.key if existing is not None else None
    if key in BASE_KEYS or (key in taken and key != own_key):
        raise OptionError(f"key {key!r} is already used by every sample or by another array; choose another key")
    if ragged:
        parts = [np.asarray(v) for v in values]
        if len(parts) != n:
            raise OptionError(f"{name!r} has {len(parts)} samples, the store has {n}")
        first = next((p for p in parts if p.size), parts[0] if parts else np.empty(0))
        spec = ArraySpec(name, first.dtype.str, tuple(first.shape[1:]), True, key, compression)
    else:
        arr = np.asarray(values)
        if arr.ndim == 0 or len(arr) != n:
            raise OptionError(f"{name!r} has {0 if arr.ndim == 0 else len(arr)} samples, the store has {n}")
        spec = ArraySpec(name, arr.dtype.str, tuple(arr.shape[1:]), False, key, compression)
    writer = open_writer(path, "r+")
    try:
        if name in writer.arrays:
            writer.delete_array(name)
        writer.create_array(spec, n)
        if spec.ragged:
            writer.write_block(name, 0, parts)
        else:
            step = writer.block_len(name)
            for s in range(0, n, step):
                writer.write_block(name, s, arr[s : s + step])
        writer.commit(manifest)
    except BaseException:
        writer.abort()
        raise
    return spec
