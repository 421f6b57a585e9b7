"""Export a store as COCO: ``annotations.json`` (boxes, categories, RLE masks) and PNG images.

Masks are run-length encoded with pycocotools (the ``coco`` extra), which is imported only when
a store has masks, so a detection export without masks needs nothing extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MissingExtraError, StoreError
from ._common import Notes, Sample, StoreView, checked_source, png_names, samples, write_json, write_png
from ._geometry import as_float, corners_to_coco

IMAGE_DIR = "images"
ANNOTATIONS = "annotations.json"


def _mask_api() -> Any:
    try:
        from pycocotools import mask
    except ImportError:
        raise MissingExtraError("pycocotools", "coco", "exporting masks to COCO") from None
    return mask


def rle(mask_api: Any, binary: np.ndarray) -> dict[str, Any]:
    """A binary H x W mask as COCO's compressed RLE (``counts`` a str, as JSON holds it)."""
    enc = mask_api.encode(np.asfortranarray(binary.astype(np.uint8)))
    return {"size": [int(v) for v in enc["size"]], "counts": enc["counts"].decode("ascii")}


def _bbox_of(binary: np.ndarray) -> list[float]:
    """The corner-frame box ``[x, y, w, h]`` around a mask's pixels (pixel c spans [c, c + 1])."""
    ys, xs = np.nonzero(binary)
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1 - xs.min()), float(ys.max() + 1 - ys.min())]


def export_coco(ds: Any, view: StoreView, stage: Path, notes: Notes) -> dict[str, Any]:
    """Write ``annotations.json`` (every sample) and, in a store with splits, ``annotations_<split>.json``
    for each split, plus the images under ``images/``; returns counts."""
    from ..halcon.export import box_rows

    items = list(samples(ds))
    names = png_names(view, [(s.index, checked_source(view, s)) for s in items])
    masks = "mask" in view.arrays
    api = _mask_api() if masks else None
    if view.task == "anomaly":
        categories = [{"id": 1, "name": "defect", "supercategory": ""}]
    else:
        categories = [
            {"id": cid, "name": name, "supercategory": ""}
            for cid, name in zip(view.class_ids, view.classes, strict=True)
        ]
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    by_split: dict[str, list[int]] = {}
    for s in items:
        h, w = s.image.shape[:2]
        image_id = s.index + 1  # COCO ids start at 1 by custom
        images.append({"id": image_id, "file_name": names[s.index], "width": int(w), "height": int(h)})
        if s.split is not None:
            by_split.setdefault(s.split, []).append(image_id)
        for ann in _annotations(view, s, box_rows, api):
            ann.update(id=len(annotations) + 1, image_id=image_id)
            annotations.append(ann)
        write_png(stage / IMAGE_DIR / names[s.index], s.image)
    if view.task == "classification":
        notes.add("COCO has no image labels: the classification labels are not in annotations.json")
    doc = {"images": images, "annotations": annotations, "categories": categories}
    write_json(stage / ANNOTATIONS, doc)
    for split, ids in sorted(by_split.items()):
        keep = set(ids)
        write_json(
            stage / f"annotations_{split}.json",
            {
                "images": [im for im in images if im["id"] in keep],
                "annotations": [a for a in annotations if a["image_id"] in keep],
                "categories": categories,
            },
        )
    return {"samples": len(images), "annotations": len(annotations)}


def _annotations(view: StoreView, s: Sample, box_rows: Any, api: Any) -> list[dict[str, Any]]:
    """The COCO annotations of one sample (without ``id`` and ``image_id``)."""
    out: list[dict[str, Any]] = []
    if view.task == "detection" or (s.boxes is not None and len(s.boxes)):
        boxes, labels = box_rows(view, s)
        crowd = np.zeros(len(boxes), np.uint8) if s.box_crowd is None else s.box_crowd.reshape(-1)
        if len(crowd) != len(boxes):
            raise StoreError(
                f"store {view.path}: sample {s.index} has {len(boxes)} boxes and {len(crowd)} iscrowd flags"
            )
        for k, (bbox, box, label) in enumerate(zip(_coco_boxes(boxes), boxes, labels, strict=True)):
            ann: dict[str, Any] = {
                "category_id": view.class_id(int(label)),
                "bbox": bbox,
                "area": bbox[2] * bbox[3],
                "iscrowd": int(crowd[k]),
                "segmentation": [],
            }
            if api is not None and s.mask is not None:
                binary = _box_mask(view, s.mask, k, box, view.class_id(int(label)))
                ann["segmentation"] = rle(api, binary)
                ann["area"] = float(binary.sum())
            out.append(ann)
        return out
    if s.mask is None or api is None:
        return out
    if view.task == "anomaly":
        binary = s.mask == 1
        if binary.any():
            out.append(_region(api, binary, 1))
        return out
    ids = [int(v) for v in np.unique(s.mask) if view.mask_ignore is None or int(v) != view.mask_ignore]
    for cid in ids:  # semantic segmentation: one annotation per class present
        out.append(_region(api, s.mask == cid, cid))
    return out


def _coco_boxes(boxes: np.ndarray) -> list[list[float]]:
    return corners_to_coco(boxes)


def _region(api: Any, binary: np.ndarray, category_id: int) -> dict[str, Any]:
    return {
        "category_id": category_id,
        "bbox": _bbox_of(binary),
        "area": float(binary.sum()),
        "iscrowd": 0,
        "segmentation": rle(api, binary),
    }


def _box_mask(view: StoreView, mask: np.ndarray, k: int, box: np.ndarray, class_id: int) -> np.ndarray:
    """The pixels of box ``k``: instance masks hold ``k + 1``; a semantic mask holds the class id,
    of which the pixels whose centres lie inside the box are taken."""
    if view.instance_masks:
        return np.asarray(mask == k + 1, dtype=bool)
    x0, y0, x1, y1 = (as_float(v) for v in box)
    h, w = mask.shape
    cols = (np.arange(w) + 0.5 >= x0) & (np.arange(w) + 0.5 <= x1)
    rows = (np.arange(h) + 0.5 >= y0) & (np.arange(h) + 0.5 <= y1)
    return np.asarray((mask == class_id) & rows[:, None] & cols[None, :], dtype=bool)
