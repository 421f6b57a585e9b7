"""The pure pixel functions of ``dlpack.transforms.functional``, rule by rule, and EXIF/TIFF orientation end to end."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlpack.sources.decode import decode_image
from dlpack.sources.probe import probe_header
from dlpack.transforms.functional import (
    Geometry,
    UpscaleError,
    apply_orientation,
    convert_channels,
    convert_depth,
    plan_geometry,
    resize_image,
)

ALL_U8 = np.arange(256, dtype=np.uint8)
ALL_U16 = np.arange(65536, dtype=np.uint16)

# ---------------------------------------------------------------- convert_depth


def test_8_to_16_bit_is_times_257_exactly() -> None:
    wide = convert_depth(ALL_U8, np.uint16)
    assert wide.dtype == np.uint16
    assert wide.tolist() == [v * 257 for v in range(256)]


def test_16_to_8_bit_rounds_x_over_257() -> None:
    narrow = convert_depth(ALL_U16, "|u1")
    assert narrow.dtype == np.uint8
    # 257 is odd, so x / 257 is never exactly halfway and round-half-anything agrees.
    expected = [int(x / 257 + 0.5) for x in range(65536)]
    assert narrow.tolist() == expected


def test_8_16_8_round_trip_is_identity() -> None:
    assert np.array_equal(convert_depth(convert_depth(ALL_U8, "<u2"), np.uint8), ALL_U8)


@pytest.mark.parametrize(
    ("value", "dtype", "target", "expected"),
    [
        (0, np.uint8, np.uint16, 0),
        (255, np.uint8, np.uint16, 65535),
        (0, np.uint16, np.uint8, 0),
        (65535, np.uint16, np.uint8, 255),
        (128, np.uint16, np.uint8, 0),  # 128 / 257 = 0.498
        (129, np.uint16, np.uint8, 1),  # 129 / 257 = 0.502
        (65406, np.uint16, np.uint8, 254),  # 254.5 - 0.002
        (65407, np.uint16, np.uint8, 255),
    ],
)
def test_depth_extremes_and_rounding_edges(value: int, dtype: Any, target: Any, expected: int) -> None:
    img = np.full((2, 3, 1), value, dtype=dtype)
    out = convert_depth(img, target)
    assert out.shape == img.shape and out.dtype == np.dtype(target)
    assert (out == expected).all()


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_same_depth_is_returned_unchanged(dtype: Any) -> None:
    img = np.arange(12, dtype=dtype).reshape(2, 2, 3)
    assert convert_depth(img, dtype) is img


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (np.float32, np.uint8),
        (np.int16, np.uint8),
        (np.uint32, np.uint16),
        (np.uint8, np.float32),
        (np.uint16, np.int8),
    ],
)
def test_other_depths_are_refused(source: Any, target: Any) -> None:
    with pytest.raises(ValueError, match="cannot convert"):
        convert_depth(np.zeros((2, 2, 1), dtype=source), target)


# ---------------------------------------------------------------- convert_channels


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_gray_to_rgb_replicates(dtype: Any) -> None:
    gray = np.arange(6, dtype=dtype).reshape(2, 3, 1) * 7
    rgb = convert_channels(gray, 3)
    assert rgb.shape == (2, 3, 3) and rgb.dtype == dtype
    for c in range(3):
        assert np.array_equal(rgb[:, :, c], gray[:, :, 0])


# Y = 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601), worked by hand and rounded to nearest.
LUMA_BY_HAND = [
    ((255, 0, 0), 76),  # 76.245
    ((0, 255, 0), 150),  # 149.685
    ((0, 0, 255), 29),  # 29.07
    ((255, 255, 255), 255),
    ((0, 0, 0), 0),
    ((10, 20, 30), 18),  # 2.99 + 11.74 + 3.42 = 18.15
    ((200, 100, 50), 124),  # 59.8 + 58.7 + 5.7 = 124.2
]


def test_rgb_to_gray_is_itu_601_luma() -> None:
    rgb = np.array([[p for p, _ in LUMA_BY_HAND]], dtype=np.uint8)
    gray = convert_channels(rgb, 1)
    assert gray.shape == (1, len(LUMA_BY_HAND), 1) and gray.dtype == np.uint8
    assert gray[0, :, 0].tolist() == [y for _, y in LUMA_BY_HAND]


# OpenCV computes in fixed point with 14-bit coefficients: within a step at 8 bits, two at 16 bits.
@pytest.mark.parametrize(("dtype", "top", "tolerance"), [(np.uint8, 255, 1.0), (np.uint16, 65535, 2.0)])
def test_rgb_to_gray_matches_the_formula_on_noise(dtype: Any, top: int, tolerance: float) -> None:
    rgb = np.random.default_rng(0).integers(0, top + 1, (16, 16, 3)).astype(dtype)
    gray = convert_channels(rgb, 1)
    assert gray.shape == (16, 16, 1) and gray.dtype == dtype
    r, g, b = (rgb[:, :, i].astype(np.float64) for i in range(3))
    expected = 0.299 * r + 0.587 * g + 0.114 * b
    assert np.abs(gray[:, :, 0] - expected).max() <= tolerance


def test_rgb_channel_order_matters_for_luma() -> None:
    """The input is RGB, not OpenCV's BGR: pure red is darker than pure blue would be as BGR."""
    red = np.array([[[255, 0, 0]]], dtype=np.uint8)
    assert convert_channels(red, 1)[0, 0, 0] == 76


@pytest.mark.parametrize("channels", [1, 3])
def test_same_channels_are_returned_unchanged(channels: int) -> None:
    img = np.zeros((2, 2, channels), dtype=np.uint8)
    assert convert_channels(img, channels) is img


@pytest.mark.parametrize(("have", "want"), [(2, 3), (4, 1), (4, 3), (3, 2), (1, 4)])
def test_other_channel_counts_are_refused(have: int, want: int) -> None:
    with pytest.raises(ValueError, match=f"cannot convert {have} channels to {want}"):
        convert_channels(np.zeros((2, 2, have), dtype=np.uint8), want)


# ---------------------------------------------------------------- plan_geometry


def _centred(g: Geometry) -> bool:
    """The resized image sits inside the canvas, with at most one pixel more padding after than before."""
    below, right = g.out_h - g.new_h - g.off_y, g.out_w - g.new_w - g.off_x
    return 0 <= g.off_y <= below <= g.off_y + 1 and 0 <= g.off_x <= right <= g.off_x + 1


def test_stretch_maps_onto_size_exactly() -> None:
    g = plan_geometry(300, 400, "stretch", size=(100, 50))  # size is (width, height)
    assert g == Geometry(src_h=300, src_w=400, out_h=50, out_w=100, new_h=50, new_w=100, off_y=0, off_x=0)
    assert (g.scale_x, g.scale_y) == (0.25, 50 / 300)


@pytest.mark.parametrize("size", [(401, 300), (400, 301), (800, 600)])
def test_stretch_refuses_to_upscale(size: tuple[int, int]) -> None:
    with pytest.raises(UpscaleError, match=r"400x300.*--allow-upscale"):
        plan_geometry(300, 400, "stretch", size=size)
    g = plan_geometry(300, 400, "stretch", size=size, allow_upscale=True)
    assert (g.out_w, g.out_h, g.new_w, g.new_h) == (*size, *size)


def test_stretch_to_the_same_size_is_not_an_upscale() -> None:
    g = plan_geometry(30, 40, "stretch", size=(40, 30))
    assert (g.new_h, g.new_w) == (30, 40)


def test_upscale_error_is_a_value_error() -> None:
    assert issubclass(UpscaleError, ValueError)


def test_fit_keeps_aspect_and_pads_centred() -> None:
    g = plan_geometry(100, 200, "fit", size=(50, 50))  # 2:1 landscape into a square
    assert (g.out_h, g.out_w, g.new_h, g.new_w) == (50, 50, 25, 50)
    assert (g.off_y, g.off_x) == (12, 0)  # 25 rows of padding: 12 above, 13 below
    assert _centred(g)


def test_fit_into_a_wide_box_pads_left_and_right() -> None:
    g = plan_geometry(100, 100, "fit", size=(64, 32))
    assert (g.out_h, g.out_w, g.new_h, g.new_w, g.off_y, g.off_x) == (32, 64, 32, 32, 0, 16)


def test_fit_with_max_side_uses_a_square_box() -> None:
    g = plan_geometry(300, 600, "fit", max_side=60)
    assert (g.out_h, g.out_w, g.new_h, g.new_w, g.off_y, g.off_x) == (60, 60, 30, 60, 15, 0)


def test_fit_does_not_upscale_unless_allowed() -> None:
    small = plan_geometry(10, 20, "fit", size=(50, 50))
    assert (small.new_h, small.new_w, small.out_h, small.out_w) == (10, 20, 50, 50)
    assert (small.off_y, small.off_x) == (20, 15)
    big = plan_geometry(10, 20, "fit", size=(50, 50), allow_upscale=True)
    assert (big.new_h, big.new_w, big.off_y, big.off_x) == (25, 50, 12, 0)


@pytest.mark.parametrize(("src_h", "src_w"), [(1, 1000), (1000, 1), (1, 1)])
def test_fit_and_none_never_go_below_one_pixel(src_h: int, src_w: int) -> None:
    for g in (
        plan_geometry(src_h, src_w, "fit", size=(10, 10)),
        plan_geometry(src_h, src_w, "fit", max_side=10),
        plan_geometry(src_h, src_w, "none", max_side=10),
    ):
        assert g.new_h >= 1 and g.new_w >= 1
        assert max(g.new_h, g.new_w) == min(10, max(src_h, src_w))


@pytest.mark.parametrize(("src", "box"), [((7, 5), (3, 3)), ((5, 7), (4, 3)), ((33, 17), (9, 11)), ((3, 3), (2, 2))])
def test_fit_odd_sizes(src: tuple[int, int], box: tuple[int, int]) -> None:
    g = plan_geometry(*src, "fit", size=box)
    assert (g.out_w, g.out_h) == box and _centred(g)
    assert g.new_h == box[1] or g.new_w == box[0]


sides = st.integers(1, 4000)


@given(src_h=sides, src_w=sides, box_w=st.integers(1, 600), box_h=st.integers(1, 600), upscale=st.booleans())
def test_fit_property(src_h: int, src_w: int, box_w: int, box_h: int, upscale: bool) -> None:
    g = plan_geometry(src_h, src_w, "fit", size=(box_w, box_h), allow_upscale=upscale)
    assert (g.out_h, g.out_w) == (box_h, box_w)
    assert 1 <= g.new_h <= box_h and 1 <= g.new_w <= box_w and _centred(g)
    if not upscale and src_h <= box_h and src_w <= box_w:
        assert (g.new_h, g.new_w) == (src_h, src_w)
    else:
        # The limiting side fills the box, and the other side keeps the aspect ratio to within rounding.
        assert g.new_h == box_h or g.new_w == box_w
        s = min(box_w / src_w, box_h / src_h)
        assert abs(g.new_h - src_h * s) <= 0.5 + 1e-9 or g.new_h == 1
        assert abs(g.new_w - src_w * s) <= 0.5 + 1e-9 or g.new_w == 1


def test_none_keeps_the_original_size() -> None:
    g = plan_geometry(123, 457, "none")
    assert (g.out_h, g.out_w, g.new_h, g.new_w, g.off_y, g.off_x) == (123, 457, 123, 457, 0, 0)


def test_none_shrinks_to_max_side_and_never_enlarges() -> None:
    g = plan_geometry(300, 1000, "none", max_side=250)
    assert (g.out_h, g.out_w, g.new_h, g.new_w) == (75, 250, 75, 250)
    g = plan_geometry(301, 1001, "none", max_side=250)  # 301 / 4.004 = 75.17
    assert (g.new_h, g.new_w) == (75, 250)
    same = plan_geometry(30, 100, "none", max_side=250)
    assert (same.new_h, same.new_w) == (30, 100)


@pytest.mark.parametrize(
    ("mode", "kwargs", "message"),
    [
        ("stretch", {}, "stretch needs size"),
        ("stretch", {"max_side": 10}, "stretch needs size"),
        ("fit", {}, "fit needs size or max_side"),
        ("crop", {"size": (10, 10)}, "unknown resize mode 'crop'"),
    ],
)
def test_geometry_errors(mode: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_geometry(20, 20, mode, **kwargs)


# ---------------------------------------------------------------- resize_image


def test_shrinking_averages_areas() -> None:
    img = np.zeros((3, 3, 1), dtype=np.float32)
    img[1, 1, 0] = 90.0
    out = resize_image(img, plan_geometry(3, 3, "stretch", size=(1, 1)))
    # Area: the mean of the 9 pixels. Bilinear would sample the centre and give 90.
    assert out.shape == (1, 1, 1) and out[0, 0, 0] == pytest.approx(10.0)


def test_shrinking_by_two_is_the_mean_of_each_block() -> None:
    img = np.random.default_rng(1).random((8, 6, 3)).astype(np.float32)
    out = resize_image(img, plan_geometry(8, 6, "stretch", size=(3, 4)))
    blocks = img.reshape(4, 2, 3, 2, 3).mean(axis=(1, 3))
    assert np.allclose(out, blocks, atol=1e-6)


def test_enlarging_interpolates_linearly() -> None:
    img = np.array([[[0.0], [100.0]]], dtype=np.float32)  # 1 x 2 x 1
    out = resize_image(img, plan_geometry(1, 2, "stretch", size=(4, 1), allow_upscale=True))
    # Pixel centres: output x maps to (x + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 (edges clamp).
    assert out[0, :, 0].tolist() == pytest.approx([0.0, 25.0, 75.0, 100.0])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.float32])
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("size", [(5, 4), (20, 16)])
def test_resize_keeps_dtype_and_channel_axis(dtype: Any, channels: int, size: tuple[int, int]) -> None:
    img = (np.random.default_rng(2).random((8, 10, channels)) * 200).astype(dtype)
    out = resize_image(img, plan_geometry(8, 10, "stretch", size=size, allow_upscale=True))
    assert out.shape == (size[1], size[0], channels) and out.dtype == dtype


def test_same_size_returns_the_input() -> None:
    img = np.ones((4, 5, 3), dtype=np.uint8)
    assert resize_image(img, plan_geometry(4, 5, "none")) is img


@pytest.mark.parametrize("channels", [1, 3])
def test_fit_pads_with_zeros_around_the_unchanged_image(channels: int) -> None:
    img = np.random.default_rng(3).integers(1, 256, (2, 4, channels)).astype(np.uint8)  # no zero pixel
    g = plan_geometry(2, 4, "fit", size=(4, 5))
    assert (g.new_h, g.new_w, g.off_y, g.off_x) == (2, 4, 1, 0)
    out = resize_image(img, g)
    assert out.shape == (5, 4, channels) and out.dtype == np.uint8
    assert np.array_equal(out[1:3], img)
    assert not out[0].any() and not out[3:].any()


def test_fit_resizes_then_pads() -> None:
    img = np.full((40, 20, 3), 200, dtype=np.uint8)
    out = resize_image(img, plan_geometry(40, 20, "fit", size=(16, 16)))
    assert out.shape == (16, 16, 3)
    assert (out[:, 4:12] == 200).all() and not out[:, :4].any() and not out[:, 12:].any()


def test_resize_refuses_a_geometry_for_another_size() -> None:
    with pytest.raises(ValueError, match="image is 5x4, geometry expects 6x4"):
        resize_image(np.zeros((4, 5, 3), np.uint8), plan_geometry(4, 6, "none"))


# ---------------------------------------------------------------- orientation

# EXIF 2.3, tag 0x0112 (and TIFF 6.0 tag 274): the side of the upright image on which the stored
# image's 0th row lies, and the side on which its 0th column lies.
EXIF_SIDES = {
    1: ("top", "left"),
    2: ("top", "right"),
    3: ("bottom", "right"),
    4: ("bottom", "left"),
    5: ("left", "top"),
    6: ("right", "top"),
    7: ("right", "bottom"),
    8: ("left", "bottom"),
}


def upright_reference(stored: np.ndarray, orientation: int) -> np.ndarray:
    """The upright image, pixel by pixel, straight from the EXIF definition (no NumPy flips)."""
    h, w = stored.shape[:2]
    row_side, col_side = EXIF_SIDES[orientation]
    big_h, big_w = (w, h) if row_side in ("left", "right") else (h, w)
    out = np.zeros((big_h, big_w, *stored.shape[2:]), dtype=stored.dtype)
    for r in range(h):
        for c in range(w):
            y = x = -1
            # Stored row r is the r-th line counted from the side its 0th row lies on.
            if row_side == "top":
                y = r
            elif row_side == "bottom":
                y = big_h - 1 - r
            elif row_side == "left":
                x = r
            else:
                x = big_w - 1 - r
            if col_side == "left":
                x = c
            elif col_side == "right":
                x = big_w - 1 - c
            elif col_side == "top":
                y = c
            else:
                y = big_h - 1 - c
            out[y, x] = stored[r, c]
    return out


def stored_for(upright: np.ndarray, orientation: int) -> np.ndarray:
    """The pixels a camera stores with ``orientation`` so that they show as ``upright``."""
    for candidate in _all_placements(upright):
        if np.array_equal(upright_reference(candidate, orientation), upright):
            return candidate
    raise AssertionError(f"no stored image shows upright with orientation {orientation}")


def _all_placements(img: np.ndarray) -> list[np.ndarray]:
    """The 8 rotations and mirror images of ``img``."""
    return [np.ascontiguousarray(np.rot90(m, k)) for m in (img, img[:, ::-1]) for k in range(4)]


CORNERS = {"TL": (0, 0), "TR": (0, -1), "BL": (-1, 0), "BR": (-1, -1)}
# Where the stored top-left and top-right pixels must show, read off EXIF_SIDES by hand.
CORNER_TABLE = {
    1: ("TL", "TR"),
    2: ("TR", "TL"),
    3: ("BR", "BL"),
    4: ("BL", "BR"),
    5: ("TL", "BL"),
    6: ("TR", "BR"),
    7: ("BR", "TR"),
    8: ("BL", "TL"),
}

#: An asymmetric stored image: 3 rows, 5 columns, every pixel distinct, with a channel axis.
ASYM = np.arange(15 * 2, dtype=np.uint16).reshape(3, 5, 2)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_reference_puts_the_corners_where_exif_says(orientation: int) -> None:
    out = upright_reference(ASYM, orientation)
    top_left, top_right = CORNER_TABLE[orientation]
    assert np.array_equal(out[CORNERS[top_left]], ASYM[0, 0])
    assert np.array_equal(out[CORNERS[top_right]], ASYM[0, -1])


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("shape", [(3, 5, 2), (3, 5), (4, 4, 3), (1, 6, 1)])
def test_apply_orientation_matches_exif(orientation: int, shape: tuple[int, ...]) -> None:
    stored = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    assert np.array_equal(apply_orientation(stored, orientation), upright_reference(stored, orientation))


@pytest.mark.parametrize(("orientation", "k"), [(1, 0), (3, 2), (6, -1), (8, 1)])
def test_rotations_turn_the_way_cameras_say(orientation: int, k: int) -> None:
    """6 is "rotate 90 degrees clockwise to view", 8 counter-clockwise, 3 half a turn."""
    assert np.array_equal(apply_orientation(ASYM, orientation), np.rot90(ASYM, k))


# ---------------------------------------------------------------- decoding oriented files

#: An upright test picture: 2 x 3 blocks of 8 x 8 pixels (so JPEG blocks stay flat), all different colours.
BLOCK_COLOURS = np.array(
    [[[230, 30, 30], [30, 200, 30], [30, 30, 230]], [[230, 230, 30], [30, 230, 230], [240, 240, 240]]], dtype=np.uint8
)
UPRIGHT = np.kron(BLOCK_COLOURS, np.ones((8, 8, 1), dtype=np.uint8))  # 16 high, 24 wide


def _pil() -> Any:
    return pytest.importorskip("PIL.Image", reason="writing EXIF JPEGs and tagged TIFFs needs Pillow")


def _jpeg(stored: np.ndarray, orientation: int) -> bytes:
    image = _pil()
    exif = image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    image.fromarray(stored).save(buf, "JPEG", quality=95, subsampling=0, exif=exif.tobytes())
    return buf.getvalue()


def _tiff(stored: np.ndarray, orientation: int) -> bytes:
    image = _pil()
    buf = io.BytesIO()
    pil = image.fromarray(stored[:, :, 0]) if stored.shape[2] == 1 else image.fromarray(stored)
    pil.save(buf, "TIFF", tiffinfo={274: orientation})
    return buf.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_jpeg_with_each_exif_orientation_decodes_upright(orientation: int) -> None:
    data = _jpeg(stored_for(UPRIGHT, orientation), orientation)
    header = probe_header(data)
    assert header is not None and header.orientation == orientation
    img = decode_image(data)
    assert img.shape == UPRIGHT.shape and img.dtype == np.uint8
    # JPEG is lossy, but flat 8 x 8 blocks at quality 95 without chroma subsampling come back nearly exact.
    assert np.abs(img.astype(int) - UPRIGHT).max() <= 8
    # BGR order for callers that resize first: the same picture with the channels reversed.
    assert np.array_equal(decode_image(data, rgb=False), img[:, :, ::-1])


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("kind", ["rgb8", "gray16"])
def test_tiff_with_each_orientation_tag_decodes_upright(orientation: int, kind: str) -> None:
    if kind == "rgb8":
        upright = UPRIGHT
    else:
        upright = UPRIGHT[:, :, :1].astype(np.uint16) * 257 + np.arange(24, dtype=np.uint16)[None, :, None]
    data = _tiff(stored_for(upright, orientation), orientation)
    header = probe_header(data)
    assert header is not None and header.format == "tiff" and header.orientation == orientation
    img = decode_image(data)
    assert img.dtype == upright.dtype and np.array_equal(img, upright)
