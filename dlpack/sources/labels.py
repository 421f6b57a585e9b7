"""Labels of one sample -> the arrays stored beside its image, through the image's own geometry.

:func:`prepare_labels` is the one per-sample step after :func:`~dlpack.sources.decode.prepare_image`:
the build's worker calls it with the :class:`~dlpack.sources.decode.PreparedImage`, so boxes and masks
are turned by the EXIF orientation the decode applied and resized, padded and clipped as the pixels
were (docs/format.md, "Labels follow the resize"). The geometry itself is pure functions in
:mod:`dlpack.transforms.functional`; this module reads label images and applies the rules.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._files import NotRegularFileError, open_regular
from ..transforms.functional import orient_boxes, polygons_to_mask, resize_boxes, resize_mask, rle_to_mask
from ._where import files_at
from .base import LocalFiles, SourceFiles
from .decode import DecodeError, PreparedImage, damage_reason, incomplete_reason, library_messages, no_header_reason
from .probe import probe_header

__all__ = ["LabelOutputs", "prepare_labels", "TASKS", "OK_DEFECTS"]

#: The tasks a source can declare (``SourceScan.task``).
TASKS = ("classification", "detection", "segmentation", "anomaly", "none")
#: Defect folder names (any case) of the samples that are ok: without ground truth their mask is all 0.
OK_DEFECTS = ("good", "ok")
_MASK_DTYPES = ("|u1", "<u2")


@dataclass(frozen=True)
class LabelOutputs:
    """The label arrays of one sample, in stored-image pixels.

    Attributes
    ----------
    arrays : dict of str to numpy.ndarray
        By stored array name: ``boxes`` float32 [k, 4], ``box_labels`` int32 [k], ``box_crowd`` uint8 [k]
        (only when the annotations give ``iscrowd``), ``mask`` [H, W] of the stored image's size.
    clipped : int
        Boxes kept but cut to the image (they stuck out of it).
    dropped : int
        Boxes left with no area in the stored image: dropped with their labels.
    """

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    clipped: int = 0
    dropped: int = 0


def _size(w: int, h: int) -> str:
    return f"{w}x{h}"


class _Frames:
    """The two frames a label can be drawn in: the upright image and the raw pixel array of its file."""

    def __init__(self, prepared: PreparedImage) -> None:
        self.up_h, self.up_w = prepared.original_size
        self.orientation = prepared.orientation
        swapped = self.orientation >= 5
        self.file_w, self.file_h = (self.up_h, self.up_w) if swapped else (self.up_w, self.up_h)

    def size(self, frame: str) -> tuple[int, int]:
        """``(width, height)`` of ``frame``."""
        return (self.file_w, self.file_h) if frame == "file" else (self.up_w, self.up_h)

    def describe(self) -> str:
        upright = _size(self.up_w, self.up_h)
        if (self.file_w, self.file_h) == (self.up_w, self.up_h):
            return upright
        return f"{upright} ({_size(self.file_w, self.file_h)} in the file, before its EXIF orientation)"

    def frame_of(self, w: int, h: int, frame: str) -> str | None:
        """The frame a ``w x h`` label image is in, or None when it fits neither.

        Declared "file": it must have the raw size. Otherwise the upright size wins; a label image of
        the raw size only (orientations 5..8 swap the sides) is in the file's frame.
        """
        if frame == "file":
            return "file" if (w, h) == (self.file_w, self.file_h) else None
        if (w, h) == (self.up_w, self.up_h):
            return "upright"
        if (w, h) == (self.file_w, self.file_h):
            return "file"
        return None


#: Where a sample's label files are: the source's files, a local folder or a bucket URL.
Root = str | os.PathLike[str] | SourceFiles


def label_files(root: Root, label_root: str | os.PathLike[str] | None) -> SourceFiles:
    """The files label paths are relative to: ``label_root`` when given (a folder, or a URL read with
    the storage options of ``root``'s files), else ``root`` (the source's files or folder)."""
    files = root if isinstance(root, SourceFiles) else LocalFiles(os.fspath(root))
    return files if label_root is None else files_at(label_root, files)


def read_label_file(root: Root, label_root: str | os.PathLike[str] | None, path: str) -> bytes:
    """The bytes of the label file ``path`` names (relative to ``label_root``, else ``root``), read
    as input files are (:class:`~dlpack.sources.base.SourceFiles`); OSError when it cannot be."""
    return label_files(root, label_root).read(path)[0]


def _label_bytes(files: SourceFiles, path: str) -> bytes:
    """A label file's bytes; a local one opened as before (regular files only, never blocking)."""
    if not isinstance(files, LocalFiles):
        return files.read(path)[0]
    fd = open_regular(Path(files.root, path))
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _read_label_image(files: SourceFiles, name: str, what: str, frames: _Frames, frame: str) -> tuple[np.ndarray, str]:
    """A label image as H x W ``uint8``/``uint16`` and the frame it is in; DecodeError names it and why."""
    import cv2

    where = f"{what} '{name}'"
    try:
        data = _label_bytes(files, name)
    except FileNotFoundError:
        raise DecodeError(f"{where} is missing") from None
    except NotRegularFileError as exc:
        raise DecodeError(f"{where} is {exc}") from None
    except OSError as exc:
        raise DecodeError(f"{where} cannot be read: {exc.strerror or exc}") from None
    if not data:
        raise DecodeError(f"{where} is unreadable: empty file (0 bytes)")
    header = probe_header(data[:65536]) or probe_header(data)
    if header is None:
        raise DecodeError(f"{where} is unreadable: {no_header_reason(data)}")
    if header.format == "jpeg":
        raise DecodeError(f"{where} is a JPEG: lossy compression changes label values; save it as PNG")
    if header.format == "png" and len(data) > 25 and data[25] == 3:
        raise DecodeError(
            f"{where} is a palette PNG: OpenCV reads its colours, not its indices; save the indices as 8-bit gray"
        )
    # The label image must have its image's size: a bigger header is refused before decoding it.
    w, h = header.width, header.height
    if frames.frame_of(w, h, frame) is None:
        raise DecodeError(f"{where} is {_size(w, h)}, its image is {frames.describe()}")
    reason = incomplete_reason(data, header.format)
    if reason:
        raise DecodeError(f"{where} is unreadable: {reason}")
    buf = np.frombuffer(data, dtype=np.uint8)

    def decode() -> np.ndarray | None | cv2.error:
        try:
            return cv2.imdecode(buf, cv2.IMREAD_UNCHANGED)
        except cv2.error as exc:
            return exc

    img, messages = library_messages(decode)
    reason = damage_reason(messages)
    if reason or img is None or isinstance(img, cv2.error):
        raise DecodeError(f"{where} is unreadable: {reason or 'not an image or corrupt (OpenCV could not decode it)'}")
    if img.dtype not in (np.uint8, np.uint16):
        raise DecodeError(f"{where} has {img.dtype} pixels: label images are 8- or 16-bit")
    if img.ndim == 3:
        if img.shape[2] >= 3:
            colour = img[:, :, :3]  # a 4th channel is alpha: not a label
            if not ((colour[:, :, 0] == colour[:, :, 1]).all() and (colour[:, :, 0] == colour[:, :, 2]).all()):
                raise DecodeError(
                    f"{where} is a colour image (its channels differ): label images hold one value per pixel; "
                    "save it as 8- or 16-bit gray"
                )
        img = img[:, :, 0]
    got = frames.frame_of(img.shape[1], img.shape[0], frame)
    if got is None:
        raise DecodeError(f"{where} is {_size(img.shape[1], img.shape[0])}, its image is {frames.describe()}")
    return np.ascontiguousarray(img), got


def _ids(values: Sequence[int] | np.ndarray) -> str:
    shown = ", ".join(str(int(v)) for v in values[:10])
    return shown + (f" and {len(values) - 10} more" if len(values) > 10 else "")


def _to_dtype(mask: np.ndarray, dtype: np.dtype[Any], where: str) -> np.ndarray:
    """Class ids into the store's mask dtype, unchanged in value (never scaled as intensities are)."""
    if mask.dtype == dtype:
        return mask
    top = int(mask.max()) if mask.size else 0
    if top > np.iinfo(dtype).max:
        raise DecodeError(f"{where} holds ids up to {top}, over the {dtype.itemsize * 8}-bit masks of the store")
    return mask.astype(dtype)


def _segmentation_mask(
    ann: Mapping[str, Any],
    keep: np.ndarray,
    labels: np.ndarray,
    size: tuple[int, int],
    dtype: np.dtype[Any],
    ignore: int,
    class_ids: Sequence[int],
    instance_masks: bool,
) -> np.ndarray:
    """COCO segmentations painted in annotation order (later ones over earlier ones), in their frame."""
    w, h = size
    segs = ann.get("segmentation")
    if not isinstance(segs, list) or len(segs) != len(keep):
        raise DecodeError(f"annotations give {len(keep)} boxes but segmentation is not a list of {len(keep)}")
    out = np.zeros((h, w), dtype=dtype)
    top = np.iinfo(dtype).max
    kept = 0
    for k, seg in enumerate(segs):
        if not keep[k]:
            continue
        kept += 1
        label = int(labels[k])
        if seg is None:
            continue
        try:
            if isinstance(seg, list):
                region = polygons_to_mask(seg, h, w).astype(bool)
            elif isinstance(seg, Mapping):
                region = rle_to_mask(seg, h, w).astype(bool)
            else:
                raise ValueError("a segmentation is a list of polygons or an RLE mapping")
        except (TypeError, ValueError) as exc:
            raise DecodeError(f"segmentation of box {k}: {exc}") from None
        value = kept if instance_masks else (int(class_ids[label]) if class_ids else label)
        # 0 is background and ``ignore`` padding: a class painted with either would vanish from the mask.
        if value <= 0 or value > top or value == ignore:
            what = f"{kept} instances do" if instance_masks else f"class id {value} does"
            raise DecodeError(
                f"{what} not fit the {dtype.itemsize * 8}-bit masks of the store (0 is background, {ignore} padding)"
            )
        out[region] = value
    return out


def prepare_labels(
    root: Root,
    label_root: str | os.PathLike[str] | None,
    annotations: Mapping[str, Any] | None,
    prepared: PreparedImage,
    task: str,
    mask_dtype: str | None = None,
    ignore: int | None = None,
    class_ids: Sequence[int] = (),
    *,
    instance_masks: bool = False,
) -> LabelOutputs:
    """The stored label arrays of one sample (the annotation contract of docs/format.md).

    Parameters
    ----------
    root, label_root
        Label image paths are relative to ``label_root`` when given, else to the source's ``root``
        (absolute paths as they are). ``root`` is the source's folder or its
        :class:`~dlpack.sources.base.SourceFiles` (a bucket's: a ``label_root`` URL is then read
        with its storage options).
    annotations : Mapping or None
        The item's ``SourceItem.annotations``.
    prepared : PreparedImage
        The sample's image as stored: its geometry and the EXIF orientation the decode applied.
    task : str
        One of :data:`TASKS`. ``detection`` always gives ``boxes`` and ``box_labels`` (maybe empty).
    mask_dtype : str or None
        ``"|u1"`` or ``"<u2"`` when the store has a ``mask`` array, None when it has none.
    ignore : int or None
        The value of padding pixels in masks (default: the dtype's largest, 255 or 65535).
    class_ids : sequence of int
        The original id of each class; when given, a label image may hold only these (and ``ignore``).
    instance_masks : bool
        COCO segmentations as instance ids (k = the k-th stored box, 1-based) instead of class ids.

    Raises
    ------
    DecodeError
        The labels cannot be used; the reason names the label file (missing, unreadable, another size
        than its image, unknown class ids) or the annotation at fault.
    """
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}")
    ann: Mapping[str, Any] = annotations or {}
    frames = _Frames(prepared)
    g = prepared.geometry
    frame = ann.get("frame", "upright")
    if frame not in ("upright", "file"):
        raise DecodeError(f"annotation frame must be 'upright' or 'file'; got {frame!r}")
    size = frames.size(frame)
    seen = ann.get("image_size")
    if seen is not None:
        try:
            seen_w, seen_h = (int(v) for v in seen)
        except (TypeError, ValueError):
            raise DecodeError(f"image_size must be [width, height]; got {seen!r}") from None
        if (seen_w, seen_h) != size:
            raise DecodeError(
                f"the annotations were made on a {_size(seen_w, seen_h)} image, but the image is {frames.describe()}"
            )
    arrays: dict[str, np.ndarray] = {}
    clipped = dropped = 0
    keep = np.zeros(0, dtype=bool)
    labels: np.ndarray = np.zeros(0, dtype=np.int64)
    if task == "detection" or "boxes" in ann:
        raw_boxes = ann.get("boxes") or []
        try:
            labels = np.asarray(ann.get("box_labels") or [], dtype=np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise DecodeError("box_labels must be a list of class indices") from None
        if len(labels) != len(raw_boxes):
            raise DecodeError(f"annotations give {len(raw_boxes)} boxes but {len(labels)} box labels")
        bad = labels[(labels < 0) | (labels >= len(class_ids))] if class_ids else labels[labels < 0]
        if bad.size:
            raise DecodeError(f"box labels must be class indices; got {_ids(np.unique(bad))}")
        try:
            boxes = np.asarray(raw_boxes, dtype=np.float64) if len(raw_boxes) else np.zeros((0, 4))
            if frame == "file":
                boxes = orient_boxes(boxes, frames.orientation, frames.file_w, frames.file_h)
            result = resize_boxes(boxes, g)
        except (TypeError, ValueError) as exc:
            raise DecodeError(f"annotation boxes: {exc}") from None
        keep = result.keep
        arrays["boxes"] = result.boxes
        arrays["box_labels"] = labels[keep].astype(np.int32)
        if "iscrowd" in ann:
            crowd = np.asarray(ann["iscrowd"] or [], dtype=np.int64).reshape(-1)
            if len(crowd) != len(labels) or not np.isin(crowd, (0, 1)).all():
                raise DecodeError(f"iscrowd must be one 0 or 1 per box ({len(labels)} boxes)")
            arrays["box_crowd"] = crowd[keep].astype(np.uint8)
        clipped = int((result.clipped & keep).sum())
        dropped = int((~keep).sum())
    if mask_dtype is not None:
        arrays["mask"] = _mask(
            root, label_root, ann, frames, prepared, task, mask_dtype, ignore, class_ids, instance_masks, keep, labels
        )
    return LabelOutputs(arrays, clipped, dropped)


def _mask(
    root: Root,
    label_root: str | os.PathLike[str] | None,
    ann: Mapping[str, Any],
    frames: _Frames,
    prepared: PreparedImage,
    task: str,
    mask_dtype: str,
    ignore: int | None,
    class_ids: Sequence[int],
    instance_masks: bool,
    keep: np.ndarray,
    labels: np.ndarray,
) -> np.ndarray:
    """The sample's ``mask``: read or painted in its frame, then oriented, resized and padded with ``ignore``."""
    try:
        dtype = np.dtype(mask_dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.str not in _MASK_DTYPES:
        raise ValueError(f"mask_dtype must be one of {', '.join(_MASK_DTYPES)}; got {mask_dtype!r}")
    ign = int(np.iinfo(dtype).max if ignore is None else ignore)
    frame = ann.get("frame", "upright")
    if task == "anomaly":
        path = ann.get("anomaly_mask")
        if path:
            gt, frame = _read_label_image(label_files(root, label_root), path, "ground-truth image", frames, frame)
            mask = (gt != 0).astype(dtype)
        else:
            defect = ann.get("defect")
            if defect is not None and str(defect).lower() not in OK_DEFECTS:
                raise DecodeError(f"no ground-truth image for this '{defect}' sample (only ok samples may have none)")
            w, h = frames.size(frame)
            mask = np.zeros((h, w), dtype=dtype)
    elif ann.get("mask"):
        path = ann["mask"]
        where = f"mask '{path}'"
        raw, frame = _read_label_image(label_files(root, label_root), path, "mask", frames, frame)
        if class_ids:
            values = np.unique(raw)
            bad = np.setdiff1d(values, np.asarray([*class_ids, ign], dtype=np.int64))
            if bad.size:
                raise DecodeError(
                    f"{where} holds class ids not in the class list: {_ids(bad)} (known: {_ids(sorted(class_ids))})"
                )
        mask = _to_dtype(raw, dtype, where)
    elif task == "segmentation":
        raise DecodeError("no mask given for this sample")
    elif "segmentation" in ann:
        mask = _segmentation_mask(ann, keep, labels, frames.size(frame), dtype, ign, class_ids, instance_masks)
    else:
        w, h = frames.size(frame)
        mask = np.zeros((h, w), dtype=dtype)
    return resize_mask(mask, prepared.geometry, ign, frames.orientation if frame == "file" else 1)
