"""Test helper: a small fixed-size store with K augmentation variants, written without the variant build.

``store_with_variants`` builds fixture PNGs with ``dlpack.build``, adds boxes, box labels, crowd
flags and a mask with ``dlpack.add_array``, then writes the variant arrays itself through the
backend writer, in the layout of docs/format.md ("Augmentation variants"): ``images_v{v}`` (the
original + 10 v by default, saturating), ``mask_v{v}`` (the mask rolled v columns), ``boxes_v{v}`` (shifted v
pixels right; odd variants drop each sample's last box, with its label and crowd flag),
``checksum_v{v}`` and ``augment_v{v}`` (a JSON record per sample), plus the manifest's ``augment``
record. :func:`expected_variant` says what variant v of sample i holds, for the assertions.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import dlpack
from dlpack import schema
from dlpack.backends import open_reader, open_writer

#: Stored image size (width, height) and the store names of each backend.
SIZE = (48, 32)  # 4608 bytes an image: read through the stored arrays, not a cached copy
NAMES = {"zarr": "variants.zarr", "hdf5": "variants.h5"}


def _pngs(root: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    for k in range(n):
        img = rng.integers(0, 200, (SIZE[1], SIZE[0], 3), dtype=np.uint8)
        folder = root / f"class{k % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(folder / f"img{k:03d}.png"), img)
    return root


def _boxes(i: int) -> np.ndarray:
    """Sample i's boxes: ``i % 3 + 1`` boxes, all different, corner-based."""
    k = i % 3 + 1
    return np.array([[j, j + 1, j + 4 + (i % 5), j + 3] for j in range(k)], np.float32)


def expected_variant(original: dict[str, Any], v: int, step: int = 10) -> dict[str, np.ndarray]:
    """What the helper stores as variant ``v`` of a sample whose original is ``original`` (ds[i])."""
    if v == 0:
        return {key: np.asarray(original[key]) for key in ("image", "mask", "boxes", "box_labels", "box_crowd")}
    keep = len(original["boxes"]) - (v % 2)
    boxes = np.asarray(original["boxes"])[:keep] + np.array([v, 0, v, 0], np.float32)
    return {
        "image": np.minimum(original["image"].astype(np.int32) + step * v, 255).astype(np.uint8),
        "mask": np.roll(original["mask"], v, axis=1),
        "boxes": boxes.astype(np.float32),
        "box_labels": np.asarray(original["box_labels"])[:keep],
        "box_crowd": np.asarray(original["box_crowd"])[:keep],
    }


def store_with_variants(tmp_path: Path, backend: str, k: int, n: int = 24, seed: int = 0, step: int = 10) -> Path:
    """A store of ``n`` 48x32 RGB images (2 classes) with boxes, a mask and ``k`` variants per image
    (variant v's pixels: the original + ``step * v``); the same ``seed`` gives the same originals."""
    out = tmp_path / NAMES[backend]
    dlpack.build(_pngs(tmp_path / f"src{seed}", n, seed), out, size=SIZE, jobs=1, quiet=True)
    boxes = [_boxes(i) for i in range(n)]
    dlpack.add_array(out, "boxes", boxes, ragged=True)
    dlpack.add_array(out, "box_labels", [np.arange(len(b), dtype=np.int32) % 2 for b in boxes], ragged=True)
    dlpack.add_array(out, "box_crowd", [(np.arange(len(b)) % 2).astype(np.uint8) for b in boxes], ragged=True)
    masks = np.zeros((n, SIZE[1], SIZE[0]), np.uint8)
    for i in range(n):
        masks[i, 2:6, i % 8 : i % 8 + 5] = 1 + i % 2
    dlpack.add_array(out, "mask", masks)

    with dlpack.open(out) as ds:
        originals = [ds[i] for i in range(n)]
        manifest = ds.manifest
        rows = ds.reader.shard_len(schema.IMAGES)
    writer = open_writer(out, "r+")
    try:
        specs = manifest.arrays
        for v in range(1, k + 1):
            got = [expected_variant(s, v, step) for s in originals]
            images = np.stack([g["image"] for g in got])
            fixed = {
                schema.IMAGES: images,
                schema.MASK: np.stack([g["mask"] for g in got]),
                schema.CHECKSUM: np.array([zlib.crc32(np.ascontiguousarray(im).data) for im in images], "<u4"),
            }
            for base, values in fixed.items():
                spec = replace(specs[base], name=schema.variant_array(base, v), key=None, sha256={})
                writer.create_array(spec, n, rows=rows if base != schema.CHECKSUM else None)
                block = writer.shard_rows(spec.name)
                for s in range(0, n, block):
                    writer.write_block(spec.name, s, values[s : s + block])
            record = [np.frombuffer(json.dumps([{"op": "test_shift", "v": v}]).encode(), np.uint8) for _ in got]
            ragged = {key: [g[key] for g in got] for key in ("boxes", "box_labels", "box_crowd")}
            for base, parts in [*ragged.items(), (schema.AUGMENT, record)]:
                like = specs[base] if base in specs else specs[schema.SOURCE]
                spec = replace(like, name=schema.variant_array(base, v), key=None, sha256={})
                writer.create_array(spec, n)
                writer.write_block(spec.name, 0, parts)
        augment = {
            "format": 1,
            "k": k,
            "seed": seed,
            "engine": "dlpack",
            "config": {"kind": "halcon", "format": "json", "text": '{"mirror": "c"}', "name": "test.json"},
            "operations": [],
            "fill_mask": 0,
            "versions": {"dlpack": dlpack.__version__, "numpy": np.__version__, "opencv": cv2.__version__},
        }
        writer.commit(replace(manifest, augment=augment))
    finally:
        writer.abort()
    reader = open_reader(out)
    try:
        assert reader.manifest.variants == k
    finally:
        reader.close()
    return out
