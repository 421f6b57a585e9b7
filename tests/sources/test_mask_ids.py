"""Class ids a mask cannot hold: refused naming the class, never painted as background or padding.

A class mask stores pixel = class id, with 0 as background and the dtype's largest value as padding.
A COCO category painted with 0, 65535 or an id outside 16 bits would vanish from every mask, so the
source refuses it (naming the category and its annotations); ``--instance-masks`` does not paint
category ids and takes any. A label-image class list naming 65535 is refused the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack.cli import main
from dlpack.errors import SourceError
from dlpack.sources import CocoSource, prepare_labels
from dlpack.sources.decode import DecodeError, TargetSpec, prepare_image

W, H = 24, 16


def _rect(x: int, y: int, w: int, h: int) -> list[int]:
    return [x, y, x + w, y, x + w, y + h, x, y + h]


def _coco(tmp_path: Path, ids: tuple[int, int], segmented: tuple[bool, bool] = (True, True)) -> tuple[Path, Path]:
    """Two images, one box each: ``a.png`` of category ``ids[0]`` ("first"), ``b.png`` of ``ids[1]`` ("second")."""
    root = tmp_path / "src"
    root.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.png", "b.png"):
        cv2.imwrite(str(root / name), rng.integers(0, 256, (H, W, 3), dtype=np.uint8))
    anns = []
    for k, (cid, seg) in enumerate(zip(ids, segmented, strict=True)):
        ann: dict[str, Any] = {"id": 11 + k, "image_id": k + 1, "category_id": cid, "bbox": [2, 3, 10, 8]}
        if seg:
            ann["segmentation"] = [_rect(2, 3, 10, 8)]
        anns.append(ann)
    doc = {
        "images": [{"id": k + 1, "file_name": n, "width": W, "height": H} for k, n in enumerate(("a.png", "b.png"))],
        "annotations": anns,
        "categories": [{"id": ids[0], "name": "first"}, {"id": ids[1], "name": "second"}],
    }
    ann_file = tmp_path / "ann.json"
    ann_file.write_text(json.dumps(doc), encoding="utf-8")
    return root, ann_file


def _build(src: Path, ann: Path, out: Path, *extra: str) -> int:
    return main(["build", str(src), str(out), "--labels", f"coco:{ann}", "--jobs", "1", "--quiet", *extra])


@pytest.mark.parametrize(
    ("bad", "why"),
    [(0, "0 is the background"), (65535, "65535 is the pad value"), (-1, "cannot hold it"), (70000, "cannot hold it")],
)
def test_a_coco_category_a_mask_cannot_hold_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: int, why: str
) -> None:
    src, ann = _coco(tmp_path, (bad, 4))
    out = tmp_path / "o.zarr"
    assert _build(src, ann, out) == 2
    err = capsys.readouterr().err
    assert "'first'" in err and f"id {bad}" in err and why in err and "annotation id(s) 11" in err
    assert "'second'" not in err and "Traceback" not in err
    assert not out.exists()
    with pytest.raises(SourceError, match="first"):
        CocoSource(src, ann).scan()


def test_coco_category_0_keeps_its_boxes_when_nothing_paints_it(tmp_path: Path) -> None:
    # Category 0 with a box but no segmentation (a common export): nothing is painted with 0, so it builds,
    # keeping the id in the class list and the box's label; the painted category keeps its pixels.
    src, ann = _coco(tmp_path, (0, 4), segmented=(False, True))
    out = tmp_path / "o.zarr"
    assert _build(src, ann, out) == 0
    with dlpack.open(out) as ds:
        assert ds.classes == ("first", "second") and ds.class_ids == (0, 4)
        by = {ds[i]["source"]: ds[i] for i in range(len(ds))}
        assert by["a.png"]["box_labels"].tolist() == [0]
        assert by["b.png"]["box_labels"].tolist() == [1]
        assert set(np.unique(by["b.png"]["mask"]).tolist()) == {0, 4}


def test_instance_masks_take_any_category_id(tmp_path: Path) -> None:
    src, ann = _coco(tmp_path, (0, 65535))
    out = tmp_path / "o.zarr"
    assert _build(src, ann, out, "--instance-masks") == 0
    with dlpack.open(out) as ds:
        assert ds.class_ids == (0, 65535)
        for i in range(len(ds)):
            s = ds[i]
            assert set(np.unique(s["mask"]).tolist()) == {0, 1}, s["source"]
            assert s["box_labels"].tolist() == [0 if s["source"] == "a.png" else 1]


def test_a_coco_category_255_gets_16_bit_masks_that_keep_its_pixels(tmp_path: Path) -> None:
    src, ann = _coco(tmp_path, (1, 255))
    out = tmp_path / "o.zarr"
    assert _build(src, ann, out) == 0
    with dlpack.open(out) as ds:
        b = next(ds[i] for i in range(len(ds)) if ds[i]["source"] == "b.png")
        assert b["mask"].dtype == np.uint16 and set(np.unique(b["mask"]).tolist()) == {0, 255}


def test_painting_an_id_a_mask_cannot_hold_is_a_decode_error(tmp_path: Path) -> None:
    # The per-sample step refuses too (the API can be called without a source's checks).
    img = tmp_path / "x.png"
    cv2.imwrite(str(img), np.zeros((H, W, 3), np.uint8))
    prepared = prepare_image(img.read_bytes(), TargetSpec(mode="none"))
    ann = {"boxes": [[2, 3, 12, 11]], "box_labels": [0], "segmentation": [[_rect(2, 3, 10, 8)]]}
    for ids in ((-1,), (0,), (255,)):
        with pytest.raises(DecodeError, match=f"class id {ids[0]} does not fit"):
            prepare_labels(tmp_path, None, ann, prepared, "detection", "|u1", None, ids)


def test_a_label_image_class_list_naming_the_pad_value_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, masks = tmp_path / "img", tmp_path / "lab"
    src.mkdir()
    masks.mkdir()
    cv2.imwrite(str(src / "a.png"), np.zeros((H, W, 3), np.uint8))
    label = np.zeros((H, W), np.uint16)
    label[2:6, 2:6] = 65535
    cv2.imwrite(str(masks / "a.png"), label)
    (masks / "classes.json").write_text(json.dumps({"0": "bg", "65535": "rim"}), encoding="utf-8")
    out = tmp_path / "o.zarr"
    code = main(["build", str(src), str(out), "--labels", f"masks:{masks}", "--jobs", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "'rim'" in err and "65535" in err and "Traceback" not in err
    assert not out.exists()
