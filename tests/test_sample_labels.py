"""Tests for the labels the built-in sample writes for the defects it draws (``labels=True``)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt
import pytest

from dlpack import sample as sample_module
from dlpack._outline import fill_holes, outline, tight_box
from dlpack.sample import CLASSES, main, make_sample

COUNT = 24  # from 24 images on every variant (gray, 16-bit, RGBA, odd sizes, odd names) is there
SIZE = 64
DEFECTS = CLASSES[1:]
LAYOUT = {"images", "masks", "ground_truth", "annotations.json", "labels.csv"}

_Bool = npt.NDArray[np.bool_]


def _tree(root: pathlib.Path) -> dict[str, bytes]:
    """Map every file's relative POSIX path under `root` to its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _decode(path: pathlib.Path) -> npt.NDArray[Any]:
    """Decode an image whose path may be non-ASCII, as dlpack's readers do."""
    image = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None, f"cv2 could not decode {path}"
    return np.asarray(image)


def _stem(rel: str) -> str:
    return rel.rsplit(".", 1)[0]


def _fill(polygons: Sequence[Sequence[float]], h: int, w: int) -> _Bool:
    """Rasterise COCO polygons (pixel-corner coordinates) by their pixel centres, even-odd rule.

    Written here, independent of the code under test: a horizontal ray from each pixel
    centre's row toggles the pixels right of every edge it crosses.
    """
    out = np.zeros((h, w), np.bool_)
    for poly in polygons:
        xs, ys = np.asarray(poly[0::2], np.float64), np.asarray(poly[1::2], np.float64)
        flips = np.zeros((h, w + 1), np.uint8)
        for xa, ya, xb, yb in zip(xs, ys, np.roll(xs, -1), np.roll(ys, -1), strict=True):
            if ya == yb:
                continue
            lo, hi = min(ya, yb), max(ya, yb)
            rows = np.arange(max(0, int(np.ceil(lo - 0.5))), min(h, int(np.ceil(hi - 0.5))))
            centre = rows + 0.5
            rows = rows[(centre >= lo) & (centre < hi)]
            x_cross = xa + (rows + 0.5 - ya) * (xb - xa) / (yb - ya)
            first = np.clip(np.floor(x_cross - 0.5) + 1, 0, w).astype(np.int64)  # first centre right of the edge
            np.bitwise_xor.at(flips, (rows, first), 1)
        out |= np.bitwise_xor.accumulate(flips, axis=1)[:, :w].astype(np.bool_)
    return out


@dataclasses.dataclass(frozen=True)
class Labelled:
    """A labelled sample as read back from disk."""

    root: pathlib.Path
    coco: dict[str, Any]
    images: dict[str, npt.NDArray[Any]]  # relative path -> decoded image
    masks: dict[str, npt.NDArray[Any]]  # relative path of the image -> decoded label image

    def annotations(self) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """Yield (image entry, annotation) pairs."""
        by_id = {im["id"]: im for im in self.coco["images"]}
        for ann in self.coco["annotations"]:
            yield by_id[ann["image_id"]], ann


def _read(root: pathlib.Path) -> Labelled:
    images_dir = root / "images"
    images = {p.relative_to(images_dir).as_posix(): _decode(p) for p in sorted(images_dir.rglob("*")) if p.is_file()}
    masks = {rel: _decode(root / "masks" / f"{_stem(rel)}.png") for rel in images}
    coco = json.loads((root / "annotations.json").read_text(encoding="utf-8"))
    return Labelled(root, coco, images, masks)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Labelled:
    return _read(make_sample(tmp_path_factory.mktemp("small"), count=COUNT, size=SIZE, seed=0, labels=True))


@pytest.fixture(scope="module")
def large(tmp_path_factory: pytest.TempPathFactory) -> Labelled:
    # From 768 px on lines are 2 px thick: another drawing path of cv2.
    return _read(make_sample(tmp_path_factory.mktemp("large"), count=8, size=800, seed=5, labels=True))


@pytest.fixture(params=["small", "large"])
def labelled(request: pytest.FixtureRequest) -> Labelled:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


# --- layout -------------------------------------------------------------------------------


def test_labels_sit_beside_the_unchanged_image_tree(tmp_path: pathlib.Path, small: Labelled) -> None:
    assert {p.name for p in small.root.iterdir()} == LAYOUT
    plain = make_sample(tmp_path / "plain", count=COUNT, size=SIZE, seed=0)
    assert _tree(small.root / "images") == _tree(plain)


def test_without_labels_only_class_folders_are_written(tmp_path: pathlib.Path) -> None:
    root = make_sample(tmp_path / "raw", count=8, size=32, seed=0, labels=False)
    assert sorted(p.name for p in root.iterdir()) == sorted(CLASSES)


def test_main_labels_flag_writes_the_labelled_layout(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli"
    assert main([str(out), "--count", "8", "--size", "32", "--seed", "3", "--labels"]) == 0
    assert capsys.readouterr().out.startswith("wrote 8 images in 4 classes with labels (")
    assert _tree(out) == _tree(make_sample(tmp_path / "lib", count=8, size=32, seed=3, labels=True))


# --- COCO -----------------------------------------------------------------------------------


def test_coco_lists_every_image_once_with_its_size(labelled: Labelled) -> None:
    entries = labelled.coco["images"]
    assert sorted(e["file_name"] for e in entries) == sorted(labelled.images)
    assert len({e["id"] for e in entries}) == len(entries)
    for e in entries:
        h, w = labelled.images[e["file_name"]].shape[:2]
        assert (e["width"], e["height"]) == (w, h), e["file_name"]


def test_coco_categories_are_the_defects_from_id_1_and_name_the_mask_values(labelled: Labelled) -> None:
    categories = labelled.coco["categories"]
    assert [(c["id"], c["name"]) for c in categories] == [(i + 1, name) for i, name in enumerate(DEFECTS)]
    lines = (labelled.root / "masks" / "classes.txt").read_text(encoding="utf-8").splitlines()
    assert lines == ["background", *DEFECTS]
    for c in categories:
        assert lines[c["id"]] == c["name"]


def test_coco_annotations_are_well_formed(labelled: Labelled) -> None:
    anns = labelled.coco["annotations"]
    assert anns, "no annotations"
    assert len({a["id"] for a in anns}) == len(anns)
    assert min(a["id"] for a in anns) == 1
    for image, ann in labelled.annotations():
        assert ann["iscrowd"] == 0
        assert ann["category_id"] == DEFECTS.index(image["file_name"].split("/")[0]) + 1, image["file_name"]
        x, y, w, h = ann["bbox"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0, ann["id"]
        assert x + w <= image["width"] and y + h <= image["height"], ann["id"]
        assert ann["segmentation"] and all(len(p) >= 6 and len(p) % 2 == 0 for p in ann["segmentation"])


def test_every_defect_image_has_annotations_and_good_ones_none(labelled: Labelled) -> None:
    annotated = {image["file_name"] for image, _ in labelled.annotations()}
    for rel in labelled.images:
        assert (rel in annotated) == (not rel.startswith("good/")), rel


def test_every_box_is_the_tight_box_of_its_defect_pixels_in_the_mask(labelled: Labelled) -> None:
    for image, ann in labelled.annotations():
        mask = labelled.masks[image["file_name"]]
        pixels = _fill(ann["segmentation"], image["height"], image["width"])
        assert pixels.any(), ann["id"]
        assert (mask[pixels] == ann["category_id"]).all(), f"annotation {ann['id']} covers pixels of another class"
        rows, cols = np.nonzero(pixels)
        tight = [int(cols.min()), int(rows.min()), int(cols.max() - cols.min() + 1), int(rows.max() - rows.min() + 1)]
        assert ann["bbox"] == tight, ann["id"]
        assert ann["area"] == int(pixels.sum()), ann["id"]


def test_mask_is_the_union_of_the_annotations(labelled: Labelled) -> None:
    union = {rel: np.zeros(m.shape, np.uint8) for rel, m in labelled.masks.items()}
    for image, ann in labelled.annotations():
        union[image["file_name"]][_fill(ann["segmentation"], image["height"], image["width"])] = ann["category_id"]
    for rel, mask in labelled.masks.items():
        assert mask.dtype == np.uint8 and mask.shape == labelled.images[rel].shape[:2], rel
        np.testing.assert_array_equal(mask, union[rel], err_msg=rel)


def test_mask_values_are_background_or_the_image_class(labelled: Labelled) -> None:
    for rel, mask in labelled.masks.items():
        cls = rel.split("/")[0]
        expected = {0} if cls == "good" else {0, CLASSES.index(cls)}
        assert set(np.unique(mask).tolist()) == expected, rel


# pycocotools (2.0.x) warns about numpy 2's copy keyword on decode; not ours to fix.
@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning")
def test_pycocotools_reads_the_same_masks(labelled: Labelled) -> None:
    coco_mask = pytest.importorskip("pycocotools.mask")
    for image, ann in labelled.annotations():
        rles = coco_mask.frPyObjects(ann["segmentation"], image["height"], image["width"])
        decoded = coco_mask.decode(coco_mask.merge(rles)).astype(np.bool_)
        np.testing.assert_array_equal(decoded, _fill(ann["segmentation"], image["height"], image["width"]))
        assert coco_mask.toBbox(coco_mask.merge(rles)).tolist() == ann["bbox"]


# --- the labels mark what the image shows ---------------------------------------------------


@pytest.mark.parametrize(("count", "size", "seed"), [(24, 64, 0), (12, 300, 1), (8, 800, 5)])
def test_labels_mark_the_pixels_the_defect_changes(count: int, size: int, seed: int) -> None:
    # The image against the same image without its defect (16-bit luminance: no tint, no
    # rounding); the labelled pixels are the changed ones.
    labelled = changed = strong = strong_labelled = 0
    for spec in sample_module._plan(count, size, seed):
        if spec.cls == "good":
            continue
        deep = dataclasses.replace(spec, kind="gray16")
        image, shapes = sample_module._render(deep, seed)
        clean, _ = sample_module._render(dataclasses.replace(deep, cls="good"), seed)
        change = np.abs(image.astype(np.float64) - clean.astype(np.float64)) / 65535.0 / abs(shapes[0].value)
        mask = np.zeros(change.shape, np.bool_)
        for shape in shapes:
            found = sample_module._shape_region(shape, spec.height, spec.width)
            if found is not None:
                region, x0, y0 = found
                mask[y0 : y0 + region.shape[0], x0 : x0 + region.shape[1]] |= region
        labelled += int(mask.sum())
        changed += int((change[mask] >= 0.5).sum())
        strong += int((change >= 0.75).sum())
        strong_labelled += int((mask & (change >= 0.75)).sum())
    # Not all: a crack that closes a loop labels the pixels inside it, and a dark crack on a
    # dark background is clipped at black.
    assert changed >= 0.9 * labelled
    assert strong_labelled >= 0.99 * strong


# --- anomaly layout ----------------------------------------------------------------------------


def test_anomaly_folders_are_good_and_one_per_defect(labelled: Labelled) -> None:
    present = {rel.split("/")[0] for rel in labelled.images}
    assert present <= {"good", *DEFECTS}
    assert {p.name for p in (labelled.root / "images").iterdir()} == present
    assert {p.name for p in (labelled.root / "ground_truth").iterdir()} == present - {"good"}


def test_ground_truth_agrees_with_the_masks(labelled: Labelled) -> None:
    truth_dir = labelled.root / "ground_truth"
    truths = {p.relative_to(truth_dir).as_posix() for p in truth_dir.rglob("*") if p.is_file()}
    defect_images = [rel for rel in labelled.images if not rel.startswith("good/")]
    assert truths == {f"{_stem(rel)}.png" for rel in defect_images}
    for rel in defect_images:
        truth = _decode(truth_dir / f"{_stem(rel)}.png")
        assert truth.dtype == np.uint8 and truth.shape == labelled.masks[rel].shape, rel
        np.testing.assert_array_equal(truth != 0, labelled.masks[rel] != 0, err_msg=rel)
        assert set(np.unique(truth).tolist()) == {0, 255}, rel


# --- CSV -------------------------------------------------------------------------------------


def test_csv_lists_every_image_once_with_its_class_and_a_split(labelled: Labelled) -> None:
    text = (labelled.root / "labels.csv").read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(text)))
    assert rows[0] == ["path", "label", "split"]
    paths = [r[0] for r in rows[1:]]
    assert sorted(paths) == sorted(labelled.images) and len(set(paths)) == len(paths)
    for path, label, split in rows[1:]:
        assert label == path.split("/")[0], path
        assert split in ("train", "val", "test"), path


def test_csv_split_is_stratified_by_class(small: Labelled) -> None:
    rows = list(csv.DictReader(io.StringIO((small.root / "labels.csv").read_text(encoding="utf-8"))))
    for cls in CLASSES:
        splits = [r["split"] for r in rows if r["label"] == cls]
        n = len(splits)
        assert splits.count("val") == round(n * 0.1) and splits.count("test") == round(n * 0.1), cls


# --- determinism -------------------------------------------------------------------------------


def test_same_seed_gives_byte_identical_labels(tmp_path: pathlib.Path, small: Labelled) -> None:
    again = make_sample(tmp_path / "again", count=COUNT, size=SIZE, seed=0, labels=True)
    assert _tree(again) == _tree(small.root)


def test_other_seed_gives_other_labels(tmp_path: pathlib.Path, small: Labelled) -> None:
    other = make_sample(tmp_path / "other", count=COUNT, size=SIZE, seed=1, labels=True)
    assert (other / "annotations.json").read_bytes() != (small.root / "annotations.json").read_bytes()
    assert (other / "labels.csv").read_bytes() != (small.root / "labels.csv").read_bytes()


# --- outlines ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_outline_fills_back_to_the_region(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(200):
        h, w = (int(v) for v in rng.integers(1, 14, 2))
        region = fill_holes(rng.random((h, w)) < rng.uniform(0.1, 0.9))
        polygons = outline(region)
        np.testing.assert_array_equal(_fill(polygons, h, w), region)
        shoelace = sum(
            abs(float(np.dot(p[0::2], np.roll(p[1::2], -1)) - np.dot(p[1::2], np.roll(p[0::2], -1)))) / 2
            for p in (np.asarray(q, np.int64) for q in polygons)
        )
        assert shoelace == region.sum()


def test_outline_joins_pixels_touching_at_a_corner_and_skips_holes() -> None:
    diagonal = np.eye(3, dtype=np.bool_)
    assert len(outline(diagonal)) == 1
    ring = np.ones((3, 3), np.bool_)
    ring[1, 1] = False
    assert fill_holes(ring).all()
    assert outline(np.ones((2, 3), np.bool_), 10, 20) == [[13, 20, 13, 22, 10, 22, 10, 20]]
    assert outline(np.zeros((2, 2), np.bool_)) == []


def test_tight_box_is_coco_xywh() -> None:
    region = np.zeros((6, 8), np.bool_)
    region[2:4, 3:7] = True
    assert tight_box(region) == (3, 2, 4, 2)
    assert tight_box(np.zeros((3, 3), np.bool_)) is None
