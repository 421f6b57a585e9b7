"""Stage 4: decode and resize, in worker processes: one call per file (:func:`prepare_file`), a block of files per worker call.

One call per file returns every output of that file: the image, and with a label plan the label
arrays of :func:`~dlpack.sources.prepare_labels` (``boxes``, ``box_labels``, ``box_crowd``, ``mask``)
and the EXIF orientation the decode applied. The fixed-size outputs (image, mask) are written into
the same block rows; the small ones ride on the :class:`Sample`, so they are journalled with the
block and resume with it.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

import numpy as np

from .. import _parallel
from .._dask import release_slot
from .._parallel import Ticks
from ..backends import StoreWriter
from ..errors import InputFileError
from ..sources.base import SourceFiles, reading_ahead
from ..sources.decode import DecodeError, prepare_image
from ..sources.labels import prepare_labels, read_label_file
from ..sources.probe import ImageHeader
from ..storage.objects import StorageAccessError
from ..storage.runner import Pool
from .inputs import Kept
from .plan import BuildPlan
from .stats import Moments, moments

#: What a worker is given per file: its path relative to the root, its probed header, its annotations.
Job = tuple[str, ImageHeader | None, Mapping[str, Any] | None]


def preload() -> None:
    """What a new worker imports before its first block (``_parallel.warm_pool``): OpenCV and the
    Zarr writer; unpickling this function has imported this module, and with it the decoder."""
    import cv2  # noqa: F401

    from ..backends import _zarr  # noqa: F401


def jobs_of(items: Sequence[Any], probes: Sequence[Any], keep: Sequence[int]) -> JobList:
    """The worker jobs of the scanned ``items`` at positions ``keep`` (with their ``probes``)."""
    return JobList(items, probes, keep)


class JobList(Sequence[Job]):
    """The worker jobs of the scanned items at positions ``keep``, made when a block of them is read."""

    __slots__ = ("_items", "_probes", "_keep")

    def __init__(self, items: Sequence[Any], probes: Sequence[Any], keep: Sequence[int]) -> None:
        self._items, self._probes = items, probes
        # A range or Kept stays as it is (nothing per item); else one 8-byte position each.
        self._keep: Any = keep if isinstance(keep, (range, Kept)) else np.asarray(keep, dtype=np.int64).reshape(-1)

    def __len__(self) -> int:
        return len(self._keep)

    def _job(self, k: int) -> Job:
        item = self._items[k]
        return (item.rel, self._probes[k].header, item.annotations)

    @overload
    def __getitem__(self, k: int) -> Job: ...

    @overload
    def __getitem__(self, k: slice) -> list[Job]: ...

    def __getitem__(self, k: int | slice) -> Job | list[Job]:
        if isinstance(k, slice):
            return [self._job(int(j)) for j in self._keep[k]]
        return self._job(int(self._keep[k]))

    def __iter__(self) -> Iterator[Job]:
        for j in self._keep:
            yield self._job(int(j))

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


def label_digest(root: str | SourceFiles, label_root: str | None, annotations: Mapping[str, Any] | None) -> str:
    """SHA-256 (hex) of a sample's annotations and the bytes of the label files they name: what
    ``--update`` compares to know that a sample's labels changed although its image did not."""
    h = hashlib.sha256()
    h.update(json.dumps(annotations, sort_keys=True, ensure_ascii=False, default=str).encode("utf-8"))
    for key in ("mask", "anomaly_mask"):
        name = (annotations or {}).get(key)
        if not name:
            continue
        h.update(b"\0" + key.encode())
        try:
            h.update(read_label_file(root, label_root, name))
        except OSError as exc:
            h.update(f"unreadable: {exc.strerror or exc}".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Sample:
    """Per-sample metadata a worker returns (pixels and masks travel only when the main process writes).

    The label fields are set when the plan has labels: ``boxes`` (None: the store has none),
    ``box_labels``, ``box_crowd``, the ``mask``'s CRC-32, the annotations' :func:`label_digest`, and
    how many boxes the resize clipped or dropped.
    """

    original_size: tuple[int, int]
    shape: tuple[int, int, int]
    transform: tuple[float, float, float, float]
    checksum: int
    conversions: tuple[str, ...]
    pixels: np.ndarray | None = None
    #: The source file as read: (size in bytes, mtime in ns) and the SHA-256 (hex) of its bytes.
    stat: tuple[int, int] = (0, 0)
    sha256: str = ""
    orientation: int = 1
    boxes: tuple[tuple[float, float, float, float], ...] | None = None
    box_labels: tuple[int, ...] = ()
    box_crowd: tuple[int, ...] | None = None
    mask_crc: int | None = None
    label_sha256: str = ""
    clipped: int = 0
    dropped: int = 0
    mask: np.ndarray | None = None

    @property
    def labelled(self) -> bool:
        """Whether the sample has label outputs (its labels' digest)."""
        return bool(self.label_sha256)

    def record(self) -> list[Any]:
        """The sample as a JSON list (a journal line); :meth:`from_record` inverts it."""
        rec = [
            list(self.original_size), list(self.shape), list(self.transform),
            self.checksum, list(self.conversions), list(self.stat), self.sha256,
        ]  # fmt: skip
        if self.labelled:
            rec.append(
                {
                    "orientation": self.orientation,
                    "boxes": None if self.boxes is None else [list(b) for b in self.boxes],
                    "box_labels": list(self.box_labels),
                    "box_crowd": None if self.box_crowd is None else list(self.box_crowd),
                    "mask_crc": self.mask_crc,
                    "label_sha256": self.label_sha256,
                    "clipped": self.clipped,
                    "dropped": self.dropped,
                }
            )
        return rec

    @classmethod
    def from_record(cls, rec: Sequence[Any]) -> Sample:
        """The sample a journal line (:meth:`record`) holds."""
        size, shape, transform, checksum, conversions, stat, sha = rec[:7]
        lab: Mapping[str, Any] = rec[7] if len(rec) > 7 else {}
        boxes, crowd, crc = lab.get("boxes"), lab.get("box_crowd"), lab.get("mask_crc")
        return cls(
            (int(size[0]), int(size[1])),
            (int(shape[0]), int(shape[1]), int(shape[2])),
            (float(transform[0]), float(transform[1]), float(transform[2]), float(transform[3])),
            int(checksum),
            tuple(str(c) for c in conversions),
            None,
            (int(stat[0]), int(stat[1])),
            str(sha),
            orientation=int(lab.get("orientation", 1)),
            boxes=None if boxes is None else tuple((float(a), float(b), float(c), float(d)) for a, b, c, d in boxes),
            box_labels=tuple(int(v) for v in lab.get("box_labels", ())),
            box_crowd=None if crowd is None else tuple(int(v) for v in crowd),
            mask_crc=None if crc is None else int(crc),
            label_sha256=str(lab.get("label_sha256", "")),
            clipped=int(lab.get("clipped", 0)),
            dropped=int(lab.get("dropped", 0)),
        )


def prepare_file(
    files: SourceFiles,
    plan: BuildPlan,
    rel: str,
    header: ImageHeader | None,
    annotations: Mapping[str, Any] | None = None,
) -> tuple[np.ndarray, Sample]:
    """Read one file and turn it into its stored form with :func:`~dlpack.sources.decode.prepare_image`,
    and its annotations into the label outputs with :func:`~dlpack.sources.prepare_labels` (the
    sample's ``mask`` rides on it). A label file that cannot be used is a :class:`DecodeError` of the
    image, naming the label file."""
    data, st = files.read(rel)
    prepared = prepare_image(data, plan.target, header)
    img, g = prepared.pixels, prepared.geometry
    spec = plan.image
    if spec.shape is not None and img.shape != spec.shape:
        h, w = prepared.original_size
        raise DecodeError(
            f"image is {w}x{h} and would be stored as {img.shape[1]}x{img.shape[0]}, but this store holds "
            f"{spec.width}x{spec.height} images (its header said otherwise); pass --size or --resize fit"
        )
    meta = Sample(
        prepared.original_size,
        (img.shape[0], img.shape[1], img.shape[2]),
        (g.scale_y, g.scale_x, float(g.off_y), float(g.off_x)),
        zlib.crc32(img.data),
        prepared.conversions,
        stat=(st.size, st.version),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    lp = plan.labels
    if lp is None:
        return img, meta
    out = prepare_labels(
        files, lp.label_root, annotations, prepared, lp.task, lp.mask_dtype, lp.mask_ignore, lp.class_ids,
        instance_masks=lp.instance_masks,
    )  # fmt: skip
    arrays = out.arrays
    mask = arrays.get("mask")
    if lp.mask_dtype is not None:
        if mask is None or mask.shape != img.shape[:2]:  # pragma: no cover - prepare_labels follows the image
            raise DecodeError(f"its mask is {None if mask is None else mask.shape}, its image {img.shape[:2]}")
        mask = np.ascontiguousarray(mask)
    boxes = arrays.get("boxes")
    n = 0 if boxes is None else len(boxes)
    crowd = arrays.get("box_crowd")
    meta = replace(
        meta,
        orientation=int(prepared.orientation),
        boxes=tuple((float(a), float(b), float(c), float(d)) for a, b, c, d in boxes.tolist())
        if lp.boxes and boxes is not None
        else (() if lp.boxes else None),
        box_labels=tuple(int(v) for v in arrays["box_labels"].tolist()) if lp.boxes and n else (),
        box_crowd=(tuple(int(v) for v in crowd.tolist()) if crowd is not None else (0,) * n) if lp.crowd else None,
        mask_crc=None if mask is None else zlib.crc32(mask.data),
        label_sha256=label_digest(files, lp.label_root, annotations),
        clipped=out.clipped,
        dropped=out.dropped,
        mask=mask,
    )
    return img, meta


def decode_block(
    files: SourceFiles,
    plan: BuildPlan,
    pairs: Sequence[Job],
    out: np.ndarray | None = None,
    keep_pixels: bool = False,
    ticks: Ticks | None = None,
    masks: np.ndarray | None = None,
) -> list[Sample | InputFileError]:
    """Prepare a run of files: their metadata or why each failed.

    Pixels go into ``out[k]`` when given (a fixed-size block; failed slots keep their zeros), masks
    into ``masks[k]``, and both stay on the returned samples when ``keep_pixels``. ``ticks`` hears how many files are done every
    :attr:`Ticks.EVERY` files, so the bar moves within a block of tens of thousands of small images.
    """
    results: list[Sample | InputFileError] = []
    with reading_ahead(files, [rel for rel, _, _ in pairs]) as source:
        for k, (rel, header, ann) in enumerate(pairs):
            if ticks is not None and k and k % ticks.EVERY == 0:
                ticks(k)
            try:
                img, meta = prepare_file(source, plan, rel, header, ann)
            except DecodeError as exc:
                results.append(InputFileError(rel, str(exc)))
                continue
            except StorageAccessError:
                raise  # the bucket refused or could not be reached: no file's fault, the build stops
            except OSError as exc:
                results.append(InputFileError(rel, f"cannot read: {exc.strerror or exc}"))
                continue
            if out is not None:
                out[k] = img
            if masks is not None and meta.mask is not None:
                masks[k] = meta.mask
            results.append(replace(meta, pixels=img) if keep_pixels else replace(meta, mask=None))
    return results


def validate_stage(
    files: SourceFiles, plan: BuildPlan, pairs: Sequence[Job], *, n_jobs: int, quiet: bool, pool: Pool | None = None
) -> list[InputFileError]:
    """Decode every file without writing; the failures (so one error can list every bad file), on
    ``pool`` when given (a cluster's, ``--scheduler``)."""
    from joblib import delayed

    step = 16
    calls = (delayed(decode_block)(files, plan, pairs[s : s + step]) for s in range(0, len(pairs), step))
    found: list[InputFileError] = []
    with _parallel.progress(len(pairs), "checking pixels", quiet) as bar:
        n_calls = -(-len(pairs) // step)
        for block in _parallel.parallel(n_jobs, calls, n_calls) if pool is None else pool.imap(calls, n_calls):
            found.extend(r for r in block if isinstance(r, InputFileError))
            bar.update(len(block))
    return found


def fixed_block(plan: BuildPlan, n: int) -> np.ndarray:
    """A zeroed block of ``n`` images of the plan's fixed size (the padding of a short block stays zero)."""
    shape = plan.image.shape
    if shape is None:
        raise ValueError("a variable-size store has no fixed block")
    return np.zeros((n, *shape), dtype=plan.image.dtype)


def mask_block(plan: BuildPlan, n: int) -> np.ndarray | None:
    """A zeroed block of ``n`` masks, or None when the plan writes no mask."""
    lp = plan.labels
    if lp is None or lp.mask_dtype is None or plan.image.height is None or plan.image.width is None:
        return None
    return np.zeros((n, plan.image.height, plan.image.width), dtype=lp.mask_dtype)


def decode_fixed_block(
    files: SourceFiles, plan: BuildPlan, pairs: Sequence[Job], ticks: Ticks | None = None
) -> tuple[np.ndarray, np.ndarray | None, list[Sample | InputFileError]]:
    """Decode a block of a fixed-size store: its images, its masks (or None), and per-file results."""
    block = fixed_block(plan, len(pairs))
    masks = mask_block(plan, len(pairs))
    return block, masks, decode_block(files, plan, pairs, out=block, ticks=ticks, masks=masks)


def write_decoded(
    writer: StoreWriter,
    start: int,
    block: np.ndarray,
    masks: np.ndarray | None,
    results: Sequence[Sample | InputFileError],
) -> bool:
    """Write a decoded block (and its masks, in the same rows) as one block; False (nothing written)
    when a file of it failed: the store is then discarded (or rebuilt) anyway."""
    if any(isinstance(r, InputFileError) for r in results):
        return False
    writer.write_block("images", start, block)
    if masks is not None:
        writer.write_block("mask", start, masks)
    return True


def block_counts(plan: BuildPlan, block: np.ndarray) -> Moments:
    """The per-channel moments of a written block (:func:`~dlpack.pack.stats.moments`), taken
    from memory where the block is written, so the commit need not read the images back."""
    return moments(block, plan.image.channels, plan.image.dtype)


def write_block_worker(
    writer: StoreWriter,
    files: SourceFiles,
    plan: BuildPlan,
    start: int,
    pairs: Sequence[Job],
    ticks: Ticks | None = None,
) -> tuple[list[Sample | InputFileError], Moments | None]:
    """Decode a block and write it as one block (in a worker, for writers that allow it): the
    per-file results, and the block's :func:`block_counts` (None when a file failed and nothing was written)."""
    block, masks, results = decode_fixed_block(files, plan, pairs, ticks)
    if any(isinstance(r, InputFileError) for r in results):
        return results, None  # nothing written: the store is discarded (or rebuilt) anyway
    counts = block_counts(plan, block)
    release_slot()  # what is left is the block's writes
    write_decoded(writer, start, block, masks, results)
    return results, counts
