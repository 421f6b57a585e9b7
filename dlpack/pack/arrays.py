"""Stage 6: the per-sample metadata arrays and the manifest of the written samples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._version import __version__
from ..backends import ArraySpec
from ..manifest import Manifest
from ..ragged import RaggedBatch
from ..sources._items import ItemTable
from ..sources.base import SourceItem, SourceScan
from ..storage.spill import PART, Column
from .columns import SampleTable
from .inputs import Selection, split_names
from .plan import BuildPlan
from .workers import Sample


def _source_array(items: Sequence[SourceItem], keep: Sequence[int]) -> Any:
    """The ragged ``source`` values of items ``keep``: their UTF-8 paths (an item table's read a
    slice at a time as the store writes them)."""
    if isinstance(items, ItemTable):
        return items.source_column(keep)
    encoded = [items[k].rel.encode("utf-8") for k in keep]
    data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return RaggedBatch(data, offsets)


def _lookup(names: Sequence[str], ids: dict[str, int]) -> np.ndarray:
    """Codes into ``names`` (and -1, the last entry) -> codes into ``ids``'s names."""
    return np.array([*(ids[n] for n in names), -1], dtype=np.int64)


def _table_codes(
    items: ItemTable, keep: Sequence[int], class_id: dict[str, int], split_id: dict[str, int]
) -> tuple[Column, Column | None]:
    """The ``labels`` and ``split`` codes of an item table's items ``keep``, from its code columns
    a part at a time (never one object per item)."""
    label_map = _lookup(items.label_names, class_id)
    split_map = _lookup(items.split_names, split_id) if split_id else None
    labels = Column("<i4")
    codes = Column("|i1") if split_map is not None else None
    for a in range(0, len(keep), PART):
        part = keep[a : a + PART]
        labels.append(label_map[items.label_codes.take(part)])
        if codes is not None and split_map is not None:
            codes.append(split_map[items.split_codes.take(part)])
    return labels, codes


def _meta_arrays(
    items: Sequence[SourceItem],
    keep: Sequence[int],
    samples: SampleTable,
    classes: Sequence[str],
    variable: bool,
    splits: Sequence[str] = (),
) -> dict[str, tuple[ArraySpec, Any]]:
    """The per-sample metadata arrays, by name: their specs and values (``split`` only when ``splits``).

    Built from the samples' columns and the item table's codes (read item by item from another
    source's items): nothing per sample is an object.
    """
    class_id = {c: i for i, c in enumerate(classes)}
    split_id = {name: i for i, name in enumerate(splits)}
    labels: Any
    codes: Any
    if isinstance(items, ItemTable):
        labels, codes = _table_codes(items, keep, class_id, split_id)
    else:
        labels = np.empty(len(keep), dtype="<i4")
        codes = np.empty(len(keep), dtype="|i1")
        for j, k in enumerate(keep):
            it = items[k]
            labels[j] = class_id[it.label] if it.label is not None else -1
            if splits:
                codes[j] = split_id[it.split] if it.split is not None else -1
    fixed: dict[str, tuple[Any, str | None]] = {
        "labels": (labels, "label"),
        "original_size": (samples.original_size, None),
        "transform": (samples.transform, None),
        "checksum": (samples.checksum, None),
        # What --update compares the source files with: (size, mtime_ns), then the content hash.
        "source_stat": (samples.stat, None),
        "source_sha256": (samples.sha256, None),
    }
    if variable:
        fixed["image_shapes"] = (samples.shape, None)
    if splits:
        fixed["split"] = (codes, "split")
    arrays: dict[str, tuple[ArraySpec, Any]] = {
        name: (ArraySpec(name, arr.dtype.str, arr.shape[1:], key=key), arr) for name, (arr, key) in fixed.items()
    }
    arrays["source"] = (ArraySpec("source", "|u1", (), ragged=True), _source_array(items, keep))
    return arrays


def label_arrays(
    plan: BuildPlan, items: Sequence[SourceItem], samples: Sequence[Sample]
) -> dict[str, tuple[ArraySpec, Any]]:
    """The label arrays of the plan but the ``mask`` (written with the images): ``boxes``, ``box_labels``,
    ``box_crowd`` (ragged), ``defect``, and the internal ``orientation`` and ``label_sha256``."""
    lp = plan.labels
    if lp is None:
        return {}
    arrays: dict[str, tuple[ArraySpec, Any]] = {}
    if lp.boxes:
        arrays["boxes"] = (
            ArraySpec("boxes", "<f4", (4,), ragged=True, key="boxes"),
            [np.array(s.boxes or (), dtype="<f4").reshape(-1, 4) for s in samples],
        )
        arrays["box_labels"] = (
            ArraySpec("box_labels", "<i4", (), ragged=True, key="box_labels"),
            [np.array(s.box_labels, dtype="<i4") for s in samples],
        )
    if lp.crowd:
        arrays["box_crowd"] = (
            ArraySpec("box_crowd", "|u1", (), ragged=True, key="box_crowd"),
            [np.array(s.box_crowd or (), dtype="|u1") for s in samples],
        )
    if lp.defects:
        code = {d: i for i, d in enumerate(lp.defects)}
        values = [(it.annotations or {}).get("defect") for it in items]
        arrays["defect"] = (
            ArraySpec("defect", "<i4", (), key="defect"),
            np.array([code[str(v)] if v is not None else -1 for v in values], dtype="<i4"),
        )
    arrays["orientation"] = (ArraySpec("orientation", "|u1", ()), np.array([s.orientation for s in samples], "|u1"))
    digests = b"".join(bytes.fromhex(s.label_sha256) for s in samples)
    arrays["label_sha256"] = (ArraySpec("label_sha256", "|u1", (32,)), np.frombuffer(digests, np.uint8).reshape(-1, 32))
    return arrays


def label_fields(scan: SourceScan, plan: BuildPlan) -> dict[str, Any]:
    """The manifest's label fields: ``class_ids`` (when not ``0 .. C-1``), ``task`` (for label
    sources), ``mask_ignore``, ``defects`` and ``mask_classes`` (a mask folder's class list)."""
    out: dict[str, Any] = {}
    if scan.class_ids and tuple(scan.class_ids) != tuple(range(len(scan.classes))):
        out["class_ids"] = tuple(scan.class_ids)
    if scan.labels not in ("folders", "none"):
        out["task"] = scan.task
    lp = plan.labels
    if lp is not None:
        out["task"] = lp.task
        if lp.mask_dtype is not None:
            out["mask_ignore"] = lp.mask_ignore
        if lp.defects:
            out["defects"] = lp.defects
    if scan.labels == "masks" and scan.classes:
        # The label images' ids named by the source's class list.
        ids = scan.class_ids or tuple(range(len(scan.classes)))
        out["mask_classes"] = tuple(zip(ids, scan.classes, strict=True))
    return out


def manifest_stage(
    plan: BuildPlan, scan: SourceScan, sel: Selection, samples: Sequence[Sample]
) -> tuple[dict[str, tuple[ArraySpec, Any]], Manifest]:
    """6. The per-sample arrays and the manifest of the written samples (the writer lists the arrays)."""
    table = SampleTable.of(samples)
    variable = plan.image.layout == "variable"
    splits = plan.split_names or split_names(scan.items)
    arrays = _meta_arrays(scan.items, sel.keep, table, scan.classes, variable, splits)
    if plan.labels is not None:
        items = [scan.items[k] for k in sel.keep]
        arrays.update(label_arrays(plan, items, table))
    conversions = table.conversion_counts()
    target = plan.target
    manifest = Manifest(
        count=plan.count,
        image=plan.image,
        backend=plan.backend,
        classes=scan.classes,
        labels=scan.labels,
        splits=splits,
        resize={
            "mode": target.mode,
            "size": list(target.size) if target.size else None,
            "max_side": target.max_side,
            "allow_upscale": target.allow_upscale,
            "interpolation": "area (shrink), linear (enlarge)",
        },
        compression=plan.compression,
        shard_rows=0 if variable else plan.shard_rows,
        skipped=tuple(sorted(sel.errors, key=lambda e: e.path)),
        conversions=dict(sorted(conversions.items())),
        plan=plan.to_dict(),
        dlpack_version=__version__,
        **label_fields(scan, plan),
    )
    return arrays, manifest
