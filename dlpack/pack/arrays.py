"""Stage 6: the per-sample metadata arrays and the manifest of the written samples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import __version__
from ..backends import ArraySpec
from ..manifest import Manifest
from ..sources.base import SourceItem, SourceScan
from .inputs import Selection, split_names
from .plan import BuildPlan
from .workers import Sample


def _meta_arrays(
    items: Sequence[SourceItem],
    samples: Sequence[Sample],
    classes: Sequence[str],
    shapes: Sequence[tuple[int, ...]] | None,
    splits: Sequence[str] = (),
) -> dict[str, tuple[ArraySpec, Any]]:
    """The per-sample metadata arrays, by name: their specs and values (``split`` only when ``splits``)."""
    class_id = {c: i for i, c in enumerate(classes)}
    fixed: dict[str, tuple[np.ndarray, str | None]] = {
        "labels": (
            np.array([class_id[it.label] if it.label is not None else -1 for it in items], dtype="<i4"),
            "label",
        ),
        "original_size": (np.array([s.original_size for s in samples], dtype="<i4").reshape(-1, 2), None),
        "transform": (np.array([s.transform for s in samples], dtype="<f8").reshape(-1, 4), None),
        "checksum": (np.array([s.checksum for s in samples], dtype="<u4"), None),
        # What --update compares the source files with: (size, mtime_ns), then the content hash.
        "source_stat": (np.array([s.stat for s in samples], dtype="<i8").reshape(-1, 2), None),
        "source_sha256": (
            np.frombuffer(b"".join(bytes.fromhex(s.sha256) for s in samples), dtype=np.uint8).reshape(-1, 32),
            None,
        ),
    }
    if shapes is not None:
        fixed["image_shapes"] = (np.array(shapes, dtype="<i4").reshape(-1, 3), None)
    if splits:
        split_id = {name: i for i, name in enumerate(splits)}
        codes = [split_id[it.split] if it.split is not None else -1 for it in items]
        fixed["split"] = (np.array(codes, dtype="|i1"), "split")
    arrays: dict[str, tuple[ArraySpec, Any]] = {
        name: (ArraySpec(name, arr.dtype.str, arr.shape[1:], key=key), arr) for name, (arr, key) in fixed.items()
    }
    sources = [np.frombuffer(it.rel.encode("utf-8"), dtype=np.uint8) for it in items]
    arrays["source"] = (ArraySpec("source", "|u1", (), ragged=True), sources)
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
    items = [scan.items[k] for k in sel.keep]
    variable = plan.image.layout == "variable"
    splits = plan.split_names or split_names(scan.items)
    arrays = _meta_arrays(items, samples, scan.classes, [s.shape for s in samples] if variable else None, splits)
    arrays.update(label_arrays(plan, items, samples))
    conversions = Counter(c for s in samples for c in s.conversions)
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
