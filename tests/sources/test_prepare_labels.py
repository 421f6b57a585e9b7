"""prepare_labels: one sample's annotations -> its stored label arrays, and every refusal naming its file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from dlpack.sources.decode import DecodeError, PreparedImage, TargetSpec, prepare_image
from dlpack.sources.labels import LabelOutputs, prepare_labels
from dlpack.transforms.functional import apply_orientation, resize_mask
from tests._exif import FORMATS, oriented_file

FIT = TargetSpec(mode="fit", size=(8, 8), channels=1)  # a 8 wide x 4 high image -> 8 x 4 in 8 x 8, 2 pad rows above


def _png(array: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", array)
    assert ok
    return buf.tobytes()


def _image(h: int = 4, w: int = 8, target: TargetSpec = FIT, orientation: int | None = None) -> PreparedImage:
    pixels = np.full((h, w, 3), 100, np.uint8)
    data = _png(pixels) if orientation is None else oriented_file(".png", pixels, orientation)
    return prepare_image(data, target)


def _write(path: Path, array: np.ndarray) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_png(array))
    return path.name


def _labels(tmp_path: Path, ann: dict[str, Any] | None, prepared: PreparedImage, task: str, **kw: Any) -> LabelOutputs:
    kw.setdefault("mask_dtype", None)
    return prepare_labels(
        tmp_path,
        kw.pop("label_root", None),
        ann,
        prepared,
        task,
        kw.pop("mask_dtype"),
        kw.pop("ignore", None),
        kw.pop("class_ids", ()),
        **kw,
    )


# ---------------------------------------------------------------- the orientation decode applied


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("suffix", FORMATS)
def test_prepared_image_records_the_orientation_it_applied(suffix: str, orientation: int) -> None:
    raw = np.zeros((5, 9, 3), np.uint8)
    raw[1:3, 2:7] = 255  # a rectangle [2, 1, 7, 3] in the raw frame
    prepared = prepare_image(oriented_file(suffix, raw, orientation), TargetSpec(channels=1))
    assert prepared.orientation == orientation
    rows, cols = np.nonzero(prepared.pixels[:, :, 0] > 127)
    out = prepare_labels("", None, {"frame": "file", "boxes": [[2, 1, 7, 3]], "box_labels": [0]}, prepared, "detection")
    assert out.arrays["boxes"].tolist() == [[cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]]


def test_a_file_without_exif_records_orientation_1() -> None:
    assert prepare_image(_png(np.zeros((5, 9, 3), np.uint8)), TargetSpec()).orientation == 1


# ---------------------------------------------------------------- boxes


def test_detection_boxes_follow_the_fit_and_count_clipped_and_dropped(tmp_path: Path) -> None:
    ann = {
        "boxes": [[0, 0, 4, 2], [6, 3, 10, 6], [9, 0, 12, 1]],  # inside; sticks out; outside the 8 x 4 image
        "box_labels": [1, 0, 2],
        "iscrowd": [0, 1, 0],
    }
    out = _labels(tmp_path, ann, _image(), "detection")
    assert out.arrays["boxes"].dtype == np.float32 and out.arrays["box_labels"].dtype == np.int32
    assert out.arrays["boxes"].tolist() == [[0, 2, 4, 4], [6, 5, 8, 6]]  # 2 rows of padding above
    assert out.arrays["box_labels"].tolist() == [1, 0]
    assert out.arrays["box_crowd"].tolist() == [0, 1] and out.arrays["box_crowd"].dtype == np.uint8
    assert (out.clipped, out.dropped) == (1, 1)
    assert "mask" not in out.arrays


def test_a_detection_sample_without_boxes_has_empty_arrays_and_no_crowd(tmp_path: Path) -> None:
    out = _labels(tmp_path, None, _image(), "detection")
    assert out.arrays["boxes"].shape == (0, 4) and out.arrays["box_labels"].shape == (0,)
    assert "box_crowd" not in out.arrays and (out.clipped, out.dropped) == (0, 0)
    assert _labels(tmp_path, None, _image(), "classification").arrays == {}


def test_boxes_in_the_file_frame_are_turned_before_the_resize(tmp_path: Path) -> None:
    prepared = _image(4, 8, TargetSpec(mode="stretch", size=(2, 4), channels=1), orientation=6)  # upright 4 x 8
    # Raw 8 x 4 box [1, 0, 3, 2] -> orientation 6: x' = 4 - y, y' = x -> [2, 1, 4, 3] -> stretch x 0.5, y 0.5.
    out = _labels(tmp_path, {"frame": "file", "boxes": [[1, 0, 3, 2]], "box_labels": [0]}, prepared, "detection")
    assert out.arrays["boxes"].tolist() == [[1.0, 0.5, 2.0, 1.5]]


def test_bad_box_annotations_are_refused_with_the_reason(tmp_path: Path) -> None:
    cases = [
        ({"boxes": [[0, 0, 1, 1]], "box_labels": []}, "1 boxes but 0 box labels"),
        ({"boxes": [[0, 0, 1]], "box_labels": [0]}, "annotation boxes"),
        ({"boxes": [[0, 0, 1, 1]], "box_labels": [5]}, "box labels must be class indices; got 5"),
        ({"boxes": [[0, 0, 1, 1]], "box_labels": [0], "iscrowd": [2]}, "iscrowd"),
        ({"frame": "sideways"}, "frame must be"),
        ({"image_size": [10, 10]}, "made on a 10x10 image, but the image is 8x4"),
    ]
    for ann, reason in cases:
        with pytest.raises(DecodeError, match=reason):
            _labels(tmp_path, ann, _image(), "detection", class_ids=(1, 2))


# ---------------------------------------------------------------- label images


def test_a_mask_is_resized_nearest_and_padded_with_ignore(tmp_path: Path) -> None:
    mask = np.zeros((4, 8), np.uint8)
    mask[:, 4:] = 2
    mask[3, 0] = 1
    _write(tmp_path / "m" / "a.png", mask)
    out = _labels(
        tmp_path, {"mask": "a.png"}, _image(), "segmentation", label_root=tmp_path / "m", mask_dtype="|u1"
    ).arrays["mask"]
    assert out.dtype == np.uint8 and out.shape == (8, 8)
    assert (out[:2] == 255).all() and (out[6:] == 255).all()
    assert np.array_equal(out[2:6], mask)


def test_16_bit_masks_keep_their_ids_and_8_bit_ones_widen_unscaled(tmp_path: Path) -> None:
    wide = np.full((4, 8), 40000, np.uint16)
    wide[0, 0] = 3
    _write(tmp_path / "w.png", wide)
    out = _labels(tmp_path, {"mask": "w.png"}, _image(), "segmentation", mask_dtype="<u2").arrays["mask"]
    assert out.dtype == np.uint16 and out[2, 0] == 3 and out[5, 7] == 40000 and out[0, 0] == 65535
    _write(tmp_path / "n.png", np.full((4, 8), 7, np.uint8))
    out = _labels(tmp_path, {"mask": "n.png"}, _image(), "segmentation", mask_dtype="<u2").arrays["mask"]
    assert out.dtype == np.uint16 and set(np.unique(out).tolist()) == {7, 65535}  # 7, not 7 x 257


def test_a_mask_of_the_raw_file_size_is_turned_with_its_image(tmp_path: Path) -> None:
    raw = np.arange(32, dtype=np.uint8).reshape(4, 8)  # the file is 8 x 4; orientation 6 shows it 4 x 8
    _write(tmp_path / "r.png", raw)
    prepared = _image(4, 8, TargetSpec(channels=1), orientation=6)
    assert prepared.original_size == (8, 4)
    out = _labels(tmp_path, {"mask": "r.png"}, prepared, "segmentation", mask_dtype="|u1").arrays["mask"]
    assert np.array_equal(out, apply_orientation(raw, 6))


def test_a_colour_mask_with_equal_channels_is_read_as_gray(tmp_path: Path) -> None:
    gray = np.zeros((4, 8), np.uint8)
    gray[1:3, 2:5] = 4
    _write(tmp_path / "c.png", np.repeat(gray[:, :, None], 3, axis=2))
    out = _labels(tmp_path, {"mask": "c.png"}, _image(), "segmentation", mask_dtype="|u1").arrays["mask"]
    assert np.array_equal(out[2:6], gray)


def _refused(tmp_path: Path, ann: dict[str, Any], *reason: str, **kw: Any) -> None:
    kw.setdefault("mask_dtype", "|u1")
    with pytest.raises(DecodeError) as info:
        _labels(tmp_path, ann, kw.pop("prepared", None) or _image(), kw.pop("task", "segmentation"), **kw)
    for part in reason:
        assert part in str(info.value)


def test_a_missing_mask_is_named(tmp_path: Path) -> None:
    _refused(tmp_path, {"mask": "masks/none.png"}, "mask 'masks/none.png' is missing")
    _refused(tmp_path, {}, "no mask given")


def test_a_mask_of_another_size_is_named_with_both_sizes(tmp_path: Path) -> None:
    _write(tmp_path / "s.png", np.zeros((5, 8), np.uint8))
    _refused(tmp_path, {"mask": "s.png"}, "mask 's.png' is 8x5, its image is 8x4")
    prepared = _image(4, 8, TargetSpec(channels=1), orientation=6)
    _refused(tmp_path, {"mask": "s.png"}, "is 8x5, its image is 4x8 (8x4 in the file", prepared=prepared)
    # Declared in the file frame, a mask of the upright size is refused.
    _write(tmp_path / "u.png", np.zeros((8, 4), np.uint8))
    _refused(tmp_path, {"mask": "u.png", "frame": "file"}, "mask 'u.png' is 4x8", prepared=prepared)


def test_class_ids_outside_the_list_are_listed(tmp_path: Path) -> None:
    mask = np.zeros((4, 8), np.uint8)
    mask[0, :3] = [3, 9, 255]
    _write(tmp_path / "k.png", mask)
    _refused(tmp_path, {"mask": "k.png"}, "mask 'k.png' holds class ids not in the class list: 3, 9", class_ids=(0, 1))
    # The ignore value may mark pixels already; the listed ids are fine.
    out = _labels(tmp_path, {"mask": "k.png"}, _image(), "segmentation", mask_dtype="|u1", class_ids=(0, 3, 9))
    assert out.arrays["mask"][2, 2] == 255


def test_ids_over_the_store_mask_depth_are_refused(tmp_path: Path) -> None:
    _write(tmp_path / "d.png", np.full((4, 8), 300, np.uint16))
    _refused(tmp_path, {"mask": "d.png"}, "mask 'd.png' holds ids up to 300, over the 8-bit masks")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "is unreadable: empty file"),
        (b"not an image at all", "is unreadable: not an image"),
        ("truncated", "is unreadable: truncated PNG"),
        ("colour", "is a colour image (its channels differ)"),
        ("jpeg", "is a JPEG"),
        ("palette", "is a palette PNG"),
    ],
)
def test_an_unusable_mask_file_is_named_with_the_reason(tmp_path: Path, content: Any, reason: str) -> None:
    path = tmp_path / "bad.png"
    if content == "truncated":
        path.write_bytes(_png(np.zeros((4, 8), np.uint8))[:-20])
    elif content == "colour":
        colour = np.zeros((4, 8, 3), np.uint8)
        colour[0, 0] = (1, 2, 3)
        _write(path, colour)
    elif content == "jpeg":
        ok, buf = cv2.imencode(".jpg", np.zeros((4, 8), np.uint8))
        path.write_bytes(buf.tobytes())
    elif content == "palette":
        pil = pytest.importorskip("PIL.Image")
        pil.fromarray(np.zeros((4, 8), np.uint8)).convert("P").save(path)
    else:
        path.write_bytes(content)
    _refused(tmp_path, {"mask": "bad.png"}, "mask 'bad.png'", reason)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_mask_that_is_a_named_pipe_is_never_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "p.png")
    _refused(tmp_path, {"mask": "p.png"}, "mask 'p.png' is not a regular file (a named pipe)")


# ---------------------------------------------------------------- COCO segmentations


def _coco(**extra: Any) -> dict[str, Any]:
    return {
        "boxes": [[0, 0, 6, 4], [4, 0, 8, 4]],
        "box_labels": [0, 1],
        "segmentation": [[[0, 0, 6, 0, 6, 4, 0, 4]], [[4, 0, 8, 0, 8, 4, 4, 4]]],
        **extra,
    }


def test_coco_segmentations_paint_category_ids_later_over_earlier(tmp_path: Path) -> None:
    out = _labels(tmp_path, _coco(), _image(), "detection", mask_dtype="|u1", class_ids=(5, 17)).arrays["mask"]
    assert out[2:6, :4].tolist() == [[5] * 4] * 4 and out[2:6, 4:].tolist() == [[17] * 4] * 4
    assert (out[:2] == 255).all()


def test_instance_masks_number_the_stored_boxes(tmp_path: Path) -> None:
    ann = _coco()
    ann["boxes"].insert(0, [20, 20, 30, 30])  # outside: dropped, so it takes no instance id
    ann["box_labels"].insert(0, 1)
    ann["segmentation"].insert(0, None)
    out = _labels(tmp_path, ann, _image(), "detection", mask_dtype="|u1", class_ids=(5, 17), instance_masks=True)
    assert out.dropped == 1 and out.arrays["box_labels"].tolist() == [0, 1]
    mask = out.arrays["mask"]
    assert mask[2:6, :4].tolist() == [[1] * 4] * 4 and mask[2:6, 4:].tolist() == [[2] * 4] * 4


def test_an_rle_segmentation_and_a_sample_without_any(tmp_path: Path) -> None:
    coco = pytest.importorskip("pycocotools.mask")
    region = np.zeros((4, 8), np.uint8)
    region[1:3, 1:7] = 1
    rle = coco.encode(np.asfortranarray(region))
    ann = {
        "boxes": [[1, 1, 7, 3]],
        "box_labels": [0],
        "segmentation": [{"size": rle["size"], "counts": rle["counts"].decode()}],
    }
    out = _labels(tmp_path, ann, _image(), "detection", mask_dtype="|u1", class_ids=(3,)).arrays["mask"]
    assert np.array_equal(out[2:6], region * 3)
    empty = _labels(tmp_path, {"boxes": []}, _image(), "detection", mask_dtype="|u1").arrays["mask"]
    assert (empty[2:6] == 0).all() and (empty[:2] == 255).all()


def test_a_bad_segmentation_is_named_by_its_box(tmp_path: Path) -> None:
    _refused(tmp_path, _coco(segmentation=[[[0, 0, 1, 1]], None]), "segmentation of box 0", task="detection")
    _refused(tmp_path, _coco(segmentation=[None]), "not a list of 2", task="detection")
    _refused(tmp_path, _coco(), "class id 255 does not fit", task="detection", class_ids=(255, 1))


# ---------------------------------------------------------------- anomaly ground truth


def test_anomaly_ground_truth_is_binarised_and_ok_samples_are_zero(tmp_path: Path) -> None:
    gt = np.zeros((4, 8), np.uint8)
    gt[1, 1:3] = 255
    gt[2, 5] = 17
    _write(tmp_path / "gt" / "s.png", gt)
    ann = {"defect": "scratch", "anomaly_mask": "s.png"}
    out = _labels(tmp_path, ann, _image(), "anomaly", label_root=tmp_path / "gt", mask_dtype="|u1").arrays["mask"]
    assert np.array_equal(out[2:6], (gt != 0).astype(np.uint8)) and (out[:2] == 255).all()
    ok = _labels(tmp_path, {"defect": "Good"}, _image(), "anomaly", mask_dtype="|u1").arrays["mask"]
    assert (ok[2:6] == 0).all()


def test_anomaly_errors_name_the_ground_truth(tmp_path: Path) -> None:
    _refused(tmp_path, {"defect": "scratch"}, "no ground-truth image for this 'scratch' sample", task="anomaly")
    _refused(
        tmp_path,
        {"defect": "scratch", "anomaly_mask": "gt/x.png"},
        "ground-truth image 'gt/x.png' is missing",
        task="anomaly",
    )


def test_a_mask_equals_resize_mask_of_the_file(tmp_path: Path) -> None:
    """prepare_labels adds no geometry of its own: the mask is resize_mask of the label image."""
    rng = np.random.default_rng(0)
    mask = rng.integers(0, 5, size=(30, 50)).astype(np.uint8)
    _write(tmp_path / "r.png", mask)
    target = TargetSpec(mode="fit", size=(16, 16), channels=1)
    prepared = _image(30, 50, target)
    out = _labels(tmp_path, {"mask": "r.png"}, prepared, "segmentation", mask_dtype="|u1").arrays["mask"]
    assert np.array_equal(out, resize_mask(mask, prepared.geometry, 255))
