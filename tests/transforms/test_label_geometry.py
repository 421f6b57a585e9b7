"""Labels follow the image: the pure geometry of boxes and masks (dlpack.transforms.functional).

Expected numbers are worked out by hand in the comments: a box's corners go through
``x * new_w / src_w + off_x`` and ``y * new_h / src_h + off_y``.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dlpack.errors import MissingExtraError
from dlpack.transforms.functional import (
    Geometry,
    apply_orientation,
    orient_boxes,
    plan_geometry,
    polygons_to_mask,
    resize_boxes,
    resize_mask,
    rle_to_mask,
)

ORIENTATIONS = range(1, 9)


def _bbox(mask: np.ndarray) -> list[int]:
    rows, cols = np.nonzero(mask)
    return [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]


# ---------------------------------------------------------------- orient_boxes


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_a_box_turns_with_its_image_for_every_exif_orientation(orientation: int) -> None:
    raw = np.zeros((7, 11), np.uint8)  # file_h = 7, file_w = 11: not square, so 5..8 swap the sides
    boxes = [[2, 1, 8, 4], [0, 0, 11, 7], [10, 6, 11, 7]]
    for x0, y0, x1, y1 in boxes:
        one = np.zeros_like(raw)
        one[y0:y1, x0:x1] = 1
        upright = apply_orientation(one, orientation)
        got = orient_boxes([[x0, y0, x1, y1]], orientation, 11, 7)
        assert got.tolist() == [_bbox(upright)]
    assert orient_boxes(boxes, orientation, 11, 7).shape == (3, 4)


def test_orient_boxes_by_hand() -> None:
    # Orientation 6 (turn 90 degrees clockwise): x' = file_h - y, y' = x; the 11x7 file shows as 7x11.
    assert orient_boxes([[2.5, 1.0, 8.0, 4.25]], 6, 11, 7).tolist() == [[2.75, 2.5, 6.0, 8.0]]
    # Orientation 3 (180 degrees): x' = 11 - x, y' = 7 - y.
    assert orient_boxes([[2.5, 1.0, 8.0, 4.25]], 3, 11, 7).tolist() == [[3.0, 2.75, 8.5, 6.0]]
    assert orient_boxes(np.zeros((0, 4)), 6, 11, 7).shape == (0, 4)


def test_orient_boxes_refuses_what_is_not_a_box_list() -> None:
    with pytest.raises(ValueError, match="k x 4"):
        orient_boxes([[1, 2, 3]], 1, 10, 10)
    with pytest.raises(ValueError, match="finite"):
        orient_boxes([[1, 2, float("nan"), 4]], 1, 10, 10)


# ---------------------------------------------------------------- resize_boxes


def test_stretch_boxes_by_hand() -> None:
    g = plan_geometry(100, 200, "stretch", (50, 40))  # 200 x 100 -> 50 x 40: scale_x 0.25, scale_y 0.4
    assert g == Geometry(100, 200, 40, 50, 40, 50, 0, 0)
    r = resize_boxes(
        [
            [20, 10, 120, 60],  # -> [5, 4, 30, 24]
            [180, 90, 260, 130],  # sticks out: cut to [180, 90, 200, 100] -> [45, 36, 50, 40]
            [210, 0, 250, 50],  # right of the image: cut to zero width, dropped
            [0, 0, 200, 100],  # the whole image -> the whole canvas
        ],
        g,
    )
    assert r.boxes.dtype == np.float32
    assert r.boxes.tolist() == [[5, 4, 30, 24], [45, 36, 50, 40], [0, 0, 50, 40]]
    assert r.keep.tolist() == [True, True, False, True]
    assert r.clipped.tolist() == [False, True, True, False]


def test_fit_boxes_by_hand_follow_the_padding_offset() -> None:
    g = plan_geometry(100, 200, "fit", (100, 100))  # scale 0.5: 100 x 50, centred: 25 rows of padding above
    assert (g.new_w, g.new_h, g.off_x, g.off_y) == (100, 50, 0, 25)
    r = resize_boxes(
        [
            [20, 10, 120, 60],  # -> [10, 5 + 25, 60, 30 + 25]
            [0, 0, 200, 100],  # -> the image's part of the canvas, never the padding
            [50, 80, 100, 150],  # cut at y = 100 -> [25, 40 + 25, 50, 50 + 25]
            [-30, 40, -10, 60],  # left of the image: dropped, not moved into the padding
        ],
        g,
    )
    assert r.boxes.tolist() == [[10, 30, 60, 55], [0, 25, 100, 75], [25, 65, 50, 75]]
    assert r.keep.tolist() == [True, True, True, False]
    assert r.clipped.tolist() == [False, False, True, True]


def test_fit_with_side_padding_and_fractional_boxes_by_hand() -> None:
    g = plan_geometry(300, 100, "fit", (60, 60))  # 100 x 300 -> 20 x 60, 20 columns of padding on the left
    assert (g.new_w, g.new_h, g.off_x, g.off_y) == (20, 60, 20, 0)
    r = resize_boxes([[10.5, 15, 55, 297]], g)  # x * 0.2 + 20, y * 0.2
    assert r.boxes[0].tolist() == pytest.approx([22.1, 3.0, 31.0, 59.4], abs=1e-5)


def test_none_mode_with_max_side_by_hand() -> None:
    g = plan_geometry(150, 300, "none", max_side=100)  # 300 x 150 -> 100 x 50
    r = resize_boxes([[30, 15, 300, 150]], g)
    assert r.boxes.tolist() == [[10, 5, 100, 50]]
    assert not r.clipped.any()


def test_no_boxes_and_bad_boxes() -> None:
    g = plan_geometry(10, 10, "none")
    r = resize_boxes([], g)
    assert r.boxes.shape == (0, 4) and r.boxes.dtype == np.float32 and r.keep.shape == (0,)
    with pytest.raises(ValueError, match=r"boxes must be a k x 4 array .* got shape \(1, 3\)"):
        resize_boxes([[0, 0, 1]], g)


def test_a_box_that_float32_collapses_is_dropped() -> None:
    g = plan_geometry(100, 1000, "stretch", (1000, 100))
    r = resize_boxes([[500.0, 10, 500.00001, 20]], g)  # positive width in float64, none in float32
    assert r.keep.tolist() == [False] and r.boxes.shape == (0, 4)


# ---------------------------------------------------------------- resize_mask


def test_stretch_mask_by_hand_takes_the_pixel_under_each_centre() -> None:
    mask = np.array([[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]], np.uint8)
    assert resize_mask(mask, plan_geometry(4, 4, "stretch", (2, 2)), 255).tolist() == [[1, 2], [3, 4]]
    # 3 -> 2: the centres 0.5 and 1.5 of the output fall on source pixels floor(0.75) = 0 and floor(2.25) = 2.
    three = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]], np.uint8)
    assert resize_mask(three, plan_geometry(3, 3, "stretch", (2, 2)), 255).tolist() == [[1, 3], [7, 9]]
    up = resize_mask(
        np.array([[1, 2], [3, 4]], np.uint8), plan_geometry(2, 2, "stretch", (4, 4), allow_upscale=True), 0
    )
    assert up.tolist() == [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]]


def test_fit_mask_pads_with_the_ignore_value_by_hand() -> None:
    mask = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.uint8)  # 4 wide, 2 high
    g = plan_geometry(2, 4, "fit", (4, 4))  # scale 1: one row of padding above and below
    assert (g.off_y, g.off_x, g.new_h, g.new_w) == (1, 0, 2, 4)
    out = resize_mask(mask, g, 255)
    assert out.tolist() == [[255] * 4, [1, 2, 3, 4], [5, 6, 7, 8], [255] * 4]
    g2 = plan_geometry(2, 4, "fit", (2, 4))  # scale 0.5: 2 x 1 in a 2 x 4 canvas, (4 - 1) // 2 = 1 row above
    assert (g2.new_w, g2.new_h, g2.off_y) == (2, 1, 1)
    # Output row 0 takes source row floor(0.5 * 2 / 1) = 1; columns floor(0.5 * 2) = 1 and floor(1.5 * 2) = 3.
    assert resize_mask(mask, g2, 9).tolist() == [[9, 9], [6, 8], [9, 9], [9, 9]]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_resizing_never_invents_a_class_id(dtype: type) -> None:
    rng = np.random.default_rng(0)
    values = np.array([0, 3, 7, 200] if dtype == np.uint8 else [0, 3, 1000, 65000], dtype)
    ignore = int(np.iinfo(dtype).max)
    for _ in range(40):
        h, w = (int(v) for v in rng.integers(3, 60, size=2))
        mask = values[rng.integers(0, len(values), size=(h, w))]
        mode = ["stretch", "fit", "none"][int(rng.integers(0, 3))]
        size = (int(rng.integers(1, 80)), int(rng.integers(1, 80)))
        g = plan_geometry(h, w, mode, size, max_side=int(rng.integers(1, 80)), allow_upscale=True)
        out = resize_mask(mask, g, ignore)
        assert out.dtype == dtype and out.shape == (g.out_h, g.out_w)
        assert set(np.unique(out).tolist()) <= set(values.tolist()) | {ignore}


def test_16_bit_masks_keep_their_ids_and_pad_with_65535() -> None:
    mask = np.array([[1000, 65000], [2, 40000]], np.uint16)
    out = resize_mask(mask, plan_geometry(2, 2, "fit", (2, 4)), 65535)  # one row of padding each side
    assert out.dtype == np.uint16
    assert out.tolist() == [[65535, 65535], [1000, 65000], [2, 40000], [65535, 65535]]


@pytest.mark.parametrize("orientation", ORIENTATIONS)
def test_a_mask_in_the_file_frame_is_turned_first(orientation: int) -> None:
    raw = np.arange(15, dtype=np.uint8).reshape(3, 5)
    upright = apply_orientation(raw, orientation)
    g = plan_geometry(upright.shape[0], upright.shape[1], "none")
    assert np.array_equal(resize_mask(raw, g, 255, orientation), upright)


def test_resize_mask_refuses_a_mask_of_another_size_or_type() -> None:
    g = plan_geometry(4, 4, "none")
    with pytest.raises(ValueError, match="geometry expects 4x4"):
        resize_mask(np.zeros((3, 4), np.uint8), g, 255)
    with pytest.raises(ValueError, match="uint8 or uint16"):
        resize_mask(np.zeros((4, 4), np.float32), g, 255)
    with pytest.raises(ValueError, match="does not fit"):
        resize_mask(np.zeros((4, 4), np.uint8), g, 256)


# ---------------------------------------------------------------- polygons_to_mask


def test_a_square_polygon_covers_exactly_its_area() -> None:
    mask = polygons_to_mask([[2, 2, 12, 2, 12, 12, 2, 12]], 20, 20)
    assert mask.dtype == np.uint8 and int(mask.sum()) == 100  # 10 x 10, as COCO measures it
    assert _bbox(mask) == [2, 2, 12, 12]
    rect = polygons_to_mask([[1, 3, 6, 3, 6, 5, 1, 5]], 8, 8, value=7)  # 5 wide, 2 high
    assert int((rect == 7).sum()) == 10 and set(np.unique(rect).tolist()) == {0, 7}


def test_a_triangle_by_hand() -> None:
    # Corners (0, 0), (4.2, 0), (0, 4.2): the centre (j + 0.5, i + 0.5) is inside when i + j + 1 < 4.2,
    # i.e. i + j <= 3: 1 + 2 + 3 + 4 = 10 pixels.
    mask = polygons_to_mask([[0, 0, 4.2, 0, 0, 4.2]], 6, 6)
    expected = np.add.outer(np.arange(6), np.arange(6)) <= 3
    assert np.array_equal(mask.astype(bool), expected)


def test_polygons_union_clip_to_the_mask_and_take_wide_values() -> None:
    two = polygons_to_mask([[0, 0, 2, 0, 2, 2, 0, 2], [1, 1, 3, 1, 3, 3, 1, 3]], 4, 4, value=300)
    assert two.dtype == np.uint16 and int((two == 300).sum()) == 7  # 4 + 4 - 1 shared
    outside = polygons_to_mask([[-5, -5, 3, -5, 3, 3, -5, 3]], 6, 6)
    assert int(outside.sum()) == 9 and _bbox(outside) == [0, 0, 3, 3]
    with pytest.raises(ValueError, match="at least 3"):
        polygons_to_mask([[0, 0, 1, 1]], 4, 4)


def test_polygons_match_the_centre_rule_on_random_shapes() -> None:
    """The rounding of cv2.fillPoly near edges and its clamping at the canvas border are both corrected."""
    rng = np.random.default_rng(3)
    h, w = 23, 31
    rows, cols = np.mgrid[0:h, 0:w]
    cx, cy = cols.ravel() + 0.5, rows.ravel() + 0.5
    for n in range(200):
        pts = rng.uniform(-40, 70, size=(int(rng.integers(3, 9)), 2))
        # Even-odd crossing test of every pixel centre, written out here as the reference.
        inside = np.zeros(cx.shape, bool)
        for (ax, ay), (bx, by) in zip(pts, np.roll(pts, -1, axis=0), strict=True):
            if ay != by:
                inside ^= ((ay > cy) != (by > cy)) & (cx < ax + (cy - ay) * (bx - ax) / (by - ay))
        got = polygons_to_mask([pts.ravel().tolist()], h, w).astype(bool)
        assert np.array_equal(got, inside.reshape(h, w)), n


def test_an_axis_aligned_polygon_agrees_with_pycocotools() -> None:
    coco = pytest.importorskip("pycocotools.mask")
    poly = [3, 2, 17, 2, 17, 9, 3, 9]
    theirs = coco.decode(coco.frPyObjects([poly], 12, 20))[:, :, 0]
    assert np.array_equal(polygons_to_mask([poly], 12, 20), theirs)


# ---------------------------------------------------------------- rle_to_mask


def test_rle_round_trip_with_pycocotools_encoder() -> None:
    coco = pytest.importorskip("pycocotools.mask")
    rng = np.random.default_rng(1)
    mask = (rng.random((13, 17)) > 0.6).astype(np.uint8)
    rle = coco.encode(np.asfortranarray(mask))
    assert np.array_equal(rle_to_mask(rle, 13, 17), mask)
    as_json = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}  # what a COCO file holds
    out = rle_to_mask(as_json, 13, 17)
    assert out.dtype == np.uint8 and out.flags.c_contiguous and np.array_equal(out, mask)


def test_uncompressed_rle_by_hand() -> None:
    pytest.importorskip("pycocotools")
    # 2 x 3, column-major runs: 1 zero, 2 ones, 3 zeros -> column 0 = [0, 1], column 1 = [1, 0], column 2 = [0, 0].
    assert rle_to_mask({"size": [2, 3], "counts": [1, 2, 3]}, 2, 3).tolist() == [[0, 1, 0], [1, 0, 0]]


def test_rle_of_another_size_is_refused() -> None:
    pytest.importorskip("pycocotools")
    with pytest.raises(ValueError, match="RLE segmentation is 3x2, its image is 4x2"):
        rle_to_mask({"size": [2, 3], "counts": [6]}, 2, 4)


def test_rle_runs_that_do_not_cover_the_mask_are_refused() -> None:
    pytest.importorskip("pycocotools")
    with pytest.raises(ValueError, match="add up to 2 x 3 = 6 pixels; they add up to 3"):
        rle_to_mask({"size": [2, 3], "counts": [1, 2]}, 2, 3)
    with pytest.raises(ValueError, match="cannot be decoded"):
        rle_to_mask({"size": [2, 3], "counts": "zzzzzzzz"}, 2, 3)  # runs past the end


def test_a_polygon_too_far_out_for_fixed_point_is_refused() -> None:
    with pytest.raises(ValueError, match="within"):
        polygons_to_mask([[0, 0, 1e9, 0, 0, 5]], 4, 4)


def test_rle_without_pycocotools_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pycocotools", None)  # import pycocotools now raises ImportError
    monkeypatch.setitem(sys.modules, "pycocotools.mask", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'dlpack-datasets\[coco\]'"):
        rle_to_mask({"size": [2, 3], "counts": [6]}, 2, 3)
