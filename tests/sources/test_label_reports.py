"""What dlpack says about label sources: box counts in ``info``, and messages that name the real problem.

- ``info`` of a detection store counts boxes and images with boxes per class (its images carry no
  class of their own, so image counts would all be 0);
- ``--labels anomaly`` without any ``good``/``ok`` folder warns, naming the folders it saw;
- label images that are not there (a masks folder of other files, a DLDataset whose segmentation
  folder is empty) are named as missing, never as "0 sizes; pass --size";
- COCO ``file_name``s relative to SRC's parent get the hint to pass that folder as SRC.
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from dlpack.cli import main

W, H = 24, 16


def _png(path: Path, seed: int = 0, shape: tuple[int, ...] = (H, W, 3)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8))


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    got = capsys.readouterr()
    return code, got.out, got.err


# ----------------------------------------------------------------------------- info of a detection store

# Per image, the category of each box: "tree" (id 5) and "stump" (id 9); "c" has none.
BOXES = {"a.png": [5, 5, 5], "b.png": [5, 9], "c.png": [], "d.png": [9]}


def _detection(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    images, anns = [], []
    for k, (name, cats) in enumerate(BOXES.items()):
        _png(src / name, k)
        images.append({"id": k + 1, "file_name": name, "width": W, "height": H})
        for cat in cats:
            anns.append({"id": len(anns) + 1, "image_id": k + 1, "category_id": cat, "bbox": [1, 1, 6, 5]})
    doc = {"images": images, "annotations": anns, "categories": [{"id": 5, "name": "tree"}, {"id": 9, "name": "stump"}]}
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(doc), encoding="utf-8")
    return src, ann


def test_info_counts_the_boxes_of_a_detection_store_per_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, ann = _detection(tmp_path)
    out = tmp_path / "o.zarr"
    assert main(["build", str(src), str(out), "--labels", f"coco:{ann}", "--jobs", "1", "--quiet"]) == 0
    capsys.readouterr()
    code, doc, _ = _run(capsys, "info", str(out), "--json")
    assert code == 0
    boxes = json.loads(doc)["box_counts"]
    assert boxes == {
        "boxes": 6,
        "boxes_per_class": {"tree": 4, "stump": 2},
        "images_per_class": {"tree": 2, "stump": 2},
        "images_without_boxes": 1,
    }
    code, text, _ = _run(capsys, "info", str(out))
    assert code == 0
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert "6 box(es), 1 image(s) without boxes" in lines["boxes"]
    assert "tree 4 in 2 image(s), stump 2 in 2 image(s)" in lines["per class"]
    assert "tree 0" not in text and "unlabelled" not in text


def test_info_counts_boxes_per_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, ann = _detection(tmp_path)
    out = tmp_path / "o.zarr"
    argv = ["build", str(src), str(out), "--labels", f"coco:{ann}", "--split", "50,50", "--jobs", "1", "--quiet"]
    assert main(argv) == 0
    capsys.readouterr()
    info = json.loads(_run(capsys, "info", str(out), "--json")[1])
    splits = info["box_counts"]["splits"]
    assert set(splits) == set(info["splits"])
    # The splits share out the store's boxes and images exactly.
    assert sum(s["boxes"] for s in splits.values()) == 6
    for c in ("tree", "stump"):
        assert sum(s["boxes_per_class"][c] for s in splits.values()) == info["box_counts"]["boxes_per_class"][c]
    assert sum(s["images_without_boxes"] for s in splits.values()) == 1
    text = _run(capsys, "info", str(out))[1]
    for name, s in splits.items():
        assert f"  {name}" in text and f"{s['boxes']} box(es)" in text


def test_info_of_a_classification_store_still_counts_images_per_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for k in range(3):
        _png(tmp_path / "src" / ("cat" if k else "dog") / f"{k}.png", k)
    out = tmp_path / "o.zarr"
    assert main(["build", str(tmp_path / "src"), str(out), "--jobs", "1", "--quiet"]) == 0
    capsys.readouterr()
    info = json.loads(_run(capsys, "info", str(out), "--json")[1])
    assert "box_counts" not in info and info["class_counts"] == {"cat": 2, "dog": 1}
    assert "cat 2, dog 1" in _run(capsys, "info", str(out))[1]


# ----------------------------------------------------------------------------- anomaly without ok images


def test_anomaly_labels_without_a_good_or_ok_folder_are_refused_naming_the_folders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "cells"
    for k, rel in enumerate(("train/mono/a.png", "train/poly/b.png", "train/poly/c.png", "test/mono/d.png")):
        _png(src / rel, k)
    out = tmp_path / "o.zarr"
    code, _, err = _run(capsys, "build", str(src), str(out), "--labels", "anomaly", "--jobs", "1", "--quiet")
    assert code == 2 and "Traceback" not in err
    assert "no ok folder" in err and "good or ok" in err
    assert "train/mono (1)" in err and "train/poly (2)" in err and "test/mono (1)" in err
    assert not out.exists()
    # The same tree with a folder of flawless images builds.
    _png(src / "train" / "Good" / "e.png", 9)
    assert main(["build", str(src), str(out), "--labels", "anomaly", "--jobs", "1", "--quiet"]) == 0


# ----------------------------------------------------------------------------- label images not there


def _seg_tree(tmp_path: Path) -> tuple[Path, Path]:
    src, masks = tmp_path / "img", tmp_path / "lab"
    for k, rel in enumerate(("x/one.png", "two.png")):
        _png(src / rel, k)
        _png(masks / rel, k, (H, W))
    return src, masks


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_masks_folder_without_label_images_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], on_error: str
) -> None:
    src, _ = _seg_tree(tmp_path)
    other = tmp_path / "voc"
    other.mkdir()
    (other / "one.xml").write_text("<annotation/>", encoding="utf-8")
    out = tmp_path / "o.zarr"
    argv = ["build", str(src), str(out), "--size", "16x16", "--jobs", "1", "--quiet", "--on-error", on_error]
    code, _, err = _run(capsys, *argv, "--labels", f"masks:{other}")
    assert code == 2 and "no image file at all" in err and "voc" in err and "Traceback" not in err
    assert "sizes" not in err and "--size" not in err
    # Label images at other paths than the images': the folder is named with what it holds.
    flat = tmp_path / "flat"
    _png(flat / "one.png", 0, (H, W))
    code, _, err = _run(capsys, *argv, "--labels", f"masks:{flat}")
    assert code == 2 and "none at an image's path: one.png" in err and "flat/two.png" in err
    assert "sizes" not in err
    assert not out.exists()


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_segmentation_dldataset_without_its_label_images_lists_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], on_error: str
) -> None:
    src, masks = _seg_tree(tmp_path)
    halcon = tmp_path / "halcon"
    argv = ["build", str(src), str(halcon), "--labels", f"masks:{masks}", "--size", "16x16", "--format", "dldataset"]
    assert main([*argv, "--jobs", "1", "--quiet"]) == 0
    for f in (halcon / "segmentation").rglob("*.png"):
        f.unlink()
    capsys.readouterr()
    out = tmp_path / "o.zarr"
    code, _, err = _run(
        capsys, "build", str(halcon), str(out), "--size", "16x16", "--jobs", "1", "--quiet", "--on-error", on_error
    )
    assert code == 2 and "Traceback" not in err
    assert "no input could be packed: all 2 input file(s)" in err
    assert err.count("does not exist") == 2 and "one.png" in err and "two.png" in err
    assert "sizes" not in err
    assert not out.exists()


# ----------------------------------------------------------------------------- file names relative to another folder


def _named_tree(tmp_path: Path) -> Path:
    """``tmp_path/set/pics/{p,q}.png`` with a COCO file and a CSV that name them ``pics/p.png``."""
    top = tmp_path / "set"
    for k, name in enumerate(("p.png", "q.png")):
        _png(top / "pics" / name, k)
    doc = {
        "images": [{"id": k + 1, "file_name": f"pics/{n}.png", "width": W, "height": H} for k, n in enumerate("pq")],
        "annotations": [],
        "categories": [{"id": 1, "name": "thing"}],
    }
    (tmp_path / "ann.json").write_text(json.dumps(doc), encoding="utf-8")
    (tmp_path / "t.csv").write_text("path,label\npics/p.png,a\npics/q.png,b\n", encoding="utf-8")
    return top


@pytest.mark.parametrize("kind", ["coco:ann.json", "csv:t.csv"])
def test_file_names_relative_to_a_parent_folder_get_the_folder_to_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    top = _named_tree(tmp_path)
    name, file = kind.split(":")
    labels = f"{name}:{tmp_path / file}"
    out = tmp_path / "o.zarr"
    # SRC one folder too deep: the names start with the folder SRC is.
    code, _, err = _run(capsys, "build", str(top / "pics"), str(out), "--labels", labels, "--jobs", "1", "--quiet")
    assert code == 2 and "Traceback" not in err
    assert f"pass {str(top)!r} as SRC" in err and "fix or replace" not in err
    # Then passing that folder builds.
    assert main(["build", str(top), str(out), "--labels", labels, "--jobs", "1", "--quiet"]) == 0
    # SRC one folder too high: the images are in a folder below it.
    code, _, err = _run(
        capsys, "build", str(tmp_path), str(tmp_path / "o2.zarr"), "--labels", labels, "--jobs", "1", "--quiet"
    )
    assert code == 2 and f"pass {str(top)!r} as SRC" in err and "fix or replace" not in err


def test_a_file_missing_from_src_alone_is_still_named_per_image(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One image really missing: no folder holds both, so the per-image error stays and no SRC is suggested.
    top = _named_tree(tmp_path)
    (top / "pics" / "q.png").unlink()
    code, _, err = _run(
        capsys, "build", str(top), str(tmp_path / "o.zarr"), "--labels", f"csv:{tmp_path / 't.csv'}", "--jobs", "1"
    )
    assert code == 2 and "pics/q.png: line 3" in err and "file not found" in err and "as SRC" not in err
