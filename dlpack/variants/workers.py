"""One work unit of a variant build, in a worker process: one shard block of one variant.

A worker gets the frozen :class:`~.plan.VariantPlan`, the block's rows and its samples' label rows
(small); it opens its own reader of the store (pinned to the planned manifest), reads the block's
stored originals, computes each variant as ``augmenter(Targets(...), variant_rng(seed, i, v))``
and, where the writer is parallel-safe, writes the image (and mask) block itself. The small
outputs (CRC, boxes, box labels, crowd flags, the record) return to the parent as
:class:`VariantRecord` lists, which it journals and writes as arrays at commit.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import schema
from .._dask import release_slot
from .._parallel import Ticks
from ..backends import StoreWriter, open_reader
from ..errors import DlpackError, OptionError
from ..transforms.base import Targets, variant_rng
from .plan import VariantPlan

__all__ = ["VariantRecord", "LabelRows", "MAX_ATTEMPTS", "variant_block", "distinct_variant", "record_text", "view_key"]

#: Draws of one variant at most: the first, and redraws while it equals another view of its sample.
MAX_ATTEMPTS = 16

#: One sample's stored label rows: boxes [k, 4] (None: the store has none), box labels, crowd flags.
LabelRows = tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]


@dataclass(frozen=True)
class VariantRecord:
    """What one variant of one sample yields besides its pixels: a journal record, an array row.

    ``applied`` is the JSON text of what was applied (``augment_v{v}``); ``boxes`` are the moved
    boxes (None when the store has none), ``box_labels`` and ``box_crowd`` follow them.
    ``attempt`` is the draw kept (:func:`distinct_variant`); ``copy`` is true when no draw differed
    from the other views of the sample, and the variant is the first draw, a copy of one of them.
    """

    checksum: int
    mask_crc: int | None
    applied: str
    boxes: tuple[tuple[float, float, float, float], ...] | None = None
    box_labels: tuple[int, ...] | None = None
    box_crowd: tuple[int, ...] | None = None
    attempt: int = 0
    copy: bool = False

    def key(self) -> tuple[Any, ...]:
        """What makes two views of one sample the same: pixels (CRC-32), mask, boxes and their labels."""
        return (self.checksum, self.mask_crc, self.boxes, self.box_labels, self.box_crowd)

    def record(self) -> list[Any]:
        """The journal's JSON list of this record; :meth:`from_record` inverts it."""
        return [
            self.checksum,
            self.mask_crc,
            self.applied,
            None if self.boxes is None else [list(b) for b in self.boxes],
            None if self.box_labels is None else list(self.box_labels),
            None if self.box_crowd is None else list(self.box_crowd),
            self.attempt,
            self.copy,
        ]

    @classmethod
    def from_record(cls, rec: Sequence[Any]) -> VariantRecord:
        """The record of a journal line (the inverse of :meth:`record`)."""
        checksum, mask_crc, text, boxes, labels, crowd, attempt, copy = rec
        return cls(
            int(checksum),
            None if mask_crc is None else int(mask_crc),
            str(text),
            None if boxes is None else tuple((float(a), float(b), float(c), float(d)) for a, b, c, d in boxes),
            None if labels is None else tuple(int(x) for x in labels),
            None if crowd is None else tuple(int(x) for x in crowd),
            int(attempt),
            bool(copy),
        )


def record_text(record: Any) -> str:
    """The stored form of what was applied: compact JSON, keys sorted (``[]`` when nothing was)."""

    def plain(x: Any) -> Any:
        for attr in ("item", "tolist"):
            fn = getattr(x, attr, None)
            if callable(fn):
                return fn()
        raise TypeError(f"{type(x).__name__} is not JSON")

    return json.dumps(record, default=plain, allow_nan=False, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _follow(
    stored: bool, values: np.ndarray | None, boxes: tuple[Any, ...] | None, what: str, i: int, v: int
) -> tuple[int, ...] | None:
    """The per-box values (labels, crowd flags) of a variant, one per moved box; None when the store has none."""
    if not stored:
        return None
    found = tuple(int(x) for x in np.asarray(values if values is not None else (), np.int64).reshape(-1).tolist())
    if boxes is not None and len(found) != len(boxes):
        raise OptionError(f"variant {v} of sample {i} has {len(boxes)} boxes but {len(found)} {what}")
    return found


def view_key(image: np.ndarray, mask: np.ndarray | None, rows: LabelRows, plan: VariantPlan) -> tuple[Any, ...]:
    """:meth:`VariantRecord.key` of a stored original (its image, mask and label rows)."""
    boxes, labels, crowd = rows
    moved = None
    if plan.boxes:
        b = np.asarray(boxes if boxes is not None else np.empty((0, 4)), np.float32).reshape(-1, 4)
        moved = tuple((float(x0), float(y0), float(x1), float(y1)) for x0, y0, x1, y1 in b.tolist())
    return (
        zlib.crc32(np.ascontiguousarray(image).data),
        None if mask is None else zlib.crc32(np.ascontiguousarray(mask).data),
        moved,
        _values(plan.box_labels, labels),
        _values(plan.box_crowd, crowd),
    )


def _values(stored: bool, values: np.ndarray | None) -> tuple[int, ...] | None:
    return (
        tuple(int(x) for x in np.asarray(values if values is not None else (), np.int64).reshape(-1))
        if stored
        else None
    )


def distinct_variant(
    plan: VariantPlan,
    i: int,
    v: int,
    image: np.ndarray,
    mask: np.ndarray | None,
    rows: LabelRows,
    avoid: set[tuple[Any, ...]],
    first: int = 0,
) -> tuple[np.ndarray, np.ndarray | None, VariantRecord]:
    """Variant ``v`` of sample ``i``: the first draw ``a`` (``first`` .. :data:`MAX_ATTEMPTS` - 1,
    from ``variant_rng(seed, i, v, a)``) whose view is not in ``avoid`` (the keys of the original
    and of the variants before ``v``); when none is, draw 0, marked as a copy.

    The cache then holds K real views of each image wherever the config can make them, and the
    choice stays a pure function of ``(seed, i, v)``, the config and the stored original.
    """
    for a in range(first, MAX_ATTEMPTS):
        img, m, rec = _variant(plan, i, v, image, mask, rows, a)
        if rec.key() not in avoid:
            return img, m, dataclasses.replace(rec, attempt=a)
    img, m, rec = _variant(plan, i, v, image, mask, rows, 0)
    return img, m, dataclasses.replace(rec, copy=True)


def _variant(
    plan: VariantPlan, i: int, v: int, image: np.ndarray, mask: np.ndarray | None, rows: LabelRows, attempt: int = 0
) -> tuple[np.ndarray, np.ndarray | None, VariantRecord]:
    """Draw ``attempt`` of variant ``v`` of sample ``i``: a pure function of the plan's seed and
    augmenter and the stored original."""
    boxes, labels, crowd = rows
    t = Targets(
        image=image,
        boxes=None if boxes is None else np.ascontiguousarray(boxes, np.float32).reshape(-1, 4),
        box_labels=labels,
        box_crowd=crowd,
        mask=mask,
        fill_mask=plan.fill_mask,
    )
    try:
        out, applied = plan.augmenter(t, variant_rng(plan.seed, i, v, attempt))
    except DlpackError as exc:
        raise type(exc)(f"variant {v} of sample {i}: {exc}") from exc
    h, w, c = plan.shape
    img = np.asarray(out.image)
    if img.ndim == 2 and c == 1:
        img = img[:, :, None]
    if img.shape != plan.shape or img.dtype != np.dtype(plan.dtype):
        raise OptionError(
            f"variant {v} of sample {i} is {list(img.shape)} {img.dtype}, but the store holds {list(plan.shape)} "
            f"{np.dtype(plan.dtype)} images: every variant keeps the stored size and type (an operation that "
            "crops must resize back, e.g. RandomResizedCrop to the stored size)"
        )
    img = np.ascontiguousarray(img)
    m = None
    if plan.mask_dtype is not None:
        m = np.asarray(out.mask) if out.mask is not None else None
        if m is None or m.shape != (h, w) or m.dtype != np.dtype(plan.mask_dtype):
            got = "none" if m is None else f"{list(m.shape)} {m.dtype}"
            raise OptionError(
                f"variant {v} of sample {i} has a mask {got}, the store's masks are {[h, w]} {plan.mask_dtype}"
            )
        m = np.ascontiguousarray(m)
    moved = None
    if plan.boxes:
        b = np.asarray(out.boxes if out.boxes is not None else np.empty((0, 4)), np.float32).reshape(-1, 4)
        moved = tuple((float(x0), float(y0), float(x1), float(y1)) for x0, y0, x1, y1 in b.tolist())
    kept_labels = _follow(plan.box_labels, out.box_labels, moved, "box labels", i, v)
    kept_crowd = _follow(plan.box_crowd, out.box_crowd, moved, "crowd flags", i, v)
    rec = VariantRecord(
        zlib.crc32(img.data),
        None if m is None else zlib.crc32(m.data),
        record_text(applied),
        moved,
        kept_labels,
        kept_crowd,
    )
    return img, m, rec


def variant_block(
    plan: VariantPlan,
    v: int,
    start: int,
    labels: Sequence[LabelRows],
    writer: StoreWriter | None,
    names: tuple[str, str | None],
    inputs: tuple[np.ndarray, np.ndarray | None] | None = None,
    ticks: Ticks | None = None,
    pooled: bool = False,
) -> tuple[list[VariantRecord], np.ndarray | None, np.ndarray | None]:
    """Variants ``v`` of samples ``start .. start + len(labels)``.

    ``inputs`` are the block's stored images (and masks) when the parent read them (a writer that
    is not parallel-safe: the parent holds the store's only handle); otherwise this worker reads
    them itself. With ``writer``, the image block (and mask block) is written here under ``names``
    and only the records return; without, the pixels return too, for the parent to write.
    ``pooled``: this is one of ``--jobs`` worker processes, one per core, so OpenCV runs single-threaded
    in it (its own threads would oversubscribe the cores: measured slower than one thread on small images).
    """
    if pooled:
        import cv2

        cv2.setNumThreads(1)
    n = len(labels)
    stop = start + n
    if inputs is None:
        reader = open_reader(plan.store)
        reader.pin_to(plan.pin)  # the very store the run planned, or a StoreError
        try:
            originals = np.empty((n, *plan.shape), dtype=plan.dtype)
            reader.read_into(schema.IMAGES, list(range(start, stop)), originals)
            masks_in = None
            if plan.mask_dtype is not None:
                masks_in = np.empty((n, plan.shape[0], plan.shape[1]), dtype=plan.mask_dtype)
                reader.read_into(schema.MASK, list(range(start, stop)), masks_in)
        finally:
            reader.close()  # an HDF5 reader's file lock would keep the parent from committing
    else:
        originals, masks_in = inputs
    block = np.empty((n, *plan.shape), dtype=plan.dtype)
    masks = None if plan.mask_dtype is None else np.empty((n, plan.shape[0], plan.shape[1]), dtype=plan.mask_dtype)
    records = []
    for k in range(n):
        if ticks is not None and k and k % ticks.EVERY == 0:
            ticks(k)
        mask_k = None if masks_in is None else masks_in[k]
        # Here only the original is avoided; the parent redraws a variant equal to an earlier one.
        original = {view_key(originals[k], mask_k, labels[k], plan)}
        img, m, rec = distinct_variant(plan, start + k, v, originals[k], mask_k, labels[k], original)
        block[k] = img
        if masks is not None and m is not None:
            masks[k] = m
        records.append(rec)
    if writer is None:
        return records, block, masks
    image_name, mask_name = names
    release_slot()  # what is left is the block's writes
    writer.write_block(image_name, start, block)
    if masks is not None and mask_name is not None:
        writer.write_block(mask_name, start, masks)
    return records, None, None
