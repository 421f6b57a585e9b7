"""dlpack export: DLDataset (JSON + converter script), COCO and HALCON's reader folders, from a store."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _dldataset_schema import problems

import dlpack
import dlpack.cli
from dlpack.errors import OptionError, StoreExistsError, StoreNotFoundError
from dlpack.exports import _common
from dlpack.exports._geometry import corners_to_coco, corners_to_halcon, degenerate_boxes, halcon_to_corners
from dlpack.halcon import hdict as _hdict

# pycocotools' own decoder (annToMask) warns under NumPy 2; the warning is about pycocotools, not dlpack.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

STANDIN = Path(__file__).resolve().parents[1] / "halcon_standin"
W, H = 16, 12


def _image(seed: int, channels: int = 3, dtype: type = np.uint8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    top = 65535 if dtype == np.uint16 else 255
    shape = (H, W, channels) if channels == 3 else (H, W)
    return rng.integers(0, top + 1, shape, dtype=np.int64).astype(dtype)


def _store(tmp_path: Path, backend: str, files: dict[str, np.ndarray]) -> Path:
    src = tmp_path / "src"
    for rel, img in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        ok, buf = cv2.imencode(".png", img)
        assert ok
        (src / rel).write_bytes(buf.tobytes())
    out = tmp_path / backend
    dlpack.build(src, out, jobs=1)
    return out


CLASSIFICATION = {"train/a/x.png": 1, "train/a/y.png": 2, "train/b/x.png": 3, "val/b/z.png": 4}


@pytest.fixture
def cls_store(tmp_path: Path, backend: str) -> Path:
    return _store(tmp_path, backend, {rel: _image(seed) for rel, seed in CLASSIFICATION.items()})


BOXES = [  # one entry per sample of cls_store, corner form x0, y0, x1, y1
    [[1.0, 2.0, 5.0, 6.0], [0.5, 3.5, 4.5, 7.5]],
    [],
    [[2.25, 1.0, 15.0, 11.5]],
    [[0.0, 0.0, 16.0, 12.0]],
]
BOX_LABELS = [[1, 0], [], [1], [0]]
CROWD = [[0, 1], [], [0], [0]]


def _add_boxes(store: Path) -> None:
    dlpack.add_array(store, "boxes", [np.array(b, np.float32).reshape(-1, 4) for b in BOXES], key="boxes", ragged=True)
    dlpack.add_array(store, "box_labels", [np.array(v, np.int32) for v in BOX_LABELS], key="box_labels", ragged=True)
    dlpack.add_array(store, "box_crowd", [np.array(v, np.uint8) for v in CROWD], key="box_crowd", ragged=True)


def _masks(n: int, ids: tuple[int, ...] = (0, 1)) -> np.ndarray:
    m = np.zeros((n, H, W), np.uint8)
    for i in range(n):
        m[i, 2 : 6 + i, 3 : 9 + i] = ids[1]
        m[i, :, W - 1] = 255  # padding
    return m


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _read_png(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    assert img is not None, path
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB) if img.ndim == 3 else img[:, :, None]


@pytest.fixture
def no_halcon(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import halcon`` fails, as on every machine without a HALCON installation."""
    monkeypatch.delitem(sys.modules, "halcon", raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if Path(p).resolve() != STANDIN])


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``import halcon`` gives the recording stand-in."""
    monkeypatch.delitem(sys.modules, "halcon", raising=False)
    monkeypatch.syspath_prepend(str(STANDIN))
    import halcon

    halcon.CALLS.clear()
    return halcon


# ---------------------------------------------------------------- geometry


def test_corner_boxes_become_pixel_centred_rows_first_and_back() -> None:
    boxes = np.array([[1.0, 2.0, 5.0, 6.0], [10.3, 0.0, 30.7, 4.5]], np.float32)
    row1, col1, row2, col2 = corners_to_halcon(boxes)
    assert row1 == (1.5, -0.5) and col1 == (0.5, 9.8) and row2 == (5.5, 4.0) and col2 == (4.5, 30.2)
    assert all(type(v) is float for t in (row1, col1, row2, col2) for v in t)
    assert np.allclose(halcon_to_corners(row1, col1, row2, col2), boxes.astype(np.float64), atol=1e-6)
    assert corners_to_coco(boxes) == [[1.0, 2.0, 4.0, 4.0], [10.3, 0.0, 20.4, 4.5]]
    assert degenerate_boxes(np.array([[1, 1, 1, 5], [0, 0, 2, 2], [3, 4, 2, 8]], np.float32)) == [0, 2]
    assert halcon_to_corners((), (), (), ()).shape == (0, 4)


# ---------------------------------------------------------------- DLDataset


def test_dldataset_classification_keys_types_images_and_splits(
    cls_store: Path, tmp_path: Path, no_halcon: None
) -> None:
    out = tmp_path / "dl"
    result = dlpack.export(cls_store, "dldataset", out)
    doc = _json(out / "dataset.json")
    assert problems(doc, "classification") == []
    assert result.task == "classification" and result.samples == 4
    assert doc["image_dir"] == "images" and doc["class_names"] == ["a", "b"] and doc["class_ids"] == [0, 1]
    assert [s["image_file_name"] for s in doc["samples"]] == [r for r in CLASSIFICATION]
    assert [s["split"] for s in doc["samples"]] == ["train", "train", "train", "validation"]
    assert [s["image_label_id"] for s in doc["samples"]] == [0, 0, 1, 1]
    assert sorted(s["image_id"] for s in doc["samples"]) == [0, 1, 2, 3]
    with dlpack.open(cls_store) as ds:
        for s in doc["samples"]:
            assert np.array_equal(_read_png(out / "images" / s["image_file_name"]), ds[s["image_id"]]["image"])
    assert (out / "to_hdict.py").is_file() and not (out / "dataset.hdict").exists()
    halcon_notes = [n for n in result.notes if "HALCON" in n]
    assert len(halcon_notes) == 1 and "to_hdict.py" in halcon_notes[0]
    assert not list(tmp_path.glob(".dl.dlpack-export-*"))  # the staging folder was renamed


def test_dldataset_keeps_16_bit_gray_images_lossless(tmp_path: Path, no_halcon: None) -> None:
    store = _store(tmp_path, "g.zarr", {"a/1.png": _image(5, 1, np.uint16), "b/2.png": _image(6, 1, np.uint16)})
    out = tmp_path / "dl"
    dlpack.export(store, "dldataset", out)
    with dlpack.open(store) as ds:
        for i in range(2):
            png = cv2.imread(str(out / "images" / ds[i]["source"]), cv2.IMREAD_UNCHANGED)
            assert png.dtype == np.uint16 and png.ndim == 2
            assert np.array_equal(png, ds[i]["image"][:, :, 0])


def test_dldataset_detection_boxes_are_pixel_centred_reals(cls_store: Path, tmp_path: Path, no_halcon: None) -> None:
    _add_boxes(cls_store)
    out = tmp_path / "dl"
    result = dlpack.export(cls_store, "dldataset", out)
    assert result.task == "detection"
    text = (out / "dataset.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    assert problems(doc, "detection") == []
    s0 = doc["samples"][0]
    # [1, 2, 5, 6] and [0.5, 3.5, 4.5, 7.5], by hand: row1 = y_min - 0.5, col1 = x_min - 0.5, ...
    assert s0["bbox_row1"] == [1.5, 3.0] and s0["bbox_col1"] == [0.5, 0.0]
    assert s0["bbox_row2"] == [5.5, 7.0] and s0["bbox_col2"] == [4.5, 4.0]
    assert s0["bbox_label_id"] == [1, 0]
    assert '"bbox_row1": [\n    1.5,\n    3.0\n   ]' in text  # reals are written as reals (3.0, not 3)
    assert doc["samples"][1]["bbox_label_id"] == [] and doc["samples"][1]["bbox_row1"] == []
    assert doc["samples"][2]["bbox_col1"] == [1.75] and doc["samples"][3]["bbox_row2"] == [11.5]


def test_dldataset_segmentation_writes_label_images(cls_store: Path, tmp_path: Path, no_halcon: None) -> None:
    masks = _masks(4)
    dlpack.add_array(cls_store, "mask", masks, key="mask")
    out = tmp_path / "dl"
    result = dlpack.export(cls_store, "dldataset", out)
    doc = _json(out / "dataset.json")
    assert result.task == "segmentation" and problems(doc, "segmentation") == []
    assert doc["segmentation_dir"] == "segmentation"
    for i, s in enumerate(doc["samples"]):
        assert s["segmentation_file_name"] == s["image_file_name"]
        label = cv2.imread(str(out / "segmentation" / s["segmentation_file_name"]), cv2.IMREAD_UNCHANGED)
        assert label.dtype == np.uint8 and np.array_equal(label, masks[i])
    assert any("255" in n and "ignore" in n for n in result.notes)


@pytest.fixture
def anomaly_store(tmp_path: Path, backend: str) -> Path:
    files = {"ok/1.png": _image(1), "ok/2.png": _image(2), "nok/3.png": _image(3), "nok/4.png": _image(4)}
    store = _store(tmp_path, backend, files)
    masks = np.zeros((4, H, W), np.uint8)
    masks[0, 1:4, 1:5] = 1  # nok/3.png (sample 0) has a marked defect; nok/4.png none
    masks[:, 0, :] = 255  # padding
    dlpack.add_array(store, "mask", masks, key="mask")
    return store


def test_dldataset_anomaly_labels_and_ground_truth(anomaly_store: Path, tmp_path: Path, no_halcon: None) -> None:
    out = tmp_path / "dl"
    result = dlpack.export(anomaly_store, "dldataset", out)
    doc = _json(out / "dataset.json")
    assert result.task == "anomaly" and problems(doc, "anomaly") == []
    by_name = {s["image_file_name"]: s for s in doc["samples"]}
    assert {n: s["anomaly_label"] for n, s in by_name.items()} == {
        "nok/3.png": "nok",
        "nok/4.png": "nok",
        "ok/1.png": "ok",
        "ok/2.png": "ok",
    }
    assert doc["anomaly_dir"] == "anomaly" and by_name["nok/3.png"]["anomaly_file_name"] == "nok/3.png"
    assert "anomaly_file_name" not in by_name["nok/4.png"] and "anomaly_file_name" not in by_name["ok/1.png"]
    gt = cv2.imread(str(out / "anomaly" / "nok" / "3.png"), cv2.IMREAD_UNCHANGED)
    expected = np.zeros((H, W), np.uint8)
    expected[1:4, 1:5] = 255
    assert np.array_equal(gt, expected)


def test_unlabelled_samples_are_left_out_and_named(tmp_path: Path, no_halcon: None) -> None:
    store = _store(tmp_path, "u.zarr", {"a/1.png": _image(1), "b/2.png": _image(2)})
    dlpack.add_array(store, "labels", np.array([0, -1], np.int32), replace=True)
    result = dlpack.export(store, "dldataset", tmp_path / "dl")
    assert result.samples == 1 and any("b/2.png" in n and "left out 1" in n for n in result.notes)


def test_a_split_halcon_does_not_know_is_refused() -> None:
    view = _common.StoreView("s.zarr", 1, "classification", ("a",), (0,), ("dev",), (), None, False, frozenset())
    sample = _common.Sample(0, "a/1.png", np.zeros((1, 1, 3), np.uint8), 0, "dev")
    with pytest.raises(OptionError, match=r"s\.zarr.*'dev'.*train, validation and test"):
        _common.halcon_split(view, sample)
    assert _common.halcon_split(view, _common.Sample(0, "a/1.png", sample.image, 0, "val")) == "validation"


def test_source_names_that_meet_keep_their_extension(tmp_path: Path, no_halcon: None) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for name, seed in (("x.png", 1), ("x.bmp", 2), ("y.png", 3)):
        cv2.imwrite(str(src / name), _image(seed)[:, :, ::-1])
    store = tmp_path / "s.zarr"
    dlpack.build(tmp_path / "src", store, jobs=1)
    dlpack.export(store, "dldataset", tmp_path / "dl")
    names = sorted(s["image_file_name"] for s in _json(tmp_path / "dl" / "dataset.json")["samples"])
    assert names == ["a/x.bmp.png", "a/x.png.png", "a/y.png"]


# ---------------------------------------------------------------- .hdict: the converter script and the direct write


def test_converter_logic_gives_halcon_builtin_values_and_tuples() -> None:
    doc = {
        "image_dir": "images",
        "class_names": ["a", "b"],
        "class_ids": [3, 7],
        "samples": [{"image_id": 0, "image_file_name": "x.png", "bbox_label_id": [7], "bbox_row1": [1, 2.5]}],
    }
    values = _hdict.halcon_values(doc, "/data/set")
    assert values["image_dir"] == "/data/set/images"
    assert values["class_names"] == ("a", "b") and values["class_ids"] == (3, 7)
    sample = values["samples"][0]
    assert sample["bbox_row1"] == (1.0, 2.5) and type(sample["bbox_row1"][0]) is float
    assert sample["bbox_label_id"] == (7,) and sample["image_id"] == 0
    assert _hdict.halcon_values(doc)["image_dir"] == "images"
    with pytest.raises(ValueError, match="image_label_id"):
        _hdict.halcon_values({"samples": [{"image_label_id": True}]})
    with pytest.raises(ValueError, match="class_ids"):
        _hdict.halcon_values({"class_ids": [1.5], "samples": []})


def _typed(path: Path) -> Any:
    return _json(path)["dict"]


@pytest.mark.slow
def test_the_converter_script_writes_the_hdict_with_halcon(cls_store: Path, tmp_path: Path, no_halcon: None) -> None:
    _add_boxes(cls_store)
    out = tmp_path / "dl"
    dlpack.export(cls_store, "dldataset", out)
    env = {**os.environ, "PYTHONPATH": str(STANDIN)}
    proc = subprocess.run(
        [sys.executable, str(out / "to_hdict.py")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    top = _typed(out / "dataset.hdict")
    assert top["image_dir"] == {"str": (out / "images").as_posix()}
    assert top["class_names"] == {"tuple": [{"str": "a"}, {"str": "b"}]}
    assert top["class_ids"] == {"tuple": [{"int": 0}, {"int": 1}]}
    samples = [s["dict"] for s in top["samples"]["tuple"]]
    assert samples[0]["image_id"] == {"int": 0} and samples[0]["split"] == {"str": "train"}
    assert samples[0]["bbox_row1"] == {"tuple": [{"float": 1.5}, {"float": 3.0}]}
    assert samples[0]["bbox_label_id"] == {"tuple": [{"int": 1}, {"int": 0}]}
    assert samples[1]["bbox_label_id"] == {"tuple": []}
    # Without HALCON the script says so and writes nothing.
    (out / "dataset.hdict").unlink()
    bare = subprocess.run(
        [sys.executable, str(out / "to_hdict.py"), "--relative-dirs"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ""},
        timeout=120,
    )
    assert bare.returncode != 0 and "halcon" in bare.stderr and not (out / "dataset.hdict").exists()


def test_export_writes_the_hdict_directly_where_halcon_imports(cls_store: Path, tmp_path: Path, standin: Any) -> None:
    out = tmp_path / "dl"
    result = dlpack.export(cls_store, "dldataset", out)
    assert not [n for n in result.notes if "HALCON" in n]
    top = _typed(out / "dataset.hdict")
    assert top["image_dir"] == {"str": (out / "images").as_posix()}  # the final folder, not the staging one
    labels = [s["dict"]["image_label_id"] for s in top["samples"]["tuple"]]
    assert labels == [{"int": 0}, {"int": 0}, {"int": 1}, {"int": 1}]
    assert standin.CALLS[-1] == ("write_dict", str(tmp_path / ".dl.dlpack-export-partial" / "dataset.hdict"))


# ---------------------------------------------------------------- COCO


def test_coco_round_trips_boxes_crowd_and_masks(cls_store: Path, tmp_path: Path) -> None:
    from pycocotools.coco import COCO

    _add_boxes(cls_store)
    masks = np.zeros((4, H, W), np.uint8)
    masks[0, 2:6, 1:5] = 1  # class b (id 1), partly inside box 0 of sample 0
    masks[0, 5:8, 0:3] = 1
    masks[2, 1:11, 3:15] = 1
    dlpack.add_array(cls_store, "mask", masks, key="mask")
    out = tmp_path / "coco"
    result = dlpack.export(cls_store, "coco", out)
    assert result.task == "detection"
    coco = COCO(str(out / "annotations.json"))
    assert sorted(coco.getCatIds()) == [0, 1] and coco.loadCats(1)[0]["name"] == "b"
    with dlpack.open(cls_store) as ds:
        for i in range(4):
            img = coco.loadImgs(i + 1)[0]
            assert (img["width"], img["height"]) == (W, H)
            assert np.array_equal(_read_png(out / "images" / img["file_name"]), ds[i]["image"])
            anns = coco.loadAnns(coco.getAnnIds(imgIds=[i + 1]))
            assert [a["bbox"] for a in anns] == corners_to_coco(np.array(BOXES[i], np.float32).reshape(-1, 4))
            assert [a["category_id"] for a in anns] == BOX_LABELS[i]
            assert [a["iscrowd"] for a in anns] == CROWD[i]
            for a, box, label in zip(anns, BOXES[i], BOX_LABELS[i], strict=True):
                x0, y0, x1, y1 = box
                yy, xx = np.mgrid[0:H, 0:W] + 0.5
                inside = (xx >= x0) & (xx <= x1) & (yy >= y0) & (yy <= y1)
                assert np.array_equal(coco.annToMask(a).astype(bool), (masks[i] == label) & inside)
    split = _json(out / "annotations_val.json")
    assert [im["file_name"] for im in split["images"]] == ["val/b/z.png"]


def test_coco_of_a_segmentation_store_has_one_region_per_class(cls_store: Path, tmp_path: Path) -> None:
    from pycocotools.coco import COCO

    masks = _masks(4)
    dlpack.add_array(cls_store, "mask", masks, key="mask")
    dlpack.export(cls_store, "coco", tmp_path / "coco")
    coco = COCO(str(tmp_path / "coco" / "annotations.json"))
    for i in range(4):
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[i + 1]))
        assert sorted(a["category_id"] for a in anns) == [0, 1]  # the padding value 255 is no class
        for a in anns:
            assert np.array_equal(coco.annToMask(a).astype(bool), masks[i] == a["category_id"])
        box = next(a["bbox"] for a in anns if a["category_id"] == 1)
        assert box == [3.0, 2.0, 6.0 + i, 4.0 + i]


def test_coco_masks_without_pycocotools_name_the_extra(
    cls_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dlpack.add_array(cls_store, "mask", _masks(4), key="mask")
    monkeypatch.setitem(sys.modules, "pycocotools", None)
    with pytest.raises(dlpack.MissingExtraError, match=r"dlpack-datasets\[coco\]"):
        dlpack.export(cls_store, "coco", tmp_path / "coco")
    assert not (tmp_path / "coco").exists() and not list(tmp_path.glob(".coco.dlpack-export-*"))


# ---------------------------------------------------------------- folders


def test_folders_classification_is_split_then_class_and_builds_back(cls_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "folders"
    dlpack.export(cls_store, "folders", out)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.png"))
    assert files == ["train/a/x.png", "train/a/y.png", "train/b/x.png", "val/b/z.png"]
    again = tmp_path / "again.zarr"
    dlpack.build(out, again, jobs=1)
    with dlpack.open(cls_store) as a, dlpack.open(again) as b:
        assert a.classes == b.classes and a.splits == b.splits
        assert [(s["source"], s["label"], s["split"]) for s in a] == [(s["source"], s["label"], s["split"]) for s in b]
        assert all(np.array_equal(x["image"], y["image"]) for x, y in zip(a, b, strict=True))


def test_folders_segmentation_images_and_labels_match_by_name(cls_store: Path, tmp_path: Path) -> None:
    masks = _masks(4, (0, 1))
    dlpack.add_array(cls_store, "mask", masks, key="mask")
    out = tmp_path / "folders"
    result = dlpack.export(cls_store, "folders", out)
    images = sorted(p.relative_to(out / "images").as_posix() for p in (out / "images").rglob("*.png"))
    labels = sorted(p.relative_to(out / "labels").as_posix() for p in (out / "labels").rglob("*.png"))
    assert images == labels == sorted(CLASSIFICATION)
    assert _json(out / "labels" / "classes.json") == {"0": "a", "1": "b"}
    for i, rel in enumerate(CLASSIFICATION):
        assert np.array_equal(cv2.imread(str(out / "labels" / rel), cv2.IMREAD_UNCHANGED), masks[i])
    assert any("no splits" in n for n in result.notes)


def test_folders_anomaly_good_and_defect_folders_with_ground_truth(anomaly_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "folders"
    dlpack.export(anomaly_store, "folders", out)
    images = sorted(p.relative_to(out / "images").as_posix() for p in (out / "images").rglob("*.png"))
    assert images == ["good/1.png", "good/2.png", "nok/3.png", "nok/4.png"]
    assert sorted(p.relative_to(out).as_posix() for p in (out / "ground_truth").rglob("*")) == [
        "ground_truth/nok",
        "ground_truth/nok/3.png",
    ]


def test_folders_of_a_detection_store_is_coco(cls_store: Path, tmp_path: Path) -> None:
    _add_boxes(cls_store)
    result = dlpack.export(cls_store, "folders", tmp_path / "f")
    assert (tmp_path / "f" / "annotations.json").is_file() and any("COCO" in n for n in result.notes)


def test_folders_of_an_unlabelled_store_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "flat"
    src.mkdir()
    cv2.imwrite(str(src / "1.png"), _image(1))
    dlpack.build(src, tmp_path / "s.zarr", jobs=1)
    with pytest.raises(OptionError, match=r"s\.zarr has no labels"):
        dlpack.export(tmp_path / "s.zarr", "folders", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the output folder


def test_output_folder_rules(cls_store: Path, tmp_path: Path, no_halcon: None) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(StoreExistsError, match="not a dlpack export"):
        dlpack.export(cls_store, "dldataset", foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    dlpack.export(cls_store, "dldataset", empty)
    assert (empty / "dataset.json").is_file() and (empty / _common.MARKER).is_file()
    with pytest.raises(StoreExistsError, match="previous dlpack export.*--overwrite"):
        dlpack.export(cls_store, "coco", empty)
    dlpack.export(cls_store, "coco", empty, overwrite=True)
    assert (empty / "annotations.json").is_file() and not (empty / "dataset.json").exists()
    with pytest.raises(OptionError, match="overlap"):
        dlpack.export(cls_store, "dldataset", cls_store / "inside" if cls_store.is_dir() else cls_store)
    with pytest.raises(OptionError, match="must be one of dldataset, coco, folders"):
        dlpack.export(cls_store, "yolo", tmp_path / "y")
    with pytest.raises(StoreNotFoundError):
        dlpack.export(tmp_path / "missing.zarr", "coco", tmp_path / "m")


def test_a_failed_export_leaves_nothing_that_looks_complete(
    cls_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_halcon: None
) -> None:
    out = tmp_path / "dl"
    dlpack.export(cls_store, "dldataset", out)
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    real = _common.write_png
    calls = []

    def failing(path: Path, pixels: np.ndarray) -> None:
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device", str(path))
        real(path, pixels)

    monkeypatch.setattr(importlib.import_module("dlpack.halcon.export"), "write_png", failing)
    with pytest.raises(OSError, match="No space"):
        dlpack.export(cls_store, "dldataset", out, overwrite=True)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before  # the old export, whole
    assert not list(tmp_path.glob(".dl.dlpack-export-*"))
    new = tmp_path / "new"
    calls.clear()
    with pytest.raises(OSError, match="No space"):
        dlpack.export(cls_store, "dldataset", new)
    assert not new.exists() and not list(tmp_path.glob(".new.dlpack-export-*"))


def test_a_partial_left_by_a_killed_export_is_removed(cls_store: Path, tmp_path: Path, no_halcon: None) -> None:
    partial = tmp_path / ".dl.dlpack-export-partial"
    partial.mkdir()
    (partial / _common.PARTIAL_MARKER).write_text("")
    (partial / "dataset.json").write_text("{")
    dlpack.export(cls_store, "dldataset", tmp_path / "dl")
    assert not partial.exists() and _json(tmp_path / "dl" / "dataset.json")["samples"]


# ---------------------------------------------------------------- CLI and API


def test_cli_export_json_and_one_note(
    cls_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_halcon: None
) -> None:
    out = tmp_path / "dl"
    assert dlpack.cli.main(["export", str(cls_store), "--to", "dldataset", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["to"] == "dldataset" and doc["task"] == "classification" and doc["samples"] == 4
    assert doc["out"] == str(out)
    assert len([line for line in captured.err.splitlines() if "HALCON" in line]) == 1
    assert dlpack.cli.main(["export", str(cls_store), "--to", "coco", str(out), "--overwrite"]) == 0
    assert "exported 4 sample(s)" in capsys.readouterr().out


def test_cli_export_bad_input_exits_2_naming_the_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.zarr"
    assert dlpack.cli.main(["export", str(missing), "--to", "coco", str(tmp_path / "o")]) == 2
    assert str(missing) in capsys.readouterr().err
    assert dlpack.cli.main(["export", str(missing), "--to", "yolo", str(tmp_path / "o")]) == 2


def test_export_is_the_function_after_its_modules_are_imported() -> None:
    import dlpack.exports.coco  # the formats live in dlpack.exports, so the public name stays the function

    assert callable(dlpack.export) and dlpack.export.__name__ == "export"
    assert dlpack.ExportResult.__name__ == "ExportResult"


def test_a_previous_export_moved_aside_by_a_killed_replacement_comes_back(
    cls_store: Path, tmp_path: Path, no_halcon: None
) -> None:
    out = tmp_path / "dl"
    dlpack.export(cls_store, "dldataset", out)
    os.rename(out, tmp_path / ".dl.dlpack-export-old")  # as a kill between the two renames leaves it
    with pytest.raises(StoreExistsError, match="previous dlpack export"):
        dlpack.export(cls_store, "coco", out)
    assert (out / "dataset.json").is_file() and not (tmp_path / ".dl.dlpack-export-old").exists()


def test_halcon_failing_to_write_leaves_a_note_and_the_json(
    cls_store: Path, tmp_path: Path, standin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_licence(*args: Any) -> None:
        raise RuntimeError("no license found")

    monkeypatch.setattr(standin, "write_dict", no_licence)
    result = dlpack.export(cls_store, "dldataset", tmp_path / "dl")
    assert [n for n in result.notes if "HALCON could not write it" in n and "no license" in n]
    assert (tmp_path / "dl" / "dataset.json").is_file() and not (tmp_path / "dl" / "dataset.hdict").exists()


def test_a_class_that_cannot_be_a_folder_is_refused_by_the_folder_layout(tmp_path: Path) -> None:
    store = _store(tmp_path, "s.zarr", {"a\\b/1.png": _image(1), "c/2.png": _image(2)})
    with pytest.raises(OptionError, match=r"class 'a\\\\b' cannot be a folder name"):
        dlpack.export(store, "folders", tmp_path / "f")
    assert not (tmp_path / "f").exists()
    dlpack.export(store, "dldataset", tmp_path / "dl")  # JSON keeps any name
    assert _json(tmp_path / "dl" / "dataset.json")["class_names"] == ["a\\b", "c"]


def test_the_task_a_manifest_records_wins_unless_label_arrays_say_more() -> None:
    from types import SimpleNamespace

    def manifest(arrays: tuple[str, ...], classes: tuple[str, ...] = ("a", "b"), **task: str) -> Any:
        return SimpleNamespace(arrays=dict.fromkeys(arrays), classes=classes, labels="folders", **task)

    infer = _common.infer_task
    assert infer(manifest(())) == "classification" and infer(manifest((), ())) == "none"
    assert infer(manifest(("boxes", "box_labels", "mask"))) == "detection"
    assert infer(manifest(("mask",))) == "segmentation"
    assert infer(manifest(("mask",), ("nok", "ok"))) == "anomaly" and infer(manifest(("defect",))) == "anomaly"
    assert infer(manifest(("mask",), task="detection")) == "detection"  # recorded: wins
    assert infer(manifest(("boxes",), task="classification")) == "detection"  # boxes added to a classification store
    assert infer(manifest((), task="none")) == "none"


def test_a_segmentation_store_without_class_names_takes_its_ids_from_the_masks(tmp_path: Path, no_halcon: None) -> None:
    src = tmp_path / "flat"
    src.mkdir()
    for k in range(2):
        cv2.imwrite(str(src / f"{k}.png"), _image(k))
    store = tmp_path / "s.zarr"
    dlpack.build(src, store, jobs=1)
    masks = np.zeros((2, H, W), np.uint8)
    masks[0, :2], masks[1, :3], masks[:, :, 0] = 7, 3, 255
    dlpack.add_array(store, "mask", masks, key="mask")
    result = dlpack.export(store, "dldataset", tmp_path / "dl")
    doc = _json(tmp_path / "dl" / "dataset.json")
    assert problems(doc, "segmentation") == []
    assert doc["class_ids"] == [0, 3, 7] and doc["class_names"] == ["class_0", "class_3", "class_7"]
    assert any("no class names" in n for n in result.notes)
