"""One link rule for every label source: a file named by a DLDataset, or matched in a mask or
ground-truth folder, that is a link leaving its folder is refused as COCO and CSV entries are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack.cli import main

Capsys = pytest.CaptureFixture[str]
LINK_RULE = "outside {}; copy the file in"


def _png(path: Path, value: int, gray: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.full((8, 8) if gray else (8, 8, 3), value, np.uint8))


def _build(capsys: Capsys, *args: str) -> tuple[int, str]:
    code = main(["build", *args])
    return code, capsys.readouterr().err


def _dldataset(folder: Path, task: str) -> dict[str, Any]:
    """A two-sample DLDataset of ``task`` (classification or segmentation) with its files."""
    samples: list[dict[str, Any]] = []
    for k, name in enumerate(("a.png", "b.png")):
        _png(folder / "images" / name, 10 + k)
        sample: dict[str, Any] = {"image_id": k, "image_file_name": name}
        if task == "segmentation":
            _png(folder / "labels" / name, 1, gray=True)
            sample["segmentation_file_name"] = name
        else:
            sample["image_label_id"] = 1
        samples.append(sample)
    doc: dict[str, Any] = {"image_dir": "images", "class_names": ["bg", "fg"], "class_ids": [0, 1], "samples": samples}
    if task == "segmentation":
        doc["segmentation_dir"] = "labels"
    return doc


def _save(folder: Path, doc: dict[str, Any]) -> None:
    (folder / "dataset.json").write_text(json.dumps(doc), encoding="utf-8")


@pytest.mark.parametrize("how", ["linked file", "file under a linked folder"])
def test_a_dldataset_image_that_is_a_link_out_of_image_dir_is_refused(tmp_path: Path, capsys: Capsys, how: str) -> None:
    halcon = tmp_path / "halcon"
    doc = _dldataset(halcon, "classification")
    _png(tmp_path / "elsewhere" / "secret.png", 200)
    if how == "linked file":
        (halcon / "images" / "evil.png").symlink_to(tmp_path / "elsewhere" / "secret.png")
        doc["samples"][0]["image_file_name"] = "evil.png"
    else:
        (halcon / "images" / "lnk").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
        doc["samples"][0]["image_file_name"] = "lnk/secret.png"
    _save(halcon, doc)
    code, err = _build(capsys, str(halcon), str(tmp_path / "out.zarr"))
    assert code == 2 and "image_id 0" in err and LINK_RULE.format("image_dir") in err, err
    assert not (tmp_path / "out.zarr").exists()
    code, err = _build(capsys, str(halcon), str(tmp_path / "out.zarr"), "--on-error", "skip")
    assert code == 1, err
    with dlpack.open(tmp_path / "out.zarr") as ds:
        assert [ds[i]["source"] for i in range(len(ds))] == ["b.png"]


def test_a_link_that_stays_inside_image_dir_is_packed(tmp_path: Path, capsys: Capsys) -> None:
    halcon = tmp_path / "halcon"
    doc = _dldataset(halcon, "classification")
    (halcon / "images" / "same.png").symlink_to(halcon / "images" / "a.png")
    doc["samples"][0]["image_file_name"] = "same.png"
    _save(halcon, doc)
    code, err = _build(capsys, str(halcon), str(tmp_path / "out.zarr"))
    assert code == 0, err
    with dlpack.open(tmp_path / "out.zarr") as ds:
        assert len(ds) == 2 and int(ds[0]["image"][0, 0, 0]) == 10


def test_a_dldataset_label_image_that_is_a_link_out_of_segmentation_dir_is_refused(
    tmp_path: Path, capsys: Capsys
) -> None:
    halcon = tmp_path / "halcon"
    doc = _dldataset(halcon, "segmentation")
    _png(tmp_path / "elsewhere" / "mask.png", 1, gray=True)
    (halcon / "labels" / "evil.png").symlink_to(tmp_path / "elsewhere" / "mask.png")
    doc["samples"][1]["segmentation_file_name"] = "evil.png"
    _save(halcon, doc)
    code, err = _build(capsys, str(halcon), str(tmp_path / "out.zarr"))
    assert code == 2 and "image_id 1" in err and "label image" in err, err
    assert LINK_RULE.format("segmentation_dir") in err


def test_a_mask_folder_label_image_that_is_a_link_out_of_the_folder_is_refused(tmp_path: Path, capsys: Capsys) -> None:
    for name in ("a.png", "b.png"):
        _png(tmp_path / "images" / name, 30)
    _png(tmp_path / "masks" / "a.png", 1, gray=True)
    _png(tmp_path / "elsewhere" / "b.png", 1, gray=True)
    (tmp_path / "masks" / "b.png").symlink_to(tmp_path / "elsewhere" / "b.png")
    out = tmp_path / "out.zarr"
    code, err = _build(capsys, str(tmp_path / "images"), str(out), "--labels", f"masks:{tmp_path / 'masks'}")
    assert code == 2 and "b.png" in err and LINK_RULE.format("the mask folder") in err, err
    code, err = _build(
        capsys, str(tmp_path / "images"), str(out), "--labels", f"masks:{tmp_path / 'masks'}", "--on-error", "skip"
    )
    assert code == 1, err
    with dlpack.open(out) as ds:
        assert [ds[i]["source"] for i in range(len(ds))] == ["a.png"]


def test_a_ground_truth_image_that_is_a_link_out_of_its_folder_is_refused(tmp_path: Path, capsys: Capsys) -> None:
    _png(tmp_path / "src" / "good" / "0.png", 40)
    _png(tmp_path / "src" / "crack" / "1.png", 50)
    _png(tmp_path / "elsewhere" / "1.png", 255, gray=True)
    (tmp_path / "gt" / "crack").mkdir(parents=True)
    (tmp_path / "gt" / "crack" / "1.png").symlink_to(tmp_path / "elsewhere" / "1.png")
    code, err = _build(
        capsys,
        str(tmp_path / "src"),
        str(tmp_path / "out.zarr"),
        "--labels",
        "anomaly",
        "--anomaly-masks",
        str(tmp_path / "gt"),
    )
    assert code == 2 and "crack/1.png" in err and LINK_RULE.format("the ground-truth folder") in err, err
