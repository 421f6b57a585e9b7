"""Export a store as the folder layouts HALCON's readers take (and ``dlpack build`` reads back).

- classification: ``OUT/[<split>/]<class>/<name>.png`` (``read_dl_dataset_classification`` with
  ``'last_folder'``: the folder that holds an image is its class);
- segmentation: ``OUT/images/<path>.png`` and ``OUT/labels/<path>.png`` with the same relative
  path (pixel value = class id; ``read_dl_dataset_segmentation``), ``OUT/labels/classes.json``;
- anomaly: ``OUT/images/<good|defect>/<name>.png`` and ``OUT/ground_truth/<defect>/<name>.png``
  (``read_dl_dataset_anomaly``);
- detection: COCO (``read_dl_dataset_from_coco``), as ``--to coco``.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from .._names import shown
from ..errors import OptionError
from ..halcon.export import anomaly_label, defect_pixels
from ._common import (
    HALCON_SPLITS,
    Notes,
    StoreView,
    checked_source,
    flat_names,
    fold,
    folder_name,
    png_names,
    samples,
    write_json,
    write_png,
)


def export_folders(ds: Any, view: StoreView, stage: Path, notes: Notes) -> dict[str, Any]:
    """Write the layout of the store's task into ``stage``; returns counts."""
    if view.task == "detection":
        from .coco import export_coco

        notes.add(
            "a detection store is written as COCO (annotations.json, images/), which read_dl_dataset_from_coco reads"
        )
        return export_coco(ds, view, stage, notes)
    if view.task == "classification":
        return _classification(ds, view, stage, notes)
    if view.task == "segmentation":
        return _segmentation(ds, view, stage, notes)
    if view.task == "anomaly":
        return _anomaly(ds, view, stage, notes)
    raise OptionError(
        f"store {view.path} has no labels, so it has no folder layout; export it with --to dldataset or --to coco"
    )


def _left_out(notes: Notes, paths: list[str], why: str) -> None:
    if paths:
        listing = ", ".join(shown(p) for p in paths[:5]) + (" ..." if len(paths) > 5 else "")
        notes.add(f"left out {len(paths)} {why}: {listing}")


def _note_folders_one_in_any_case(notes: Notes, folders: list[str], what: str) -> None:
    """Folders whose names differ only in case are one folder where the export may be copied
    (macOS, Windows): their files never meet (the names are unique in any case), but their labels would."""
    seen: dict[str, str] = {}
    for name in sorted(set(folders)):
        other = seen.setdefault(fold(name), name)
        if other != name:
            notes.add(
                f"the {what} folders {shown(other)!r} and {shown(name)!r} differ only in case: on a case-insensitive "
                "file system (macOS, Windows) they are one folder; export with --to dldataset or --to coco there"
            )


def _classification(ds: Any, view: StoreView, stage: Path, notes: Notes) -> dict[str, Any]:
    for split in view.splits:
        if split not in HALCON_SPLITS:  # dlpack build reads only these names back as splits
            raise OptionError(
                f"store {view.path} has the split {shown(split)!r}; the folder layout keeps splits as top folders named "
                "train, val, validation or test"
            )
    items = [s for s in samples(ds)]
    unlabelled = [s.source for s in items if s.label < 0]
    kept = [s for s in items if s.label >= 0]
    no_split = [s.source for s in kept if view.splits and s.split is None]
    groups: dict[int, tuple[str, PurePosixPath]] = {}
    for s in kept:
        name = folder_name(view, view.classes[s.label], "class")
        folder = name if s.split is None else f"{s.split}/{name}"
        groups[s.index] = (folder, checked_source(view, s))
    names = flat_names(groups)
    _note_folders_one_in_any_case(notes, [folder for folder, _ in groups.values()], "class")
    for s in kept:
        write_png(stage / names[s.index], s.image)
    _left_out(notes, unlabelled, "unlabelled sample(s), which have no class folder")
    if no_split:
        notes.add(
            f"{len(no_split)} sample(s) without a split are in class folders at the top, beside the split folders"
        )
    return {"samples": len(kept), "left_out": len(unlabelled)}


def _segmentation(ds: Any, view: StoreView, stage: Path, notes: Notes) -> dict[str, Any]:
    items = list(samples(ds))
    names = png_names(view, [(s.index, checked_source(view, s)) for s in items])
    for s in items:
        if s.mask is None:
            raise OptionError(f"store {view.path} is a segmentation store without a mask array")
        write_png(stage / "images" / names[s.index], s.image)
        write_png(stage / "labels" / names[s.index], s.mask)
    write_json(
        stage / "labels" / "classes.json", {str(i): n for i, n in zip(view.class_ids, view.classes, strict=True)}
    )
    if view.splits:
        notes.add("the segmentation folder layout has no splits; export with --to dldataset to keep them")
    if view.mask_ignore is not None:
        notes.add(f"label images hold {view.mask_ignore} where the image was padded; treat it as an ignore class id")
    return {"samples": len(items)}


def _anomaly(ds: Any, view: StoreView, stage: Path, notes: Notes) -> dict[str, Any]:
    items = list(samples(ds))
    groups: dict[int, tuple[str, PurePosixPath]] = {}
    labels: dict[int, str] = {}
    unknown: list[str] = []
    for s in items:
        label = anomaly_label(view, s)
        if label is None:
            unknown.append(s.source)
            continue
        labels[s.index] = label
        defect = view.defects[s.defect] if s.defect is not None and 0 <= s.defect < len(view.defects) else None
        if defect is None or (label == "ok") != (defect.lower() in ("good", "ok")):
            defect = "good" if label == "ok" else "nok"
        groups[s.index] = (folder_name(view, defect, "defect"), checked_source(view, s))
    names = flat_names(groups)
    _note_folders_one_in_any_case(notes, [folder for folder, _ in groups.values()], "defect")
    gt = 0
    for s in items:
        if s.index not in names:
            continue
        write_png(stage / "images" / names[s.index], s.image)
        if labels[s.index] == "nok" and s.mask is not None and (s.mask == 1).any():
            write_png(stage / "ground_truth" / names[s.index], defect_pixels(view, s.mask))
            gt += 1
    _left_out(notes, unknown, "sample(s) that are neither ok nor nok")
    if view.splits:
        notes.add("the anomaly folder layout has no splits; export with --to dldataset to keep them")
    return {"samples": len(names), "ground_truth": gt, "left_out": len(unknown)}
