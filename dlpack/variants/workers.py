"""One work unit of a variant build, in a worker process: one shard block of one variant.

A worker gets the frozen :class:`~.plan.VariantPlan`, the block's rows and its samples' label rows
(small); it opens its own reader of the store (pinned to the planned manifest), reads the block's
stored originals, computes each variant as ``augmenter(Targets(...), variant_rng(seed, i, v))``
and, where the writer is parallel-safe, writes the image (and mask) block itself. The small
outputs (CRC, boxes, box labels, crowd flags, the record) return to the parent as
:class:`VariantRecord` lists, which it journals and writes as arrays at commit.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import schema
from .._parallel import Ticks
from ..backends import StoreWriter, open_reader
from ..errors import DlpackError, OptionError
from ..transforms.base import Targets, variant_rng
from .plan import VariantPlan

__all__ = ["VariantRecord", "LabelRows", "variant_block", "record_text"]

#: One sample's stored label rows: boxes [k, 4] (None: the store has none), box labels, crowd flags.
LabelRows = tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]


@dataclass(frozen=True)
class VariantRecord:
    """What one variant of one sample yields besides its pixels: a journal record, an array row.

    ``applied`` is the JSON text of what was applied (``augment_v{v}``); ``boxes`` are the moved
    boxes (None when the store has none), ``box_labels`` and ``box_crowd`` follow them.
    """

    checksum: int
    mask_crc: int | None
    applied: str
    boxes: tuple[tuple[float, float, float, float], ...] | None = None
    box_labels: tuple[int, ...] | None = None
    box_crowd: tuple[int, ...] | None = None

    def record(self) -> list[Any]:
        """The journal's JSON list of this record; :meth:`from_record` inverts it."""
        return [
            self.checksum,
            self.mask_crc,
            self.applied,
            None if self.boxes is None else [list(b) for b in self.boxes],
            None if self.box_labels is None else list(self.box_labels),
            None if self.box_crowd is None else list(self.box_crowd),
        ]

    @classmethod
    def from_record(cls, rec: Sequence[Any]) -> VariantRecord:
        checksum, mask_crc, text, boxes, labels, crowd = rec
        return cls(
            int(checksum),
            None if mask_crc is None else int(mask_crc),
            str(text),
            None if boxes is None else tuple((float(a), float(b), float(c), float(d)) for a, b, c, d in boxes),
            None if labels is None else tuple(int(x) for x in labels),
            None if crowd is None else tuple(int(x) for x in crowd),
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


def _variant(
    plan: VariantPlan, i: int, v: int, image: np.ndarray, mask: np.ndarray | None, rows: LabelRows
) -> tuple[np.ndarray, np.ndarray | None, VariantRecord]:
    """Variant ``v`` of sample ``i``: a pure function of the plan's seed and augmenter and the stored original."""
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
        out, applied = plan.augmenter(t, variant_rng(plan.seed, i, v))
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
        reader._pin = plan.pin  # the very store the run planned, or a StoreError
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
        img, m, rec = _variant(plan, start + k, v, originals[k], None if masks_in is None else masks_in[k], labels[k])
        block[k] = img
        if masks is not None and m is not None:
            masks[k] = m
        records.append(rec)
    if writer is None:
        return records, block, masks
    image_name, mask_name = names
    writer.write_block(image_name, start, block)
    if masks is not None and mask_name is not None:
        writer.write_block(mask_name, start, masks)
    return records, None, None
