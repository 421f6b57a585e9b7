"""Export a store as a HALCON DLDataset: ``dataset.json`` with HALCON's keys, PNG images and label
images, the ``to_hdict.py`` converter, and ``dataset.hdict`` where HALCON's binding imports."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from .._names import shown
from ..errors import StoreError
from ..exports._common import (
    Notes,
    Sample,
    StoreView,
    checked_source,
    halcon_split,
    png_names,
    samples,
    unique_png_names,
    variant_samples,
    write_json,
    write_png,
)
from ..exports._geometry import corners_to_halcon, degenerate_boxes
from .hdict import halcon_values, script_text, to_halcon

IMAGE_DIR, SEGMENTATION_DIR, ANOMALY_DIR = "images", "segmentation", "anomaly"


def box_rows(view: StoreView, s: Sample) -> tuple[np.ndarray, np.ndarray]:
    """A sample's ``(K x 4 boxes, K class indices)``, checked: one label per box, labels within
    the classes, no degenerate box."""
    boxes = np.zeros((0, 4), np.float32) if s.boxes is None else s.boxes
    labels = np.zeros((0,), np.int32) if s.box_labels is None else s.box_labels.reshape(-1)
    where = f"store {view.path}: sample {s.index} ({shown(s.source)})"
    if s.box_labels is None and len(boxes):
        raise StoreError(f"{where} has boxes but the store has no box_labels array")
    if len(labels) != len(boxes):
        raise StoreError(f"{where} has {len(boxes)} boxes and {len(labels)} box labels")
    bad = [int(v) for v in labels if not 0 <= int(v) < len(view.classes)]
    if bad:
        raise StoreError(
            f"{where}: box label {bad[0]} is not a class index (the store has {len(view.classes)} classes)"
        )
    flat = degenerate_boxes(boxes)
    if flat:
        k = flat[0]
        raise StoreError(f"{where}: box {k} {boxes[k].tolist()} has no area (x_min >= x_max or y_min >= y_max)")
    return boxes, labels


def anomaly_label(view: StoreView, s: Sample) -> str | None:
    """``'ok'``/``'nok'`` from the label (classes ok, nok) or the defect folder (``good``/``ok`` = ok)."""
    if set(view.classes) == {"ok", "nok"} and s.label >= 0:
        return view.classes[s.label]
    if s.defect is not None and 0 <= s.defect < len(view.defects):
        return "ok" if view.defects[s.defect].lower() in ("good", "ok") else "nok"
    return None


def defect_pixels(view: StoreView, mask: np.ndarray) -> np.ndarray:
    """An anomaly mask (0 ok, 1 defect, ``mask_ignore`` padding) as a ground-truth image: 255 where
    defective, 0 elsewhere (padding included)."""
    return np.where(mask == 1, 255, 0).astype(np.uint8)


#: Where variants' images go inside ``images/``: ``dlpack_variants/v{v}/<the original's name>``
#: (with a suffix where a sample's own source path took that name).
VARIANT_DIR = "dlpack_variants"


def export_dldataset(
    ds: Any, view: StoreView, stage: Path, final: Path, notes: Notes, include_variants: bool = False
) -> dict[str, Any]:
    """Write the DLDataset into ``stage`` (renamed to ``final`` when done); returns its counts.

    With ``include_variants``, the augmentation variants of every training sample (split ``train``,
    or no split) are extra samples: ``image_id`` ``v * N + i`` for variant ``v`` of sample ``i`` of
    ``N``, their own image (and boxes or label image), the original's split and label, and
    ``dlpack_variant_of`` (the original's ``image_id``) and ``dlpack_variant`` (``v``) pointing back.
    """
    task = view.task
    items = list(samples(ds))
    names = png_names(view, [(s.index, checked_source(view, s)) for s in items])
    doc: dict[str, Any] = {"image_dir": IMAGE_DIR}
    if task == "anomaly":
        doc["class_names"], doc["class_ids"] = ["ok", "nok"], [0, 1]
    else:
        doc["class_names"], doc["class_ids"] = list(view.classes), list(view.class_ids)
    if task == "segmentation":
        doc["segmentation_dir"] = SEGMENTATION_DIR
    out_samples: list[dict[str, Any]] = []
    left_out: list[str] = []
    counts = {"no_split": 0, "anomaly_files": 0}

    def add(s: Sample, name: str, entry: dict[str, Any]) -> None:
        split = halcon_split(view, s)
        if split is not None:
            entry["split"] = split
        elif view.splits and not s.variant:
            counts["no_split"] += 1
        if task == "classification":
            if s.label < 0:
                if not s.variant:  # a variant of a sample left out is left out with it, uncounted
                    left_out.append(s.source)
                return
            entry["image_label_id"] = view.class_id(s.label)
        elif task == "detection":
            boxes, labels = box_rows(view, s)
            entry["bbox_label_id"] = [view.class_id(int(k)) for k in labels]
            row1, col1, row2, col2 = corners_to_halcon(boxes)
            entry.update(bbox_row1=list(row1), bbox_col1=list(col1), bbox_row2=list(row2), bbox_col2=list(col2))
        elif task == "segmentation":
            if s.mask is None:
                raise StoreError(f"store {view.path} is a segmentation store without a mask array")
            write_png(stage / SEGMENTATION_DIR / name, s.mask)
            entry["segmentation_file_name"] = name
        elif task == "anomaly":
            label = anomaly_label(view, s)
            if label is None:
                if not s.variant:
                    left_out.append(s.source)
                return
            entry["anomaly_label"] = label
            if label == "nok" and s.mask is not None and (s.mask == 1).any():
                write_png(stage / ANOMALY_DIR / name, defect_pixels(view, s.mask))
                entry["anomaly_file_name"] = name
                counts["anomaly_files"] += 1
        write_png(stage / IMAGE_DIR / name, s.image)
        out_samples.append(entry)

    for s in items:
        add(s, names[s.index], {"image_id": s.index, "image_file_name": names[s.index]})
    variants = 0
    if include_variants:
        n = len(items)
        trained = [s.index for s in items if s.split in (None, "train")]
        variant_names: dict[tuple[int, int], str] = {}
        for v in range(1, ds.variants + 1):  # the original's name under v{v}/, unless a sample took it
            named = unique_png_names(
                {i: (f"{VARIANT_DIR}/v{v}", names[i]) for i in trained},
                taken=[*names.values(), *variant_names.values()],
            )
            variant_names.update(((i, v), name) for i, name in named.items())
        for s in variant_samples(ds, lambda o: o.split in (None, "train")):
            name = variant_names[(s.index, s.variant)]
            entry = {
                "image_id": s.variant * n + s.index,
                "image_file_name": name,
                "dlpack_variant_of": s.index,
                "dlpack_variant": s.variant,
            }
            before = len(out_samples)
            add(s, name, entry)
            variants += len(out_samples) - before
        notes.add(
            f"{variants} augmentation variant(s) of the training samples are extra samples "
            "(dlpack_variant_of names each one's original image_id)"
        )
        if not view.splits:
            notes.add(
                "the store has no splits, so every sample's variants are included; HALCON's split_dl_dataset "
                "would put variants and their originals in different splits: build with --split to keep them together"
            )
    if counts["anomaly_files"]:
        doc["anomaly_dir"] = ANOMALY_DIR
    doc["samples"] = out_samples
    if left_out:
        notes.add(
            f"left out {len(left_out)} unlabelled sample(s), which a {task} DLDataset cannot hold: "
            + ", ".join(shown(p) for p in left_out[:5])
            + (" ..." if len(left_out) > 5 else "")
        )
    if task == "detection" and "mask" in view.arrays:
        notes.add(
            "the masks are not in dataset.json (a DLDataset holds instance masks as regions, which JSON cannot); "
            "export to coco to keep them"
        )
    if counts["no_split"]:
        notes.add(f"{counts['no_split']} sample(s) have no split; HALCON's split_dl_dataset assigns one")
    if task == "segmentation" and view.mask_ignore is not None:
        notes.add(
            f"label images hold {view.mask_ignore} where the image was padded; pass it to HALCON as an ignore class id"
        )
    write_json(stage / "dataset.json", doc)
    (stage / "to_hdict.py").write_text(script_text(), encoding="utf-8")
    _write_hdict(doc, stage, final, notes)
    result = {"samples": len(out_samples), "left_out": len(left_out), "anomaly_files": counts["anomaly_files"]}
    if include_variants:
        result["variants"] = variants
    return result


def _write_hdict(doc: dict[str, Any], stage: Path, final: Path, notes: Notes) -> None:
    """``dataset.hdict`` through HALCON's binding when it imports; a note when it does not."""
    try:
        ha = importlib.import_module("halcon")  # optional: a HALCON installation, not a package dependency
    except Exception as exc:  # the binding raises more than ImportError when no HALCON library loads
        notes.add(
            f"no dataset.hdict: HALCON's Python binding does not import here ({type(exc).__name__}: {exc}); "
            "run python to_hdict.py on a machine with HALCON"
        )
        return
    target = stage / "dataset.hdict"
    try:
        ha.write_dict(to_halcon(ha, halcon_values(doc, final.as_posix())), str(target), [], [])
    except Exception as exc:  # HALCON's errors (no licence, ...): the JSON and the script still serve
        target.unlink(missing_ok=True)
        notes.add(
            f"no dataset.hdict: HALCON could not write it ({type(exc).__name__}: {exc}); "
            "run python to_hdict.py where HALCON works"
        )
