"""Pure geometric functions for augmentation: no randomness, no state.

Every geometric operation is a 3 x 3 matrix ``M`` that maps a corner-based point ``(x, y)`` of the
input (pixel ``(row i, col j)`` covers ``[j, j + 1] x [i, i + 1]``) to the output canvas. Images
and masks are warped by it, boxes by their four corners (then the axis-aligned hull, clipped to
the canvas: albumentations' and torchvision's rule), so pixels and labels always move together.
Flips and 90-degree turns are exact index operations, not interpolated warps.
"""

from __future__ import annotations

import cv2
import numpy as np

__all__ = [
    "hflip",
    "vflip",
    "rot90",
    "flip_matrix",
    "rot90_matrix",
    "affine_matrix",
    "crop_matrix",
    "warp_image",
    "warp_mask",
    "warp_boxes",
    "perspective_matrix",
    "crop",
    "resize",
    "resize_nearest",
    "INTERPOLATIONS",
    "BORDERS",
]

#: Interpolation names a config may use -> OpenCV flags.
INTERPOLATIONS = {
    "nearest": cv2.INTER_NEAREST,
    "linear": cv2.INTER_LINEAR,
    "cubic": cv2.INTER_CUBIC,
    "area": cv2.INTER_AREA,
    "lanczos": cv2.INTER_LANCZOS4,
}

#: How a warp fills the pixels it uncovers -> OpenCV border modes: ``constant`` takes the fill value,
#: the others take image pixels (edge repeated, mirrored with or without the edge pixel, wrapped).
BORDERS = {
    "constant": cv2.BORDER_CONSTANT,
    "replicate": cv2.BORDER_REPLICATE,
    "reflect": cv2.BORDER_REFLECT,
    "wrap": cv2.BORDER_WRAP,
    "reflect101": cv2.BORDER_REFLECT_101,
}


def hflip(a: np.ndarray) -> np.ndarray:
    """Mirror left-right (columns reversed); works on images (H x W x C) and masks (H x W)."""
    return np.ascontiguousarray(a[:, ::-1])


def vflip(a: np.ndarray) -> np.ndarray:
    """Mirror top-bottom (rows reversed)."""
    return np.ascontiguousarray(a[::-1])


def rot90(a: np.ndarray, k: int) -> np.ndarray:
    """Turn by ``k`` quarter turns counter-clockwise, as :func:`numpy.rot90` (and albumentations'
    ``RandomRotate90``) do; an H x W image becomes W x H for odd ``k``."""
    return np.ascontiguousarray(np.rot90(a, k % 4, axes=(0, 1)))


def flip_matrix(w: int, h: int, horizontal: bool, vertical: bool) -> np.ndarray:
    """The matrix of a mirror of a ``w x h`` canvas (``x -> w - x`` and/or ``y -> h - y``)."""
    m = np.eye(3)
    if horizontal:
        m[0, 0], m[0, 2] = -1.0, float(w)
    if vertical:
        m[1, 1], m[1, 2] = -1.0, float(h)
    return m


def rot90_matrix(w: int, h: int, k: int) -> np.ndarray:
    """The matrix of :func:`rot90` of a ``w x h`` canvas (counter-clockwise on screen, y down)."""
    k %= 4
    if k == 0:
        return np.eye(3)
    if k == 1:  # (x, y) -> (y, w - x), canvas h x w
        return np.array([[0.0, 1.0, 0.0], [-1.0, 0.0, float(w)], [0.0, 0.0, 1.0]])
    if k == 2:
        return np.array([[-1.0, 0.0, float(w)], [0.0, -1.0, float(h)], [0.0, 0.0, 1.0]])
    return np.array([[0.0, -1.0, float(h)], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # (x, y) -> (h - y, x)


def affine_matrix(
    w: int,
    h: int,
    angle: float = 0.0,
    scale: float | tuple[float, float] = 1.0,
    translate: tuple[float, float] = (0.0, 0.0),
    shear: tuple[float, float] = (0.0, 0.0),
) -> np.ndarray:
    """Scale, rotate by ``angle`` degrees (counter-clockwise on screen), then shear (degrees, x and y)
    about the canvas centre, then translate by ``translate`` pixels: the albumentations ``Affine``
    parameters (their order and signs) as one matrix."""
    sx, sy = (scale, scale) if isinstance(scale, (int, float)) else scale
    cx, cy = w / 2.0, h / 2.0
    a = np.deg2rad(angle)
    # y points down, so a counter-clockwise turn on screen is a clockwise one in (x, y).
    rot = np.array([[np.cos(a), np.sin(a), 0.0], [-np.sin(a), np.cos(a), 0.0], [0.0, 0.0, 1.0]])
    # albumentations' sign: a positive x shear moves the rows above the centre to the right.
    shx, shy = np.tan(np.deg2rad(shear[0])), np.tan(np.deg2rad(shear[1]))
    sh = np.array([[1.0, -shx, 0.0], [-shy, 1.0, 0.0], [0.0, 0.0, 1.0]])
    sc = np.diag([float(sx), float(sy), 1.0])
    to_c = np.array([[1.0, 0.0, -cx], [0.0, 1.0, -cy], [0.0, 0.0, 1.0]])
    back = np.array([[1.0, 0.0, cx + translate[0]], [0.0, 1.0, cy + translate[1]], [0.0, 0.0, 1.0]])
    m: np.ndarray = back @ sh @ rot @ sc @ to_c
    return m


def crop_matrix(x0: float, y0: float, cw: float, ch: float, out_w: int, out_h: int) -> np.ndarray:
    """The matrix of cutting ``[x0, x0 + cw] x [y0, y0 + ch]`` and resizing it to ``out_w x out_h``."""
    return np.array([[out_w / cw, 0.0, -x0 * out_w / cw], [0.0, out_h / ch, -y0 * out_h / ch], [0.0, 0.0, 1.0]])


def perspective_matrix(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The projective matrix that maps the four corner-based points ``src`` (4 x 2) onto ``dst``."""
    s = np.asarray(src, np.float32).reshape(4, 2)
    d = np.asarray(dst, np.float32).reshape(4, 2)
    return np.asarray(cv2.getPerspectiveTransform(s, d), np.float64)


def _cv_matrix(m: np.ndarray) -> np.ndarray:
    """``m`` for OpenCV, whose pixel ``j`` sits at ``x = j`` (its centre), not at ``[j, j + 1]``."""
    half = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])
    unhalf = np.array([[1.0, 0.0, -0.5], [0.0, 1.0, -0.5], [0.0, 0.0, 1.0]])
    out: np.ndarray = unhalf @ m @ half
    return out


def _fill_value(fill: float | tuple[float, ...], channels: int) -> tuple[float, ...]:
    """OpenCV's border value: one number per channel (a single number is repeated)."""
    if isinstance(fill, tuple):
        return tuple(float(v) for v in (fill * max(1, channels) if len(fill) == 1 else fill))
    return (float(fill),) * max(1, min(channels, 4))


def _warp(
    a: np.ndarray,
    m: np.ndarray,
    out_w: int,
    out_h: int,
    flag: int,
    fill: float | tuple[float, ...],
    border: int = cv2.BORDER_CONSTANT,
) -> np.ndarray:
    mc = _cv_matrix(np.asarray(m, np.float64))
    affine = np.allclose(mc[2], [0.0, 0.0, 1.0])
    channels = a.shape[2] if a.ndim == 3 else 0
    value = _fill_value(fill, channels)
    src = a
    if channels > 4:  # OpenCV warps at most 4 channels at once
        one = [fill[c] if isinstance(fill, tuple) else fill for c in range(channels)]
        return np.stack([_warp(a[:, :, c], m, out_w, out_h, flag, one[c], border) for c in range(channels)], axis=2)
    if affine:
        warped = cv2.warpAffine(src, mc[:2], (out_w, out_h), flags=flag, borderMode=border, borderValue=value)
    else:
        warped = cv2.warpPerspective(src, mc, (out_w, out_h), flags=flag, borderMode=border, borderValue=value)
    out = np.asarray(warped)
    if channels and out.ndim == 2:  # OpenCV drops a channel axis of size 1
        out = out[:, :, None]
    return out


def warp_image(
    img: np.ndarray,
    m: np.ndarray,
    out_w: int,
    out_h: int,
    interpolation: str = "linear",
    fill: float | tuple[float, ...] = 0.0,
    border: str = "constant",
) -> np.ndarray:
    """``img`` (H x W x C, uint8 or uint16) warped by ``m`` onto an ``out_w x out_h`` canvas;
    uncovered pixels take ``fill`` (one number, or one per channel), or image pixels for another
    :data:`BORDERS` mode. The dtype and channel count are kept."""
    return _warp(img, m, out_w, out_h, INTERPOLATIONS[interpolation], fill, BORDERS[border])


def warp_mask(
    mask: np.ndarray, m: np.ndarray, out_w: int, out_h: int, fill: int, border: str = "constant"
) -> np.ndarray:
    """A label image warped by nearest neighbour (no new values appear); uncovered pixels take ``fill``
    (``constant`` border) or the mask's own pixels (the image's other border modes)."""
    return _warp(mask, m, out_w, out_h, cv2.INTER_NEAREST, float(fill), BORDERS[border])


def crop(
    a: np.ndarray, x0: int, y0: int, cw: int, ch: int, fill: float | tuple[float, ...] = 0.0, border: str = "constant"
) -> np.ndarray:
    """The ``cw x ch`` window of ``a`` (image or mask) whose top-left pixel is ``(x0, y0)``: exact
    copies, no interpolation. Parts of the window outside ``a`` are padded as :func:`warp_image` fills."""
    h, w = a.shape[:2]
    top, left = max(0, -y0), max(0, -x0)
    bottom, right = max(0, y0 + ch - h), max(0, x0 + cw - w)
    if top or left or bottom or right:
        channels = a.shape[2] if a.ndim == 3 else 0
        padded = cv2.copyMakeBorder(a, top, bottom, left, right, BORDERS[border], value=_fill_value(fill, channels))
        a = padded[:, :, None] if channels and padded.ndim == 2 else padded
        x0, y0 = x0 + left, y0 + top
    return np.ascontiguousarray(a[y0 : y0 + ch, x0 : x0 + cw])


def resize(img: np.ndarray, out_w: int, out_h: int, interpolation: str = "linear") -> np.ndarray:
    """``img`` (H x W x C) resized to ``out_w x out_h`` (pixel centres aligned, as :func:`crop_matrix`
    maps boxes); dtype and channel count kept."""
    if img.shape[:2] == (out_h, out_w):
        return img
    out = cv2.resize(img, (out_w, out_h), interpolation=INTERPOLATIONS[interpolation])
    if img.ndim == 3 and out.ndim == 2:  # OpenCV drops a channel axis of size 1
        out = out[:, :, None]
    return out


def resize_nearest(mask: np.ndarray, out_w: int, out_h: int) -> np.ndarray:
    """A label image resized by taking, for each output pixel, the input pixel under its centre."""
    h, w = mask.shape[:2]
    rows = ((2 * np.arange(out_h, dtype=np.int64) + 1) * h) // (2 * out_h)
    cols = ((2 * np.arange(out_w, dtype=np.int64) + 1) * w) // (2 * out_w)
    return np.ascontiguousarray(mask[rows][:, cols])


def warp_boxes(boxes: np.ndarray, m: np.ndarray, out_w: int, out_h: int) -> tuple[np.ndarray, np.ndarray]:
    """Boxes (k x 4, corner-based) moved by ``m``: the hull of their four moved corners, clipped to
    ``[0, out_w] x [0, out_h]``.

    Returns the float32 k x 4 boxes and, per box, the share of its unclipped moved area that is
    left inside the canvas (0 for a box that left it, or had no area): the ``visibility`` factor.
    """
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    if not len(b):
        return np.zeros((0, 4), np.float32), np.zeros(0, np.float64)
    xs = b[:, [0, 2, 2, 0]]
    ys = b[:, [1, 1, 3, 3]]
    pts = np.stack([xs, ys, np.ones_like(xs)], axis=-1) @ np.asarray(m, np.float64).T  # k x 4 x 3
    px, py = pts[..., 0] / pts[..., 2], pts[..., 1] / pts[..., 2]
    hull = np.stack([px.min(1), py.min(1), px.max(1), py.max(1)], axis=1)
    clipped = hull.copy()
    np.clip(clipped[:, 0::2], 0.0, float(out_w), out=clipped[:, 0::2])
    np.clip(clipped[:, 1::2], 0.0, float(out_h), out=clipped[:, 1::2])
    full = (hull[:, 2] - hull[:, 0]) * (hull[:, 3] - hull[:, 1])
    kept = (clipped[:, 2] - clipped[:, 0]) * (clipped[:, 3] - clipped[:, 1])
    visible = np.where(full > 0, kept / np.where(full > 0, full, 1.0), 0.0)
    return clipped.astype(np.float32), visible
