"""The albumentations-subset operations: config round trips, determinism, labels that follow the pixels,
the pure pixel functions, and (with albumentations installed) exact parity for flips and quarter turns."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from dlpack.errors import ConfigError
from dlpack.transforms import color, geometric
from dlpack.transforms.base import Pipeline, Targets, Transform, transform_from_dict, variant_rng
from dlpack.transforms.ops import (
    ALBUMENTATIONS_OPS,
    Affine,
    CoarseDropout,
    GaussianBlur,
    GaussNoise,
    HorizontalFlip,
    HueSaturationValue,
    Perspective,
    RandomBrightnessContrast,
    RandomCrop,
    RandomResizedCrop,
    RandomRotate90,
    Rotate,
    ShiftScaleRotate,
    VerticalFlip,
)

W, H = 48, 40
BOX = (14.0, 10.0, 31.0, 25.0)  # x_min, y_min, x_max, y_max: integer corners, so the drawn pixels match

#: Every operation with parameters away from its defaults (and p = 1, so it always applies).
EXAMPLES: dict[str, Transform] = {
    "HorizontalFlip": HorizontalFlip(p=1.0),
    "VerticalFlip": VerticalFlip(p=1.0),
    "RandomRotate90": RandomRotate90(p=1.0),
    "Affine": Affine(
        p=1.0,
        scale=((0.8, 1.2), (0.9, 1.1)),
        translate_percent=((-0.1, 0.1), (-0.05, 0.05)),
        rotate=(-30.0, 30.0),
        shear=((-8.0, 8.0), (-4.0, 4.0)),
        border_mode=0,
        fill=7.0,
        fill_mask=9,
        balanced_scale=True,
    ),
    "ShiftScaleRotate": ShiftScaleRotate(p=1.0, rotate_limit=(-30.0, 30.0), fill_mask=9),
    "Rotate": Rotate(p=1.0, limit=(-40.0, 40.0), interpolation=0, fill_mask=9),
    "RandomCrop": RandomCrop(32, 24, p=1.0),
    "RandomResizedCrop": RandomResizedCrop((32, 40), p=1.0, scale=(0.3, 1.0), ratio=(0.5, 2.0)),
    "RandomBrightnessContrast": RandomBrightnessContrast(p=1.0, brightness_limit=(-0.3, 0.3), brightness_by_max=False),
    "HueSaturationValue": HueSaturationValue(p=1.0),
    "GaussNoise": GaussNoise(p=1.0, std_range=(0.05, 0.1), mean_range=(-0.02, 0.02), per_channel=False),
    "GaussianBlur": GaussianBlur(p=1.0, blur_limit=(3, 7), sigma_limit=(0.0, 2.0)),
    "Perspective": Perspective(p=1.0, scale=(0.03, 0.08), fill_mask=9),
    "CoarseDropout": CoarseDropout(p=1.0, num_holes_range=(2, 4), hole_height_range=(3, 8), fill="random", fill_mask=5),
}

#: Geometric operations for the box-landing test (linear interpolation, zero fill around the image).
GEOMETRIC: dict[str, Transform] = {
    "HorizontalFlip": HorizontalFlip(p=1.0),
    "VerticalFlip": VerticalFlip(p=1.0),
    "RandomRotate90": RandomRotate90(p=1.0),
    "Affine": Affine(
        p=1.0,
        scale=((0.8, 1.2), (0.8, 1.2)),
        translate_percent=((-0.1, 0.1), (-0.1, 0.1)),
        rotate=(-30.0, 30.0),
        shear=((-10.0, 10.0), (-10.0, 10.0)),
    ),
    "Affine(px, keep_ratio)": Affine(
        p=1.0, scale=((0.7, 1.1), (0.7, 1.1)), keep_ratio=True, translate_px=((-5, 5), (-4, 4)), rotate=(-90, 90)
    ),
    "ShiftScaleRotate": ShiftScaleRotate(p=1.0, rotate_limit=(-30.0, 30.0)),
    "Rotate": Rotate(p=1.0, limit=(-40.0, 40.0)),
    "RandomCrop": RandomCrop(24, 32, p=1.0),
    "RandomCrop(pad_if_needed)": RandomCrop(56, 52, p=1.0, pad_if_needed=True, pad_position="random"),
    "RandomResizedCrop": RandomResizedCrop((32, 40), p=1.0, scale=(0.3, 1.0)),
    "Perspective": Perspective(p=1.0, scale=(0.05, 0.1)),
    "Perspective(keep_size=false)": Perspective(p=1.0, scale=(0.05, 0.1), keep_size=False),
}

KINDS = [(np.uint8, 1), (np.uint8, 3), (np.uint16, 1), (np.uint16, 3)]


def _targets(dtype: Any = np.uint8, channels: int = 3, seed: int = 0) -> Targets:
    """A noisy image with three boxes (one at the edge), their labels and crowd flags, and a mask."""
    rng = np.random.default_rng(seed)
    top = np.iinfo(dtype).max
    img = rng.integers(0, top + 1, (H, W, channels)).astype(dtype)
    mask = np.zeros((H, W), np.uint8)
    mask[10:25, 14:31] = 1
    mask[0:8, 40:48] = 2
    boxes = np.array([BOX, (40, 0, 48, 8), (2, 30, 12, 38)], np.float32)
    return Targets(
        img,
        boxes=boxes,
        box_labels=np.array([3, 1, 4], np.int32),
        box_crowd=np.array([0, 1, 0], np.uint8),
        mask=mask,
        fill_mask=0,
    )


def _drawn(dtype: Any, channels: int) -> Targets:
    """A black image with BOX drawn white into it, and the same rectangle as class 1 of the mask."""
    top = np.iinfo(dtype).max
    img = np.zeros((H, W, channels), dtype)
    x0, y0, x1, y1 = (int(v) for v in BOX)
    img[y0:y1, x0:x1] = top
    mask = np.zeros((H, W), np.uint8)
    mask[y0:y1, x0:x1] = 1
    return Targets(
        img,
        boxes=np.array([BOX], np.float32),
        box_labels=np.array([7], np.int32),
        box_crowd=np.array([0], np.uint8),
        mask=mask,
        visibility=np.ones(1),
    )


def _extent(on: np.ndarray) -> np.ndarray:
    """The corner-based bounding box of the True pixels."""
    rows, cols = np.nonzero(on)
    return np.array([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], np.float64)


def _same(a: Targets, b: Targets) -> bool:
    def eq(x: np.ndarray | None, y: np.ndarray | None) -> bool:
        return (x is None and y is None) or (
            x is not None and y is not None and x.dtype == y.dtype and np.array_equal(x, y)
        )

    return all(eq(getattr(a, f), getattr(b, f)) for f in ("image", "boxes", "box_labels", "box_crowd", "mask"))


# ---------------------------------------------------------------- configs round-trip


def test_the_examples_cover_every_albumentations_operation() -> None:
    assert set(EXAMPLES) == set(ALBUMENTATIONS_OPS)
    assert {type(op).name for op in GEOMETRIC.values()} == {
        name for name, cls in ALBUMENTATIONS_OPS.items() if cls.geometric
    }


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_operation_round_trips_through_to_dict_and_json(name: str) -> None:
    op = EXAMPLES[name]
    d = op.to_dict()
    assert d["__class_fullname__"] == name
    assert transform_from_dict(d, "t") == op
    assert transform_from_dict(json.loads(json.dumps(d)), "t") == op


@pytest.mark.parametrize(("dtype", "channels"), KINDS)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_same_seed_same_output_and_the_record_replays_it(name: str, dtype: Any, channels: int) -> None:
    op = EXAMPLES[name]
    pipe = Pipeline((op,), min_area=0.0)
    again = Pipeline.from_dict(json.loads(json.dumps(pipe.to_dict())))
    t = _targets(dtype, channels)
    out, record = pipe(t, variant_rng(5, 3, 1))
    out2, record2 = again(t, variant_rng(5, 3, 1))
    assert record == record2 and _same(out, out2)
    assert [r["op"] for r in record] == [name]
    assert out.image.dtype == dtype and out.image.ndim == 3 and out.image.shape[2] == channels
    assert out.mask is not None and out.mask.shape == out.image.shape[:2]
    replayed = pipe.replay(t, json.loads(json.dumps(record)))  # the record is JSON and reproduces the variant
    assert _same(out, replayed)
    # The generator matters: some other variant of the sample differs (a flip at p = 1 has nothing to draw).
    if name not in ("HorizontalFlip", "VerticalFlip"):
        assert any(not _same(out, pipe(t, variant_rng(5, 3, v))[0]) for v in range(2, 8))


@pytest.mark.parametrize("name", sorted(n for n, c in ALBUMENTATIONS_OPS.items() if not c.geometric))
def test_pixel_operations_never_move_labels(name: str) -> None:
    t = _targets()
    for v in range(4):
        out, _ = Pipeline((EXAMPLES[name],), min_area=0.0)(t, variant_rng(0, 0, v))
        assert out.boxes is not None and t.boxes is not None
        assert np.array_equal(out.boxes, t.boxes)
        assert np.array_equal(out.box_labels, t.box_labels) and np.array_equal(out.box_crowd, t.box_crowd)
        if name != "CoarseDropout":
            assert np.array_equal(out.mask, t.mask)


def test_coarse_dropout_fills_the_mask_only_when_it_names_a_fill_mask() -> None:
    t = _targets()
    op = CoarseDropout(p=1.0, num_holes_range=(3, 3), hole_height_range=(6, 6), hole_width_range=(6, 6), fill=0.0)
    params = op.draw(np.random.default_rng(1), t)
    assert np.array_equal(op.apply(t, params).mask, t.mask)
    with_mask = CoarseDropout(**{**op.__dict__, "fill_mask": 5}).apply(t, params)
    assert with_mask.mask is not None
    for x0, y0, x1, y1 in params["holes"]:
        assert x1 - x0 == 6 and y1 - y0 == 6
        assert (with_mask.mask[y0:y1, x0:x1] == 5).all() and (with_mask.image[y0:y1, x0:x1] == 0).all()


# ---------------------------------------------------------------- labels follow the pixels


@pytest.mark.parametrize(("dtype", "channels"), KINDS)
@pytest.mark.parametrize("name", sorted(GEOMETRIC))
def test_a_drawn_box_lands_where_the_moved_box_says(name: str, dtype: Any, channels: int) -> None:
    op = GEOMETRIC[name]
    t = _drawn(dtype, channels)
    half = np.iinfo(dtype).max // 2
    checked = 0
    for seed in range(12):
        params = op.draw(np.random.default_rng(seed), t)
        out = op.apply(t, params)
        assert out.boxes is not None and out.mask is not None and out.visibility is not None
        assert out.mask.shape == out.image.shape[:2]
        assert np.array_equal(out.box_labels, [7]) and np.array_equal(out.box_crowd, [0])
        # A rotated box's hull is the bounding box of the rotated pixels only while all of it is on the canvas.
        if out.visibility[0] < 0.999 and not isinstance(op, (RandomCrop, RandomResizedCrop)):
            continue
        box = out.boxes[0].astype(np.float64)
        assert np.abs(_extent(out.image[:, :, 0] > half) - box).max() <= 1.0, (params, box)
        assert np.abs(_extent(out.mask == 1) - box).max() <= 1.0, (params, box)
        checked += 1
    assert checked >= 6


def test_uncovered_mask_pixels_take_the_operations_fill_mask_else_the_stores() -> None:
    t = _drawn(np.uint8, 1).replace(fill_mask=255)
    params = {"angle": 45.0}
    own = Rotate(p=1.0, fill_mask=9).apply(t, params)
    store = Rotate(p=1.0).apply(t, params)
    assert own.mask is not None and store.mask is not None
    assert own.mask[0, 0] == 9 and store.mask[0, 0] == 255
    assert set(np.unique(store.mask)) == {0, 1, 255}  # nearest neighbour: no new classes


def test_boxes_below_min_area_or_min_visibility_go_with_their_labels() -> None:
    boxes = np.array([[2, 2, 10, 10], [8, 0, 24, 8], [30, 30, 40, 38], [12, 12, 16, 13]], np.float32)
    t = Targets(
        np.zeros((H, W, 1), np.uint8),
        boxes=boxes,
        box_labels=np.array([1, 2, 3, 4], np.int32),
        box_crowd=np.array([0, 1, 0, 1], np.uint8),
    )
    record = [{"op": "RandomCrop", "x": 0, "y": 0}]
    crop = (RandomCrop(16, 16, p=1.0),)
    # box 2 keeps half its area (visibility 0.5), box 3 leaves the canvas, box 4 keeps 4 px.
    loose = Pipeline(crop, min_area=0.0, min_visibility=0.0).replay(t, record)
    assert loose.box_labels is not None and loose.box_crowd is not None
    assert loose.box_labels.tolist() == [1, 2, 4] and loose.box_crowd.tolist() == [0, 1, 1]
    assert loose.boxes is not None and loose.boxes.tolist() == [[2, 2, 10, 10], [8, 0, 16, 8], [12, 12, 16, 13]]
    strict = Pipeline(crop, min_area=0.0, min_visibility=0.6).replay(t, record)
    assert strict.box_labels is not None and strict.box_labels.tolist() == [1, 4]
    # min_area drops only a box the operations made smaller: box 4 (4 px) and box 1 (64 px) are
    # as small in the original and stay; box 2 went from 128 to 64 px.
    by_area = Pipeline(crop, min_area=10.0).replay(t, record)
    assert by_area.box_labels is not None and by_area.box_labels.tolist() == [1, 2, 4]
    shrunk = Pipeline(crop, min_area=100.0).replay(t, record)
    assert shrunk.box_labels is not None and shrunk.box_labels.tolist() == [1, 4]
    assert shrunk.box_crowd is not None and shrunk.box_crowd.tolist() == [0, 1]


def test_visibility_accumulates_over_two_crops() -> None:
    t = Targets(np.zeros((H, W, 3), np.uint8), boxes=np.array([[0, 0, 16, 8]], np.float32), box_labels=np.array([1]))
    ops = (RandomCrop(40, 12, p=1.0), RandomCrop(8, 8, p=1.0))
    record = [{"op": "RandomCrop", "x": 0, "y": 0}, {"op": "RandomCrop", "x": 8, "y": 0}]
    # 12/16 of the box survives the first crop (12 px wide), then 4/12 of what is left: 4/16 in all.
    assert Pipeline(ops, min_visibility=0.3).replay(t, record).box_labels.tolist() == []  # type: ignore[union-attr]
    assert Pipeline(ops, min_visibility=0.2).replay(t, record).box_labels.tolist() == [1]  # type: ignore[union-attr]


def test_random_rotate90_turns_a_non_square_canvas() -> None:
    t = _drawn(np.uint8, 3)
    out = RandomRotate90(p=1.0).apply(t, {"k": 1})
    assert out.image.shape == (W, H, 3) and out.mask is not None and out.mask.shape == (W, H)
    # counter-clockwise: the box's left edge becomes its bottom edge
    assert out.boxes is not None and out.boxes[0].tolist() == [10.0, W - 31.0, 25.0, W - 14.0]


def test_crops_change_the_canvas_and_a_crop_larger_than_the_image_is_a_clear_error() -> None:
    t = _targets()
    out, _ = Pipeline((RandomCrop(20, 30, p=1.0),))(t, variant_rng(0, 0, 1))
    assert out.image.shape == (20, 30, 3) and out.mask is not None and out.mask.shape == (20, 30)
    out, _ = Pipeline((RandomResizedCrop((16, 24), p=1.0),))(t, variant_rng(0, 0, 1))
    assert out.image.shape == (16, 24, 3)
    with pytest.raises(ConfigError, match=r"RandomCrop: the 64x20 crop is larger than the 48x40 image.*pad_if_needed"):
        RandomCrop(20, 64, p=1.0).draw(np.random.default_rng(0), t)


def test_random_crop_pads_where_pad_position_says() -> None:
    t = _drawn(np.uint8, 1)
    op = RandomCrop(50, 56, p=1.0, pad_if_needed=True, pad_position="top_left", fill=9.0, fill_mask=3)
    params = op.draw(np.random.default_rng(0), t)
    assert params == {"x": 0, "y": 0}  # padding goes after the image, so the only window starts at its corner
    out = op.apply(t, params)
    assert out.image.shape == (50, 56, 1)
    assert (out.image[40:, :, 0] == 9).all() and (out.image[:, 48:, 0] == 9).all()
    assert out.mask is not None and (out.mask[40:] == 3).all()
    assert np.array_equal(out.image[:40, :48], t.image)


def test_affine_shear_and_rotation_follow_the_documented_directions() -> None:
    t = _drawn(np.uint8, 1)
    turned = Rotate(p=1.0).apply(t, {"angle": 90.0})
    # 90 degrees counter-clockwise about the centre (24, 20): x' = 24 + (y - 20), y' = 20 - (x - 24)
    assert turned.boxes is not None
    assert np.allclose(turned.boxes[0], [24 + 10 - 20, 20 - (31 - 24), 24 + 25 - 20, 20 - (14 - 24)], atol=1e-4)
    above = t.replace(boxes=np.array([[14, 2, 20, 8]], np.float32))  # above the centre row 20
    sheared = Affine(p=1.0).apply(above, {"angle": 0.0, "scale": [1, 1], "translate": [0, 0], "shear": [20.0, 0.0]})
    # a positive x shear moves the rows above the centre to the right, the farther the more
    shift = np.tan(np.deg2rad(20.0))
    assert sheared.boxes is not None
    assert np.allclose(sheared.boxes[0], [14 + 12 * shift, 2, 20 + 18 * shift, 8], atol=1e-4)


# ---------------------------------------------------------------- the pure pixel functions


@pytest.mark.parametrize(("dtype", "channels"), KINDS)
def test_pixel_functions_keep_shape_and_dtype(dtype: Any, channels: int) -> None:
    img = _targets(dtype, channels).image
    outs = [
        color.brightness_contrast(img, 1.3, 20.0),
        color.shift_hsv(img, 10.0, -20.0, 15.0),
        color.gauss_noise(img, 10.0, 0.0, 1),
        color.gaussian_blur(img, 5, 1.0),
        color.gaussian_blur(img, 0, 1.5),
        color.fill_holes(img, [[1, 1, 5, 5]], 3),
    ]
    for out in outs:
        assert out.shape == img.shape and out.dtype == img.dtype


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_brightness_contrast_saturates_instead_of_wrapping(dtype: Any) -> None:
    top = np.iinfo(dtype).max
    img = np.array([[[0], [10], [top - 5], [top]]], dtype)
    assert color.brightness_contrast(img, 1.0, 20.0)[0, :, 0].tolist() == [20, 30, top, top]
    assert color.brightness_contrast(img, 1.0, -20.0)[0, :, 0].tolist() == [0, 0, top - 25, top - 20]
    assert color.brightness_contrast(img, 2.0, 0.0)[0, :, 0].tolist() == [0, 20, top, top]


def test_hsv_on_gray_images_changes_only_the_value() -> None:
    gray = np.array([[[0], [100], [250]]], np.uint8)
    assert color.shift_hsv(gray, 50.0, 80.0, 0.0).tolist() == gray.tolist()
    assert color.shift_hsv(gray, 50.0, 80.0, 10.0)[0, :, 0].tolist() == [10, 110, 255]
    wide = gray.astype(np.uint16) * 257
    assert color.shift_hsv(wide, 0.0, 0.0, 10.0)[0, :, 0].tolist() == [2570, 100 * 257 + 2570, 65535]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_hsv_hue_wraps_and_grays_stay_gray(dtype: Any) -> None:
    top = np.iinfo(dtype).max
    red = np.array([[[top, 0, 0], [top // 2, top // 2, top // 2]]], dtype)
    turned = color.shift_hsv(red, 60.0, 0.0, 0.0)  # 60 steps of 2 degrees: red becomes green
    assert turned[0, 0].tolist() == [0, top, 0]
    assert turned[0, 1].tolist() == red[0, 1].tolist()
    assert color.shift_hsv(red, 90.0, 0.0, 0.0)[0, 0].tolist() == [0, top, top]  # 180 degrees: cyan
    # more saturation cannot give a gray pixel a colour
    assert color.shift_hsv(red, 0.0, 100.0, 0.0)[0, 1].tolist() == red[0, 1].tolist()


def test_gauss_noise_is_a_function_of_its_seed() -> None:
    img = np.full((16, 16, 3), 128, np.uint8)
    a = color.gauss_noise(img, 20.0, 0.0, 7)
    assert np.array_equal(a, color.gauss_noise(img, 20.0, 0.0, 7))
    assert not np.array_equal(a, color.gauss_noise(img, 20.0, 0.0, 8))
    assert 12 < float(a.astype(np.float64).std()) < 28
    same = color.gauss_noise(img, 20.0, 0.0, 7, per_channel=False)
    assert np.array_equal(same[:, :, 0], same[:, :, 2])


def test_gaussian_blur_spreads_a_point_and_keeps_its_sum() -> None:
    img = np.zeros((15, 15, 1), np.uint16)
    img[7, 7, 0] = 10000
    out = color.gaussian_blur(img, 7, 1.0)
    assert out[7, 7, 0] < 10000 and out[7, 8, 0] > 0 and out[0, 0, 0] == 0
    assert abs(int(out.astype(np.int64).sum()) - 10000) < 50
    assert color.blur_kernel_size(2.0) == 15


def test_fill_holes_clips_to_the_image() -> None:
    img = np.zeros((6, 8, 3), np.uint8)
    out = color.fill_holes(img, [[6, 4, 12, 9], [-3, -3, 1, 1]], [1, 2, 300])
    assert out[4:, 6:].tolist() == [[[1, 2, 255]] * 2] * 2
    assert out[0, 0].tolist() == [1, 2, 255] and int(out.sum()) == (1 + 2 + 255) * 5


def test_geometric_crop_pads_outside_the_image() -> None:
    a = np.arange(12, dtype=np.uint8).reshape(3, 4)
    assert geometric.crop(a, 1, 1, 2, 2).tolist() == [[5, 6], [9, 10]]
    assert geometric.crop(a, -1, 2, 3, 2, fill=99).tolist() == [[99, 8, 9], [99, 99, 99]]
    assert geometric.crop(a, 3, 0, 2, 1, border="replicate").tolist() == [[3, 3]]
    assert geometric.resize_nearest(a, 2, 3).tolist() == [[1, 3], [5, 7], [9, 11]]


# ---------------------------------------------------------------- parity with albumentations


@pytest.fixture(scope="module")
def A() -> Any:  # noqa: N802 - albumentations' own alias
    # albumentations is a test-only dependency that is not installed for the lowest-versions run
    # (`make test-min`: 2.0.8 needs a newer OpenCV than the minimum pin), so these tests skip there.
    import os

    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # no network check at import
    albumentations = pytest.importorskip("albumentations")
    if int(albumentations.__version__.split(".")[0]) < 2:
        pytest.skip("the parity tests read the parameters albumentations 2 reports (save_applied_params)")
    return albumentations


def _albumentations_run(
    A: Any, transform: Any, t: Targets, seed: int | None = None
) -> tuple[dict[str, Any], list[Any]]:
    # Compose reseeds its transforms (from ``seed``, or at random without one).
    compose = A.Compose(
        [transform],
        bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"]),
        save_applied_params=True,
        seed=seed,
    )
    assert t.boxes is not None and t.box_labels is not None
    out = compose(image=t.image, mask=t.mask, bboxes=t.boxes, labels=t.box_labels.tolist())
    return out, out["applied_transforms"]


@pytest.mark.parametrize(("dtype", "channels"), [(np.uint8, 1), (np.uint8, 3)])
@pytest.mark.parametrize("name", ["HorizontalFlip", "VerticalFlip", "RandomRotate90"])
def test_flips_and_quarter_turns_equal_albumentations_exactly(A: Any, name: str, dtype: Any, channels: int) -> None:
    t = _targets(dtype, channels)
    seen = set()
    # Seeds until every quarter turn was drawn (at most 64): which seed draws which turn is
    # albumentations' business, that all four are compared is this test's.
    for seed in range(64):
        if seen == {0, 1, 2, 3}:
            break
        theirs = getattr(A, name)(p=1.0)
        out, applied = _albumentations_run(A, theirs, t, seed)
        params = {"k": int(applied[0][1]["factor"])} if name == "RandomRotate90" else {}
        seen.add(params.get("k"))
        ours = EXAMPLES[name].apply(t, params)
        image = out["image"] if out["image"].ndim == 3 else out["image"][:, :, None]
        assert image.dtype == ours.image.dtype and np.array_equal(image, ours.image)
        assert np.array_equal(out["mask"], ours.mask)
        assert ours.boxes is not None and ours.box_labels is not None
        assert np.allclose(np.asarray(out["bboxes"], np.float64), ours.boxes, atol=1e-4)
        assert list(out["labels"]) == ours.box_labels.tolist()
    assert seen == ({0, 1, 2, 3} if name == "RandomRotate90" else {None})


def test_affine_moves_boxes_as_albumentations_does(A: Any) -> None:
    t = _targets()
    fixed = A.Affine(
        p=1.0,
        rotate=(20, 20),
        shear={"x": (10, 10), "y": (5, 5)},
        scale={"x": (1.2, 1.2), "y": (0.9, 0.9)},
        translate_px={"x": (3, 3), "y": (-2, -2)},
    )
    out, _ = _albumentations_run(A, fixed, t)
    ours = Affine(p=1.0).apply(t, {"angle": 20.0, "scale": [1.2, 0.9], "translate": [3, -2], "shear": [10.0, 5.0]})
    kept = ours.visibility is not None and ours.boxes is not None
    assert kept and ours.boxes is not None
    theirs = np.asarray(out["bboxes"], np.float64)
    assert theirs.shape == ours.boxes.shape and np.allclose(theirs, ours.boxes, atol=1e-3)
