"""Pure pixel-value functions for augmentation: brightness/contrast, HSV shifts, noise, blur, dropout holes.

Each takes an H x W x C image (C 1 or 3, ``uint8`` or ``uint16``) and returns a new one of the same
shape and dtype; results saturate at the dtype's range (never wrap). No function draws random numbers
itself: noise comes from a seed the caller passes, so a recorded ``(params, seed)`` reproduces it.
Amounts given "in 8-bit units" (hue, saturation and value shifts) mean the same visible change on a
16-bit image, where they are scaled by 65535 / 255.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

__all__ = [
    "brightness_contrast",
    "shift_hsv",
    "gauss_noise",
    "gaussian_blur",
    "blur_kernel_size",
    "fill_holes",
    "max_value",
]


def max_value(dtype: Any) -> int:
    """The largest value of an image dtype (255 or 65535)."""
    return int(np.iinfo(dtype).max)


def _check_image(img: np.ndarray) -> None:
    if img.ndim != 3 or img.shape[2] not in (1, 3) or img.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"an image is H x W x 1 or 3, uint8 or uint16; got shape {img.shape}, {img.dtype}")


def _copy(a: np.ndarray) -> np.ndarray:
    out: np.ndarray = a.copy()
    return out


def _saturate(values: np.ndarray, dtype: np.dtype[np.generic]) -> np.ndarray:
    """Round to nearest and clip to ``dtype``'s range."""
    out: np.ndarray = np.clip(np.rint(values), 0, max_value(dtype)).astype(dtype)
    return out


def brightness_contrast(img: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """``img * alpha + beta`` (``beta`` in the image's own units), rounded and saturated."""
    _check_image(img)
    if img.dtype == np.uint8:  # a 256-entry table: exact and fast
        lut = _saturate(np.arange(256, dtype=np.float64) * alpha + beta, img.dtype)
        out: np.ndarray = lut[img]
        return out
    return _saturate(img.astype(np.float64) * alpha + beta, img.dtype)


def shift_hsv(img: np.ndarray, hue: float, sat: float, val: float) -> np.ndarray:
    """Shift hue, saturation and value, all in 8-bit units (OpenCV's 8-bit HSV: hue 0..179, a step
    of 2 degrees, wrapping around; saturation and value 0..255, saturating).

    Pixels without saturation (grays) stay gray. A gray image (C = 1) has no hue or saturation: only
    ``val`` is applied, as an offset on the gray value.
    """
    _check_image(img)
    top = max_value(img.dtype)
    scale = top / 255.0
    if img.shape[2] == 1:
        if val == 0:
            return _copy(img)
        return _saturate(img.astype(np.float64) + val * scale, img.dtype)
    if hue == 0 and sat == 0 and val == 0:
        return _copy(img)
    if img.dtype == np.uint8:
        h, s, v = cv2.split(cv2.cvtColor(img, cv2.COLOR_RGB2HSV))
        levels = np.arange(256, dtype=np.float64)
        h = np.floor(np.mod(levels + hue, 180.0)).astype(np.uint8)[h]
        gray = s == 0
        s = _saturate(levels + sat, img.dtype)[s]
        s[gray] = 0
        v = _saturate(levels + val, img.dtype)[v]
        return np.ascontiguousarray(np.asarray(cv2.cvtColor(cv2.merge((h, s, v)), cv2.COLOR_HSV2RGB)))
    # 16 bits: OpenCV's float HSV (hue in degrees 0..360, saturation and value 0..1).
    hsv = cv2.cvtColor((img.astype(np.float32) / np.float32(top)), cv2.COLOR_RGB2HSV)
    hf, sf, vf = cv2.split(hsv)
    hf = np.mod(hf + np.float32(2.0 * hue), np.float32(360.0))
    gray = sf == 0
    sf = np.clip(sf + np.float32(sat / 255.0), 0.0, 1.0)
    sf[gray] = 0.0
    vf = np.clip(vf + np.float32(val / 255.0), 0.0, 1.0)
    rgb = np.asarray(cv2.cvtColor(cv2.merge((hf, sf, vf)), cv2.COLOR_HSV2RGB))
    return _saturate(rgb.astype(np.float64) * top, img.dtype)


def gauss_noise(img: np.ndarray, std: float, mean: float, seed: int, per_channel: bool = True) -> np.ndarray:
    """Add Gaussian noise of ``std`` and ``mean`` (the image's own units) drawn from ``seed``;
    ``per_channel`` False adds the same noise to every channel."""
    _check_image(img)
    h, w, c = img.shape
    rng = np.random.default_rng(int(seed))
    noise = rng.normal(mean, std, (h, w, c if per_channel else 1))
    return _saturate(img.astype(np.float64) + noise, img.dtype)


def blur_kernel_size(sigma: float) -> int:
    """The odd kernel size used for a Gaussian of ``sigma`` when none is given: 2 * int(3.5 sigma) + 1."""
    return int(sigma * 3.5) * 2 + 1


def gaussian_blur(img: np.ndarray, ksize: int, sigma: float) -> np.ndarray:
    """Gaussian blur with an odd ``ksize`` x ``ksize`` kernel (0: :func:`blur_kernel_size` of ``sigma``)
    and ``sigma`` (0: OpenCV's default for the kernel size); edges mirrored without repeating the edge pixel."""
    _check_image(img)
    if ksize == 0:
        ksize = blur_kernel_size(sigma)
    if ksize % 2 == 0:
        ksize += 1
    if ksize <= 1:
        return _copy(img)
    out = np.asarray(
        cv2.GaussianBlur(img, (ksize, ksize), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_REFLECT_101)
    )
    if out.ndim == 2:  # OpenCV drops a channel axis of size 1
        out = out[:, :, None]
    return out


def fill_holes(a: np.ndarray, holes: Sequence[Sequence[int]], fill: float | Sequence[float] | np.ndarray) -> np.ndarray:
    """``a`` (image H x W x C, or mask H x W) with the rectangles ``[x0, y0, x1, y1]`` (pixels
    ``x0 <= x < x1``, ``y0 <= y < y1``, clipped to ``a``) set to ``fill``.

    ``fill`` is one number, one per channel, or an array of ``a``'s dtype the size of ``a`` whose
    pixels fill the holes (random fills); numbers saturate to the dtype.
    """
    out = _copy(a)
    h, w = a.shape[:2]
    top = max_value(a.dtype)
    source = fill if isinstance(fill, np.ndarray) and fill.shape == a.shape else None
    value = None if source is not None else np.clip(np.rint(np.asarray(fill, np.float64)), 0, top).astype(a.dtype)
    for x0, y0, x1, y1 in holes:
        xa, ya, xb, yb = max(0, int(x0)), max(0, int(y0)), min(w, int(x1)), min(h, int(y1))
        if xa >= xb or ya >= yb:
            continue
        out[ya:yb, xa:xb] = source[ya:yb, xa:xb] if source is not None else value
    return out
