"""End to end: labelled sources built into Zarr, HDF5 and a DLDataset, with labels that follow the resize.

A COCO-labelled folder, a folder of label images, an anomaly folder with ground truth, a CSV and a
HALCON DLDataset JSON are written here by hand (40 x 20 images, boxes and masks chosen so the
stored values can be worked out on paper), built with ``dlpack.build`` and ``dlpack build``, and
read back. The expected numbers below are written out, not computed by dlpack's own geometry:

- stretch 40x20 -> 20x20: ``x * 0.5``, ``y * 1``;
- fit 40x20 -> 20x20: scale 0.5, the image 20 x 10 centred, so ``x * 0.5``, ``y * 0.5 + 5``;
  rows 0..4 and 15..19 are padding;
- masks are nearest-neighbour: stored pixel ``j`` takes source pixel ``floor((2j + 1) * src / dst / 2)``,
  i.e. every second column (1, 3, 5, ...) here, and pad pixels hold the manifest's ``mask_ignore``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from _dldataset_schema import problems
from _exif import oriented_file, upright

import dlpack
from dlpack.cli import main
from dlpack.errors import DlpackError
from dlpack.sample import make_sample

# pycocotools' own decoder (annToMask) warns under NumPy 2; the warning is about pycocotools, not dlpack.
pytestmark = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)

Capsys = pytest.CaptureFixture[str]
W, H = 40, 20  # every hand-made image: 40 wide, 20 high
SIZE = (20, 20)
IGNORE = 255

# ----------------------------------------------------------------------------- writing inputs


def _write(path: Path, pixels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(path.suffix, pixels)
    assert ok, path
    path.write_bytes(buf.tobytes())
    return path


def _noise(seed: int, w: int = W, h: int = H) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# COCO: categories 7 "dog" and 3 "cat" (listed out of order: dlpack sorts them by id).
# a.png: one cat, COCO bbox [4, 2, 20, 10] = corners [4, 2, 24, 12], its polygon the same rectangle.
# b.png: one dog, COCO bbox [10, 5, 10, 10] = corners [10, 5, 20, 15], polygon the same rectangle.
# c.png: no annotations.
COCO_BBOX = {"a.png": [[4.0, 2.0, 20.0, 10.0]], "b.png": [[10.0, 5.0, 10.0, 10.0]], "c.png": []}
COCO_CATEGORY = {"a.png": [3], "b.png": [7], "c.png": []}
# Stored boxes (corner form) after each resize, by hand (see the module docstring).
BOXES = {
    "none": {"a.png": [[4, 2, 24, 12]], "b.png": [[10, 5, 20, 15]], "c.png": []},
    "stretch": {"a.png": [[2, 2, 12, 12]], "b.png": [[5, 5, 10, 15]], "c.png": []},
    "fit": {"a.png": [[2, 6, 12, 11]], "b.png": [[5, 7.5, 10, 12.5]], "c.png": []},
}
# The stored COCO mask (pixel = category id, 0 background) as (rows, cols, value) rectangles.
# The polygons fill the pixels whose centres they hold: a.png rows 2..11, cols 4..23; b.png rows
# 5..14, cols 10..19. Stretch keeps the rows and takes every second column (source col 2j+1);
# fit takes every second row too (source row 2i+1) and shifts them down by 5.
COCO_MASKS = {
    "none": {"a.png": (slice(2, 12), slice(4, 24), 3), "b.png": (slice(5, 15), slice(10, 20), 7)},
    "stretch": {"a.png": (slice(2, 12), slice(2, 12), 3), "b.png": (slice(5, 15), slice(5, 10), 7)},
    "fit": {"a.png": (slice(6, 11), slice(2, 12), 3), "b.png": (slice(7, 12), slice(5, 10), 7)},
}


def _rect(x: float, y: float, w: float, h: float) -> list[float]:
    return [x, y, x + w, y, x + w, y + h, x, y + h]


def coco_doc() -> dict[str, Any]:
    images = [{"id": k + 1, "file_name": name, "width": W, "height": H} for k, name in enumerate(COCO_BBOX)]
    annotations = []
    for k, name in enumerate(COCO_BBOX):
        for bbox, cat in zip(COCO_BBOX[name], COCO_CATEGORY[name], strict=True):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": k + 1,
                    "category_id": cat,
                    "bbox": bbox,
                    "area": bbox[2] * bbox[3],
                    "iscrowd": 0,
                    "segmentation": [_rect(*bbox)],
                }
            )
    categories = [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}]
    return {"images": images, "annotations": annotations, "categories": categories}


def coco_source(tmp_path: Path, doc: dict[str, Any] | str | None = None) -> tuple[Path, Path]:
    """``tmp_path/coco/images/{a,b,c}.png`` and ``tmp_path/coco/annotations.json``."""
    root = tmp_path / "coco"
    for k, name in enumerate(COCO_BBOX):
        _write(root / "images" / name, _noise(k))
    ann = root / "annotations.json"
    text = doc if isinstance(doc, str) else json.dumps(coco_doc() if doc is None else doc)
    ann.write_text(text, encoding="utf-8")
    return root / "images", ann


# Label images: a.png has class 2 ("scratch") at rows 4..11, cols 10..29; sub/b.png is all background.
MASK_CLASSES = ("background", "crack", "scratch")


def mask_source(tmp_path: Path) -> tuple[Path, Path]:
    """``tmp_path/seg/images/{a,sub/b}.png`` and their label images in ``tmp_path/seg/masks``."""
    root = tmp_path / "seg"
    _write(root / "images" / "a.png", _noise(1))
    _write(root / "images" / "sub" / "b.png", _noise(2))
    m = np.zeros((H, W), np.uint8)
    m[4:12, 10:30] = 2
    _write(root / "masks" / "a.png", m)
    _write(root / "masks" / "sub" / "b.png", np.zeros((H, W), np.uint8))
    (root / "masks" / "classes.txt").write_text("".join(f"{c}\n" for c in MASK_CLASSES), encoding="utf-8")
    return root / "images", root / "masks"


def expected_seg_mask(resize: str) -> np.ndarray:
    """a.png's stored mask, by hand: stretch keeps rows 4..11 and takes source cols 2j+1 in 10..29,
    i.e. j = 5..14; fit also takes source rows 2i+1 in 4..11 (i = 2..5), shifted down by 5."""
    out = np.zeros(SIZE[::-1], np.uint8)
    if resize == "stretch":
        out[4:12, 5:15] = 2
    else:
        out[:5] = out[15:] = IGNORE
        out[7:11, 5:15] = 2
    return out


def anomaly_source(tmp_path: Path) -> tuple[Path, Path]:
    """MVTec-style: ``images/train/good``, ``images/test/good``, ``images/test/crack`` and ground truth."""
    root = tmp_path / "an"
    _write(root / "images" / "train" / "good" / "g1.png", _noise(1))
    _write(root / "images" / "test" / "good" / "g2.png", _noise(2))
    _write(root / "images" / "test" / "crack" / "c1.png", _noise(3))
    gt = np.zeros((H, W), np.uint8)
    gt[2:6, 8:16] = 255
    _write(root / "ground_truth" / "crack" / "c1_mask.png", gt)
    return root / "images", root / "ground_truth"


def expected_defect_mask() -> np.ndarray:
    """c1.png's ground truth stretched to 20x20: rows 2..5; source cols 2j+1 in 8..15, so j = 4..7."""
    out = np.zeros(SIZE[::-1], np.uint8)
    out[2:6, 4:8] = 1
    return out


def csv_source(tmp_path: Path, extra_rows: str = "") -> tuple[Path, Path]:
    root = tmp_path / "csv"
    for k, name in enumerate(("x.png", "y.png", "z.png")):
        _write(root / "img" / name, _noise(k))
    table = root / "labels.csv"
    table.write_text("path,label,split\nx.png,cat,train\ny.png,dog,val\nz.png,cat,test\n" + extra_rows, "utf-8")
    return root / "img", table


# DLDataset: the same two boxes as the COCO source, pixel-centred and rows first
# (row1 = y_min - 0.5, col1 = x_min - 0.5, ...), class ids 3 and 7.
def dldataset_doc() -> dict[str, Any]:
    return {
        "image_dir": "images",
        "class_names": ["cat", "dog"],
        "class_ids": [3, 7],
        "samples": [
            {"image_id": 1, "image_file_name": "a.png", "split": "train", "bbox_label_id": [3],
             "bbox_row1": [1.5], "bbox_col1": [3.5], "bbox_row2": [11.5], "bbox_col2": [23.5]},
            {"image_id": 2, "image_file_name": "b.png", "split": "validation", "bbox_label_id": [7],
             "bbox_row1": [4.5], "bbox_col1": [9.5], "bbox_row2": [14.5], "bbox_col2": [19.5]},
            {"image_id": 3, "image_file_name": "c.png", "split": "test", "bbox_label_id": [],
             "bbox_row1": [], "bbox_col1": [], "bbox_row2": [], "bbox_col2": []},
        ],
    }  # fmt: skip


def dldataset_source(tmp_path: Path, doc: dict[str, Any] | None = None) -> Path:
    """``tmp_path/dl/dataset.json`` and its ``images/``; returns the JSON file."""
    root = tmp_path / "dl"
    for k, name in enumerate(("a.png", "b.png", "c.png", "d.png")):
        _write(root / "images" / name, _noise(k))
    path = root / "dataset.json"
    path.write_text(json.dumps(dldataset_doc() if doc is None else doc), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- running builds

HOWS = ("api", "cli")


def _build(how: str, src: Path, out: Path, **opts: Any) -> None:
    """Build ``src`` into ``out`` through ``dlpack.build`` or ``dlpack build``; the options are the same."""
    if how == "api":
        dlpack.build(src, out, jobs=1, quiet=True, **opts)
        return
    argv = ["build", str(src), str(out), "--quiet", "--jobs", "1"]
    for name, value in opts.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif name == "size":
            argv += [flag, f"{value[0]}x{value[1]}"]
        else:
            argv += [flag, str(value)]
    assert main(argv) == 0, argv


def _by_source(ds: Any) -> dict[str, dict[str, Any]]:
    return {ds[i]["source"]: ds[i] for i in range(len(ds))}


def _boxes(sample: dict[str, Any]) -> list[list[float]]:
    boxes = np.asarray(sample["boxes"])
    assert boxes.dtype == np.float32 and boxes.reshape(-1, 4).shape == boxes.shape
    return boxes.tolist()


def _no_store_opens(out: Path) -> None:
    """Nothing at ``out`` that opens as a store (a failed build leaves none)."""
    if out.exists():
        with pytest.raises(DlpackError):
            dlpack.open(out).close()


# ----------------------------------------------------------------------------- COCO


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("resize", ["stretch", "fit"])
def test_coco_folder_boxes_and_masks_follow_the_resize(tmp_path: Path, backend: str, resize: str, how: str) -> None:
    images, ann = coco_source(tmp_path)
    out = tmp_path / backend
    _build(how, images, out, labels=f"coco:{ann}", size=SIZE, resize=resize)
    with dlpack.open(out) as ds:
        assert (ds.task, ds.classes, ds.class_ids) == ("detection", ("cat", "dog"), (3, 7))
        assert ds.manifest.mask_ignore == IGNORE
        samples = _by_source(ds)
        assert sorted(samples) == ["a.png", "b.png", "c.png"]
        for name, sample in samples.items():
            assert _boxes(sample) == BOXES[resize][name], name
            # box_labels index ds.classes: cat (id 3) is 0, dog (id 7) is 1
            assert [ds.class_ids[k] for k in sample["box_labels"].tolist()] == COCO_CATEGORY[name]
            assert sample["box_crowd"].tolist() == [0] * len(COCO_CATEGORY[name])
            expected = np.zeros(SIZE[::-1], np.uint8)
            if resize == "fit":
                expected[:5] = expected[15:] = IGNORE
            if name in COCO_MASKS[resize]:
                rows, cols, value = COCO_MASKS[resize][name]
                expected[rows, cols] = value
            assert sample["mask"].dtype == np.uint8
            assert np.array_equal(sample["mask"], expected), name
        batch = ds.get_batch([0, 1, 2])
        assert batch["mask"].shape == (3, 20, 20) and len(batch["boxes"]) == 3


def test_a_box_in_the_upright_frame_of_an_exif_rotated_jpeg_lands_right(tmp_path: Path, backend: str) -> None:
    """The file is 20 wide, 40 high, tagged orientation 6 (turn 90 degrees clockwise to view): upright
    it is 40x20, and the labelling tool drew the box [4, 2, 24, 12] on that upright image."""
    up = np.zeros((H, W, 3), np.uint8)
    up[2:12, 4:24] = 255  # the boxed object, bright
    raw = np.ascontiguousarray(np.rot90(up, 1))  # what the file holds
    assert raw.shape == (W, H, 3) and np.array_equal(upright(raw, 6), up)
    src = tmp_path / "images"
    src.mkdir()
    (src / "r.jpg").write_bytes(oriented_file(".jpg", raw, 6))
    doc = {
        "images": [{"id": 1, "file_name": "r.jpg", "width": W, "height": H}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [4, 2, 20, 10], "iscrowd": 0}],
        "categories": [{"id": 1, "name": "thing"}],
    }
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps(doc), encoding="utf-8")
    out = tmp_path / backend
    _build("cli", src, out, labels=f"coco:{ann}", size=SIZE)
    with dlpack.open(out) as ds:
        sample = ds[0]
        assert _boxes(sample) == [[2.0, 2.0, 12.0, 12.0]]
        gray = sample["image"].astype(int).mean(axis=2)
        assert gray[4:10, 4:10].min() > 200  # inside the box: the object
        assert gray[15:, :].max() < 60 and gray[:, 15:].max() < 60  # well outside it: background


@pytest.mark.parametrize("resize", ["none", "stretch"])
def test_coco_round_trip_through_the_store_and_back(tmp_path: Path, backend: str, resize: str) -> None:
    from pycocotools.coco import COCO

    images, ann = coco_source(tmp_path)
    store = tmp_path / backend
    opts: dict[str, Any] = {"size": SIZE} if resize == "stretch" else {}
    _build("api", images, store, labels=f"coco:{ann}", **opts)
    out = tmp_path / "coco-out"
    result = dlpack.export(store, "coco", out)
    assert result.task == "detection"
    coco = COCO(str(out / "annotations.json"))
    assert {c["id"]: c["name"] for c in coco.loadCats(coco.getCatIds())} == {3: "cat", 7: "dog"}
    scale = (1.0, 1.0) if resize == "none" else (0.5, 1.0)  # (x, y)
    with dlpack.open(store) as ds:
        samples = _by_source(ds)
        found = {img["file_name"]: img for img in coco.loadImgs(coco.getImgIds())}
        assert sorted(found) == ["a.png", "b.png", "c.png"]
        for name, img in found.items():
            anns = coco.loadAnns(coco.getAnnIds(imgIds=[img["id"]]))
            want = [[x * scale[0], y * scale[1], w * scale[0], h * scale[1]] for x, y, w, h in COCO_BBOX[name]]
            assert [a["bbox"] for a in anns] == want, name  # exact: no resize, or a scale of 0.5 and 1
            assert [a["category_id"] for a in anns] == COCO_CATEGORY[name]
            assert [a["iscrowd"] for a in anns] == [0] * len(anns)
            stored = samples[name]["mask"]
            for a in anns:  # the polygon became the stored mask, and comes back as it
                assert np.array_equal(coco.annToMask(a).astype(bool), stored == a["category_id"]), name
            if resize == "none":
                assert (img["width"], img["height"]) == (W, H)
                for a in anns:
                    assert a["area"] == COCO_BBOX[name][0][2] * COCO_BBOX[name][0][3]


# ----------------------------------------------------------------------------- label images


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("resize", ["stretch", "fit"])
def test_mask_folder_masks_are_nearest_neighbour_with_the_pad_ignored(
    tmp_path: Path, backend: str, resize: str, how: str
) -> None:
    images, masks = mask_source(tmp_path)
    out = tmp_path / backend
    _build(how, images, out, labels=f"masks:{masks}", size=SIZE, resize=resize)
    with dlpack.open(out) as ds:
        assert (ds.task, ds.classes, ds.class_ids) == ("segmentation", MASK_CLASSES, (0, 1, 2))
        assert ds.manifest.mask_ignore == IGNORE
        samples = _by_source(ds)
        assert np.array_equal(samples["a.png"]["mask"], expected_seg_mask(resize))
        background = expected_seg_mask(resize)
        background[background == 2] = 0
        assert np.array_equal(samples["sub/b.png"]["mask"], background)
        assert ds.get_batch([0, 1])["mask"].shape == (2, 20, 20)


# ----------------------------------------------------------------------------- anomaly


@pytest.mark.parametrize("how", HOWS)
def test_anomaly_folder_keeps_defects_splits_and_ground_truth(tmp_path: Path, backend: str, how: str) -> None:
    images, truth = anomaly_source(tmp_path)
    out = tmp_path / backend
    _build(how, images, out, labels="anomaly", anomaly_masks=str(truth), size=SIZE)
    with dlpack.open(out) as ds:
        assert (ds.task, ds.classes, ds.class_ids) == ("anomaly", ("ok", "nok"), (0, 1))
        samples = _by_source(ds)
        assert sorted(samples) == ["test/crack/c1.png", "test/good/g2.png", "train/good/g1.png"]
        for name, sample in samples.items():
            defect = name.split("/")[1]
            assert ds.defects[sample["defect"]] == defect
            assert ds.classes[sample["label"]] == ("ok" if defect == "good" else "nok")
            assert sample["split"] == name.split("/")[0]
            want = expected_defect_mask() if defect == "crack" else np.zeros(SIZE[::-1], np.uint8)
            assert np.array_equal(sample["mask"], want), name
        assert [ds[int(i)]["source"] for i in ds.indices("train")] == ["train/good/g1.png"]


# ----------------------------------------------------------------------------- CSV and DLDataset input


@pytest.mark.parametrize("how", HOWS)
def test_csv_labels_and_splits_are_kept(tmp_path: Path, backend: str, how: str) -> None:
    images, table = csv_source(tmp_path)
    out = tmp_path / backend
    _build(how, images, out, labels=f"csv:{table}", size=SIZE)
    with dlpack.open(out) as ds:
        assert (ds.task, ds.classes, ds.splits) == ("classification", ("cat", "dog"), ("test", "train", "val"))
        got = {s["source"]: (ds.classes[s["label"]], s["split"]) for s in _by_source(ds).values()}
        assert got == {"x.png": ("cat", "train"), "y.png": ("dog", "val"), "z.png": ("cat", "test")}
        assert [ds[int(i)]["source"] for i in ds.indices(split="train")] == ["x.png"]


@pytest.mark.parametrize("how", ["folder", "json", "labels", "api"])
def test_a_dldataset_json_builds_with_its_boxes_class_ids_and_splits(tmp_path: Path, backend: str, how: str) -> None:
    """SRC may be the DLDataset folder or its JSON; ``--labels dldataset:FILE`` takes SRC as the images."""
    path = dldataset_source(tmp_path)
    out = tmp_path / backend
    if how == "folder":
        _build("cli", path.parent, out, size=SIZE)
    elif how == "json":
        _build("cli", path, out, size=SIZE)
    elif how == "labels":
        _build("cli", path.parent / "images", out, labels=f"dldataset:{path}", size=SIZE)
    else:
        _build("api", path.parent / "images", out, labels=f"dldataset:{path}", size=SIZE)
    with dlpack.open(out) as ds:
        assert (ds.task, ds.classes, ds.class_ids) == ("detection", ("cat", "dog"), (3, 7))
        samples = _by_source(ds)
        assert sorted(samples) == ["a.png", "b.png", "c.png"]
        for name, sample in samples.items():
            assert _boxes(sample) == BOXES["stretch"][name], name
            assert [ds.class_ids[k] for k in sample["box_labels"].tolist()] == COCO_CATEGORY[name]
        assert {n: s["split"] for n, s in samples.items()} == {"a.png": "train", "b.png": "validation", "c.png": "test"}
        assert [ds[int(i)]["source"] for i in ds.indices(split="train")] == ["a.png"]


# ----------------------------------------------------------------------------- DLDataset output


def _dldataset_out(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """Build one hand-made source with ``--format dldataset`` into ``tmp_path/halcon``; (OUT, task)."""
    out = tmp_path / "halcon"
    if kind == "coco":
        images, ann = coco_source(tmp_path)
        _build("cli", images, out, labels=f"coco:{ann}", size=SIZE, format="dldataset")
        return out, "detection"
    if kind == "masks":
        images, masks = mask_source(tmp_path)
        _build("cli", images, out, labels=f"masks:{masks}", size=SIZE, resize="fit", format="dldataset")
        return out, "segmentation"
    if kind == "anomaly":
        images, truth = anomaly_source(tmp_path)
        _build("api", images, out, labels="anomaly", anomaly_masks=str(truth), size=SIZE, format="dldataset")
        return out, "anomaly"
    if kind == "csv":
        images, table = csv_source(tmp_path)
        _build("api", images, out, labels=f"csv:{table}", size=SIZE, format="dldataset")
        return out, "classification"
    path = dldataset_source(tmp_path)
    _build("cli", path.parent, out, size=SIZE, format="dldataset")
    return out, "detection"


@pytest.mark.parametrize("kind", ["coco", "masks", "anomaly", "csv", "dldataset"])
def test_format_dldataset_writes_halcons_keys_per_task(tmp_path: Path, kind: str) -> None:
    out, task = _dldataset_out(tmp_path, kind)
    doc = _json(out / "dataset.json")
    assert problems(doc, task) == []
    assert (out / "to_hdict.py").is_file()
    for s in doc["samples"]:
        img = cv2.imread(str(out / doc["image_dir"] / s["image_file_name"]), cv2.IMREAD_UNCHANGED)
        assert img is not None and img.shape[:2] == (20, 20), s
    # the build's own store went with it: nothing beside OUT opens as a store
    for entry in tmp_path.iterdir():
        if entry.name.startswith("."):
            _no_store_opens(entry)


def test_dldataset_output_boxes_are_pixel_centred_and_class_ids_kept(tmp_path: Path) -> None:
    out, _ = _dldataset_out(tmp_path, "coco")
    doc = _json(out / "dataset.json")
    assert (doc["class_names"], doc["class_ids"]) == (["cat", "dog"], [3, 7])
    by_name = {s["image_file_name"]: s for s in doc["samples"]}
    assert sorted(by_name) == ["a.png", "b.png", "c.png"]
    # stored a.png box [2, 2, 12, 12] and b.png [5, 5, 10, 15], minus half a pixel, rows first
    assert [by_name["a.png"][k] for k in ("bbox_row1", "bbox_col1", "bbox_row2", "bbox_col2")] == [
        [1.5], [1.5], [11.5], [11.5]
    ]  # fmt: skip
    assert [by_name["b.png"][k] for k in ("bbox_row1", "bbox_col1", "bbox_row2", "bbox_col2")] == [
        [4.5], [4.5], [14.5], [9.5]
    ]  # fmt: skip
    assert [by_name[n]["bbox_label_id"] for n in ("a.png", "b.png", "c.png")] == [[3], [7], []]


def test_dldataset_output_segmentation_images_are_the_stored_masks(tmp_path: Path) -> None:
    out, _ = _dldataset_out(tmp_path, "masks")
    doc = _json(out / "dataset.json")
    by_name = {s["image_file_name"]: s for s in doc["samples"]}
    label = cv2.imread(str(out / doc["segmentation_dir"] / by_name["a.png"]["segmentation_file_name"]), -1)
    assert np.array_equal(label, expected_seg_mask("fit"))


def test_dldataset_output_anomaly_labels(tmp_path: Path) -> None:
    out, _ = _dldataset_out(tmp_path, "anomaly")
    doc = _json(out / "dataset.json")
    labels = {s["image_file_name"]: (s["anomaly_label"], s.get("split")) for s in doc["samples"]}
    assert labels == {
        "test/crack/c1.png": ("nok", "test"),
        "test/good/g2.png": ("ok", "test"),
        "train/good/g1.png": ("ok", "train"),
    }


@pytest.mark.parametrize("kind", ["csv", "dldataset"])
def test_dldataset_output_keeps_the_sources_splits(tmp_path: Path, kind: str) -> None:
    out, _ = _dldataset_out(tmp_path, kind)
    doc = _json(out / "dataset.json")
    splits = {s["image_file_name"]: s["split"] for s in doc["samples"]}
    if kind == "csv":  # dlpack's val is HALCON's validation
        assert splits == {"x.png": "train", "y.png": "validation", "z.png": "test"}
    else:
        assert splits == {"a.png": "train", "b.png": "validation", "c.png": "test"}
    if kind == "csv":
        cat, dog = doc["class_ids"][doc["class_names"].index("cat")], doc["class_ids"][doc["class_names"].index("dog")]
        labels = {s["image_file_name"]: s["image_label_id"] for s in doc["samples"]}
        assert labels == {"x.png": cat, "y.png": dog, "z.png": cat}
    # a DLDataset output reads back as a store-like view with the same splits
    with dlpack.open(out) as view:
        assert len(view.indices(split="train")) == 1


# ----------------------------------------------------------------------------- bad inputs, through the CLI


def _coco_with(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = coco_doc()
    edit(doc)
    return doc


def _add_ann(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["annotations"].append({"id": 50, "image_id": 3, "category_id": 3, "iscrowd": 0, **fields})


def _add_image(name: str, image_id: int = 9) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["images"].append({"id": image_id, "file_name": name, "width": W, "height": H})


#: case -> (source kind, what to change, the entry named, a fragment of the reason, samples left with skip;
#: None: a whole-source error, which --on-error skip cannot get past).
BAD: dict[str, tuple[str, Any, str, str, int | None]] = {
    "coco-missing-image": ("coco", _add_image("gone.png"), "gone.png", "not found", 3),
    "coco-unknown-category": ("coco", _add_ann(category_id=99, bbox=[1, 1, 2, 2]), "c.png", "category id 99", 2),
    "coco-box-outside": ("coco", _add_ann(bbox=[50, 1, 2, 2]), "annotation id 50", "outside", 2),
    "coco-box-zero-size": ("coco", _add_ann(bbox=[1, 1, 0, 2]), "annotation id 50", "zero or negative size", 2),
    "coco-escaping-file-name": ("coco", _add_image("../x.png"), "../x.png", "leaves the image folder", 3),
    "coco-duplicate-image-id": ("coco", _add_image("a2.png", image_id=1), "image id 1", "listed twice", None),
    "coco-duplicate-annotation-id": ("coco", _add_ann(id=1, bbox=[1, 1, 2, 2]), "annotation id 1", "twice", None),
    "coco-malformed-json": ("coco", '{"images": [,]}', "annotations.json", "line 1, column 13", None),
    "masks-missing-mask": ("masks", "missing", "c.png", "no label image", 2),
    "masks-another-size": ("masks", "size", "sub/b.png", "30x20", 1),
    "masks-class-not-listed": ("masks", "class", "sub/b.png", "not in the class list", 1),
    "csv-missing-file": ("csv", "w.png,dog,train\n", "w.png", "line 5", 3),
    "dldataset-unknown-key": ("dldataset", "key", "image_id 3", "colour", 2),
    "dldataset-row1-not-below-row2": ("dldataset", "rows", "image_id 4", "row1", 3),
}


def _bad_source(tmp_path: Path, kind: str, change: Any) -> list[str]:
    """Write the broken source; return ``SRC --labels ...`` for ``dlpack build``."""
    if kind == "coco":
        doc = change if isinstance(change, str) else _coco_with(change)
        images, ann = coco_source(tmp_path, doc)
        return [str(images), "--labels", f"coco:{ann}"]
    if kind == "masks":
        images, masks = mask_source(tmp_path)
        if change == "missing":
            _write(images / "c.png", _noise(5))
        elif change == "size":
            _write(masks / "sub" / "b.png", np.zeros((H, 30), np.uint8))
        else:
            _write(masks / "sub" / "b.png", np.full((H, W), 5, np.uint8))
        return [str(images), "--labels", f"masks:{masks}"]
    if kind == "csv":
        images, table = csv_source(tmp_path, change)
        return [str(images), "--labels", f"csv:{table}"]
    doc = dldataset_doc()
    if change == "key":
        doc["samples"][2]["colour"] = "red"
    else:
        doc["samples"].append(
            {"image_id": 4, "image_file_name": "d.png", "bbox_label_id": [3], "bbox_row1": [5.0], "bbox_col1": [1.0],
             "bbox_row2": [5.0], "bbox_col2": [3.0]}
        )  # fmt: skip
    return [str(dldataset_source(tmp_path, doc).parent)]


@pytest.mark.parametrize("case", sorted(BAD))
def test_every_bad_input_exits_2_naming_the_entry_and_skip_builds_the_rest(
    tmp_path: Path, capsys: Capsys, case: str
) -> None:
    kind, change, entry, reason, left = BAD[case]
    src = _bad_source(tmp_path, kind, change)
    out = tmp_path / "out.zarr"
    capsys.readouterr()
    assert main(["build", src[0], str(out), *src[1:], "--size", "20x20", "--quiet", "--jobs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlpack: error:") and "Traceback" not in err
    assert entry in err and reason in err, err
    _no_store_opens(out)
    skip = ["build", src[0], str(out), *src[1:], "--size", "20x20", "--on-error", "skip", "--jobs", "1"]
    if left is None:  # the source as a whole cannot be trusted: skipping does not help
        assert main(skip) == 2
        assert entry in capsys.readouterr().err
        _no_store_opens(out)
        return
    assert main(skip) == 1  # 1: built, with inputs left out
    err = capsys.readouterr().err
    assert entry in err and reason in err, err
    with dlpack.open(out) as ds:
        assert len(ds) == left
        skipped = " ".join(f"{s.path}: {s.reason}" for s in ds.manifest.skipped)
        assert entry in skipped and reason in skipped, skipped


# ----------------------------------------------------------------------------- the built-in sample


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_sample(tmp_path_factory.mktemp("sample") / "s", count=24, size=64, labels=True)


@pytest.mark.parametrize("layout", ["coco", "masks", "anomaly", "csv"])
def test_the_builtin_sample_builds_with_each_label_layout(sample: Path, tmp_path: Path, layout: str) -> None:
    flags = {
        "coco": {"labels": f"coco:{sample / 'annotations.json'}"},
        "masks": {"labels": f"masks:{sample / 'masks'}"},
        "anomaly": {"labels": "anomaly", "anomaly_masks": str(sample / "ground_truth")},
        "csv": {"labels": f"csv:{sample / 'labels.csv'}"},
    }[layout]
    out = tmp_path / "s.zarr"
    _build("cli", sample / "images", out, size=(32, 32), **flags)
    with dlpack.open(out) as ds:
        assert len(ds) == 24
        if layout == "coco":
            doc = _json(sample / "annotations.json")
            assert (ds.task, ds.classes, ds.class_ids) == ("detection", ("scratch", "spot", "crack"), (1, 2, 3))
            assert sum(len(ds[i]["boxes"]) for i in range(len(ds))) == len(doc["annotations"])
            samples = _by_source(ds)
            for img in doc["images"]:  # stretched to 32x32: x * 32 / width, y * 32 / height
                iw, ih = img["width"], img["height"]
                anns = [a for a in doc["annotations"] if a["image_id"] == img["id"]]
                want = [
                    [x * 32 / iw, y * 32 / ih, (x + w) * 32 / iw, (y + h) * 32 / ih]
                    for x, y, w, h in (a["bbox"] for a in anns)
                ]
                sample = samples[img["file_name"]]
                assert np.array_equal(sample["boxes"], np.array(want, np.float32).reshape(-1, 4)), img["file_name"]
                got = [ds.class_ids[k] for k in sample["box_labels"].tolist()]
                assert got == [a["category_id"] for a in anns]
        elif layout == "masks":
            assert (ds.task, ds.classes, ds.class_ids) == (
                "segmentation",
                ("background", "scratch", "spot", "crack"),
                (0, 1, 2, 3),
            )
            for i in range(len(ds)):
                s = ds[i]
                cls = s["source"].split("/")[0]
                values = set(np.unique(s["mask"]).tolist())
                assert values <= {0, ("good", "scratch", "spot", "crack").index(cls)}, s["source"]
        elif layout == "anomaly":
            assert (ds.task, ds.classes) == ("anomaly", ("ok", "nok"))
            for i in range(len(ds)):
                s = ds[i]
                defect = s["source"].split("/")[0]
                assert ds.defects[s["defect"]] == defect
                assert ds.classes[s["label"]] == ("ok" if defect == "good" else "nok")
                if defect == "good":
                    assert not s["mask"].any()
        else:
            assert (ds.task, ds.splits) == ("classification", ("test", "train", "val"))
            assert ds.classes == ("crack", "good", "scratch", "spot")
            for i in range(len(ds)):
                assert ds.classes[ds[i]["label"]] == ds[i]["source"].split("/")[0]
