"""HALCON's augment_dl_samples vocabulary: each operation's rules, its labels, its pixels and its records."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import cv2
import numpy as np
import pytest

from dlpack.transforms.base import Pipeline, Targets, Transform, transform_from_dict, variant_rng
from dlpack.transforms.halcon_ops import (
    BrightnessVariation,
    BrightnessVariationSpot,
    ContrastVariation,
    CropPercentage,
    CropPixel,
    Mirror,
    Rotate,
    RotateRange,
    SaturationVariation,
    brightness_spot,
    inner_rectangle,
    pipeline_from_halcon,
    scale_contrast,
    scale_saturation,
)

OPS: list[Transform] = [
    Mirror("rc"),
    Mirror("r"),
    Rotate(90),
    Rotate(180),
    RotateRange(25),
    BrightnessVariation(30),
    BrightnessVariationSpot(50),
    ContrastVariation(0.4),
    SaturationVariation(0.5),
    CropPercentage(70),
    CropPixel(20),
]
GEOMETRIC = [op for op in OPS if op.geometric]
KINDS = [(np.uint8, 1), (np.uint8, 3), (np.uint16, 1), (np.uint16, 3)]


def _targets(w: int = 40, h: int = 30, dtype: Any = np.uint8, channels: int = 3, seed: int = 0) -> Targets:
    top = np.iinfo(dtype).max
    img = np.random.default_rng(seed).integers(0, top, (h, w, channels), dtype=dtype, endpoint=True)
    return Targets(
        img,
        boxes=np.array([[5, 4, 15, 10], [20, 12, 36, 27]], np.float32),
        box_labels=np.array([3, 7], np.int32),
        box_crowd=np.array([0, 1], np.uint8),
        mask=np.random.default_rng(seed + 1).integers(0, 4, (h, w), dtype=np.uint8),
        visibility=np.ones(2),
    )


def _same(a: Targets, b: Targets) -> bool:
    parts = ("image", "boxes", "box_labels", "box_crowd", "mask")
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in parts)


# ------------------------------------------------------------------ round trips and determinism


@pytest.mark.parametrize("op", OPS, ids=lambda op: f"{op.name}")
def test_every_op_round_trips_through_its_dict_and_json(op: Transform) -> None:
    d = json.loads(json.dumps(op.to_dict()))
    assert d["__class_fullname__"] == op.name
    assert transform_from_dict(d, "test") == op


@pytest.mark.parametrize(("dtype", "channels"), KINDS)
@pytest.mark.parametrize("op", OPS, ids=lambda op: f"{op.name}")
def test_every_op_gives_the_same_output_for_the_same_seed(op: Transform, dtype: Any, channels: int) -> None:
    t = _targets(dtype=dtype, channels=channels) if op.name != "rotate" else _targets(32, 32, dtype, channels)
    params = op.draw(variant_rng(5, 2, 1), t)
    assert params == op.draw(variant_rng(5, 2, 1), t)
    assert json.loads(json.dumps(params)) == params  # the record is JSON as it is
    out = op.apply(t, params)
    assert _same(out, op.apply(t, params))
    assert out.image.dtype == t.image.dtype and out.image.shape == t.image.shape
    assert out.mask is not None and out.mask.dtype == np.uint8 and out.mask.shape == t.shape
    # Replaying the record of a pipeline run gives the same variant, with no generator involved.
    pipe = Pipeline((op,), min_area=0.0)
    variant, record = pipe(t, variant_rng(5, 2, 1))
    if op.name == "saturation_variation" and channels == 1:
        # A gray image has no saturation: the operation is never drawn for it.
        assert not op.changes(t) and record == [] and np.array_equal(variant.image, t.image)
        return
    assert record and record[0]["op"] == op.name
    assert _same(pipe.replay(t, json.loads(json.dumps(record))), variant)


@pytest.mark.parametrize("op", [op for op in OPS if op not in (Mirror("r"), Rotate(180))], ids=lambda op: f"{op.name}")
def test_draws_differ_between_variants(op: Transform) -> None:
    t = _targets(32, 32)
    draws = {json.dumps(op.draw(variant_rng(0, 0, v), t), sort_keys=True) for v in range(40)}
    assert len(draws) > 1


# ------------------------------------------------------------------ mirror


@pytest.mark.parametrize(
    ("axes", "expected"),
    [
        ("c", [[25, 4, 35, 10], [4, 12, 20, 27]]),  # columns: x -> 40 - x
        ("r", [[5, 20, 15, 26], [20, 3, 36, 18]]),  # rows: y -> 30 - y
        ("rc", [[25, 20, 35, 26], [4, 3, 20, 18]]),
    ],
)
def test_mirror_moves_boxes_by_halcons_rule(axes: str, expected: list[list[int]]) -> None:
    t = _targets(40, 30)
    out = Mirror("rc").apply(t, {"axes": axes})
    assert out.boxes is not None
    assert out.boxes.tolist() == expected
    img = t.image
    want = img[:, ::-1] if axes == "c" else img[::-1] if axes == "r" else img[::-1, ::-1]
    assert np.array_equal(out.image, want)
    m = t.mask
    assert m is not None
    assert np.array_equal(out.mask, m[:, ::-1] if axes == "c" else m[::-1] if axes == "r" else m[::-1, ::-1])
    assert out.box_labels is not None and out.box_labels.tolist() == [3, 7]


def test_mirror_rc_picks_rows_columns_or_both_a_third_each() -> None:
    t = _targets(16, 16)
    op = Mirror("rc")
    rng = np.random.default_rng(1)
    counts = Counter(op.draw(rng, t)["axes"] for _ in range(3000))
    assert set(counts) == {"r", "c", "rc"}
    for axes in ("r", "c", "rc"):
        assert abs(counts[axes] / 3000 - 1 / 3) < 0.04, counts


def test_mirror_with_one_axis_always_uses_it() -> None:
    rng = np.random.default_rng(2)
    assert {Mirror("c").draw(rng, _targets())["axes"] for _ in range(50)} == {"c"}


# ------------------------------------------------------------------ rotate


@pytest.mark.parametrize(
    ("angle", "expected"),
    [
        (90, [[6, 20, 10, 28], [12, 0, 27, 12]]),  # counter-clockwise: (x, y) -> (y, 32 - x)
        (180, [[20, 22, 28, 26], [0, 5, 12, 20]]),
        (270, [[22, 4, 26, 12], [5, 20, 20, 32]]),  # (x, y) -> (32 - y, x)
    ],
)
def test_rotate_moves_boxes_on_a_square_image(angle: int, expected: list[list[int]]) -> None:
    t = _targets(32, 32).replace(boxes=np.array([[4, 6, 12, 10], [20, 12, 32, 27]], np.float32))
    out = Rotate(90).apply(t, {"angle": angle})
    assert out.boxes is not None and out.boxes.tolist() == expected
    assert np.array_equal(out.image, np.rot90(t.image, angle // 90))
    assert np.array_equal(out.mask, np.rot90(t.mask, angle // 90))


def test_rotate_by_90_is_counter_clockwise_as_halcons_rotate_image() -> None:
    img = np.zeros((8, 8, 1), np.uint8)
    img[0, 7] = 255  # the top-right corner goes to the top-left
    out = Rotate(90).apply(Targets(img), {"angle": 90})
    assert out.image[0, 0, 0] == 255 and int(out.image.sum()) == 255


def test_rotate_by_180_on_a_non_square_image() -> None:
    t = _targets(40, 30)
    out = Rotate(90).apply(t, {"angle": 180})
    assert out.boxes is not None and out.boxes.tolist() == [[25, 20, 35, 26], [4, 3, 20, 18]]
    assert out.image.shape == t.image.shape


@pytest.mark.parametrize(
    ("w", "h", "step", "angles"), [(32, 32, 90, {90, 180, 270}), (40, 30, 90, {180}), (30, 40, 180, {180})]
)
def test_rotate_never_turns_a_non_square_image_by_90(w: int, h: int, step: int, angles: set[int]) -> None:
    t = _targets(w, h)
    rng = np.random.default_rng(3)
    assert {Rotate(step).draw(rng, t)["angle"] for _ in range(300)} == angles


# ------------------------------------------------------------------ labels land where the pixels go


def _drawn(w: int, h: int, box: tuple[int, int, int, int], dtype: Any, channels: int) -> Targets:
    """An image (and mask) black but for ``box`` filled with the brightest value (mask value 1)."""
    img = np.zeros((h, w, channels), dtype)
    x0, y0, x1, y1 = box
    img[y0:y1, x0:x1] = np.iinfo(dtype).max
    mask = np.zeros((h, w), np.uint8)
    mask[y0:y1, x0:x1] = 1
    return Targets(img, boxes=np.array([box], np.float32), box_labels=np.array([1], np.int32), mask=mask)


def _bbox(on: np.ndarray) -> list[int]:
    ys, xs = np.nonzero(on)
    return [int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1]


@pytest.mark.parametrize(("dtype", "channels"), [(np.uint8, 1), (np.uint16, 3)])
@pytest.mark.parametrize(
    ("op", "w", "h"),
    [
        (Mirror("rc"), 48, 40),
        (Rotate(90), 40, 40),
        (Rotate(180), 48, 40),
        (RotateRange(30), 48, 40),
        (RotateRange(180), 40, 40),
        (CropPercentage(75), 48, 40),
        (CropPixel(28), 48, 40),
    ],
    ids=lambda x: getattr(x, "name", str(x)),
)
def test_a_box_drawn_into_the_image_lands_where_the_moved_box_says(
    op: Transform, w: int, h: int, dtype: Any, channels: int
) -> None:
    t = _drawn(w, h, (14, 12, 30, 26), dtype, channels)
    half = np.iinfo(dtype).max / 2
    checked = 0
    for v in range(12):
        out = Pipeline((op,), min_area=0.0)(t, variant_rng(0, 0, v))[0]
        assert out.boxes is not None
        lit = out.image[:, :, 0] > half
        if not len(out.boxes):
            assert not (out.mask == 1).any()  # the box left the canvas with its pixels
            continue
        box = out.boxes[0]
        assert np.abs(np.array(_bbox(lit)) - box).max() <= 1.0, (v, _bbox(lit), box)
        assert np.abs(np.array(_bbox(out.mask == 1)) - box).max() <= 1.0, (v, _bbox(out.mask == 1), box)
        assert out.box_labels is not None and out.box_labels.tolist() == [1]
        checked += 1
    assert checked >= 6


def test_crop_boxes_are_clipped_and_those_left_outside_dropped_with_their_labels() -> None:
    t = _targets(40, 30)
    out = Pipeline((CropPixel(12),))(t, variant_rng(0, 0, 0))[0]
    params = CropPixel(12).draw(variant_rng(0, 0, 0), t)
    assert params["width"] == params["height"] == 12
    assert out.boxes is not None and out.box_labels is not None and out.box_crowd is not None
    assert len(out.boxes) == len(out.box_labels) == len(out.box_crowd)
    assert (out.boxes[:, 0::2] >= 0).all() and (out.boxes[:, 0::2] <= 40).all()
    assert (out.boxes[:, 1::2] >= 0).all() and (out.boxes[:, 1::2] <= 30).all()


def test_crop_pixel_larger_than_the_image_is_cut_to_it() -> None:
    params = CropPixel(100).draw(np.random.default_rng(0), _targets(40, 30))
    assert params == {"x": 0, "y": 0, "width": 40, "height": 30}


def test_crop_percentage_window_and_its_zoom() -> None:
    t = _targets(40, 30)
    params = CropPercentage(50).draw(np.random.default_rng(0), t)
    assert (params["width"], params["height"]) == (20, 15)
    assert 0 <= params["x"] <= 20 and 0 <= params["y"] <= 15
    out = CropPercentage(50).apply(t, {"x": 0, "y": 0, "width": 20, "height": 15})
    want = cv2.resize(t.image[:15, :20], (40, 30), interpolation=cv2.INTER_LINEAR)
    assert np.array_equal(out.image, want)


@pytest.mark.parametrize(
    ("w", "h", "angle"), [(64, 64, 45), (64, 64, 3), (64, 32, 10), (64, 32, 80), (32, 64, 30), (100, 20, 5)]
)
def test_the_inner_rectangle_lies_inside_the_turned_image_and_the_canvas(w: int, h: int, angle: float) -> None:
    rw, rh = inner_rectangle(w, h, angle)
    assert 0 < rw <= w and 0 < rh <= h
    a = np.deg2rad(angle)
    for sx in (-1, 1):
        for sy in (-1, 1):
            x, y = sx * rw / 2, sy * rh / 2
            # The corner turned back into the image's own frame lies within the image.
            bx, by = x * np.cos(a) + y * np.sin(a), -x * np.sin(a) + y * np.cos(a)
            assert abs(bx) <= w / 2 + 1e-6 and abs(by) <= h / 2 + 1e-6


def test_the_inner_rectangle_of_a_square_turned_45_degrees() -> None:
    rw, rh = inner_rectangle(64, 64, 45)
    assert rw == pytest.approx(64 / np.sqrt(2)) and rh == pytest.approx(64 / np.sqrt(2))


def test_rotate_range_leaves_no_unfilled_corner() -> None:
    t = Targets(np.full((40, 48, 3), 200, np.uint8))
    for angle in (-30, -7, 1, 13, 45, 89, 135):
        out = RotateRange(180).apply(t, {"angle": angle})
        assert int(out.image.min()) == 200, angle


def test_rotate_range_angles_are_whole_numbers_of_either_sign_within_the_range() -> None:
    rng = np.random.default_rng(4)
    angles = [RotateRange(5).draw(rng, _targets())["angle"] for _ in range(500)]
    assert set(angles) == {-5, -4, -3, -2, -1, 1, 2, 3, 4, 5}


# ------------------------------------------------------------------ pixel operations


def test_brightness_changes_the_image_only() -> None:
    t = _targets()
    for op in (BrightnessVariation(40), BrightnessVariationSpot(40), ContrastVariation(0.5), SaturationVariation(0.5)):
        out = op.apply(t, op.draw(np.random.default_rng(0), t))
        assert not np.array_equal(out.image, t.image), op.name
        for k in ("boxes", "box_labels", "box_crowd", "mask"):
            assert np.array_equal(getattr(out, k), getattr(t, k)), (op.name, k)


def test_brightness_offsets_are_8_bit_gray_values_times_257_on_16_bit_images() -> None:
    op = BrightnessVariation(50)
    u1 = Targets(np.full((4, 4, 1), 100, np.uint8))
    u2 = Targets(np.full((4, 4, 1), 100 * 257, np.uint16))
    assert np.all(op.apply(u1, {"offset": 20.0}).image == 120)
    assert np.all(op.apply(u2, {"offset": 20.0}).image == 120 * 257)
    assert np.all(op.apply(u1, {"offset": -150.0}).image == 0)  # saturates
    offsets = [op.draw(np.random.default_rng(s), u1)["offset"] for s in range(300)]
    assert -50 <= min(offsets) < -40 and 40 < max(offsets) <= 50


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_the_brightness_spot_peaks_at_its_position_with_its_amplitude(dtype: Any) -> None:
    scale = 257 if dtype == np.uint16 else 1
    img = np.full((40, 60, 3), 100 * scale, dtype)
    out = brightness_spot(img, 30.0, 40.0, x=20.5, y=10.5)
    diff = out[:, :, 0].astype(np.int64) - img[:, :, 0]
    assert diff[10, 20] == diff.max() == 30 * scale
    assert diff[10, 30] < diff[10, 25] < diff[10, 20] and diff[20, 20] < diff[15, 20] < diff[10, 20]
    assert (out[:, :, 0] == out[:, :, 2]).all()
    assert diff[10, 20 + 20] < 0.01 * 30 * scale + 1  # fades out at the edge of the size x size square
    dark = brightness_spot(img, -30.0, 40.0, x=20.5, y=10.5)
    assert int(dark[10, 20, 0]) == 70 * scale


def test_brightness_spot_draws_size_and_position_in_halcons_ranges() -> None:
    t = _targets(60, 40)
    draws = [BrightnessVariationSpot(10).draw(np.random.default_rng(s), t) for s in range(300)]
    assert all(30 <= d["size"] <= 60 and 0 <= d["x"] <= 60 and 0 <= d["y"] <= 40 for d in draws)
    assert all(-10 <= d["amplitude"] <= 10 for d in draws)
    assert min(d["amplitude"] for d in draws) < 0 < max(d["amplitude"] for d in draws)


def test_contrast_scales_distances_from_the_mean() -> None:
    img = np.array([[[50], [150]]], np.uint8)  # mean 100
    assert scale_contrast(img, 1.5)[..., 0].tolist() == [[25, 175]]
    assert scale_contrast(img, 0.5)[..., 0].tolist() == [[75, 125]]
    wide = img.astype(np.uint16) * 257
    assert scale_contrast(wide, 1.5)[..., 0].tolist() == [[round(25 * 257), round(175 * 257)]]


def test_saturation_scales_hsv_saturation_and_keeps_hue_and_value() -> None:
    rgb = np.array([[[200, 100, 50], [10, 200, 120], [90, 90, 90]]], np.uint8)
    half = scale_saturation(rgb, 0.5)
    assert half[0, 0].tolist() == [200, 150, 125]
    assert half[0, 2].tolist() == [90, 90, 90]  # gray pixels have no saturation
    hsv0 = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV_FULL).astype(int)
    hsv1 = cv2.cvtColor(half, cv2.COLOR_RGB2HSV_FULL).astype(int)
    assert np.abs(hsv0[0, :2, 0] - hsv1[0, :2, 0]).max() <= 2  # hue
    assert np.array_equal(hsv0[0, :, 2], hsv1[0, :, 2])  # value
    assert np.abs(hsv1[0, :2, 1] - hsv0[0, :2, 1] / 2).max() <= 1.5  # saturation halved
    assert scale_saturation(rgb, 3.0)[0, 0].tolist() == [200, 67, 0]  # saturation clips at 1
    gray = rgb[:, :, :1]
    assert np.array_equal(scale_saturation(gray, 0.3), gray)


# ------------------------------------------------------------------ the config object


def test_one_operation_per_augmented_variant_in_the_augmentation_percentage_share() -> None:
    doc = {"augmentation_percentage": 40, "mirror": "c", "brightness_variation": 10, "rotate": 180}
    pipe = pipeline_from_halcon(doc, "test.json")
    t = _targets(16, 16)
    records = [pipe(t, variant_rng(0, i, 1))[1] for i in range(2000)]
    assert all(len(r) <= 1 for r in records)
    done = [r[0]["op"] for r in records if r]
    assert abs(len(done) / 2000 - 0.40) < 0.04
    counts = Counter(done)
    assert set(counts) == {"mirror", "brightness_variation", "rotate"}
    for n in counts.values():
        assert abs(n / len(done) - 1 / 3) < 0.06, counts


def test_halcon_defaults_augment_half_of_the_samples() -> None:
    pipe = pipeline_from_halcon({"mirror": "rc"}, "test.json")
    assert pipe.kind == "halcon"
    assert pipe.ops[0].p == 0.5


def test_values_that_turn_an_operation_off_leave_it_out() -> None:
    doc = {
        "mirror": "off",
        "rotate": 0,
        "rotate_range": 0,
        "brightness_variation": 0,
        "crop_percentage": "off",
        "crop_pixel": "off",
        "contrast_variation": 0.1,
    }
    pipe = pipeline_from_halcon(doc, "test.json")
    one_of = pipe.to_dict()["transforms"][0]
    assert [t["__class_fullname__"] for t in one_of["transforms"]] == ["contrast_variation"]


def test_mirror_cr_is_read_as_rc() -> None:
    pipe = pipeline_from_halcon({"mirror": "cr"}, "test.json")
    assert pipe.to_dict()["transforms"][0]["transforms"][0]["axes"] == "rc"
