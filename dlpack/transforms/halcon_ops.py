"""HALCON's ``augment_dl_samples`` vocabulary: its parameters as registered operations.

A HALCON-style config is an object of ``augment_dl_samples`` parameter names and values, e.g.
``{"augmentation_percentage": 100, "mirror": "rc", "rotate": 90, "brightness_variation": 20}``.
HALCON augments each sample with probability ``augmentation_percentage`` / 100 and then applies
exactly one operation, drawn uniformly from the enabled ones; :func:`pipeline_from_halcon` builds
that as one :class:`~dlpack.transforms.base.OneOf` of equal weights. Each operation's registry
name is its HALCON parameter name, so the manifest's operation list and every variant's record
read in HALCON's words (docs/augment.md, "HALCON vocabulary", says what each one does and where
dlpack chose a meaning HALCON does not publish).

The pure functions here are the ones HALCON's vocabulary needs and the geometric module has not:
an additive brightness offset and illumination spot, contrast about the mean, saturation, the
inner rectangle of a rotated image and a crop zoomed back to the input size.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import cv2
import numpy as np

from ..errors import ConfigError
from .base import (
    DEFAULT_MIN_AREA,
    DEFAULT_MIN_VISIBILITY,
    OneOf,
    Pipeline,
    Targets,
    Transform,
    check_number,
    check_probability,
    register,
)
from .geometric import (
    affine_matrix,
    crop_matrix,
    flip_matrix,
    hflip,
    rot90,
    rot90_matrix,
    vflip,
    warp_boxes,
    warp_image,
    warp_mask,
)

__all__ = [
    "Mirror",
    "Rotate",
    "RotateRange",
    "BrightnessVariation",
    "BrightnessVariationSpot",
    "ContrastVariation",
    "SaturationVariation",
    "CropPercentage",
    "CropPixel",
    "HALCON_PARAMETERS",
    "CROP_PARAMETERS",
    "pipeline_from_halcon",
    "add_brightness",
    "brightness_spot",
    "scale_contrast",
    "scale_saturation",
    "inner_rectangle",
    "crop_zoom",
]

#: HALCON's brightness values are gray values of 8-bit images; a 16-bit image spans 257 times more.
_DEPTH_SCALE = {np.dtype(np.uint8): 1.0, np.dtype(np.uint16): 257.0}


# --- pure functions -------------------------------------------------------------------------------


def _depth_scale(img: np.ndarray) -> float:
    scale = _DEPTH_SCALE.get(img.dtype)
    if scale is None:
        raise ValueError(f"augmentation works on uint8 and uint16 images, got {img.dtype}")
    return scale


def _saturate(values: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """Float pixel values rounded and clipped into ``dtype`` (uint8 or uint16)."""
    top = float(np.iinfo(dtype).max)
    out: np.ndarray = np.clip(np.rint(values), 0.0, top).astype(dtype)
    return out


def add_brightness(img: np.ndarray, offset: float) -> np.ndarray:
    """``img`` plus ``offset`` 8-bit gray values (times 257 on a 16-bit image), saturated."""
    if offset == 0:
        return np.array(img, copy=True)
    return _saturate(img.astype(np.float32) + np.float32(offset * _depth_scale(img)), img.dtype)


def brightness_spot(img: np.ndarray, amplitude: float, size: float, x: float, y: float) -> np.ndarray:
    """``img`` with a Gaussian illumination spot added (``amplitude`` < 0: a shadow), saturated.

    The spot peaks with ``amplitude`` 8-bit gray values (times 257 on a 16-bit image) at the
    corner-based point ``(x, y)``; its standard deviation is ``size / (2 pi)``, so it falls below
    1 % of its peak at the edge of a ``size x size`` square around that point.
    """
    h, w = img.shape[:2]
    sigma = max(float(size), 1e-6) / (2.0 * math.pi)
    gx = np.exp(-(((np.arange(w) + 0.5 - x) / sigma) ** 2) / 2.0).astype(np.float32)
    gy = np.exp(-(((np.arange(h) + 0.5 - y) / sigma) ** 2) / 2.0).astype(np.float32)
    spot = np.float32(amplitude * _depth_scale(img)) * np.outer(gy, gx)
    return _saturate(img.astype(np.float32) + spot[:, :, None], img.dtype)


def scale_contrast(img: np.ndarray, factor: float) -> np.ndarray:
    """Distances from the image's mean gray value (over all pixels and channels) times ``factor``."""
    mean = np.float32(img.mean())
    return _saturate((img.astype(np.float32) - mean) * np.float32(factor) + mean, img.dtype)


def scale_saturation(img: np.ndarray, factor: float) -> np.ndarray:
    """HSV saturation times ``factor`` (clipped at 1), hue and value kept; gray images unchanged.

    Within one hue, a channel ``c`` of an RGB pixel is ``V - S * V * g(hue)`` (``V`` the largest
    channel), so scaling ``S`` moves every channel's distance from ``V`` by the same factor: done
    so directly, with no colour-space round trip (and so on 16-bit images too).
    """
    if img.shape[2] != 3:
        return np.array(img, copy=True)
    r, g, b = (c.astype(np.float32) for c in cv2.split(img))  # contiguous planes: fast arithmetic
    v = np.maximum(np.maximum(r, g), b)
    k: np.ndarray | np.float32 = np.float32(factor)
    if factor > 1:
        # The factor that takes the saturation to 1 (the darkest channel to 0) is the most it can grow;
        # a gray pixel (no spread) is unchanged by any factor.
        spread = v - np.minimum(np.minimum(r, g), b)
        k = np.minimum(k, v / np.maximum(spread, np.float32(1e-6)))
    planes = [_saturate(v - k * (v - c), img.dtype) for c in (r, g, b)]
    return np.asarray(cv2.merge(planes))


def inner_rectangle(w: int, h: int, angle: float) -> tuple[float, float]:
    """Width and height of the largest axis-aligned rectangle centred inside a ``w x h`` image
    turned by ``angle`` degrees, and inside the ``w x h`` canvas too."""
    a = math.radians(angle)
    s, c = abs(math.sin(a)), abs(math.cos(a))
    long, short = max(w, h), min(w, h)
    if short <= 2.0 * s * c * long or abs(s - c) < 1e-10:
        # Two corners of the rectangle touch the long sides: it is limited by the short side.
        half = 0.5 * short
        rw, rh = (half / s, half / c) if w >= h else (half / c, half / s)
    else:
        cos2 = c * c - s * s
        rw, rh = (w * c - h * s) / cos2, (h * c - w * s) / cos2
    return min(rw, float(w)), min(rh, float(h))


def crop_zoom(img: np.ndarray, x: int, y: int, cw: int, ch: int, out_w: int, out_h: int) -> np.ndarray:
    """The ``cw x ch`` window at ``(x, y)`` resized (bilinear) to ``out_w x out_h``.

    Slicing then resizing repeats the window's edge pixels where bilinear sampling reaches past
    them, where a warp onto a canvas would blend in a fill value.
    """
    part = img[y : y + ch, x : x + cw]
    if (cw, ch) == (out_w, out_h):
        return np.ascontiguousarray(part)
    out = np.asarray(cv2.resize(part, (out_w, out_h), interpolation=cv2.INTER_LINEAR))
    return out[:, :, None] if out.ndim == 2 and img.ndim == 3 else out


# --- operations -----------------------------------------------------------------------------------


def _whole(value: Any, where: str, lo: int, hi: int | None = None) -> int:
    """A whole number in ``[lo, hi]`` (an int, or a float with no fraction), else a ConfigError."""
    number = check_number(value, where, lo, hi)
    if number != int(number):
        raise ConfigError(f"{where} must be a whole number, got {value!r}")
    return int(number)


def _moved(t: Targets, m: np.ndarray, image: np.ndarray, mask: np.ndarray | None) -> Targets:
    """``t`` with its pixels replaced and its boxes moved by ``m`` (onto the new image's canvas)."""
    h, w = image.shape[:2]
    if t.boxes is None:
        return t.replace(image=image, mask=mask)
    boxes, visible = warp_boxes(t.boxes, m, w, h)
    return t.moved(boxes, visible, image=image, mask=mask)


@register
@dataclass(frozen=True)
class Mirror(Transform):
    """HALCON ``mirror``: ``'r'`` mirrors the rows (top-bottom), ``'c'`` the columns (left-right).

    With more than one axis allowed, each is chosen with probability 1/n, drawn again until at
    least one is: for ``'rc'``, rows, columns or both, a third each.
    """

    name: ClassVar[str] = "mirror"
    geometric: ClassVar[bool] = True
    axes: str = "rc"
    p: float = 1.0

    def __post_init__(self) -> None:
        if self.axes not in ("r", "c", "rc"):
            raise ConfigError(f"mirror must be 'off', 'r', 'c' or 'rc', got {self.axes!r}")
        check_probability(self.p, "mirror.p")

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``{"axes": "r" | "c" | "rc"}``: the axes mirrored this time."""
        chosen = ""
        while not chosen:
            chosen = "".join(a for a in self.axes if rng.random() < 1.0 / len(self.axes))
        return {"axes": chosen}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Exact: pixels, mask and boxes mirrored without resampling."""
        axes = str(params["axes"])
        h, w = t.shape
        image, mask = t.image, t.mask
        if "c" in axes:
            image, mask = hflip(image), (hflip(mask) if mask is not None else None)
        if "r" in axes:
            image, mask = vflip(image), (vflip(mask) if mask is not None else None)
        return _moved(t, flip_matrix(w, h, "c" in axes, "r" in axes), image, mask)


def _quarter_turns(t: Targets, angle: int) -> Targets:
    """``t`` turned counter-clockwise by ``angle`` (a multiple of 90) degrees, exactly."""
    h, w = t.shape
    k = (angle // 90) % 4
    mask = rot90(t.mask, k) if t.mask is not None else None
    return _moved(t, rot90_matrix(w, h, k), rot90(t.image, k), mask)


@register
@dataclass(frozen=True)
class Rotate(Transform):
    """HALCON ``rotate``: a turn by a random multiple of ``step`` (90 or 180) in (0, 360) degrees,
    counter-clockwise as HALCON's ``rotate_image``. Turns of 90 and 270 would change the canvas of
    a non-square image, so such an image is only ever turned by 180."""

    name: ClassVar[str] = "rotate"
    geometric: ClassVar[bool] = True
    step: int = 90
    p: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or self.step not in (90, 180):
            raise ConfigError(f"rotate must be 0, 90 or 180, got {self.step!r}")
        check_probability(self.p, "rotate.p")

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``{"angle": degrees}``, a multiple of ``step``; only 180 for a non-square image."""
        h, w = t.shape
        angles = [a for a in range(int(self.step), 360, int(self.step)) if w == h or a == 180]
        return {"angle": angles[int(rng.integers(len(angles)))]}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Exact quarter turns."""
        return _quarter_turns(t, int(params["angle"]))


@register
@dataclass(frozen=True)
class RotateRange(Transform):
    """HALCON ``rotate_range``: a turn by a whole number of degrees in ``[-max_angle, max_angle]``
    (never 0); the largest axis-aligned rectangle inside the turned image is cut out and zoomed
    back to the input size, so no corner is left unfilled."""

    name: ClassVar[str] = "rotate_range"
    geometric: ClassVar[bool] = True
    max_angle: int = 10
    p: float = 1.0

    def __post_init__(self) -> None:
        _whole(self.max_angle, "rotate_range", 1, 180)
        check_probability(self.p, "rotate_range.p")

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``{"angle": degrees}``, a whole number, never 0."""
        angle = int(rng.integers(1, int(self.max_angle) + 1))
        return {"angle": -angle if rng.random() < 0.5 else angle}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Multiples of 180 (or of 90 on a square image) turn exactly; other angles are a bilinear warp of
        the inner rectangle, the mask by nearest neighbour."""
        angle = int(params["angle"])
        h, w = t.shape
        if angle % 180 == 0 or (angle % 90 == 0 and w == h):
            return _quarter_turns(t, angle)
        rw, rh = inner_rectangle(w, h, angle)
        # One pixel less each way keeps bilinear sampling off the turned image's edge (no fill).
        rw, rh = max(rw - 1.0, 1.0), max(rh - 1.0, 1.0)
        m = crop_matrix((w - rw) / 2.0, (h - rh) / 2.0, rw, rh, w, h) @ affine_matrix(w, h, angle=angle)
        image = warp_image(t.image, m, w, h, "linear")
        mask = warp_mask(t.mask, m, w, h, t.fill_mask) if t.mask is not None else None
        return _moved(t, m, image, mask)


class _Crop(Transform):
    """A window of the image zoomed back to the input size; labels follow (HALCON allows these
    for classification only: :func:`pipeline_from_halcon` refuses them for labelled stores)."""

    geometric: ClassVar[bool] = True

    def window(self, w: int, h: int) -> tuple[int, int]:
        """The window's width and height in pixels for a ``w x h`` image."""
        raise NotImplementedError

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        h, w = t.shape
        cw, ch = self.window(w, h)
        return {"x": int(rng.integers(0, w - cw + 1)), "y": int(rng.integers(0, h - ch + 1)), "width": cw, "height": ch}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        h, w = t.shape
        x, y, cw, ch = (int(params[k]) for k in ("x", "y", "width", "height"))
        m = crop_matrix(x, y, cw, ch, w, h)
        image = crop_zoom(t.image, x, y, cw, ch, w, h)
        mask = warp_mask(t.mask, m, w, h, t.fill_mask) if t.mask is not None else None
        return _moved(t, m, image, mask)


@register
@dataclass(frozen=True)
class CropPercentage(_Crop):
    """HALCON ``crop_percentage``: a window of ``percentage`` % of the width and of the height, at a
    random position, zoomed back to the input size."""

    name: ClassVar[str] = "crop_percentage"
    percentage: float = 90.0
    p: float = 1.0

    def __post_init__(self) -> None:
        check_number(self.percentage, "crop_percentage", 1, 100)
        check_probability(self.p, "crop_percentage.p")

    def window(self, w: int, h: int) -> tuple[int, int]:
        """``percentage`` % of each side, rounded, at least one pixel."""
        share = float(self.percentage) / 100.0
        return max(1, min(w, round(share * w))), max(1, min(h, round(share * h)))


@register
@dataclass(frozen=True)
class CropPixel(_Crop):
    """HALCON ``crop_pixel``: a ``pixels x pixels`` window (cut to the image where it is smaller) at
    a random position, zoomed back to the input size."""

    name: ClassVar[str] = "crop_pixel"
    pixels: int = 224
    p: float = 1.0

    def __post_init__(self) -> None:
        _whole(self.pixels, "crop_pixel", 1)
        check_probability(self.p, "crop_pixel.p")

    def window(self, w: int, h: int) -> tuple[int, int]:
        """``pixels`` on each side, cut to the image."""
        return min(int(self.pixels), w), min(int(self.pixels), h)


def _check_variation(op: str, value: Any, hi: float) -> None:
    check_number(value, op, 0, hi)
    if value == 0:
        raise ConfigError(f"{op} must be above 0 (0 turns it off in a config), got {value!r}")


@register
@dataclass(frozen=True)
class BrightnessVariation(Transform):
    """HALCON ``brightness_variation``: a uniform offset in ``[-value, value]`` gray values added
    to every pixel (8-bit units: times 257 on a 16-bit image)."""

    name: ClassVar[str] = "brightness_variation"
    value: float = 20.0
    p: float = 1.0

    def __post_init__(self) -> None:
        _check_variation(self.name, self.value, 255)
        check_probability(self.p, f"{self.name}.p")

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``{"offset": gray values}`` in 8-bit units."""
        return {"offset": float(rng.uniform(-self.value, self.value))}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Add ``offset`` (times 257 on a 16-bit image), saturated."""
        return t.replace(image=add_brightness(t.image, float(params["offset"])))


@register
@dataclass(frozen=True)
class BrightnessVariationSpot(Transform):
    """HALCON ``brightness_variation_spot``: a Gaussian illumination spot of a random size 0.5 to
    1 times the image width, at a random position, peaking at a uniform ``[-value, value]`` gray
    values (a negative peak darkens; 8-bit units: times 257 on a 16-bit image)."""

    name: ClassVar[str] = "brightness_variation_spot"
    value: float = 20.0
    p: float = 1.0

    def __post_init__(self) -> None:
        _check_variation(self.name, self.value, 255)
        check_probability(self.p, f"{self.name}.p")

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """The spot's peak ``amplitude`` (8-bit gray values), its ``size`` and centre ``x``, ``y`` in pixels."""
        h, w = t.shape
        return {
            "amplitude": float(rng.uniform(-self.value, self.value)),
            "size": float(w * (0.5 + 0.5 * rng.random())),
            "x": float(rng.random() * w),
            "y": float(rng.random() * h),
        }

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Add the spot, saturated; labels stay."""
        spot = brightness_spot(
            t.image, float(params["amplitude"]), float(params["size"]), float(params["x"]), float(params["y"])
        )
        return t.replace(image=spot)


@register
@dataclass(frozen=True)
class ContrastVariation(Transform):
    """``contrast_variation`` (HALCON publishes no formula): the distances of the pixels from the
    image's mean gray value times a uniform factor in ``[1 - value, 1 + value]``, ``value`` 0..1."""

    name: ClassVar[str] = "contrast_variation"
    value: float = 0.2
    p: float = 1.0

    def __post_init__(self) -> None:
        _check_variation(self.name, self.value, 1)
        check_probability(self.p, f"{self.name}.p")

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``{"factor": f}``, uniform in ``[1 - value, 1 + value]``."""
        return {"factor": float(rng.uniform(1.0 - self.value, 1.0 + self.value))}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Scale the distances from the mean gray value by ``factor``, saturated."""
        return t.replace(image=scale_contrast(t.image, float(params["factor"])))


@register
@dataclass(frozen=True)
class SaturationVariation(Transform):
    """``saturation_variation`` (HALCON publishes no formula): the HSV saturation of an RGB image
    times a uniform factor in ``[1 - value, 1 + value]``, ``value`` 0..1; a gray image is unchanged."""

    name: ClassVar[str] = "saturation_variation"
    value: float = 0.2
    p: float = 1.0

    def __post_init__(self) -> None:
        _check_variation(self.name, self.value, 1)
        check_probability(self.p, f"{self.name}.p")

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``{"factor": f}``, uniform in ``[1 - value, 1 + value]``."""
        return {"factor": float(rng.uniform(1.0 - self.value, 1.0 + self.value))}

    def changes(self, t: Targets) -> bool:
        """Only an RGB image has saturation."""
        return t.image.ndim == 3 and t.image.shape[2] == 3  # a gray image has no saturation

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Scale the HSV saturation by ``factor``; hue and value stay."""
        return t.replace(image=scale_saturation(t.image, float(params["factor"])))


# --- the config object ----------------------------------------------------------------------------


def _off(value: Any) -> bool:
    return isinstance(value, str) and value == "off"


def _mirror(value: Any, where: str) -> Transform | None:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be 'off', 'r', 'c' or 'rc', got {value!r}")
    if value == "off":
        return None
    return Mirror("rc" if value == "cr" else value)


def _rotate(value: Any, where: str) -> Transform | None:
    step = check_number(value, where)
    if step not in (0, 90, 180):
        raise ConfigError(f"{where} must be 0, 90 or 180, got {value!r}")
    return Rotate(int(step)) if step else None


def _rotate_range(value: Any, where: str) -> Transform | None:
    angle = _whole(value, where, 0, 180)
    return RotateRange(angle) if angle else None


def _variation(cls: type[Transform], hi: float) -> Callable[[Any, str], Transform | None]:
    def parse(value: Any, where: str) -> Transform | None:
        v = check_number(value, where, 0, hi)
        return cls(value=v) if v else None  # type: ignore[call-arg]

    return parse


def _crop_percentage(value: Any, where: str) -> Transform | None:
    return None if _off(value) else CropPercentage(check_number(value, where, 1, 100))


def _crop_pixel(value: Any, where: str) -> Transform | None:
    return None if _off(value) else CropPixel(_whole(value, where, 1))


#: HALCON parameter -> its reader (value, where) -> the operation, or None where the value turns it off.
_OPERATIONS: dict[str, Callable[[Any, str], Transform | None]] = {
    "mirror": _mirror,
    "rotate": _rotate,
    "rotate_range": _rotate_range,
    "brightness_variation": _variation(BrightnessVariation, 255),
    "brightness_variation_spot": _variation(BrightnessVariationSpot, 255),
    "contrast_variation": _variation(ContrastVariation, 1),
    "saturation_variation": _variation(SaturationVariation, 1),
    "crop_percentage": _crop_percentage,
    "crop_pixel": _crop_pixel,
}
#: HALCON allows these for classification models only; dlpack, unless a config opts in.
CROP_PARAMETERS = ("crop_percentage", "crop_pixel", "rotate_range")
#: Settings of a HALCON-style config that are not operations: HALCON's own, then dlpack's.
_SETTINGS = (
    "augmentation_percentage",
    # For HALCON's oriented (rectangle2) boxes only; dlpack's boxes are axis-aligned.
    "ignore_direction",
    "class_ids_no_orientation",
    "allow_crop_with_labels",
    "min_area",
    "min_visibility",
)
#: Every key a HALCON-style config may have.
HALCON_PARAMETERS = (*_OPERATIONS, *_SETTINGS)
#: Tasks whose stores have no labels that move: HALCON's classification, and unlabelled stores.
_UNMOVING_TASKS = ("classification", "none")


def pipeline_from_halcon(doc: Mapping[str, Any], where: str, *, task: str | None = None) -> Pipeline:
    """The pipeline a HALCON-style config describes (``where`` names the file in error messages).

    ``augmentation_percentage`` (default 50, as HALCON's) becomes the probability of one
    :class:`OneOf` over the enabled operations with equal weights. ``crop_percentage``,
    ``crop_pixel`` and ``rotate_range`` are refused for a store whose ``task`` is not
    classification or none (None: not known, not checked) unless ``allow_crop_with_labels`` is
    true; then boxes and masks follow them. ``min_area`` and ``min_visibility`` drop boxes as in
    every pipeline. Unknown names, wrong types and values out of range are ConfigErrors naming the
    file and the parameter.
    """
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where}: a HALCON-style config is an object of parameter names, got {type(doc).__name__}")
    for key in doc:
        if key not in HALCON_PARAMETERS:
            raise ConfigError(_unknown(key, doc, where))
    percentage = check_number(doc.get("augmentation_percentage", 50), f"{where}: augmentation_percentage", 0, 100)
    allow = doc.get("allow_crop_with_labels", False)
    if not isinstance(allow, bool):
        raise ConfigError(f"{where}: allow_crop_with_labels must be true or false, got {allow!r}")
    ignore = doc.get("ignore_direction", False)
    if not isinstance(ignore, bool) and ignore not in ("true", "false"):
        raise ConfigError(f"{where}: ignore_direction must be true or false, got {ignore!r}")
    ids = doc.get("class_ids_no_orientation", [])
    if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
        raise ConfigError(f"{where}: class_ids_no_orientation must be a list of class ids, got {ids!r}")
    ops: list[Transform] = []
    for key, parse in _OPERATIONS.items():
        if key not in doc:
            continue
        try:
            op = parse(doc[key], key)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if op is None:
            continue
        if key in CROP_PARAMETERS and task is not None and task not in _UNMOVING_TASKS and not allow:
            raise ConfigError(
                f"{where}: {key} is for classification only, as in HALCON, and this store's task is {task}; "
                'set "allow_crop_with_labels": true to apply it with its boxes and masks following'
            )
        ops.append(op)
    if not ops:
        raise ConfigError(
            f"{where}: the config turns on no operation, so every variant would equal its original; "
            f"set one of {', '.join(_OPERATIONS)}"
        )
    if percentage == 0:
        raise ConfigError(f"{where}: augmentation_percentage is 0, so every variant would equal its original")
    return Pipeline(
        (OneOf(tuple(ops), p=percentage / 100.0),),
        check_number(doc.get("min_area", DEFAULT_MIN_AREA), f"{where}: min_area", 0),
        check_probability(doc.get("min_visibility", DEFAULT_MIN_VISIBILITY), f"{where}: min_visibility"),
        kind="halcon",
    )


def _unknown(key: Any, doc: Mapping[str, Any], where: str) -> str:
    close = difflib.get_close_matches(str(key), HALCON_PARAMETERS, n=3)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    albu = ""
    if {"__version__", "transform"} & set(doc):
        albu = "; an albumentations config needs both a '__version__' and a 'transform' key"
    return f"{where}: unknown parameter {key!r}{hint}; a HALCON-style config reads {', '.join(HALCON_PARAMETERS)}{albu}"
