"""COCO source: images named by a COCO annotation file, with boxes, crowd flags and segmentations.

The rules (also in docs/labels.md, "COCO"):

- Items are the file's ``images`` in the order the file lists them; ``file_name`` is relative to
  ``images_root``. An image without annotations is kept, with no boxes.
- Classes are the ``categories`` sorted by id: ``classes`` holds the names, ``class_ids`` the ids
  (any ints); a box's label is its index into ``classes``.
- Boxes: COCO ``[x, y, w, h]`` becomes corner form ``[x, y, x + w, y + h]``. A box that sticks out of
  the image (``width`` x ``height`` of the image entry) is clipped to it and counted in a note; a box
  of zero or negative size, or entirely outside the image, refuses its image.
- Segmentations (polygons or RLE) are passed through, one per box (null where a box has none), when
  any annotation has one: the build then writes a mask. A class mask holds pixel = category id, so a
  category with segmentations must have an id from 1 to 65534 (0 is background, 65535 padding):
  any other is a whole-source error naming the category (or pass ``instance_masks``).
- Frame: boxes are in the upright frame (EXIF orientation applied) unless the entry's
  ``width``/``height`` match only the raw file's size (a rotated JPEG labelled as stored): then
  ``"file"``. A size that matches neither refuses the image: its boxes would land in the wrong place.

Whole-source errors (:class:`~dlpack.errors.SourceError`, nothing is packed): a missing or malformed
file (JSON errors name the line and column), a missing ``images``/``annotations``/``categories`` list,
a malformed category, an image entry without ``id`` or ``file_name``, an annotation without ``id`` or
``image_id`` or naming an image id that is not listed, duplicate image, annotation or category ids,
duplicate category names and two image entries naming one file. Per-image errors
(:class:`~dlpack.errors.InputFileError` in :attr:`SourceScan.errors`, skipped with ``on_error="skip"``):
a file name that is absolute or leaves the image folder, a missing image file, a missing or bad
``width``/``height``, a size that matches the file in neither frame, and every annotation problem
(unknown category id, missing or bad ``bbox``, degenerate or outside box, bad ``iscrowd`` or
``segmentation``), each naming the annotation id.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from .._files import open_regular
from .._names import shown
from ..errors import InputFileError, LabelFileError, SourceError, SourceNotFoundError
from ._entries import bucket_files, check_root, file_problem, listing, load_json, place, relative_name
from .base import SourceFiles, SourceItem, SourceScan
from .probe import HEADER_BYTES, probe_header

__all__ = ["CocoSource", "coco_box"]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def coco_box(bbox: object, width: float, height: float) -> tuple[list[float] | None, bool, str | None]:
    """COCO ``[x, y, w, h]`` as a corner box clipped to ``[0, width] x [0, height]``.

    Returns ``(box, clipped, None)``, or ``(None, False, reason)`` for a box that is not four finite
    numbers, has zero or negative size, or lies entirely outside the image.
    """
    if not isinstance(bbox, (list, tuple)) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
        return None, False, f"'bbox' must be [x, y, width, height] (4 finite numbers), got {shown(bbox)}"
    x, y, w, h = (float(v) for v in bbox)
    if w <= 0 or h <= 0:
        return None, False, f"box {shown(list(bbox))} has zero or negative size"
    x0, y0, x1, y1 = x, y, x + w, y + h
    if x1 <= 0 or y1 <= 0 or x0 >= width or y0 >= height:
        return None, False, f"box {shown(list(bbox))} lies entirely outside the {width:g}x{height:g} image"
    clipped = (max(x0, 0.0), max(y0, 0.0), min(x1, float(width)), min(y1, float(height)))
    return list(clipped), clipped != (x0, y0, x1, y1), None


def _segmentation(seg: object) -> tuple[object, str | None]:
    """A COCO segmentation as passed on (None for none), or a reason it is not one."""
    if seg is None or (isinstance(seg, list) and not seg):
        return None, None
    if isinstance(seg, list):
        for poly in seg:
            if not isinstance(poly, list) or len(poly) < 6 or len(poly) % 2 or not all(_is_number(v) for v in poly):
                return None, "'segmentation' polygons must be lists of at least 3 x,y pairs of numbers"
        return seg, None
    if isinstance(seg, dict):
        size = seg.get("size")
        if (
            "counts" in seg
            and isinstance(size, list)
            and len(size) == 2
            and all(_is_int(v) and v > 0 for v in size)
            and isinstance(seg["counts"], (str, list))
        ):
            return seg, None
        return None, '\'segmentation\' RLE must be {"size": [height, width], "counts": ...}'
    return None, f"'segmentation' must be polygons or RLE, got {type(seg).__name__}"


def _frame(files: SourceFiles | None, path: str, width: int, height: int) -> tuple[str, str | None]:
    """The frame the entry's ``width`` x ``height`` describe, from the file's header, or a reason they fit neither.

    ``path`` is a local file's path, or the object's path in the bucket ``files``."""
    try:
        if files is not None:
            head = files.read_head(path, HEADER_BYTES)[0]
        else:
            fd = open_regular(path)
            with os.fdopen(fd, "rb") as f:
                head = f.read(HEADER_BYTES)
    except OSError as exc:
        return "upright", f"cannot read: {exc.strerror or exc}"
    header = probe_header(head)
    if header is None:  # not an image, or an unusual header: the decode stage names the problem
        return "upright", None
    if (width, height) == header.oriented_size:
        return "upright", None
    if (width, height) == (header.width, header.height):
        return "file", None
    raw = f"{header.width}x{header.height}"
    up = "x".join(map(str, header.oriented_size))
    sizes = raw if raw == up else f"{raw} as stored, {up} upright"
    return "upright", (
        f"the COCO entry says {width}x{height} but the file is {sizes}: its boxes were drawn on another "
        "size of this image"
    )


@dataclass(frozen=True, init=False)
class CocoSource:
    """The images of a COCO annotation file, with their boxes (see the module docstring for the rules).

    ``instance_masks`` asks for instance masks (0 background, k = the k-th box) instead of category
    masks; it needs segmentations in the file and is recorded in each item's annotations. The image
    folder and the file may be ``s3://`` URLs, read with ``storage_options``.
    """

    root: Path
    annotation_file: Path
    instance_masks: bool
    storage_options: object = None

    def __init__(
        self,
        images_root: str | os.PathLike[str],
        annotation_file: str | os.PathLike[str],
        instance_masks: bool = False,
        storage_options: object = None,
    ) -> None:
        object.__setattr__(self, "root", place(images_root))
        object.__setattr__(self, "annotation_file", place(annotation_file))
        object.__setattr__(self, "instance_masks", bool(instance_masks))
        object.__setattr__(self, "storage_options", storage_options)

    @property
    def files(self) -> SourceFiles | None:
        """The bucket's files when the image folder is a URL (None: the local folder ``root``)."""
        return bucket_files(self.root, self.storage_options)

    def scan(self) -> SourceScan:
        """List the images of the annotation file with their boxes.

        Raises
        ------
        SourceError
            The image folder or the annotation file is unusable as a whole (see the module docstring).
        """
        root = self.root
        bucket = self.files
        if bucket is None and not root.is_dir():
            if not root.exists():
                raise SourceNotFoundError(f"COCO image folder {shown(os.fspath(root))!r} does not exist")
            raise SourceError(f"COCO image folder {shown(os.fspath(root))!r} is not a folder")
        where = shown(str(self.annotation_file))
        doc = load_json(self.annotation_file, "COCO annotation file", self.storage_options)
        if not isinstance(doc, dict):
            raise LabelFileError(f"COCO file {where!r} must hold a JSON object with images, annotations and categories")
        for key in ("images", "annotations", "categories"):
            if key not in doc:
                raise LabelFileError(f"COCO file {where!r} has no {key!r} list (a required key)")
            if not isinstance(doc[key], list):
                raise LabelFileError(f"COCO file {where!r}: {key!r} must be a list, got {type(doc[key]).__name__}")
        classes, class_ids = _categories(doc["categories"], where)
        index = {cid: k for k, cid in enumerate(class_ids)}
        images = _images(doc["images"], where)
        by_image = _annotations(doc["annotations"], {i for i, _ in images}, where)
        wants_masks = any(
            isinstance(a.get("segmentation"), (dict, list)) and a.get("segmentation")
            for anns in by_image.values()
            for a in anns
        )
        if self.instance_masks and not wants_masks:
            raise LabelFileError(
                f"instance masks need segmentations, but no annotation in COCO file {where!r} has one; "
                "drop --instance-masks to pack the boxes only"
            )
        if wants_masks and not self.instance_masks:
            _check_mask_ids(by_image, dict(zip(class_ids, classes, strict=True)), where)
        items: list[SourceItem] = []
        errors: list[InputFileError] = []
        clipped: list[str] = []
        missing: list[str] = []
        for image_id, entry in images:
            rel, reason = relative_name(entry["file_name"])
            if rel is None:
                errors.append(InputFileError(shown(entry["file_name"]), f"image id {image_id}: {reason}"))
                continue
            problem = file_problem(root if bucket is None else bucket, rel)
            if problem is not None:
                if bucket is None and not os.path.lexists(os.path.join(os.fspath(root), rel)):
                    missing.append(rel)
                errors.append(InputFileError(rel, f"image id {image_id}: {problem}"))
                continue
            w_given, h_given = entry.get("width"), entry.get("height")
            if not (_is_int(w_given) and _is_int(h_given) and w_given > 0 and h_given > 0):
                got = f"width={shown(w_given)}, height={shown(h_given)}"
                errors.append(
                    InputFileError(
                        rel, f"image id {image_id}: 'width' and 'height' must be positive integers, got {got}"
                    )
                )
                continue
            width, height = w_given, h_given
            frame, reason = _frame(
                bucket, rel if bucket is not None else os.path.join(os.fspath(root), rel), width, height
            )
            if reason is not None:
                errors.append(InputFileError(rel, f"image id {image_id}: {reason}"))
                continue
            problems: list[str] = []
            boxes: list[list[float]] = []
            labels: list[int] = []
            crowd: list[int] = []
            segs: list[object] = []
            for ann in by_image.get(image_id, []):
                aid = ann["id"]
                cat = ann.get("category_id")
                if not _is_int(cat) or cat not in index:
                    known = ", ".join(map(str, class_ids[:10])) + (", ..." if len(class_ids) > 10 else "")
                    problems.append(f"annotation id {aid}: unknown category id {shown(cat)} (categories: {known})")
                    continue
                if "bbox" not in ann:
                    problems.append(f"annotation id {aid} has no 'bbox' (a required key)")
                    continue
                box, was_clipped, why = coco_box(ann["bbox"], width, height)
                if box is None:
                    problems.append(f"annotation id {aid}: {why}")
                    continue
                iscrowd = ann.get("iscrowd", 0)
                if iscrowd not in (0, 1) or isinstance(iscrowd, bool):
                    problems.append(f"annotation id {aid}: 'iscrowd' must be 0 or 1, got {shown(iscrowd)}")
                    continue
                seg, why = _segmentation(ann.get("segmentation"))
                if why is not None:
                    problems.append(f"annotation id {aid}: {why}")
                    continue
                if was_clipped:
                    clipped.append(f"annotation id {aid} ({rel})")
                boxes.append(box)
                labels.append(index[cat])
                crowd.append(int(iscrowd))
                segs.append(seg)
            if problems:
                errors.append(InputFileError(rel, f"image id {image_id}: " + "; ".join(problems)))
                continue
            ann_out: dict[str, Any] = {
                "frame": frame,
                "boxes": boxes,
                "box_labels": labels,
                "iscrowd": crowd,
                "image_size": [width, height],
            }
            if wants_masks:
                ann_out["segmentation"] = segs
                if self.instance_masks:
                    ann_out["instance_masks"] = True
            items.append(SourceItem(rel, None, ann_out))
        if not items and not errors:
            raise LabelFileError(f"COCO file {where!r} lists no images")
        check_root(root, missing, len(images), f"COCO file {where!r}")
        notes: tuple[str, ...] = ()
        if clipped:
            notes = (
                f"clipped {len(clipped)} box(es) that stuck out of their image to the image's edges: "
                f"{listing(clipped)}",
            )
        return SourceScan(
            tuple(items),
            classes,
            tuple(errors),
            "coco",
            class_ids=class_ids,
            task="detection",
            notes=notes,
        )


#: The category ids a class mask can hold: 0 is its background and 65535 the pad value of 16-bit masks.
MASK_IDS = (1, 65534)


def _check_mask_ids(by_image: Mapping[int, list[Mapping[str, Any]]], names: Mapping[int, str], where: str) -> None:
    """Refuse a category whose segmentations a class mask cannot hold (pixel = category id).

    Id 0 would paint the class as background, and the pad value (or an id out of 16 bits) would turn
    its pixels into padding or not fit: the class would vanish from every mask. Renumbering silently
    instead would make the mask disagree with the ids the store keeps, so the user decides.
    """
    lo, hi = MASK_IDS
    bad: dict[int, list[int]] = {}
    for anns in by_image.values():
        for a in anns:
            cat = a.get("category_id")
            if _is_int(cat) and cat in names and not lo <= cat <= hi and a.get("segmentation"):
                bad.setdefault(cat, []).append(a["id"])
    if not bad:
        return
    parts = []
    for cid, aids in sorted(bad.items()):
        if cid == 0:
            why = "0 is the background of a mask"
        elif cid == hi + 1:
            why = f"{cid} is the pad value of a 16-bit mask"
        else:
            why = "a mask pixel cannot hold it"
        shown_ids = ", ".join(map(str, aids[:5])) + (f" and {len(aids) - 5} more" if len(aids) > 5 else "")
        parts.append(f"category {shown(names[cid])!r} has id {cid} ({why}; annotation id(s) {shown_ids})")
    raise LabelFileError(
        f"COCO file {where!r}: the segmentations are painted into class masks (pixel = category id), which hold "
        f"ids {lo} to {hi}, but " + "; ".join(parts) + f": give the category an id from {lo} to {hi}, or pass "
        "--instance-masks (instance_masks=True) to store instance masks"
    )


def _categories(cats: list[Any], where: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Names and ids of the categories, sorted by id; any malformed or repeated one is a SourceError."""
    by_id: dict[int, str] = {}
    names: dict[str, int] = {}
    for n, cat in enumerate(cats):
        if not isinstance(cat, Mapping) or not _is_int(cat.get("id")):
            raise LabelFileError(f"COCO file {where!r}: categories[{n}] has no integer 'id'")
        cid, name = cat["id"], cat.get("name")
        if not isinstance(name, str) or not name.strip():
            raise LabelFileError(f"COCO file {where!r}: category id {cid} has no 'name' (a non-empty string)")
        if cid in by_id:
            raise LabelFileError(f"COCO file {where!r}: category id {cid} is listed twice ({by_id[cid]!r}, {name!r})")
        if name in names:
            raise LabelFileError(
                f"COCO file {where!r}: categories {names[name]} and {cid} have the same name {shown(name)!r}; "
                "class names must be unique"
            )
        by_id[cid] = name
        names[name] = cid
    ids = tuple(sorted(by_id))
    return tuple(by_id[i] for i in ids), ids


def _images(images: list[Any], where: str) -> list[tuple[int, Mapping[str, Any]]]:
    """``(id, entry)`` of each image entry, in file order; a missing key or a repeated id or name is a SourceError."""
    out: list[tuple[int, Mapping[str, Any]]] = []
    seen: dict[int, int] = {}
    files: dict[str, int] = {}
    for n, entry in enumerate(images):
        if not isinstance(entry, Mapping) or not _is_int(entry.get("id")):
            raise LabelFileError(f"COCO file {where!r}: images[{n}] has no integer 'id' (a required key)")
        image_id = entry["id"]
        if "file_name" not in entry:
            raise LabelFileError(f"COCO file {where!r}: image id {image_id} has no 'file_name' (a required key)")
        if image_id in seen:
            raise LabelFileError(
                f"COCO file {where!r}: image id {image_id} is listed twice (images[{seen[image_id]}] and images[{n}])"
            )
        seen[image_id] = n
        rel, _ = relative_name(entry["file_name"])
        if rel is not None:
            if rel in files:
                raise LabelFileError(
                    f"COCO file {where!r}: image ids {files[rel]} and {image_id} both name the file {shown(rel)!r}"
                )
            files[rel] = image_id
        out.append((image_id, entry))
    return out


def _annotations(anns: list[Any], image_ids: set[int], where: str) -> dict[int, list[Mapping[str, Any]]]:
    """The annotations by image id, in file order; a missing id, a repeated id or an unknown image is a SourceError."""
    by_image: dict[int, list[Mapping[str, Any]]] = {}
    seen: set[int] = set()
    for n, ann in enumerate(anns):
        if not isinstance(ann, Mapping) or not _is_int(ann.get("id")):
            raise LabelFileError(f"COCO file {where!r}: annotations[{n}] has no integer 'id' (a required key)")
        aid = ann["id"]
        if aid in seen:
            raise LabelFileError(f"COCO file {where!r}: annotation id {aid} is listed twice")
        seen.add(aid)
        image_id = ann.get("image_id")
        if not _is_int(image_id):
            raise LabelFileError(f"COCO file {where!r}: annotation id {aid} has no integer 'image_id' (a required key)")
        if image_id not in image_ids:
            raise LabelFileError(
                f"COCO file {where!r}: annotation id {aid} names image id {image_id}, which 'images' does not list"
            )
        by_image.setdefault(image_id, []).append(ann)
    return by_image
