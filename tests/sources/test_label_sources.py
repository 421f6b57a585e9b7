"""Label sources (COCO, label-image folders, anomaly folders, CSV), the folder source's class_folder and
the ``--labels KIND[:PATH]`` option: every scan on tiny generated files, every bad input by name and reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _exif import exif_block, png_with_exif

from dlpack.errors import OptionError, SourceError
from dlpack.options import BuildOptions, parse_labels
from dlpack.sources import (
    AnomalyFolderSource,
    CocoSource,
    CsvSource,
    FolderSource,
    MaskFolderSource,
    SourceScan,
    label_source,
)
from dlpack.sources.coco import coco_box


def _img(path: Path, w: int = 40, h: int = 30, value: int = 0, dtype: type = np.uint8) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.full((h, w), value, dtype))
    return path


def _errors(scan: SourceScan) -> dict[str, str]:
    return {e.path: e.reason for e in scan.errors}


# --- COCO -------------------------------------------------------------------------------------


def _coco(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "images": [
            {"id": 1, "file_name": "a.png", "width": 40, "height": 30},
            {"id": 2, "file_name": "sub/b.png", "width": 40, "height": 30},
            {"id": 3, "file_name": "empty.png", "width": 40, "height": 30},
        ],
        "annotations": [
            {"id": 10, "image_id": 1, "category_id": 7, "bbox": [1, 2, 10, 5], "iscrowd": 0},
            {"id": 11, "image_id": 1, "category_id": 3, "bbox": [0, 0, 4, 4], "iscrowd": 1},
            {"id": 12, "image_id": 2, "category_id": 3, "bbox": [5, 5, 3, 3]},
        ],
        "categories": [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}],
    }
    doc.update(changes)
    for entry in doc["images"]:
        if isinstance(entry, dict) and isinstance(entry.get("file_name"), str) and ".." not in entry["file_name"]:
            name = entry["file_name"]
            if not name.startswith("/") and not (tmp_path / "img" / name).exists():
                _img(tmp_path / "img" / name)
    return doc


def _coco_scan(tmp_path: Path, doc: dict[str, Any] | str, instance_masks: bool = False) -> SourceScan:
    (tmp_path / "img").mkdir(exist_ok=True)
    ann = tmp_path / "ann.json"
    ann.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return CocoSource(tmp_path / "img", ann, instance_masks).scan()


def test_coco_scan_converts_boxes_keeps_category_ids_and_images_without_boxes(tmp_path: Path) -> None:
    scan = _coco_scan(tmp_path, _coco(tmp_path))
    assert scan.classes == ("cat", "dog") and scan.class_ids == (3, 7)
    assert scan.task == "detection" and scan.labels == "coco" and not scan.errors and not scan.notes
    by_rel = {i.rel: i.annotations for i in scan.items}
    assert [i.rel for i in scan.items] == ["a.png", "sub/b.png", "empty.png"]
    a = by_rel["a.png"]
    assert a is not None
    assert a["boxes"] == [[1.0, 2.0, 11.0, 7.0], [0.0, 0.0, 4.0, 4.0]]
    assert a["box_labels"] == [1, 0] and a["iscrowd"] == [0, 1]
    assert a["image_size"] == [40, 30] and a["frame"] == "upright"
    assert "segmentation" not in a
    assert by_rel["empty.png"] == {
        "frame": "upright",
        "boxes": [],
        "box_labels": [],
        "iscrowd": [],
        "image_size": [40, 30],
    }
    json.dumps([i.annotations for i in scan.items])  # hashed into the source digest


def test_coco_segmentations_pass_through_and_ask_for_masks(tmp_path: Path) -> None:
    doc = _coco(tmp_path)
    poly = [[1, 1, 9, 1, 9, 9]]
    rle = {"size": [30, 40], "counts": "abc"}
    doc["annotations"][0]["segmentation"] = poly
    doc["annotations"][2]["segmentation"] = rle
    scan = _coco_scan(tmp_path, doc, instance_masks=True)
    by_rel = {i.rel: i.annotations for i in scan.items}
    assert by_rel["a.png"]["segmentation"] == [poly, None]  # type: ignore[index]
    assert by_rel["sub/b.png"]["segmentation"] == [rle]  # type: ignore[index]
    assert by_rel["empty.png"]["segmentation"] == []  # type: ignore[index]
    assert all(i.annotations["instance_masks"] is True for i in scan.items)  # type: ignore[index]


def test_coco_instance_masks_without_segmentations_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="instance masks need segmentations"):
        _coco_scan(tmp_path, _coco(tmp_path), instance_masks=True)


def test_coco_box_that_sticks_out_is_clipped_and_counted(tmp_path: Path) -> None:
    doc = _coco(tmp_path)
    doc["annotations"][0]["bbox"] = [-5, 20, 20, 20]
    scan = _coco_scan(tmp_path, doc)
    a = next(i for i in scan.items if i.rel == "a.png").annotations
    assert a is not None and a["boxes"][0] == [0.0, 20.0, 15.0, 30.0]
    assert len(scan.notes) == 1 and "clipped 1 box" in scan.notes[0] and "annotation id 10 (a.png)" in scan.notes[0]


@pytest.mark.parametrize(
    ("bbox", "reason"),
    [
        ([1, 1, 0, 5], "zero or negative size"),
        ([1, 1, 5, -2], "zero or negative size"),
        ([50, 1, 5, 5], "entirely outside the 40x30 image"),
        ([-10, 1, 10, 5], "entirely outside the 40x30 image"),
        ([1, 2, 3], "must be [x, y, width, height]"),
        ([1, 2, 3, "4"], "must be [x, y, width, height]"),
    ],
)
def test_coco_bad_box_refuses_its_image_naming_the_annotation(tmp_path: Path, bbox: list[Any], reason: str) -> None:
    doc = _coco(tmp_path)
    doc["annotations"][2]["bbox"] = bbox
    scan = _coco_scan(tmp_path, doc)
    errors = _errors(scan)
    assert list(errors) == ["sub/b.png"] and "sub/b.png" not in [i.rel for i in scan.items]
    assert "image id 2" in errors["sub/b.png"] and "annotation id 12" in errors["sub/b.png"]
    assert reason in errors["sub/b.png"]


def test_coco_box_helper_is_pure() -> None:
    assert coco_box([1, 2, 3, 4], 40, 30) == ([1.0, 2.0, 4.0, 6.0], False, None)
    assert coco_box([38, 28, 5, 5], 40, 30) == ([38.0, 28.0, 40.0, 30.0], True, None)


def test_coco_unknown_category_is_refused_per_image(tmp_path: Path) -> None:
    doc = _coco(tmp_path)
    doc["annotations"][1]["category_id"] = 99
    errors = _errors(_coco_scan(tmp_path, doc))
    assert list(errors) == ["a.png"]
    assert "annotation id 11" in errors["a.png"] and "unknown category id 99" in errors["a.png"]


def test_coco_missing_image_file_is_refused_per_image(tmp_path: Path) -> None:
    doc = _coco(tmp_path)
    doc["images"].append({"id": 4, "file_name": "gone.png", "width": 40, "height": 30})
    errors = _errors(_coco_scan(tmp_path, doc))
    assert list(errors) == ["gone.png"]
    assert "image id 4" in errors["gone.png"] and "file not found" in errors["gone.png"]


@pytest.mark.parametrize(
    ("name", "reason"),
    [("../outside.png", "leaves the image folder"), ("/etc/x.png", "absolute path"), ("a/../../x.png", "leaves")],
)
def test_coco_file_name_escaping_the_image_folder_is_refused(tmp_path: Path, name: str, reason: str) -> None:
    _img(tmp_path / "outside.png")
    doc = _coco(tmp_path)
    doc["images"].append({"id": 5, "file_name": name, "width": 40, "height": 30})
    errors = _errors(_coco_scan(tmp_path, doc))
    assert list(errors) == [name] and "image id 5" in errors[name] and reason in errors[name]


def test_coco_link_out_of_the_image_folder_is_refused(tmp_path: Path) -> None:
    _img(tmp_path / "outside.png")
    doc = _coco(tmp_path)
    (tmp_path / "img" / "link.png").symlink_to(tmp_path / "outside.png")
    doc["images"].append({"id": 5, "file_name": "link.png", "width": 40, "height": 30})
    errors = _errors(_coco_scan(tmp_path, doc))
    assert "outside the image folder" in errors["link.png"]


@pytest.mark.parametrize(
    ("key", "changes", "message"),
    [
        ("duplicate image id", {"id": 1}, "image id 1 is listed twice"),
        ("duplicate annotation id", None, "annotation id 10 is listed twice"),
    ],
)
def test_coco_duplicate_ids_are_source_errors(
    tmp_path: Path, key: str, changes: dict[str, Any] | None, message: str
) -> None:
    doc = _coco(tmp_path)
    if changes is not None:
        doc["images"][1].update(changes)
    else:
        doc["annotations"][1]["id"] = 10
    with pytest.raises(SourceError, match=message):
        _coco_scan(tmp_path, doc)


def test_coco_duplicate_category_and_file_name_are_source_errors(tmp_path: Path) -> None:
    doc = _coco(tmp_path)
    doc["categories"].append({"id": 7, "name": "wolf"})
    with pytest.raises(SourceError, match="category id 7 is listed twice"):
        _coco_scan(tmp_path, doc)
    doc = _coco(tmp_path)
    doc["images"][1]["file_name"] = "./a.png"
    with pytest.raises(SourceError, match="image ids 1 and 2 both name the file 'a.png'"):
        _coco_scan(tmp_path, doc)


def test_coco_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"ann\.json' is not valid JSON: .* at line 2, column 16"):
        _coco_scan(tmp_path, '{"images": [],\n "categories": ]}')


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("annotations"), "has no 'annotations' list"),
        (lambda d: d.update(images={}), "'images' must be a list"),
        (lambda d: d["images"][0].pop("id"), r"images\[0\] has no integer 'id'"),
        (lambda d: d["images"][0].pop("file_name"), "image id 1 has no 'file_name'"),
        (lambda d: d["annotations"][0].pop("id"), r"annotations\[0\] has no integer 'id'"),
        (lambda d: d["annotations"][0].pop("image_id"), "annotation id 10 has no integer 'image_id'"),
        (lambda d: d["annotations"][0].update(image_id=42), "annotation id 10 names image id 42"),
        (lambda d: d["categories"][0].pop("name"), "category id 7 has no 'name'"),
    ],
)
def test_coco_missing_required_keys_are_source_errors(tmp_path: Path, edit: Any, message: str) -> None:
    doc = _coco(tmp_path)
    edit(doc)
    with pytest.raises(SourceError, match=message):
        _coco_scan(tmp_path, doc)


def test_coco_missing_bbox_size_or_bad_values_are_refused_per_image(tmp_path: Path) -> None:
    doc = _coco(tmp_path)
    del doc["annotations"][2]["bbox"]
    doc["annotations"][0]["iscrowd"] = 2
    del doc["images"][2]["width"]
    errors = _errors(_coco_scan(tmp_path, doc))
    assert "annotation id 12 has no 'bbox'" in errors["sub/b.png"]
    assert "annotation id 10: 'iscrowd' must be 0 or 1" in errors["a.png"]
    assert "image id 3: 'width' and 'height' must be positive integers" in errors["empty.png"]


def test_coco_bad_segmentation_is_refused_per_image(tmp_path: Path) -> None:
    doc = _coco(tmp_path)
    doc["annotations"][2]["segmentation"] = [[1, 2, 3]]
    errors = _errors(_coco_scan(tmp_path, doc))
    assert "annotation id 12" in errors["sub/b.png"] and "polygons must be lists" in errors["sub/b.png"]


def test_coco_frame_is_file_when_the_entry_matches_only_the_raw_size(tmp_path: Path) -> None:
    # A 40x30 PNG tagged orientation 6 (rotate 90) is 30x40 upright.
    ok, buf = cv2.imencode(".png", np.zeros((30, 40), np.uint8))
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "r.png").write_bytes(png_with_exif(buf.tobytes(), exif_block(6)))
    doc = {
        "images": [
            {"id": 1, "file_name": "r.png", "width": 40, "height": 30},
            {"id": 2, "file_name": "u.png", "width": 30, "height": 40},
            {"id": 3, "file_name": "x.png", "width": 20, "height": 20},
        ],
        "annotations": [],
        "categories": [{"id": 1, "name": "a"}],
    }
    (tmp_path / "img" / "u.png").write_bytes((tmp_path / "img" / "r.png").read_bytes())
    _img(tmp_path / "img" / "x.png")
    scan = _coco_scan(tmp_path, doc)
    frames = {i.rel: i.annotations["frame"] for i in scan.items}  # type: ignore[index]
    assert frames == {"r.png": "file", "u.png": "upright"}
    errors = _errors(scan)
    assert "image id 3: the COCO entry says 20x20 but the file is 40x30" in errors["x.png"]


# --- label-image folders -----------------------------------------------------------------------


def test_mask_folder_matches_by_path_without_extension(tmp_path: Path) -> None:
    _img(tmp_path / "img/a/b/one.jpg")
    _img(tmp_path / "img/two.png")
    _img(tmp_path / "img/masks/two.png", value=1)  # masks_dir inside the image folder: not an image
    _img(tmp_path / "img/masks/a/b/one.png", value=2)
    _img(tmp_path / "img/masks/a/b/stray.png", value=2, dtype=np.uint16)
    scan = MaskFolderSource(tmp_path / "img", tmp_path / "img/masks").scan()
    assert [(i.rel, i.annotations) for i in scan.items] == [
        ("a/b/one.jpg", {"mask": "a/b/one.png"}),
        ("two.png", {"mask": "two.png"}),
    ]
    assert scan.task == "segmentation" and scan.label_root == str(tmp_path / "img/masks")
    assert scan.classes == () and scan.class_ids == () and not scan.errors and scan.excluded == ()
    assert len(scan.notes) == 1 and "1 label image(s)" in scan.notes[0] and "a/b/stray.png" in scan.notes[0]


def test_mask_folder_missing_or_two_masks_name_both_paths(tmp_path: Path) -> None:
    _img(tmp_path / "img/one.png")
    _img(tmp_path / "img/two.png")
    _img(tmp_path / "gt/two.png")
    _img(tmp_path / "gt/two.tif")
    scan = MaskFolderSource(tmp_path / "img", tmp_path / "gt").scan()
    errors = _errors(scan)
    assert f"{tmp_path / 'gt'}/one.<png" in errors["one.png"] and "no label image" in errors["one.png"]
    assert (
        "two label images" in errors["two.png"]
        and "gt/two.png" in errors["two.png"]
        and "gt/two.tif" in errors["two.png"]
    )
    assert scan.items == ()


@pytest.mark.parametrize(
    ("name", "text", "classes", "ids"),
    [
        ("classes.txt", "background\ncrack\nhole\n\n", ("background", "crack", "hole"), (0, 1, 2)),
        ("classes.json", '["bg", "x"]', ("bg", "x"), (0, 1)),
        ("classes.json", '{"20": "hole", "5": "crack", "0": "bg"}', ("bg", "crack", "hole"), (0, 5, 20)),
    ],
)
def test_mask_folder_class_list(
    tmp_path: Path, name: str, text: str, classes: tuple[str, ...], ids: tuple[int, ...]
) -> None:
    _img(tmp_path / "img/one.png")
    _img(tmp_path / "gt/one.png")
    (tmp_path / "gt" / name).write_text(text)
    scan = MaskFolderSource(tmp_path / "img", tmp_path / "gt").scan()
    assert scan.classes == classes and scan.class_ids == ids


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"classes.txt": "a\n\nb\n"}, "line 2 is empty"),
        ({"classes.txt": "a\na\n"}, "ids 0 and 1 have the same name 'a'"),
        ({"classes.json": '{"x": "a"}'}, "key 'x' is not an integer class id"),
        ({"classes.json": "[1, 2]"}, "must be a list of names"),
        ({"classes.json": "[1,"}, "is not valid JSON"),
        ({"classes.txt": "a\n", "classes.json": '["a"]'}, "both classes.txt and classes.json"),
    ],
)
def test_mask_folder_bad_class_list_is_a_source_error(tmp_path: Path, files: dict[str, str], message: str) -> None:
    _img(tmp_path / "img/one.png")
    _img(tmp_path / "gt/one.png")
    for name, text in files.items():
        (tmp_path / "gt" / name).write_text(text)
    with pytest.raises(SourceError, match=message):
        MaskFolderSource(tmp_path / "img", tmp_path / "gt").scan()


def test_mask_folder_missing_folder_is_a_source_error(tmp_path: Path) -> None:
    _img(tmp_path / "img/one.png")
    with pytest.raises(SourceError, match="label folder .* does not exist"):
        MaskFolderSource(tmp_path / "img", tmp_path / "nope").scan()
    with pytest.raises(SourceError, match="is the image folder itself"):
        MaskFolderSource(tmp_path / "img", tmp_path / "img").scan()


# --- anomaly folders -------------------------------------------------------------------------


def _mvtec(root: Path) -> None:
    _img(root / "train/good/000.png")
    _img(root / "train/good/001.png")
    _img(root / "test/good/000.png")
    _img(root / "test/crack/000.png")
    _img(root / "test/Scratch/007.png")
    _img(root / "ground_truth/crack/000_mask.png", value=255)
    _img(root / "ground_truth/hole/003_mask.png", value=255)


def test_anomaly_folders_mvtec_layout(tmp_path: Path) -> None:
    _mvtec(tmp_path / "bottle")
    scan = AnomalyFolderSource(tmp_path / "bottle", tmp_path / "bottle/ground_truth").scan()
    got = [(i.rel, i.label, i.split, i.annotations) for i in scan.items]
    assert got == [
        ("test/Scratch/007.png", "nok", "test", {"defect": "Scratch"}),
        ("test/crack/000.png", "nok", "test", {"defect": "crack", "anomaly_mask": "crack/000_mask.png"}),
        ("test/good/000.png", "ok", "test", {"defect": "good"}),
        ("train/good/000.png", "ok", "train", {"defect": "good"}),
        ("train/good/001.png", "ok", "train", {"defect": "good"}),
    ]
    assert scan.classes == ("ok", "nok") and scan.class_ids == (0, 1) and scan.task == "anomaly"
    assert scan.label_root == str(tmp_path / "bottle/ground_truth") and not scan.errors
    assert len(scan.notes) == 1 and "hole/003_mask.png" in scan.notes[0]


def test_anomaly_ok_folder_any_case_and_ground_truth_by_name(tmp_path: Path) -> None:
    _img(tmp_path / "d/OK/1.png")
    _img(tmp_path / "d/dent/2.jpg")
    _img(tmp_path / "gt/dent/2.png")
    scan = AnomalyFolderSource(tmp_path / "d", tmp_path / "gt").scan()
    assert [(i.label, i.annotations) for i in scan.items] == [
        ("ok", {"defect": "OK"}),
        ("nok", {"defect": "dent", "anomaly_mask": "dent/2.png"}),
    ]
    assert scan.label_root == str(tmp_path / "gt")


def test_anomaly_images_without_a_folder_are_named(tmp_path: Path) -> None:
    _img(tmp_path / "d/good/1.png")
    _img(tmp_path / "d/loose.png")
    with pytest.raises(SourceError, match=r"1 image\(s\) sit directly in the folder of .*: loose\.png"):
        AnomalyFolderSource(tmp_path / "d").scan()


def test_anomaly_ground_truth_inside_without_masks_dir_names_the_flag(tmp_path: Path) -> None:
    _mvtec(tmp_path / "bottle")
    with pytest.raises(SourceError, match="--labels anomaly --anomaly-masks DIR"):
        AnomalyFolderSource(tmp_path / "bottle").scan()


# --- CSV -------------------------------------------------------------------------------------


def _csv(tmp_path: Path, text: str) -> SourceScan:
    (tmp_path / "img").mkdir(exist_ok=True)
    (tmp_path / "t.csv").write_text(text, encoding="utf-8")
    return CsvSource(tmp_path / "img", tmp_path / "t.csv").scan()


def test_csv_columns_any_order_labels_sorted_splits_kept(tmp_path: Path) -> None:
    _img(tmp_path / "img/a.png")
    _img(tmp_path / "img/sub/b.png")
    scan = _csv(tmp_path, "Split,label,path\nTrain,zebra,a.png\n,ant,sub/b.png\n")
    assert [(i.rel, i.label, i.split) for i in scan.items] == [("a.png", "zebra", "Train"), ("sub/b.png", "ant", None)]
    assert scan.classes == ("ant", "zebra") and scan.labels == "csv" and scan.task == "classification"


def test_csv_missing_file_and_escaping_paths_name_the_line(tmp_path: Path) -> None:
    _img(tmp_path / "img/a.png")
    _img(tmp_path / "x.png")
    scan = _csv(tmp_path, "path,label\na.png,cat\ngone.png,cat\n../x.png,cat\n/abs/x.png,cat\n")
    errors = _errors(scan)
    assert "line 3" in errors["gone.png"] and "file not found" in errors["gone.png"]
    assert "line 4" in errors["../x.png"] and "leaves the image folder" in errors["../x.png"]
    assert "line 5" in errors["/abs/x.png"] and "absolute path" in errors["/abs/x.png"]
    assert [i.rel for i in scan.items] == ["a.png"]


def test_csv_empty_label_is_refused_per_row(tmp_path: Path) -> None:
    _img(tmp_path / "img/a.png")
    _img(tmp_path / "img/b.png")
    errors = _errors(_csv(tmp_path, "path,label\na.png,cat\nb.png, \n"))
    assert errors == {"b.png": f"line 3 of {tmp_path / 't.csv'}: the label is empty"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty; it needs a header row"),
        ("a.png,cat\n", "unknown column\\(s\\) 'a.png', 'cat'; the first row must name the columns"),
        ("path,label,weight\n", "unknown column\\(s\\) 'weight'"),
        ("path,lable\n", "unknown column\\(s\\) 'lable'"),
        ("path,split\n", "no 'path' and 'label' columns"),
        ("path,label,label\n", "a column named twice"),
        ("path,label\na.png,cat\na.png,dog\n", "lines 2 and 3 both name 'a.png'"),
        ("path,label\na.png,cat,extra\n", "line 2 has 3 field"),
    ],
)
def test_csv_bad_file_is_a_source_error(tmp_path: Path, text: str, message: str) -> None:
    _img(tmp_path / "img/a.png")
    with pytest.raises(SourceError, match=message):
        _csv(tmp_path, text)


# --- folder source: class_folder -----------------------------------------------------------------


def test_folder_class_folder_last_is_the_images_own_folder(tmp_path: Path) -> None:
    _img(tmp_path / "src/train/cat/lot_7/x.png")
    _img(tmp_path / "src/train/dog/y.png")
    _img(tmp_path / "src/test/cat/z.png")
    top = FolderSource(tmp_path / "src").scan()
    last = FolderSource(tmp_path / "src", class_folder="last").scan()
    assert [i.label for i in top.items] == ["cat", "cat", "dog"] and top.task == "classification"
    assert [(i.label, i.split) for i in last.items] == [("cat", "test"), ("lot_7", "train"), ("dog", "train")]
    assert last.classes == ("cat", "dog", "lot_7")
    with pytest.raises(OptionError, match="class_folder must be one of top, last"):
        FolderSource(tmp_path / "src", class_folder="first")


def test_unlabelled_folder_has_task_none(tmp_path: Path) -> None:
    _img(tmp_path / "src/x.png")
    assert FolderSource(tmp_path / "src").scan().task == "none"


def test_label_folder_refusal_names_the_label_sources(tmp_path: Path) -> None:
    _img(tmp_path / "src/cat/x.png")
    _img(tmp_path / "src/masks/x.png")
    with pytest.raises(SourceError) as info:
        FolderSource(tmp_path / "src").scan()
    assert "--exclude 'masks'" in str(info.value) and "--labels masks:DIR" in str(info.value)
    assert "--labels anomaly --anomaly-masks DIR" in str(info.value)


# --- --labels KIND[:PATH] and the options ----------------------------------------------------------


def test_parse_labels() -> None:
    assert parse_labels("auto") == ("auto", None)
    assert parse_labels("coco:a:b.json") == ("coco", "a:b.json")
    assert parse_labels("anomaly") == ("anomaly", None)
    with pytest.raises(OptionError, match="unknown kind 'voc'"):
        parse_labels("voc:x.xml")
    with pytest.raises(OptionError, match="labels masks needs a path: --labels masks:DIR"):
        parse_labels("masks")
    with pytest.raises(OptionError, match="labels coco needs a path"):
        parse_labels("coco: ")
    with pytest.raises(OptionError, match="takes no path.*--anomaly-masks DIR"):
        parse_labels("anomaly:gt")


def test_build_options_check_the_label_options() -> None:
    assert BuildOptions(labels="coco:x.json", instance_masks=True).label_kind == "coco"
    assert BuildOptions(labels="csv:t.csv").label_path == "t.csv"
    with pytest.raises(OptionError, match="unknown kind"):
        BuildOptions(labels="folder")
    with pytest.raises(OptionError, match="anomaly_masks only applies to labels=anomaly"):
        BuildOptions(anomaly_masks="gt")
    with pytest.raises(OptionError, match="instance_masks only applies to labels=coco"):
        BuildOptions(labels="masks:gt", instance_masks=True)
    with pytest.raises(OptionError, match="class_folder applies to class folders"):
        BuildOptions(labels="anomaly", class_folder="last")
    with pytest.raises(OptionError, match="class_folder must be one of top, last"):
        BuildOptions(class_folder="middle")  # type: ignore[arg-type]


def test_label_source_builds_each_kind(tmp_path: Path) -> None:
    src = tmp_path / "src"
    folder = label_source(src, BuildOptions(labels="folders", class_folder="last", exclude=("x*",)))
    assert isinstance(folder, FolderSource) and folder.class_folder == "last" and folder.exclude == ("x*",)
    coco = label_source(src, BuildOptions(labels="coco:a.json", instance_masks=True))
    assert isinstance(coco, CocoSource) and coco.annotation_file == Path("a.json") and coco.instance_masks
    masks = label_source(src, BuildOptions(labels="masks:gt"))
    assert isinstance(masks, MaskFolderSource) and masks.masks_dir == Path("gt") and masks.root == src
    anomaly = label_source(src, BuildOptions(labels="anomaly", anomaly_masks="gt"))
    assert isinstance(anomaly, AnomalyFolderSource) and anomaly.masks_dir == Path("gt")
    csv = label_source(src, BuildOptions(labels="csv:t.csv"))
    assert isinstance(csv, CsvSource) and csv.csv_file == Path("t.csv")


def test_label_source_dldataset(tmp_path: Path) -> None:
    try:
        import dlpack.halcon.source  # noqa: F401
    except ImportError:
        with pytest.raises(OptionError, match="--labels dldataset is not available"):
            label_source(tmp_path, BuildOptions(labels="dldataset:d.json"))
    else:
        source = label_source(tmp_path, BuildOptions(labels="dldataset:d.json"))
        assert type(source).__name__ == "DLDatasetSource"


def test_cli_has_the_label_flags() -> None:
    import argparse

    from dlpack.cli import add_option_arguments

    parser = argparse.ArgumentParser()
    add_option_arguments(parser, BuildOptions)
    args = parser.parse_args(
        ["--labels", "anomaly", "--anomaly-masks", "gt", "--class-folder", "top", "--instance-masks"]
    )
    assert args.labels == "anomaly" and args.anomaly_masks == "gt" and args.instance_masks is True
    assert args.class_folder == "top"
