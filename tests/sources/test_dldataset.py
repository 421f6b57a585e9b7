"""A HALCON DLDataset (JSON) as input: the source's scan per task, its refusals, and the read-only view."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

import dlpack
from dlpack.bench import run_bench
from dlpack.cli import main
from dlpack.errors import BadInputsError, OptionError, SourceError, StoreError
from dlpack.halcon.source import DLDatasetSource, read_dldataset
from dlpack.halcon.view import DLDatasetView, is_dldataset
from dlpack.sources import Source
from dlpack.sources.decode import TargetSpec

Capsys = pytest.CaptureFixture[str]


def _png(path: Path, h: int = 12, w: int = 16, value: int = 0, gray: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(value)
    shape = (h, w) if gray else (h, w, 3)
    img = np.full(shape, value, np.uint8) if gray else rng.integers(0, 256, shape, dtype=np.uint8)
    assert cv2.imwrite(str(path), img)


def _write(folder: Path, doc: dict[str, Any], images: Sequence[str] = (), name: str = "dataset.json") -> Path:
    """Write ``doc`` as ``folder/name`` and a tiny PNG for each of ``images`` (paths below ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, rel in enumerate(images):
        _png(folder / rel, value=k + 1)
    path = folder / name
    path.write_text(json.dumps(doc))
    return path


def _classification(image_dir: str = "images") -> dict[str, Any]:
    return {
        "image_dir": image_dir,
        "class_names": ["scratch", "good"],
        "class_ids": [5, 2],
        "samples": [
            {"image_id": 10, "image_file_name": "a.png", "image_label_id": 2, "split": "train"},
            {"image_id": 11, "image_file_name": "sub/b.png", "image_label_id": 5, "split": "validation"},
            {"image_id": 12, "image_file_name": "c.png", "image_label_id": 2, "split": "test"},
        ],
    }


CLS_IMAGES = ["images/a.png", "images/sub/b.png", "images/c.png"]


def _detection() -> dict[str, Any]:
    return {
        "image_dir": "images",
        "class_names": ["nut", "bolt"],
        "class_ids": [3, 7],
        "samples": [
            {
                "image_id": 1,
                "image_file_name": "a.png",
                "split": "train",
                "bbox_label_id": [7, 3],
                "bbox_row1": [1.5, 0.0],
                "bbox_col1": [2.5, -0.5],
                "bbox_row2": [5.5, 3.0],
                "bbox_col2": [9.5, 4.0],
            },
            {
                "image_id": 2,
                "image_file_name": "b.png",
                "split": "train",
                "bbox_label_id": [],
                "bbox_row1": [],
                "bbox_col1": [],
                "bbox_row2": [],
                "bbox_col2": [],
            },
            # A one-box tuple written as JSON scalars.
            {
                "image_id": 3,
                "image_file_name": "c.png",
                "split": "test",
                "bbox_label_id": 3,
                "bbox_row1": 0.5,
                "bbox_col1": 1.5,
                "bbox_row2": 2.5,
                "bbox_col2": 3.5,
            },
        ],
    }


DET_IMAGES = ["images/a.png", "images/b.png", "images/c.png"]


def _segmentation(tmp_path: Path) -> Path:
    folder = tmp_path / "seg"
    doc = {
        "image_dir": "images",
        "segmentation_dir": "labels",
        "class_names": ["background", "crack"],
        "class_ids": [0, 4],
        "samples": [
            {"image_id": 0, "image_file_name": "a.png", "segmentation_file_name": "a.png", "split": "train"},
            {"image_id": 1, "image_file_name": "b.png", "segmentation_file_name": "b.png", "split": "train"},
        ],
    }
    path = _write(folder, doc, ["images/a.png", "images/b.png"])
    for name in ("a.png", "b.png"):
        mask = np.zeros((12, 16), np.uint8)
        mask[2:6, 4:12] = 4
        (folder / "labels").mkdir(exist_ok=True)
        assert cv2.imwrite(str(folder / "labels" / name), mask)
    return path


def _anomaly(tmp_path: Path) -> Path:
    folder = tmp_path / "ad"
    doc = {
        "image_dir": "",
        "anomaly_dir": "gt",
        "class_names": ["ok", "nok"],
        "class_ids": [0, 1],
        "samples": [
            {"image_id": 0, "image_file_name": "good/0.png", "anomaly_label": "ok", "split": "train"},
            {
                "image_id": 1,
                "image_file_name": "bad/1.png",
                "anomaly_label": "nok",
                "anomaly_file_name": "bad/1.png",
                "split": "test",
            },
        ],
    }
    path = _write(folder, doc, ["good/0.png", "bad/1.png"])
    _png(folder / "gt" / "bad" / "1.png", gray=True, value=255)
    return path


# ---------------------------------------------------------------- the scan, per task


def test_classification_keeps_class_ids_and_names_in_the_given_order_and_the_splits(tmp_path: Path) -> None:
    path = _write(tmp_path / "ds", _classification(), CLS_IMAGES)
    source = DLDatasetSource(path)
    assert isinstance(source, Source)
    scan = source.scan()
    assert scan.errors == ()
    assert (scan.classes, scan.class_ids, scan.task, scan.labels) == (
        ("scratch", "good"),
        (5, 2),
        "classification",
        "dldataset",
    )
    assert [(it.rel, it.label, it.split) for it in scan.items] == [
        ("a.png", "good", "train"),
        ("sub/b.png", "scratch", "validation"),
        ("c.png", "good", "test"),
    ]
    assert source.root == tmp_path / "ds" / "images"
    assert all((source.root / it.rel).is_file() for it in scan.items)


def test_detection_boxes_become_corner_based_and_labels_class_indices(tmp_path: Path) -> None:
    scan = DLDatasetSource(_write(tmp_path / "ds", _detection(), DET_IMAGES)).scan()
    assert scan.errors == () and scan.task == "detection" and scan.class_ids == (3, 7)
    a, b, c = (it.annotations for it in scan.items)
    assert a is not None and b is not None and c is not None
    # x_min = col1 + 0.5, y_min = row1 + 0.5, x_max = col2 + 0.5, y_max = row2 + 0.5
    assert a == {"frame": "file", "boxes": [[3.0, 2.0, 10.0, 6.0], [0.0, 0.5, 4.5, 3.5]], "box_labels": [1, 0]}
    assert b == {"frame": "file", "boxes": [], "box_labels": []}
    assert c == {"frame": "file", "boxes": [[2.0, 1.0, 4.0, 3.0]], "box_labels": [0]}
    assert all(it.label is None for it in scan.items)


def test_segmentation_items_name_their_label_image_under_segmentation_dir(tmp_path: Path) -> None:
    path = _segmentation(tmp_path)
    scan = DLDatasetSource(path).scan()
    assert scan.errors == () and scan.task == "segmentation" and scan.class_ids == (0, 4)
    assert scan.label_root == str(tmp_path / "seg" / "labels")
    assert [it.annotations for it in scan.items] == [
        {"frame": "file", "mask": "a.png"},
        {"frame": "file", "mask": "b.png"},
    ]


def test_anomaly_items_are_ok_or_nok_with_optional_ground_truth(tmp_path: Path) -> None:
    scan = DLDatasetSource(_anomaly(tmp_path)).scan()
    assert scan.errors == () and scan.task == "anomaly"
    assert (scan.classes, scan.class_ids, scan.label_root) == (("ok", "nok"), (0, 1), str(tmp_path / "ad" / "gt"))
    assert [(it.rel, it.label, it.split, it.annotations) for it in scan.items] == [
        ("good/0.png", "ok", "train", {"frame": "file"}),
        ("bad/1.png", "nok", "test", {"frame": "file", "anomaly_mask": "bad/1.png"}),
    ]


def test_image_dir_absolute_relative_or_empty_and_images_root(tmp_path: Path) -> None:
    elsewhere = tmp_path / "photos"
    for rel in ("a.png", "sub/b.png", "c.png"):
        _png(elsewhere / rel)
    absolute = _write(tmp_path / "abs", _classification(str(elsewhere)))
    assert DLDatasetSource(absolute).root == elsewhere
    assert len(DLDatasetSource(absolute).scan().items) == 3
    # '' is the JSON file's folder; a relative image_dir starts there, not at the working directory.
    empty = _write(tmp_path / "here", _classification(""), ["a.png", "sub/b.png", "c.png"])
    assert DLDatasetSource(empty).root == tmp_path / "here"
    assert len(DLDatasetSource(empty).scan().items) == 3
    moved = _write(tmp_path / "moved", _classification("/no/such/folder"))
    with pytest.raises(SourceError, match="image_dir .* is not a folder"):
        DLDatasetSource(moved).scan()
    scan = DLDatasetSource(moved, images_root=elsewhere).scan()
    assert [it.rel for it in scan.items] == ["a.png", "sub/b.png", "c.png"]


def test_a_folder_holding_dataset_json_is_read_like_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "ds", _classification(), CLS_IMAGES)
    assert read_dldataset(tmp_path / "ds") == read_dldataset(path)
    assert DLDatasetSource(tmp_path / "ds").scan().items == DLDatasetSource(path).scan().items
    with pytest.raises(SourceError, match="folder without dataset.json"):
        read_dldataset(tmp_path)


# ---------------------------------------------------------------- bad input: one sample


def _one_error(tmp_path: Path, doc: dict[str, Any], images: list[str]) -> str:
    scan = DLDatasetSource(_write(tmp_path / "bad", doc, images)).scan()
    assert len(scan.errors) == 1, scan.errors
    return str(scan.errors[0])


def test_an_unknown_sample_key_names_the_sample_and_the_allowed_keys(tmp_path: Path) -> None:
    doc = _classification()
    doc["samples"][1]["image_label_name"] = "scratch"
    err = _one_error(tmp_path, doc, CLS_IMAGES)
    assert err.startswith("sub/b.png: image_id 11: unknown key(s) 'image_label_name' for a classification DLDataset")
    assert "image_label_id" in err


def test_a_box_key_in_a_classification_sample_is_unknown_there(tmp_path: Path) -> None:
    doc = _detection()
    doc["samples"][0]["image_label_id"] = 3
    with pytest.raises(SourceError, match=r"mixes the keys of several tasks: classification \(image_id 1 \(a.png\)\)"):
        DLDatasetSource(_write(tmp_path / "bad", doc, DET_IMAGES)).scan()


@pytest.mark.parametrize(
    ("key", "values", "reason"),
    [
        ("bbox_row2", [1.5, 3.0], "box 0: row1 1.5 >= row2 1.5"),
        ("bbox_col2", [9.5, -0.5], "box 1: col1 -0.5 >= col2 -0.5"),
        ("bbox_label_id", [7, 9], "box 1: bbox_label_id 9 is not one of the class_ids [3, 7]"),
        ("bbox_row1", [1.5], "box tuples of different lengths: bbox_label_id 2, bbox_row1 1, bbox_col1 2"),
        ("bbox_col1", [2.5, "x"], "box 1: coordinates must be finite numbers"),
    ],
)
def test_a_bad_box_names_the_sample_and_the_box(tmp_path: Path, key: str, values: list[Any], reason: str) -> None:
    doc = _detection()
    doc["samples"][0][key] = values
    err = _one_error(tmp_path, doc, DET_IMAGES)
    assert err.startswith(f"a.png: image_id 1: {reason}")


def test_a_sample_with_some_box_keys_only_is_refused(tmp_path: Path) -> None:
    doc = _detection()
    del doc["samples"][2]["bbox_col2"]
    assert _one_error(tmp_path, doc, DET_IMAGES).startswith("c.png: image_id 3: has bbox_label_id, bbox_row1")


def test_a_class_id_not_in_class_ids_is_refused(tmp_path: Path) -> None:
    doc = _classification()
    doc["samples"][2]["image_label_id"] = 3
    err = _one_error(tmp_path, doc, CLS_IMAGES)
    assert err == "c.png: image_id 12: image_label_id 3 is not one of the class_ids [5, 2]"


def test_missing_files_name_the_sample_and_the_path(tmp_path: Path) -> None:
    err = _one_error(tmp_path, _classification(), CLS_IMAGES[:2])
    assert err.startswith("c.png: image_id 12: the image file ") and err.endswith("c.png' does not exist")
    seg = _segmentation(tmp_path)
    (seg.parent / "labels" / "b.png").unlink()
    (e,) = DLDatasetSource(seg).scan().errors
    assert e.path == "b.png" and "label image" in e.reason and "labels/b.png' does not exist" in e.reason


@pytest.mark.parametrize("name", ["../outside.png", "/etc/passwd", "sub/../../x.png", "", 7])
def test_file_names_that_leave_image_dir_are_refused(tmp_path: Path, name: Any) -> None:
    doc = _classification()
    doc["samples"][0]["image_file_name"] = name
    _png(tmp_path / "outside.png")
    err = _one_error(tmp_path, doc, CLS_IMAGES)
    assert "image_id 10: image_file_name" in err
    assert "is not a relative path inside image_dir" in err or "must be a non-empty string" in err


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"split": "val"}, "split 'val' is not one of train, validation, test"),
        ({"image_id": "10"}, "image_id must be an integer, got '10'"),
        ({"image_label_id": None}, "image_label_id None is not one of the class_ids"),
    ],
)
def test_bad_sample_values_are_refused(tmp_path: Path, change: dict[str, Any], reason: str) -> None:
    doc = _classification()
    doc["samples"][0].update(change)
    assert reason in _one_error(tmp_path, doc, CLS_IMAGES)


def test_one_image_used_by_two_samples_is_refused_at_the_second(tmp_path: Path) -> None:
    doc = _classification()
    doc["samples"][2]["image_file_name"] = "./a.png"
    err = _one_error(tmp_path, doc, CLS_IMAGES)
    assert err == "./a.png: image_id 12: the same image file as image_id 10; each image is one sample"


def test_a_bad_anomaly_label_is_refused(tmp_path: Path) -> None:
    path = _anomaly(tmp_path)
    doc = json.loads(path.read_text())
    doc["samples"][0]["anomaly_label"] = "good"
    path.write_text(json.dumps(doc))
    (e,) = DLDatasetSource(path).scan().errors
    assert str(e) == "good/0.png: image_id 0: anomaly_label must be 'ok' or 'nok', got 'good'"


# ---------------------------------------------------------------- bad input: the whole source


def test_oriented_boxes_are_not_supported_yet(tmp_path: Path) -> None:
    doc = _detection()
    for s in doc["samples"]:
        for key in ("bbox_row1", "bbox_col1", "bbox_row2", "bbox_col2"):
            del s[key]
        s.update(bbox_row=[4.0], bbox_col=[4.0], bbox_phi=[0.3], bbox_length1=[2.0], bbox_length2=[1.0])
    with pytest.raises(SourceError, match=r"image_id 1 \(a.png\) has oriented boxes .*not supported yet \(3 sample"):
        DLDatasetSource(_write(tmp_path / "bad", doc, DET_IMAGES)).scan()


def test_a_duplicate_image_id_names_both_samples(tmp_path: Path) -> None:
    doc = _classification()
    doc["samples"][2]["image_id"] = 10
    with pytest.raises(
        SourceError, match=r"image_id 10 is used twice, by image_id 10 \(a.png\) and samples\[2\] \(c.png\)"
    ):
        DLDatasetSource(_write(tmp_path / "bad", doc, CLS_IMAGES)).scan()


def test_malformed_json_names_the_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "dataset.json"
    path.write_text('{"image_dir": "",\n "samples": [}\n')
    with pytest.raises(SourceError, match="is not valid JSON: .* at line 2, column 14"):
        DLDatasetSource(path).scan()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"class_ids": [5]}, "2 class_names but 1 class_ids"),
        ({"class_ids": [5, 5]}, "class_ids repeats 5"),
        ({"class_names": ["a", "a"]}, "class_names repeats 'a'"),
        ({"class_ids": [5, True]}, "class_ids must be integers"),
        ({"samples": []}, "holds no samples"),
        ({"samples": [3]}, r"samples\[0\] must be an object"),
        ({"image_dirs": "x"}, "top-level key.* 'image_dirs'"),
        ({"class_names": None}, "class_names must be non-empty strings"),
    ],
)
def test_unusable_datasets_are_refused_as_a_whole(tmp_path: Path, change: dict[str, Any], reason: str) -> None:
    doc = {**_classification(), **change}
    with pytest.raises(SourceError, match=reason):
        DLDatasetSource(_write(tmp_path / "bad", doc, CLS_IMAGES)).scan()


def test_label_folders_a_task_needs_must_be_named(tmp_path: Path) -> None:
    path = _segmentation(tmp_path)
    doc = json.loads(path.read_text())
    del doc["segmentation_dir"]
    path.write_text(json.dumps(doc))
    with pytest.raises(SourceError, match="no segmentation_dir"):
        DLDatasetSource(path).scan()


# ---------------------------------------------------------------- read-only open, loader, bench


def test_open_reads_a_dldataset_folder_in_place(tmp_path: Path) -> None:
    path = _write(tmp_path / "ds", _detection(), DET_IMAGES)
    for target in (tmp_path / "ds", path):
        assert is_dldataset(target)
        with dlpack.open(target) as ds:
            assert isinstance(ds, DLDatasetView)
            assert (len(ds), ds.classes, ds.class_ids, ds.task, ds.splits) == (
                3,
                ("nut", "bolt"),
                (3, 7),
                "detection",
                ("test", "train"),
            )
            s = ds[0]
            expected = cv2.cvtColor(cv2.imread(str(tmp_path / "ds" / "images" / "a.png")), cv2.COLOR_BGR2RGB)
            np.testing.assert_array_equal(s["image"], expected)
            assert (s["label"], s["index"], s["source"], s["split"]) == (-1, 0, "a.png", "train")
            np.testing.assert_array_equal(s["boxes"], np.array([[3, 2, 10, 6], [0, 0.5, 4.5, 3.5]], np.float32))
            np.testing.assert_array_equal(s["box_labels"], [1, 0])
            assert ds[-1]["boxes"].shape == (1, 4) and ds[1]["boxes"].shape == (0, 4)
            np.testing.assert_array_equal(ds.indices("train"), [0, 1])


def test_the_loader_reads_a_split_of_a_classification_set(tmp_path: Path) -> None:
    with dlpack.open(_write(tmp_path / "ds", _classification(), CLS_IMAGES)) as ds:
        assert ds.classes == ("scratch", "good") and [ds[i]["label"] for i in range(3)] == [1, 0, 1]
        batches = list(ds.loader(batch_size=2, shuffle=False, workers=2, split="validation"))
        assert len(batches) == 1 and batches[0]["label"].tolist() == [0]
        assert batches[0]["source"] == ["sub/b.png"] and batches[0]["image"][0].shape == (12, 16, 3)
        with pytest.raises(OptionError, match="has no split 'val'; its splits are: test, train, validation"):
            ds.indices("val")
        everything = [b for b in ds.loader(batch_size=2, shuffle=True, seed=1)]
        assert sorted(int(i) for b in everything for i in b["index"]) == [0, 1, 2]


def test_a_target_resizes_images_and_moves_boxes_and_masks_with_them(tmp_path: Path) -> None:
    view = DLDatasetView(
        _write(tmp_path / "ds", _detection(), DET_IMAGES), TargetSpec("stretch", (32, 6), allow_upscale=True)
    )
    # 16x12 -> 32x6: x doubles, y halves.
    np.testing.assert_allclose(view[0]["boxes"], [[6, 1, 20, 3], [0, 0.25, 9, 1.75]])
    (batch,) = view.loader(batch_size=3, shuffle=False)
    assert batch["image"].shape == (3, 6, 32, 3) and len(batch["boxes"]) == 3
    assert view.image_layout() == ((6, 32, 3), "|u1")
    seg = DLDatasetView(_segmentation(tmp_path), TargetSpec("fit", (16, 16)))
    (batch,) = seg.loader(batch_size=2, shuffle=False)
    mask = batch["mask"]
    assert mask.shape == (2, 16, 16) and mask.dtype == np.uint8
    # 16x12 fitted into 16x16: two rows of padding above and below, marked 255 (ignore).
    assert (mask[:, :2] == 255).all() and (mask[:, 14:] == 255).all()
    assert set(np.unique(mask[:, 2:14]).tolist()) == {0, 4} and (mask[0, 4:8, 4:12] == 4).all()


def test_open_refuses_bad_samples_unless_asked_to_skip_them(tmp_path: Path) -> None:
    doc = _classification()
    doc["samples"][1]["image_label_id"] = 99
    path = _write(tmp_path / "ds", doc, CLS_IMAGES)
    with pytest.raises(BadInputsError, match=r"sub/b.png: image_id 11: image_label_id 99 is not one of") as info:
        dlpack.open(path)
    assert "on_error='skip'" in str(info.value)
    view = DLDatasetView(path, on_error="skip")
    assert [it.rel for it in view.items] == ["a.png", "c.png"] and len(view.skipped) == 1


def test_a_json_file_that_is_not_a_dldataset_is_not_opened_as_one(tmp_path: Path) -> None:
    other = tmp_path / "notes.json"
    other.write_text('{"hello": 1}')
    assert not is_dldataset(other) and not is_dldataset(tmp_path)
    with pytest.raises(StoreError):
        dlpack.open(other)


def test_the_fingerprint_follows_the_dataset_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "ds", _classification(), CLS_IMAGES)
    first = DLDatasetView(path).fingerprint()
    assert DLDatasetView(path).fingerprint() == first
    doc = _classification()
    doc["samples"][0]["split"] = "test"
    path.write_text(json.dumps(doc))
    assert DLDatasetView(path).fingerprint() != first


def test_bench_measures_a_dldataset_as_decoded_on_the_fly(tmp_path: Path) -> None:
    folder = tmp_path / "ds"
    _write(folder, _classification(), CLS_IMAGES)
    store = tmp_path / "s.zarr"
    dlpack.build(folder / "images", store, size=(16, 12), labels="none")
    rep = run_bench([folder, store], samples=6, batch_size=2, repeat=1, caches="warm", orders="random", quiet=True)
    dld, zarr = rep.cells
    assert (dld.kind, dld.target, rep.targets[0]["count"], rep.targets[0]["decoded_on_the_fly"]) == (
        "dldataset",
        "ds",
        3,
        True,
    )
    assert rep.targets[0]["image_shape"] == [12, 16, 3]
    assert zarr.vs_folder is not None and dld.vs_folder is None


def test_cli_bench_accepts_a_dldataset_json(tmp_path: Path, capsys: Capsys) -> None:
    path = _write(tmp_path / "ds", _classification(), CLS_IMAGES)
    argv = ["bench", str(path), "--size", "8x6", "--samples", "4", "--repeat", "1", "--cache", "warm",
            "--order", "random", "--batch-size", "2", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    assert "dataset.json" in capsys.readouterr().out


def test_a_build_packs_a_classification_dldataset_with_its_classes_and_splits(tmp_path: Path) -> None:
    path = _write(tmp_path / "ds", _classification(), CLS_IMAGES)
    dlpack.build(DLDatasetSource(path), tmp_path / "o.zarr", size=(16, 12), quiet=True)
    with dlpack.open(tmp_path / "o.zarr") as ds:
        assert isinstance(ds, dlpack.Dataset) and ds.classes == ("scratch", "good")
        assert [(ds[i]["label"], ds[i]["split"], ds[i]["source"]) for i in range(3)] == [
            (1, "train", "a.png"),
            (0, "validation", "sub/b.png"),
            (1, "test", "c.png"),
        ]


def test_cli_bench_names_a_bad_sample_of_a_dldataset(tmp_path: Path, capsys: Capsys) -> None:
    path = _write(tmp_path / "ds", _classification(), CLS_IMAGES[:2])
    assert main(["bench", str(tmp_path / "ds"), "--size", "8x6", "--samples", "4", "--repeat", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlpack: error:") and "Traceback" not in err
    assert "c.png: image_id 12: the image file" in err and str(path) in err


def test_an_anomaly_set_opens_with_ok_and_nok_labels(tmp_path: Path) -> None:
    with dlpack.open(_anomaly(tmp_path)) as ds:
        assert ds.classes == ("ok", "nok") and [s["label"] for s in ds] == [0, 1]
        assert [s["source"] for s in ds] == ["good/0.png", "bad/1.png"]


def test_a_label_image_outside_segmentation_dir_is_refused(tmp_path: Path) -> None:
    path = _segmentation(tmp_path)
    doc = json.loads(path.read_text())
    doc["samples"][1]["segmentation_file_name"] = "../images/b.png"
    path.write_text(json.dumps(doc))
    (e,) = DLDatasetSource(path).scan().errors
    assert str(e) == (
        "b.png: image_id 1: segmentation_file_name '../images/b.png' is not a relative path inside "
        "segmentation_dir; name a file below it"
    )


def test_cli_info_on_a_dldataset_says_what_it_is_and_what_reads_it(tmp_path: Path, capsys: Capsys) -> None:
    _write(tmp_path / "ds", _classification(), CLS_IMAGES)
    assert main(["info", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert "is a HALCON DLDataset, not a store" in err and "dlpack bench" in err and "Traceback" not in err
