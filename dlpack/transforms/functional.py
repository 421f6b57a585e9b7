"""Pure NumPy/OpenCV pixel functions: no I/O, no randomness, no state.

Coordinates are corner-based (COCO style): a point ``(x, y)`` of the original image lands at
``(x * scale_x + offset_x, y * scale_y + offset_y)`` in the stored image.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

__all__ = [
    "Geometry",
    "plan_geometry",
    "resize_image",
    "apply_orientation",
    "convert_channels",
    "convert_depth",
    "UpscaleError",
]


class UpscaleError(ValueError):
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
        return self.new_h / self.src_h

    @property
    def scale_x(self) -> float:
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
