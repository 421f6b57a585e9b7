"""``dlpack.open``: random access to a store, whatever its backend."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import operator
import os
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import schema
from ..backends import StoreReader
from ..errors import (
    DlpackError,
    OptionError,
    SampleIndexError,
    StoreError,
    StoreNotFoundError,
)
from ..manifest import ArraySpec, Manifest
from ..storage.location import Location, is_url
from ..storage.remote import open_reader
from .loader import Loader, LoaderOptions, source_loader

if TYPE_CHECKING:
    from ..halcon.view import DLDatasetView
    from .views import CachedViews

__all__ = ["Dataset", "open"]

#: Images :meth:`Dataset.check` reads at a time (bounded memory).
_VERIFY_BYTES = 64 * 2**20


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


def verify_store(path: str | os.PathLike[str] | Location, storage_options: Any = None) -> VerifyReport:
    """Verify the store at ``path`` (a local path or an object-store URL; see :meth:`Dataset.check`),
    also when it does not open: then every array whose damage keeps it from opening is named where
    its manifest can be read."""
    where = _where(path, storage_options)
    try:
        ds = Dataset(where)
    except (StoreError, StoreNotFoundError) as exc:
        return _unopenable(where, exc)
    with ds:
        return ds.check()


def _where(path: str | os.PathLike[str] | Location, storage_options: Any) -> Path | Location:
    """A local store's path as given (made a Path), or the Location of a URL with its options."""
    if is_url(path):
        return Location.parse(path, storage_options)
    if storage_options:
        Location.parse(path, storage_options)  # the OptionError: options are for URLs
    return Path(path.url if isinstance(path, Location) else path)


def _unopenable(path: Path | Location, exc: DlpackError) -> VerifyReport:
    try:
        reader = open_reader(path)
        count = len(reader)
    except DlpackError:
        return VerifyReport(str(path), None, [], [(None, str(exc))])
    with reader:
        damaged = reader.array_problems()
        broken = {name for name, _ in damaged}
        # Codes against the lists they index (labels against the classes ...), unless already named.
        damaged += [(name, why) for name, why in reader.code_problems() if not broken & {name, name + "_data"}]
    return VerifyReport(str(path), count, [], damaged or [(None, str(exc))])


class Dataset:
    """A read-only, random-access view of one store; a :class:`~dlpack.read.loader.BatchSource`.

    A sample is ``{"image", "label", "index", "source"}`` plus every stored array that has a
    ``key`` (``boxes`` [k, 4], ``box_labels`` [k], ``mask`` [H, W], arrays added with
    :func:`add_array` ...), ``split`` (the split's name, or None) in a store whose source assigned
    splits, and ``defect`` (an int indexing :attr:`defects`) in an anomaly store. Picklable: only
    the path travels, and each process opens its own handles on first use.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Location,
        storage_options: Any = None,
        *,
        cache_bytes: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._cache = (cache_bytes, None if cache_dir is None else os.fspath(cache_dir))
        self._setup(_where(path, storage_options), None)

    def _setup(self, path: Path | Location, pin: str | None) -> None:
        #: The store's local path, or its :class:`~dlpack.storage.location.Location` (printed as its URL).
        self.path: Any = path
        if isinstance(path, Location):
            self._reader: StoreReader = open_reader(path, cache_bytes=self._cache[0], cache_dir=self._cache[1])
        else:
            self._reader = open_reader(path)
        self._reader.pin_to(pin)  # a copy must read the very store its original opened
        self._warm_skip: frozenset[str] | None = None  # what warm() leaves cold (the variants), found once
        m = self._reader.manifest  # fail now, not at the first sample, on incomplete or newer stores
        missing = [n for n in schema.required_arrays(m.image.layout) if n not in m.arrays]
        if missing == [schema.IMAGE_SHAPES]:
            raise StoreError(f"store {self.path} lacks image_shapes, which a variable-size store needs; rebuild it")
        if missing:
            raise StoreError(
                f"store {self.path} lacks the array(s) {', '.join(missing)} every dlpack store has; rebuild it"
            )
        self._reader.read_all(schema.LABELS)  # range-checked against the classes, and checksummed, now
        self.backend = m.backend
        own = (schema.image_array(m.image.layout), schema.LABELS)
        #: (key, spec, how ds[i] shows it): "name" a code as its list's name (split), "int" a code as an
        #: int (defect, as label), "array" the stored value.
        self._keyed = [
            (spec.key, spec, _shown(spec)) for spec in m.arrays.values() if spec.key and spec.name not in own
        ]

    def __getstate__(self) -> dict[str, Any]:
        # A Location travels with its storage options; each process makes its own client and cache.
        return {"path": self.path, "pin": self._reader.pin, "cache": self._cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._cache = state.get("cache", (None, None))
        self._setup(state["path"], state.get("pin"))

    @property
    def reader(self) -> StoreReader:
        """The backend reader (for benchmarks and tools that read arrays by name)."""
        return self._reader

    @property
    def manifest(self) -> Manifest:
        """The store's manifest, as the reader pinned it when the store was opened."""
        return self._reader.manifest

    @property
    def classes(self) -> tuple[str, ...]:
        """Class names; a sample's ``label`` indexes this tuple (-1 means unlabelled)."""
        return self.manifest.classes

    @property
    def splits(self) -> tuple[str, ...]:
        """Split names (sorted); a batch's ``split`` code ``k`` means ``splits[k]``, -1 no split."""
        return self.manifest.splits

    @property
    def stats(self) -> dict[str, Any] | None:
        """Per-channel pixel statistics the build recorded, ``{"mean": [C], "std": [C], "count":
        pixels}`` in units of the stored dtype (0..255 for uint8), for ``torch_loader(mean="store")``;
        None in a store built before they were recorded (rebuild it to get them)."""
        stats = self.manifest.stats
        return None if stats is None else {k: list(v) if isinstance(v, list) else v for k, v in stats.items()}

    @property
    def class_ids(self) -> tuple[int, ...]:
        """The original id of each class (COCO category id, HALCON class id, mask pixel value), aligned
        with :attr:`classes`; ``0 .. len(classes) - 1`` in stores that do not record them."""
        return self.manifest.resolved_class_ids

    @property
    def task(self) -> str:
        """``"classification"``, ``"detection"``, ``"segmentation"``, ``"anomaly"`` or ``"none"``; in
        stores that do not record it, ``"classification"`` when labelled, else ``"none"``."""
        return self.manifest.resolved_task

    @property
    def defects(self) -> tuple[str, ...]:
        """Anomaly stores: defect folder names; a sample's ``defect`` code ``k`` means ``defects[k]``."""
        return self.manifest.defects

    def _split_codes(self) -> np.ndarray:
        """The ``split`` array (the reader checks its codes against the split names, and caches it)."""
        spec = self.manifest.arrays.get(schema.SPLIT)
        if spec is None or spec.ragged:
            names = ", ".join(self.manifest.splits)
            raise StoreError(f"store {self.path} lists splits ({names}) but has no split array; rebuild it")
        return np.asarray(self._reader.read_all(schema.SPLIT)).reshape(-1)

    def indices(self, split: str) -> np.ndarray:
        """The sorted sample indices (int64) of one split, for ``loader(indices=...)`` or your own sampler.

        Raises :class:`~dlpack.OptionError` for a split the store does not have, naming the ones it has.
        """
        names = self.manifest.splits
        if not names:
            raise OptionError(
                f"store {self.path} has no splits: its source assigned none (a build takes splits from top "
                "folders named train, val, validation or test, or makes them with --split); select samples with "
                "indices= instead"
            )
        if not isinstance(split, str) or split not in names:
            raise OptionError(f"store {self.path} has no split {split!r}; its splits are: {', '.join(names)}")
        return np.flatnonzero(self._split_codes() == names.index(split)).astype(np.int64)

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
        """``{"image": HxWxC, "label": int, "index": i, "source": "relative/path.png", KEY: ...}``;
        ``split`` is the split's name (a str) or None, as ``label`` is an int."""
        j = self._index(i)
        r = self._reader
        sample: dict[str, Any] = {
            "image": r.read_image(j),
            "label": int(r.read_all(schema.LABELS)[j]),
            "index": j,
            "source": r.source(j),
        }
        for key, spec, shown in self._keyed:
            if shown == "name":
                code = int(self._split_codes()[j])
                sample[key] = None if code < 0 else self.manifest.splits[code]
            elif shown == "int":
                sample[key] = int(r.read_all(spec.name)[j])
            else:
                sample[key] = r.read(spec.name, j)
        return sample

    # ------------------------------------------------------------------ augmentation variants

    @property
    def variants(self) -> int:
        """The number K of augmentation variants per image (0 without; see ``dlpack augment``)."""
        return self.manifest.variants

    def _variant_index(self, i: int, v: int) -> tuple[int, int]:
        j = self._index(i)
        k = self.variants
        try:
            w = operator.index(v)
        except TypeError:
            raise SampleIndexError(f"variant must be an integer, got {v!r}") from None
        if not 0 <= w <= k:
            has = (
                f"K={k} variants per image (0 is the original)"
                if k
                else "no augmentation variants (run dlpack augment)"
            )
            raise SampleIndexError(f"variant {v} is out of range for {self.path}: it has {has}")
        return j, w

    def _variant_array(self, base: str, v: int) -> str:
        name = schema.variant_array(base, v)
        if name not in self.manifest.arrays:
            raise StoreError(
                f"store {self.path} records {self.variants} variants but has no array {name!r}; the store is "
                "damaged: run dlpack augment on it again with --replace"
            )
        return name

    def variant(self, i: int, v: int) -> dict[str, Any]:
        """Variant ``v`` of sample ``i`` as a sample dict like ``ds[i]`` (``image``, ``label``,
        ``index``, ``source``, the split and keyed arrays), with the variant's ``image`` and its
        ``boxes``, ``box_labels``, ``box_crowd`` and ``mask`` where the store has them, plus
        ``"variant": v``. ``v = 0`` is the original; ``1 .. K`` the stored variants.

        Raises :class:`~dlpack.SampleIndexError` for a sample or variant out of range (naming K).
        """
        j, w = self._variant_index(i, v)
        sample = self[j]
        sample["variant"] = w
        if w == 0:
            return sample
        r = self._reader
        sample["image"] = r.read(self._variant_array(schema.IMAGES, w), j)
        for base in (schema.MASK, schema.BOXES, "box_labels", "box_crowd"):
            spec = self.manifest.arrays.get(base)
            if spec is not None and spec.key:
                sample[spec.key] = r.read(self._variant_array(base, w), j)
        return sample

    def augmentation(self, i: int, v: int) -> list[dict[str, Any]]:
        """What was applied to make variant ``v`` of sample ``i``: the record ``[{"op": NAME, **params},
        ...]`` (``[]`` for the original, ``v = 0``, and for a variant nothing was applied to)."""
        j, w = self._variant_index(i, v)
        if w == 0:
            return []
        raw = self._reader.read(self._variant_array(schema.AUGMENT, w), j)
        try:
            record = json.loads(np.ascontiguousarray(raw, dtype=np.uint8).tobytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise StoreError(f"augment_v{w} of {self.path} holds no JSON record for sample {j}: {exc}") from exc
        if not isinstance(record, list):
            raise StoreError(f"augment_v{w} of {self.path} holds {type(record).__name__} for sample {j}, not a list")
        return record

    # ------------------------------------------------------------------ BatchSource

    #: A row of :meth:`get_batch` depends only on its index: the loader may read several batches in
    #: one call and cut them apart (:class:`~dlpack.read.loader.BatchSource`).
    batch_rows_independent = True

    def get_batch(
        self, indices: Sequence[int] | np.ndarray, epoch: int = 0, out: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Samples ``indices`` stacked: ``image`` is B x H x W x C (a list for variable-size stores);
        ragged arrays as a :class:`~dlpack.ragged.RaggedBatch` (a sequence of B arrays). A store's samples do not depend on ``epoch``."""
        return self.get_valid_batch(self._batch_indices(indices), epoch, out)

    def batch_arrays(self) -> tuple[str, ...]:
        """The arrays :meth:`get_valid_batch` reads per sample: the pixels (and the shapes of a
        variable-size store), the labels and every keyed array; not the checksums, the source paths
        (read once, for the names) or the augmentation variants. What a plain read costs on disk."""
        m = self.manifest
        shapes = (schema.IMAGE_SHAPES,) if m.image.shape is None and schema.IMAGE_SHAPES in m.arrays else ()
        return (schema.image_array(m.image.layout), *shapes, schema.LABELS, *(spec.name for _, spec, _ in self._keyed))

    def get_valid_batch(self, idx: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        """:meth:`get_batch` of int64 indices already in range (the loader's: it draws them from
        ``range(len)``), without checking them again: the check costs 3 us a call, 13 % of an
        epoch of 32x32 batches of 256 read on the calling thread."""
        r = self._reader
        shape = self.manifest.image.shape
        images: Any
        if shape is None:
            images = [r.read_image(j) for j in idx.tolist()]
        else:
            if out is None:
                out = np.empty((len(idx), *shape), dtype=self.manifest.image.dtype)
            images = r.gather(schema.IMAGES, idx, out)
        batch: dict[str, Any] = {
            "image": images,
            "label": r.read_all(schema.LABELS).take(idx, axis=0, mode="clip"),
            "index": idx,
            "source": r.lazy_sources(idx),  # decoded when read (most steps never do)
        }
        if self._keyed:
            ragged = r.read_ragged_batch([spec.name for _, spec, _ in self._keyed if spec.ragged], idx)
            for key, spec, _ in self._keyed:
                if spec.ragged:
                    batch[key] = ragged[spec.name]
                else:
                    batch[key] = r.gather(spec.name, idx, np.empty((len(idx), *spec.shape), dtype=spec.dtype))
        return batch

    def _batch_indices(self, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """``indices`` as int64 sample indices (negative ones from the end), or a SampleIndexError."""
        n = len(self)
        idx = np.asarray(indices).reshape(-1)
        if idx.dtype == np.int64 and idx.size and int(idx.min()) >= 0 and int(idx.max()) < n:
            return idx  # the loader's batches: already in range, nothing to convert
        if idx.dtype.kind not in "iu" and idx.size:
            raise SampleIndexError(f"sample indices must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        idx = np.where(idx < 0, idx + n, idx)
        bad = (idx < 0) | (idx >= n)
        if bad.any():
            raise SampleIndexError(
                f"sample index {np.asarray(indices).reshape(-1)[bad][0]} is out of range for {self.path} with {n} samples"
            )
        return idx

    @property
    def streamed(self) -> bool:
        """Whether the store is read over the network (an object store), not from a local file system."""
        return bool(self._reader.streamed)

    @property
    def shard_rows(self) -> int | None:
        """Images per shard of the image array (None for a variable-size store, or one that does not record it)."""
        rows = self.manifest.shard_rows
        return rows if self.manifest.image.shape is not None and rows > 0 else None

    @property
    def block_hint(self) -> int | None:
        """The run of consecutive samples the loader's ``order="block"`` reads by default: one whole
        shard on a streamed store (each fetch is then used whole, by one rank), None on a local
        one (the loader keeps its fixed default there, so local orders never change)."""
        return self.shard_rows if self.streamed else None

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Start fetching what samples ``indices`` (the loader's next reads, in order) need: the
        shards of a streamed store; nothing on a local one. Never changes what a read returns."""
        self._reader.prefetch(np.asarray(indices, dtype=np.int64).reshape(-1))

    def warm(self) -> None:
        """Open maps and read indexes now (the loader calls it before its threads start), of the
        arrays samples and batches read: not of the augmentation variants (K times the images), which
        a reader of variants warms itself (``reader.warm()`` warms every array)."""
        if self._warm_skip is None:
            self._warm_skip = frozenset(name for name in self.manifest.arrays if schema.variant_of(name) is not None)
        self._reader.warm(skip=self._warm_skip)

    def fingerprint(self) -> str:
        """An id of the content: the sample count and every image's checksum."""
        h = hashlib.sha256(str(len(self)).encode())
        h.update(np.ascontiguousarray(self._reader.read_all(schema.CHECKSUM)).tobytes())
        return h.hexdigest()[:16]

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        """``((H, W, C), dtype)`` of every image, or None for a variable-size store."""
        shape = self.manifest.image.shape
        return None if shape is None else (shape, self.manifest.image.dtype)

    def cached_views(
        self, seed: int = 0, *, original_rate: float | None = None, views_per_batch: int = 1
    ) -> CachedViews:
        """The augmentation views of this store as a batch source (what ``loader(augment="cached")``
        reads; docs/loader.md, "Cached augmentation views"). An OptionError without variants."""
        from .views import CachedViews

        return CachedViews(self, seed, original_rate=original_rate, views_per_batch=views_per_batch)

    # ------------------------------------------------------------------ training

    def loader(
        self,
        options: LoaderOptions | None = None,
        *,
        transform: Callable[..., dict[str, Any]] | None = None,
        split: str | None = None,
        indices: Sequence[int] | np.ndarray | None = None,
        **kwargs: Any,
    ) -> Loader:
        """A batch loader over this store; keyword arguments are :class:`~dlpack.LoaderOptions` fields.

        ``ds.loader(batch_size=32, shuffle=True, seed=0, prefetch=4, workers="auto", drop_last=True,
        rank=0, world_size=1)``; ``transform(batch) -> batch`` runs on the worker threads.
        ``split="train"`` (see :meth:`indices`) or ``indices=[...]`` restricts every epoch to those
        samples; the shuffle, rank shards and resume then apply to the selection.
        """
        return source_loader(self, options, transform, split, indices, kwargs)

    def __iter__(self) -> Any:
        for i in range(len(self)):
            yield self[i]

    def close(self) -> None:
        """Release open handles and maps; the store reopens lazily if used again."""
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
        """What :meth:`verify` checks, as a report naming every damaged array instead of raising.

        A store with augmentation variants has each variant image compared with its
        ``checksum_v{v}`` too; a variant that does not match is named (``images_v{v}``) in ``damaged``.
        """
        r = self._reader
        image_arrays = r.spec(schema.image_array(self.manifest.image.layout)).stored_names()
        variant_images = [
            name for v in range(1, self.variants + 1) if (name := schema.variant_array(schema.IMAGES, v)) in r.arrays
        ]
        pixels = [*image_arrays, *variant_images]
        damaged = r.array_problems(skip=pixels)
        broken = {name for name, _ in damaged}
        damaged += [(n, why) for n, why in r.code_problems() if not broken & {n, n + "_data", n + "_offsets"}]
        bad: list[tuple[int, str]] = []
        # Each image is compared with its CRC only while the CRCs, sources and shapes are intact.
        needed = {schema.CHECKSUM, schema.SOURCE + "_data", schema.SOURCE + "_offsets", schema.IMAGE_SHAPES, None}
        if not broken & needed:
            try:
                expected = r.read_all(schema.CHECKSUM)
                shape = self.manifest.image.shape
                if shape is None:
                    for i in range(len(self)):
                        img = np.ascontiguousarray(r.read_image(i))
                        if zlib.crc32(img.data) != int(expected[i]):
                            bad.append((i, r.source(i)))
                else:  # in blocks: a remote reader fetches the shards of a block whole, several at once
                    step = max(1, _VERIFY_BYTES // max(1, r.spec(schema.IMAGES).item_nbytes))
                    buf = np.empty((min(step, len(self)), *shape), dtype=self.manifest.image.dtype)
                    for a in range(0, len(self), step):
                        got = r.read_into(schema.IMAGES, np.arange(a, min(len(self), a + step)), buf)
                        for k in range(min(step, len(self) - a)):
                            if zlib.crc32(np.ascontiguousarray(got[k]).data) != int(expected[a + k]):
                                bad.append((a + k, r.source(a + k)))
            except StoreError as exc:
                damaged.append((image_arrays[0], str(exc)))
            damaged += self._variant_problems(broken)
        if not bad and not damaged:
            # The images' own checksum covers bytes the per-image CRCs do not (none, today).
            damaged = r.array_problems(skip=[n for s in r.arrays.values() for n in s.stored_names() if n not in pixels])
        return VerifyReport(str(self.path), len(self), bad, damaged)

    def _variant_problems(self, broken: set[str | None]) -> list[tuple[str | None, str]]:
        """Each variant's images against ``checksum_v{v}``, and the variant arrays the store must hold."""
        r, m = self._reader, self.manifest
        problems: list[tuple[str | None, str]] = []
        bases = [schema.IMAGES, schema.CHECKSUM, schema.AUGMENT]
        bases += [b for b in (schema.MASK, schema.BOXES, "box_labels", "box_crowd") if b in m.arrays]
        for v in range(1, self.variants + 1):
            missing = [n for b in bases if (n := schema.variant_array(b, v)) not in m.arrays]
            if missing:
                problems.append((None, f"variant {v} lacks the array(s) {', '.join(missing)}"))
                continue
            images, checksums = schema.variant_array(schema.IMAGES, v), schema.variant_array(schema.CHECKSUM, v)
            if checksums in broken:
                continue
            try:
                expected = r.read_all(checksums)
                wrong = [
                    i
                    for i in range(len(self))
                    if zlib.crc32(np.ascontiguousarray(r.read(images, i)).data) != int(expected[i])
                ]
            except StoreError as exc:
                problems.append((images, f"variant {v}: {exc}"))
                continue
            if wrong:
                shown = ", ".join(f"{i} ({r.source(i)})" for i in wrong[:5]) + (", ..." if len(wrong) > 5 else "")
                problems.append(
                    (
                        images,
                        f"variant {v}: {len(wrong)} image(s) of {images} do not match {checksums}: samples {shown}",
                    )
                )
        return problems

    def info(self) -> dict[str, Any]:
        """Facts for ``dlpack info``."""
        m = self.manifest
        nbytes = self._reader.nbytes_on_disk()
        labels = np.asarray(self._reader.read_all(schema.LABELS)).reshape(-1)
        codes = self._split_codes() if m.splits else np.full(len(labels), -1)

        def per_class(mask: np.ndarray) -> dict[str, int]:
            counts = np.bincount(labels[mask & (labels >= 0)].astype(np.int64), minlength=len(m.classes))
            return {c: int(n) for c, n in zip(m.classes, counts, strict=False)}

        everything = np.ones(len(labels), dtype=bool)
        splits = {
            name: {"count": int((codes == k).sum()), "classes": per_class(codes == k)}
            for k, name in enumerate(m.splits)
        }
        return (
            {
                "path": str(self.path),
                "backend": self.backend,
                "format_version": m.format_version,
                "count": m.count,
                "classes": list(m.classes),
                "class_counts": per_class(everything),
                "unlabelled": int((labels < 0).sum()),
                "splits": splits,
                "unsplit": int((codes < 0).sum()) if m.splits else 0,
                "layout": m.image.layout,
                "resolution": [m.image.width, m.image.height] if m.image.shape else None,
                "channels": m.image.channels,
                "dtype": m.image.dtype,
                "compression": m.compression,
                "shard_images": m.shard_rows,
                "bytes_on_disk": nbytes,
                "arrays": {name: spec.to_dict() for name, spec in m.arrays.items()},
                "skipped": [{"path": e.path, "reason": e.reason} for e in m.skipped],
                "conversions": m.conversions,
                "resize": m.resize,
                "task": m.resolved_task,
                "class_ids": list(m.resolved_class_ids),
            }
            | self._box_counts(codes)
            | ({"mask_ignore": m.mask_ignore} if m.mask_ignore is not None else {})
            | ({"defects": list(m.defects)} if m.defects else {})
            | ({"augment": _augment_info(m.augment)} if m.augment else {})
            | ({"stats": m.stats} if m.stats else {})
        )

    def _box_counts(self, codes: np.ndarray) -> dict[str, Any]:
        """Boxes and images with boxes per class, whole store and per split (a detection store's
        classes label its boxes, not its images: ``class_counts`` would count none of them)."""
        m = self.manifest
        if "box_labels" not in m.arrays:
            return {}
        rows = np.asarray(self._reader._ragged_codes("box_labels"), dtype=np.int64).reshape(-1)
        offsets = np.asarray(self._reader._ragged_offsets("box_labels"), dtype=np.int64)
        per_row = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))  # the sample of each box
        k = len(m.classes)

        def counts(samples: np.ndarray) -> dict[str, Any]:
            chosen = samples[per_row]
            boxes = np.bincount(rows[chosen], minlength=k)
            # One (sample, class) pair per image that has at least one box of the class.
            pairs = np.unique(per_row[chosen] * k + rows[chosen])
            images = np.bincount(pairs % k, minlength=k) if k else pairs
            with_boxes = len(np.unique(per_row[chosen]))
            return {
                "boxes": int(len(rows[chosen])),
                "boxes_per_class": {c: int(n) for c, n in zip(m.classes, boxes, strict=False)},
                "images_per_class": {c: int(n) for c, n in zip(m.classes, images, strict=False)},
                "images_without_boxes": int(samples.sum()) - with_boxes,
            }

        out = counts(np.ones(len(offsets) - 1, dtype=bool))
        if m.splits:
            out["splits"] = {name: counts(codes == j) for j, name in enumerate(m.splits)}
        return {"box_counts": out}


def _augment_info(record: dict[str, Any]) -> dict[str, Any]:
    """The facts ``info`` shows of a store's variants (the manifest has the whole record)."""
    found = record.get("config")
    config: dict[str, Any] = found if isinstance(found, dict) else {}
    ops = record.get("operations")
    transforms = ops.get("transforms") if isinstance(ops, dict) else None
    return {
        "k": record.get("k"),
        "seed": record.get("seed"),
        "engine": record.get("engine"),
        "config": config.get("name"),
        "kind": config.get("kind"),
        "operations": len(transforms) if isinstance(transforms, list) else None,
    }


def _shown(spec: ArraySpec) -> str:
    """How ``ds[i]`` shows keyed array ``spec``: codes of a fixed schema array as an int (``defect``,
    as ``label``), ``split`` by its name, everything else as stored."""
    role = schema.CODED.get(spec.name)
    if role is None or spec.ragged or spec.shape != () or spec.key != role.key:
        return "array"
    return "name" if spec.name == schema.SPLIT else "int"


def open(  # noqa: A001 - the public name is dlpack.open
    path: str | os.PathLike[str] | Location,
    storage_options: Any = None,
    *,
    cache_bytes: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Dataset | DLDatasetView:
    """Open a store (Zarr folder or HDF5 file) for reading; a HALCON DLDataset (a folder holding
    ``dataset.json``, or its ``.json`` file) opens read-only in place, decoded on the fly.

    ``path`` may be an object-store URL (``s3://bucket/x.zarr``, a Zarr store), with
    ``storage_options`` (endpoint, keys, ...: :data:`dlpack.storage.location.OPTION_KEYS`) over the
    AWS environment; whole shards are kept in ``cache_bytes`` of memory (default 1 GiB) and, with
    ``cache_dir``, in a local folder the processes of one machine share."""
    if is_url(path):
        return Dataset(path, storage_options, cache_bytes=cache_bytes, cache_dir=cache_dir)
    if storage_options:
        Location.parse(path, storage_options)  # the OptionError: options are for URLs
    from ..halcon.view import DLDatasetView, is_dldataset

    if is_dldataset(path):
        return DLDatasetView(path)
    return Dataset(path)
