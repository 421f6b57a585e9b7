"""Pure NumPy/OpenCV pixel functions: no I/O, no randomness, no state.

Coordinates are corner-based (COCO style): a point ``(x, y)`` of the original image lands at
``(x * scale_x + offset_x, y * scale_y + offset_y)`` in the stored image. Pixel ``(row i, col j)``
covers ``[j, j + 1] x [i, i + 1]``; its centre is ``(j + 0.5, i + 0.5)``.

Labels follow the image through the same :class:`Geometry`: :func:`orient_boxes` and
:func:`resize_boxes` for boxes, :func:`resize_mask` for label images, :func:`polygons_to_mask` and
:func:`rle_to_mask` for COCO segmentations (docs/format.md, "Labels follow the resize").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from ..errors import DlpackError, MissingExtraError

__all__ = [
    "Geometry",
    "plan_geometry",
    "resize_image",
    "apply_orientation",
    "convert_channels",
    "convert_depth",
    "UpscaleError",
    "orient_boxes",
    "resize_boxes",
    "BoxResize",
    "resize_mask",
    "polygons_to_mask",
    "rle_to_mask",
]


class UpscaleError(DlpackError, ValueError):
    """The requested geometry would enlarge the image and upscaling was not allowed."""


@dataclass(frozen=True)
class Geometry:
    """Where an original ``src_h x src_w`` image goes in the stored ``out_h x out_w`` canvas."""

    src_h: int
    src_w: int
    out_h: int
    out_w: int
    new_h: int  # size of the resized image before padding
    new_w: int
    off_y: int  # top-left corner of the resized image inside the canvas (fit mode pads)
    off_x: int

    @property
    def scale_y(self) -> float:
        """Resized over original height (> 1: upscaled)."""
        return self.new_h / self.src_h

    @property
    def scale_x(self) -> float:
        """Resized over original width (> 1: upscaled)."""
        return self.new_w / self.src_w


def _fit_scale(h: int, w: int, box_h: int, box_w: int, allow_upscale: bool) -> float:
    s = min(box_w / w, box_h / h)
    return s if allow_upscale else min(s, 1.0)


def plan_geometry(
    src_h: int,
    src_w: int,
    mode: str,
    size: tuple[int, int] | None = None,
    max_side: int | None = None,
    allow_upscale: bool = False,
) -> Geometry:
    """Decide the stored size of one image.

    ``size`` is ``(width, height)``. ``stretch`` maps the image onto ``size`` exactly; ``fit`` keeps
    the aspect ratio inside ``size`` (or a ``max_side`` square) and pads, centred, with zeros;
    ``none`` keeps the original size, shrunk to ``max_side`` if given. Enlarging raises
    :class:`UpscaleError` unless ``allow_upscale``.
    """
    if mode == "stretch":
        if size is None:
            raise ValueError("stretch needs size")
        w, h = size
        if (h > src_h or w > src_w) and not allow_upscale:
            raise UpscaleError(
                f"image is {src_w}x{src_h}, smaller than the target {w}x{h}; stretching would upscale it "
                "(pass --allow-upscale, or use --resize fit to pad instead)"
            )
        return Geometry(src_h, src_w, h, w, h, w, 0, 0)
    if mode == "fit":
        if size is not None:
            box_w, box_h = size
        elif max_side is not None:
            box_w = box_h = max_side
        else:
            raise ValueError("fit needs size or max_side")
        s = _fit_scale(src_h, src_w, box_h, box_w, allow_upscale)
        nh = min(box_h, max(1, round(src_h * s)))
        nw = min(box_w, max(1, round(src_w * s)))
        return Geometry(src_h, src_w, box_h, box_w, nh, nw, (box_h - nh) // 2, (box_w - nw) // 2)
    if mode == "none":
        nh, nw = src_h, src_w
        if max_side is not None and max(src_h, src_w) > max_side:
            s = max_side / max(src_h, src_w)
            nh, nw = max(1, round(src_h * s)), max(1, round(src_w * s))
        return Geometry(src_h, src_w, nh, nw, nh, nw, 0, 0)
    raise ValueError(f"unknown resize mode {mode!r}")


def resize_image(img: np.ndarray, g: Geometry) -> np.ndarray:
    """Resize (area interpolation when shrinking, bilinear when enlarging) and pad to ``g``.

    Returns an H x W x C array of the input dtype.
    """
    if img.shape[0] != g.src_h or img.shape[1] != g.src_w:
        raise ValueError(f"image is {img.shape[1]}x{img.shape[0]}, geometry expects {g.src_w}x{g.src_h}")
    out = img
    if (g.new_h, g.new_w) != (g.src_h, g.src_w):
        shrink = g.new_h <= g.src_h and g.new_w <= g.src_w
        interp = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        out = cv2.resize(img, (g.new_w, g.new_h), interpolation=interp)
        if out.ndim == 2:  # cv2 drops a trailing channel axis of size 1
            out = out[:, :, None]
    if (g.out_h, g.out_w) != (g.new_h, g.new_w):
        canvas = np.zeros((g.out_h, g.out_w, out.shape[2]), dtype=out.dtype)
        canvas[g.off_y : g.off_y + g.new_h, g.off_x : g.off_x + g.new_w] = out
        out = canvas
    return out


def apply_orientation(img: np.ndarray, orientation: int) -> np.ndarray:
    """Rotate/flip an image as EXIF orientation 1..8 says, so it shows upright."""
    if orientation == 2:
        return img[:, ::-1]
    if orientation == 3:
        return img[::-1, ::-1]
    if orientation == 4:
        return img[::-1]
    if orientation == 5:
        return np.swapaxes(img, 0, 1)
    if orientation == 6:
        return np.swapaxes(img, 0, 1)[:, ::-1]
    if orientation == 7:
        return np.swapaxes(img, 0, 1)[::-1, ::-1]
    if orientation == 8:
        return np.swapaxes(img, 0, 1)[::-1]
    return img


def convert_channels(img: np.ndarray, channels: int) -> np.ndarray:
    """Gray (H x W x 1) <-> RGB (H x W x 3): replicate gray, or take ITU-R 601 luma of RGB."""
    c = img.shape[2]
    if c == channels:
        return img
    if channels == 3 and c == 1:
        return np.repeat(img, 3, axis=2)
    if channels == 1 and c == 3:
        return cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)[:, :, None]
    raise ValueError(f"cannot convert {c} channels to {channels}")


def convert_depth(img: np.ndarray, dtype: np.dtype[np.generic] | str) -> np.ndarray:
    """uint8 <-> uint16 by exact scaling (x * 257, and rounding x / 257 back)."""
    target = np.dtype(dtype)
    if img.dtype == target:
        return img
    if img.dtype == np.uint8 and target == np.uint16:
        wide: np.ndarray = np.multiply(img, 257, dtype=np.uint16)
        return wide
    if img.dtype == np.uint16 and target == np.uint8:
        return ((img.astype(np.uint32) + 128) // 257).astype(np.uint8)
    raise ValueError(f"cannot convert {img.dtype} to {target}")


# ---------------------------------------------------------------- labels that follow the image


def _as_boxes(boxes: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
    """``boxes`` as a float64 [k, 4] array of finite corner coordinates (ValueError otherwise)."""
    arr = np.asarray(boxes, dtype=np.float64)
    if arr.size == 0:
        return np.zeros((0, 4), np.float64)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise ValueError(f"boxes must be a k x 4 array of [x_min, y_min, x_max, y_max]; got shape {arr.shape}")
    if not np.isfinite(arr).all():
        raise ValueError("boxes hold a coordinate that is not a finite number")
    return arr


def _orient_points(x: np.ndarray, y: np.ndarray, orientation: int, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """Corner-based points of a raw ``w x h`` pixel array -> where :func:`apply_orientation` puts them."""
    if orientation == 2:
        return w - x, y
    if orientation == 3:
        return w - x, h - y
    if orientation == 4:
        return x, h - y
    if orientation == 5:
        return y, x
    if orientation == 6:
        return h - y, x
    if orientation == 7:
        return h - y, w - x
    if orientation == 8:
        return y, w - x
    return x, y


def orient_boxes(
    boxes: np.ndarray | Sequence[Sequence[float]], orientation: int, file_w: int, file_h: int
) -> np.ndarray:
    """Boxes drawn on the raw pixel array of a file -> the same boxes on the upright image.

    Parameters
    ----------
    boxes : array-like, k x 4
        Corner-based ``[x_min, y_min, x_max, y_max]`` in the file's raw frame (before EXIF orientation).
    orientation : int
        The EXIF orientation 1..8 the image was turned by (:func:`apply_orientation`).
    file_w, file_h : int
        Size of the raw pixel array; the upright image is ``file_h x file_w`` for orientations 5..8.

    Returns
    -------
    numpy.ndarray
        float64 k x 4, corner-based, in the upright frame: a box covering pixels of the raw image
        covers exactly the same pixels once image and box are turned.
    """
    arr = _as_boxes(boxes)
    xa, ya = _orient_points(arr[:, 0], arr[:, 1], orientation, file_w, file_h)
    xb, yb = _orient_points(arr[:, 2], arr[:, 3], orientation, file_w, file_h)
    return np.stack([np.minimum(xa, xb), np.minimum(ya, yb), np.maximum(xa, xb), np.maximum(ya, yb)], axis=1)


@dataclass(frozen=True)
class BoxResize:
    """What :func:`resize_boxes` made of k input boxes.

    Attributes
    ----------
    boxes : numpy.ndarray
        float32 m x 4, the kept boxes in stored-image pixels (corner-based), in input order.
    keep : numpy.ndarray
        bool [k]: which input boxes still have an area in the stored image (labels are kept with it).
    clipped : numpy.ndarray
        bool [k]: which input boxes stuck out of the image and were cut to it (dropped ones included).
    """

    boxes: np.ndarray
    keep: np.ndarray
    clipped: np.ndarray


def resize_boxes(boxes: np.ndarray | Sequence[Sequence[float]], g: Geometry) -> BoxResize:
    """Map upright, corner-based boxes of the ``g.src_w x g.src_h`` image into the stored canvas.

    Every mode a :class:`Geometry` expresses is one affine map: ``x * new_w / src_w + off_x`` and
    ``y * new_h / src_h + off_y`` (stretch, fit with its padding offset, none with ``max_side``).
    A box is first clipped to the image (``[0, src_w] x [0, src_h]``), so it ends inside the part
    of the canvas the image covers (``[0, out_w] x [0, out_h]``, and in fit mode never in the padding).
    Boxes left with no area (in float32) are dropped; :attr:`BoxResize.keep` says which, so the
    caller drops their labels too.
    """
    arr = _as_boxes(boxes)
    clipped_arr = arr.copy()
    np.clip(clipped_arr[:, 0::2], 0.0, float(g.src_w), out=clipped_arr[:, 0::2])
    np.clip(clipped_arr[:, 1::2], 0.0, float(g.src_h), out=clipped_arr[:, 1::2])
    clipped = (clipped_arr != arr).any(axis=1)
    out = np.empty_like(clipped_arr)
    # Multiply before dividing: the image's far edge (x = src_w) lands exactly on new_w.
    out[:, 0::2] = clipped_arr[:, 0::2] * g.new_w / g.src_w + g.off_x
    out[:, 1::2] = clipped_arr[:, 1::2] * g.new_h / g.src_h + g.off_y
    np.clip(out[:, 0::2], 0.0, float(g.out_w), out=out[:, 0::2])
    np.clip(out[:, 1::2], 0.0, float(g.out_h), out=out[:, 1::2])
    stored = out.astype(np.float32)
    keep = (stored[:, 2] > stored[:, 0]) & (stored[:, 3] > stored[:, 1])
    return BoxResize(np.ascontiguousarray(stored[keep]).reshape(-1, 4), keep, clipped)


def _nearest_rows(src: int, dst: int) -> np.ndarray:
    """For each of ``dst`` output pixels, the source pixel under its centre: floor((i + 0.5) * src / dst)."""
    return ((2 * np.arange(dst, dtype=np.int64) + 1) * src) // (2 * dst)


def resize_mask(mask: np.ndarray, g: Geometry, ignore: int, orientation: int = 1) -> np.ndarray:
    """A label image (pixel = class id) resized and padded as :func:`resize_image` does the image.

    Parameters
    ----------
    mask : numpy.ndarray
        H x W (or H x W x 1) ``uint8`` or ``uint16``; upright, or in the file's raw frame when
        ``orientation`` is given.
    g : Geometry
        The image's geometry (``src_h x src_w`` is the upright size).
    ignore : int
        The value of the padding pixels fit mode adds (no class: a loss ignores them).
    orientation : int
        The EXIF orientation to apply first (:func:`apply_orientation`), for a mask in the raw frame.

    Returns
    -------
    numpy.ndarray
        ``out_h x out_w``, of the mask's dtype. Nearest neighbour: each stored pixel takes the class id
        of the source pixel under its centre, so no value appears that the mask did not hold (class ids
        are never interpolated), and the pixels of a region of the stored image come from that region.
    """
    if mask.ndim == 3 and mask.shape[2] == 1:
        mask = mask[:, :, 0]
    if mask.ndim != 2:
        raise ValueError(f"a mask is H x W; got shape {mask.shape}")
    if mask.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"a mask is uint8 or uint16; got {mask.dtype}")
    if not 0 <= ignore <= np.iinfo(mask.dtype).max:
        raise ValueError(f"ignore value {ignore} does not fit a {mask.dtype} mask")
    upright = apply_orientation(mask, orientation)
    if upright.shape != (g.src_h, g.src_w):
        raise ValueError(f"mask is {upright.shape[1]}x{upright.shape[0]} upright, geometry expects {g.src_w}x{g.src_h}")
    resized = upright[_nearest_rows(g.src_h, g.new_h)][:, _nearest_rows(g.src_w, g.new_w)]
    if (g.out_h, g.out_w) == (g.new_h, g.new_w):
        return np.ascontiguousarray(resized)
    canvas = np.full((g.out_h, g.out_w), ignore, dtype=mask.dtype)
    canvas[g.off_y : g.off_y + g.new_h, g.off_x : g.off_x + g.new_w] = resized
    return canvas


_SHIFT = 8  # fillPoly's fixed-point fraction bits: vertices at 1/256 pixel
_MARGIN = 4  # pixels drawn around the mask, where fillPoly's clamped spans land
_FAR = 1 << 20  # polygon coordinates beyond this overflow fillPoly's fixed point


def _inside(px: np.ndarray, py: np.ndarray, poly: np.ndarray) -> np.ndarray:
    """Even-odd test of points against one polygon (the half-open crossing rule on edges)."""
    inside = np.zeros(px.shape, dtype=bool)
    x1, y1 = poly[:, 0], poly[:, 1]
    x2, y2 = np.roll(x1, -1), np.roll(y1, -1)
    for ax, ay, bx, by in zip(x1, y1, x2, y2, strict=True):
        if ay == by:
            continue
        spans = (ay > py) != (by > py)
        cross = ax + (py - ay) * (bx - ax) / (by - ay)
        inside ^= spans & (px < cross)
    return inside


def polygons_to_mask(
    polygons: Sequence[Sequence[float]], h: int, w: int, value: int = 1, dtype: Any = None
) -> np.ndarray:
    """Rasterise a COCO polygon segmentation (``[[x, y, x, y, ...], ...]``, pixel-corner coordinates).

    Rule: a pixel is set when its centre ``(j + 0.5, i + 0.5)`` lies inside one of the polygons
    (even-odd rule within a polygon, union across them), so a square with integer corners
    ``[x0, x1] x [y0, y1]`` sets exactly its ``(x1 - x0) * (y1 - y0)`` pixels, as COCO measures
    areas. ``cv2.fillPoly`` fills each polygon (vertices at 1/256 pixel); it rounds near the
    boundary (pixels the boundary touches, vertex rows), so every pixel within two pixels of the
    boundary (a ``cv2.polylines`` band) is then decided by an exact test of its centre.

    Parameters
    ----------
    polygons : sequence of sequences of float
        Each a flat list of at least 3 points.
    h, w : int
        Size of the mask (the frame the coordinates are in).
    value : int
        Written into the covered pixels; 0 elsewhere.
    dtype : numpy dtype, optional
        ``uint8`` when ``value`` fits it, else ``uint16``, unless given.
    """
    out_dtype = np.dtype(dtype) if dtype is not None else np.dtype(np.uint8 if value <= 255 else np.uint16)
    covered = np.zeros((h, w), dtype=bool)
    for poly in polygons:
        pts = np.asarray(poly, dtype=np.float64)
        if pts.ndim != 1 or pts.size % 2 or pts.size < 6:
            raise ValueError(f"a polygon is a flat list of at least 3 x, y points; got {pts.size} numbers")
        if not np.isfinite(pts).all() or np.abs(pts).max() > _FAR:
            raise ValueError(f"a polygon holds a coordinate that is not a number within +-{_FAR:,} pixels")
        pts = pts.reshape(-1, 2)
        # fillPoly puts pixel centres on integers (corner coordinates move by half a pixel) and clamps
        # spans that leave the canvas onto its edge: it draws on a canvas a margin wider, then cropped.
        fixed = np.round((pts - 0.5 + _MARGIN) * (1 << _SHIFT)).astype(np.int32)
        drawn = np.zeros((h + 2 * _MARGIN, w + 2 * _MARGIN), dtype=np.uint8)
        cv2.fillPoly(drawn, [fixed], 1, lineType=cv2.LINE_8, shift=_SHIFT)
        near = np.zeros_like(drawn)
        cv2.polylines(near, [fixed], True, 1, thickness=5, lineType=cv2.LINE_8, shift=_SHIFT)
        rows, cols = np.nonzero(near)
        drawn[rows, cols] = _inside(cols - _MARGIN + 0.5, rows - _MARGIN + 0.5, pts)
        covered |= drawn[_MARGIN : _MARGIN + h, _MARGIN : _MARGIN + w].astype(bool)
    out = np.zeros((h, w), dtype=out_dtype)
    out[covered] = value
    return out


def rle_to_mask(rle: Mapping[str, Any], h: int, w: int) -> np.ndarray:
    """Decode a COCO RLE segmentation (``{"size": [h, w], "counts": ...}``) with pycocotools.

    ``counts`` is COCO's compressed string or the uncompressed list of run lengths (column-major,
    starting with a run of zeros). Returns an ``h x w`` ``uint8`` mask of 0 and 1. pycocotools is
    optional (``pip install 'dlpack-datasets[coco]'``): it is imported on first use.
    """
    try:
        from pycocotools import mask as coco_mask
    except ImportError as exc:
        raise MissingExtraError("pycocotools", "coco", "decoding COCO RLE segmentations") from exc
    size = rle.get("size")
    counts = rle.get("counts")
    if not isinstance(size, (list, tuple)) or len(size) != 2 or counts is None:
        raise ValueError('an RLE segmentation is {"size": [h, w], "counts": ...}')
    if (int(size[0]), int(size[1])) != (h, w):
        raise ValueError(f"RLE segmentation is {size[1]}x{size[0]}, its image is {w}x{h}")
    if isinstance(counts, list):
        runs = [int(c) for c in counts]
        if any(c < 0 for c in runs) or sum(runs) != h * w:
            raise ValueError(
                f"RLE runs must be >= 0 and add up to {h} x {w} = {h * w} pixels; they add up to {sum(runs)}"
            )
        coded = coco_mask.frPyObjects({"size": [h, w], "counts": runs}, h, w)
    elif isinstance(counts, (str, bytes)):
        coded = {"size": [h, w], "counts": counts.encode("ascii", "replace") if isinstance(counts, str) else counts}
    else:
        raise ValueError("RLE counts must be a string or a list of run lengths")
    try:
        decoded = np.asarray(coco_mask.decode(coded))
        area = int(coco_mask.area(coded))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"RLE counts cannot be decoded ({exc})") from None
    # pycocotools leaves the pixels after runs that end early unset: such a mask is not 0/1, or does
    # not hold the area its runs give.
    if decoded.shape[:2] != (h, w) or decoded.max(initial=0) > 1 or int(decoded.sum()) != area:
        raise ValueError(f"RLE counts do not describe a {w}x{h} mask")
    return np.ascontiguousarray(decoded, dtype=np.uint8).reshape(h, w)
