"""The albumentations subset as dlpack operations, registered under albumentations' class names.

Each class is a frozen dataclass over the pure functions of :mod:`.geometric` and :mod:`.color`.
:meth:`from_dict` reads an entry of an albumentations ``to_dict`` document, in the key names of
both the 1.4 releases (``cval``, ``value``, ``var_limit``, ``max_holes``, ...) and of 2.0 (``fill``,
``std_range``, ``num_holes_range``, ...); :meth:`to_dict` writes the 2.0 names. A key albumentations
writes for a feature dlpack does not implement is accepted at its default value only; any other
value is a :class:`~dlpack.errors.ConfigError` naming the entry, the operation and the key, as is
a value of the wrong type or out of range. docs/augment.md ("albumentations operations") lists the
keys each operation reads and the few semantics dlpack fixes where albumentations leaves them open.

Geometric operations move boxes by their corners (clipped, with the visibility factor) and masks
by nearest neighbour, through the same matrix as the pixels; pixel operations never touch labels
(``CoarseDropout`` fills the mask's holes only when it names a ``fill_mask``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError
from . import color, geometric
from .base import Targets, Transform, check_probability, register

__all__ = [
    "HorizontalFlip",
    "VerticalFlip",
    "RandomRotate90",
    "Affine",
    "ShiftScaleRotate",
    "Rotate",
    "RandomCrop",
    "RandomResizedCrop",
    "RandomBrightnessContrast",
    "HueSaturationValue",
    "GaussNoise",
    "GaussianBlur",
    "Perspective",
    "CoarseDropout",
    "ALBUMENTATIONS_OPS",
    "release_defaults",
]

#: OpenCV interpolation flags (what albumentations writes) -> :data:`geometric.INTERPOLATIONS` names.
INTERPOLATION_NAMES = {0: "nearest", 1: "linear", 2: "cubic", 3: "area", 4: "lanczos"}
#: OpenCV border modes (what albumentations writes) -> :data:`geometric.BORDERS` names.
BORDER_NAMES = {0: "constant", 1: "replicate", 2: "reflect", 3: "wrap", 4: "reflect101"}

Span = tuple[float, float]
XYSpan = tuple[Span, Span]
Fill = float | tuple[float, ...]

_MISSING: Any = object()


def _shown(value: Any) -> str:
    """``value`` as the config file spells it (JSON), for messages."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        pass
    try:
        return repr(value)
    except ValueError:  # an int of more digits than Python turns into text
        return f"an integer of {value.bit_length()} bits" if isinstance(value, int) else type(value).__name__


def _plain(value: Any) -> Any:
    """Tuples (nested too) as lists: the JSON form."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _is_number(value: Any) -> bool:
    """A finite real: an int too large for a float is not one (no operation could use it)."""
    if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


class _Fields:
    """Reads the keys of one albumentations entry, each checked; :meth:`done` refuses the rest."""

    def __init__(self, name: str, d: Mapping[str, Any], where: str) -> None:
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: a transform is an object, got {_shown(d)}")
        self.name = name
        self.d = d
        self.at = f"{where} ({name})"
        self.seen = {"__class_fullname__"}

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.at}.{key}: {message}")

    def raw(self, key: str, *aliases: str) -> tuple[str, Any]:
        """The value of ``key`` or of one of its other names (``None`` counts as absent)."""
        self.seen.update((key, *aliases))
        given = [(k, self.d[k]) for k in (key, *aliases) if self.d.get(k) is not None]
        if len(given) > 1 and any(v != given[0][1] for _, v in given[1:]):
            names = " and ".join(k for k, _ in given)
            raise self.error(given[0][0], f"{names} name the same setting; give one of them")
        return given[0] if given else (key, _MISSING)

    def number(
        self, key: str, default: float, lo: float | None = None, hi: float | None = None, *aliases: str
    ) -> float:
        k, v = self.raw(key, *aliases)
        if v is _MISSING:
            return float(default)
        return self._check_number(k, v, lo, hi)

    def _check_number(self, key: str, v: Any, lo: float | None, hi: float | None, what: str = "a number") -> float:
        if not _is_number(v):
            raise self.error(key, f"must be {what}, got {_shown(v)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            span = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
            raise self.error(key, f"must be in {span}, got {_shown(v)}")
        return float(v)

    def integer(
        self, key: str, default: int | None, lo: int | None = None, hi: int | None = None, *aliases: str
    ) -> int:
        k, v = self.raw(key, *aliases)
        if v is _MISSING:
            if default is None:
                raise self.error(key, "is required")
            return default
        if not _is_number(v) or float(v) != int(v):
            raise self.error(k, f"must be a whole number, got {_shown(v)}")
        return int(self._check_number(k, v, lo, hi, "a whole number"))

    def flag(self, key: str, default: bool) -> bool:
        k, v = self.raw(key)
        if v is _MISSING:
            return default
        if not isinstance(v, bool):
            raise self.error(k, f"must be true or false, got {_shown(v)}")
        return v

    def span(
        self,
        key: str,
        default: Span,
        scalar: str = "symmetric",
        lo: float | None = None,
        hi: float | None = None,
        *aliases: str,
    ) -> Span:
        """A ``[low, high]`` range; a single number ``x`` means ``[-x, x]`` (``symmetric``), ``[0, x]``
        (``zero``) or ``[x, x]`` (``same``), as albumentations reads it for that key."""
        k, v = self.raw(key, *aliases)
        if v is _MISSING:
            return default
        return self._span(k, v, scalar, lo, hi)

    def _span(self, key: str, v: Any, scalar: str, lo: float | None, hi: float | None) -> Span:
        if _is_number(v):
            x = float(v)
            pair = (-abs(x), abs(x)) if scalar == "symmetric" else (0.0, x) if scalar == "zero" else (x, x)
        elif isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_number(x) for x in v):
            pair = (float(v[0]), float(v[1]))
        else:
            raise self.error(key, f"must be a number or a [low, high] pair of numbers, got {_shown(v)}")
        if pair[0] > pair[1]:
            raise self.error(key, f"low must not exceed high, got {_shown(v)}")
        for x in pair:
            self._check_number(key, x, lo, hi)
        if not math.isfinite(pair[1] - pair[0]):  # a draw from it would overflow the generator
            raise self.error(key, f"the range is too wide to draw from (high - low beyond a float), got {_shown(v)}")
        return pair

    def xy(self, key: str, default: XYSpan, lo: float | None = None, hi: float | None = None, *aliases: str) -> XYSpan:
        """A per-axis range: ``{"x": range, "y": range}`` (a missing axis keeps its default), or one
        range (a number ``x`` meaning ``[x, x]``) for both axes."""
        k, v = self.raw(key, *aliases)
        if v is _MISSING:
            return default
        if isinstance(v, Mapping):
            extra = sorted(set(v) - {"x", "y"})
            if extra or not v:
                raise self.error(k, f'is an object with "x" and/or "y", got {_shown(v)}')
            x = self._span(f"{k}.x", v["x"], "same", lo, hi) if "x" in v else default[0]
            y = self._span(f"{k}.y", v["y"], "same", lo, hi) if "y" in v else default[1]
            return (x, y)
        both = self._span(k, v, "same", lo, hi)
        return (both, both)

    def choice(self, key: str, default: Any, options: Mapping[Any, Any], *aliases: str) -> Any:
        k, v = self.raw(key, *aliases)
        if v is _MISSING:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, str, np.integer)) or v not in options:
            allowed = ", ".join(_shown(o) for o in options)
            raise self.error(k, f"dlpack supports {allowed}, got {_shown(v)}")
        return int(v) if isinstance(v, np.integer) else v

    def only(self, key: str, allowed: Any, *aliases: str) -> None:
        """A key for a feature dlpack does not implement: accepted at its default only."""
        k, v = self.raw(key, *aliases)
        if v is not _MISSING and (v != allowed or isinstance(v, bool) != isinstance(allowed, bool)):
            raise self.error(k, f"dlpack supports only {_shown(allowed)}, got {_shown(v)}")

    def fill(self, key: str, default: Fill | None, *aliases: str) -> Fill | None:
        """A fill value: one number, or one per channel."""
        k, v = self.raw(key, *aliases)
        if v is _MISSING:
            return default
        if _is_number(v):
            return float(v)
        if isinstance(v, (list, tuple)) and v and all(_is_number(x) for x in v):
            return tuple(float(x) for x in v)
        raise self.error(k, f"must be a number or a list of numbers (one per channel), got {_shown(v)}")

    def probability(self, default: float) -> float:
        """``p``; albumentations 1.x's ``always_apply: true`` means applied every time (p = 1)."""
        p = self.number("p", default, 0.0, 1.0)
        _, always = self.raw("always_apply")
        if always is not _MISSING and not isinstance(always, bool):
            raise self.error("always_apply", f"must be true or false, got {_shown(always)}")
        return 1.0 if always is True else p

    def done(self, names: Sequence[str]) -> None:
        extra = [k for k in self.d if k not in self.seen]
        if extra:
            raise self.error(extra[0], f"not a key dlpack reads for {self.name} (it reads: {', '.join(names)})")


# ---------------------------------------------------------------- shared pieces


def _interpolation(r: _Fields, key: str = "interpolation") -> int:
    return int(r.choice(key, 1, INTERPOLATION_NAMES))


def _border(r: _Fields, default: int, *aliases: str) -> int:
    return int(r.choice("border_mode", default, BORDER_NAMES, *aliases))


def _nearest_masks_only(r: _Fields) -> None:
    r.only("mask_interpolation", 0)


def _fill_mask(r: _Fields, *aliases: str) -> int | None:
    k, v = r.raw("fill_mask", *aliases)
    if v is _MISSING:
        return None
    if not _is_number(v) or float(v) != int(v) or v < 0:
        raise r.error(k, f"must be a whole number >= 0 (a mask class id), got {_shown(v)}")
    return int(v)


def _image_fill(op: str, fill: Fill, image: np.ndarray) -> Fill:
    """``fill`` checked against the image's channels and range."""
    top = color.max_value(image.dtype)
    values = fill if isinstance(fill, tuple) else (fill,)
    if len(values) not in (1, image.shape[2]):
        raise ConfigError(f"{op}.fill gives {len(values)} values for an image of {image.shape[2]} channel(s)")
    if any(v < 0 or v > top for v in values):
        raise ConfigError(f"{op}.fill {_shown(_plain(fill))} is outside the {image.dtype} range 0..{top}")
    return fill


def _mask_fill(op: str, own: int | None, t: Targets) -> int:
    """The value of uncovered mask pixels: the operation's own ``fill_mask``, else the store's."""
    value = t.fill_mask if own is None else own
    if t.mask is not None and value > color.max_value(t.mask.dtype):
        raise ConfigError(f"{op}.fill_mask {value} does not fit a {t.mask.dtype} mask")
    return int(value)


def _moved(t: Targets, m: np.ndarray, out_w: int, out_h: int, **changes: Any) -> Targets:
    """``t`` with ``changes`` (new pixels) and its boxes moved by ``m`` onto an ``out_w x out_h`` canvas."""
    if t.boxes is None:
        return t.replace(**changes)
    boxes, visible = geometric.warp_boxes(t.boxes, m, out_w, out_h)
    return t.moved(boxes, visible, **changes)


def _warped(
    t: Targets,
    m: np.ndarray,
    out_w: int,
    out_h: int,
    *,
    op: str,
    interpolation: int,
    border: int,
    fill: Fill,
    fill_mask: int | None,
) -> Targets:
    """Pixels, mask and boxes of ``t`` moved by the one matrix ``m``."""
    b = BORDER_NAMES[border]
    image = geometric.warp_image(
        t.image, m, out_w, out_h, INTERPOLATION_NAMES[interpolation], _image_fill(op, fill, t.image), b
    )
    mask = None
    if t.mask is not None:
        mask = geometric.warp_mask(t.mask, m, out_w, out_h, _mask_fill(op, fill_mask, t), b)
    return _moved(t, m, out_w, out_h, image=image, mask=mask)


class _Op(Transform):
    """An albumentations operation: ``to_dict`` writes the fields in albumentations' 2.0 form, and
    ``from_dict`` reads either release's keys through :meth:`_read`."""

    #: Defaults of the last 1.4 release where they differ from 2.0 (a 1.x document that leaves a key out).
    v1_defaults: ClassVar[Mapping[str, tuple[Any, tuple[str, ...]]]] = {}

    def __post_init__(self) -> None:
        check_probability(self.p, f"{self.name}.p")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"__class_fullname__": self.name}
        for f in fields(self):  # type: ignore[arg-type]
            d[f.name] = _plain(getattr(self, f.name))
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Transform:
        r = _Fields(cls.name, d, where)
        kw = cls._read(r)
        r.done(sorted(r.seen - {"__class_fullname__"}))
        return cls(**kw)

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        return {"p": r.probability(0.5)}


# ---------------------------------------------------------------- flips and quarter turns


@register
@dataclass(frozen=True)
class HorizontalFlip(_Op):
    """Mirror left-right (exact, no interpolation)."""

    name: ClassVar[str] = "HorizontalFlip"
    geometric: ClassVar[bool] = True
    p: float = 0.5

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Exact: pixels, mask and boxes mirrored without resampling (no parameters)."""
        h, w = t.shape
        mask = geometric.hflip(t.mask) if t.mask is not None else None
        return _moved(t, geometric.flip_matrix(w, h, True, False), w, h, image=geometric.hflip(t.image), mask=mask)


@register
@dataclass(frozen=True)
class VerticalFlip(_Op):
    """Mirror top-bottom (exact)."""

    name: ClassVar[str] = "VerticalFlip"
    geometric: ClassVar[bool] = True
    p: float = 0.5

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Exact: pixels, mask and boxes mirrored without resampling (no parameters)."""
        h, w = t.shape
        mask = geometric.vflip(t.mask) if t.mask is not None else None
        return _moved(t, geometric.flip_matrix(w, h, False, True), w, h, image=geometric.vflip(t.image), mask=mask)


@register
@dataclass(frozen=True)
class RandomRotate90(_Op):
    """``k`` in 0..3 quarter turns counter-clockwise, drawn uniformly (exact); a non-square image
    becomes W x H for odd ``k``."""

    name: ClassVar[str] = "RandomRotate90"
    geometric: ClassVar[bool] = True
    v1_defaults: ClassVar[Mapping[str, tuple[Any, tuple[str, ...]]]] = {"p": (0.5, ())}
    p: float = 1.0

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        return {"p": r.probability(1.0)}

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``{"k": quarter turns}``, 0..3 with equal odds."""
        return {"k": int(rng.integers(0, 4))}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Exact; an odd ``k`` swaps width and height."""
        k = int(params["k"]) % 4
        h, w = t.shape
        out_w, out_h = (h, w) if k % 2 else (w, h)
        mask = geometric.rot90(t.mask, k) if t.mask is not None else None
        return _moved(t, geometric.rot90_matrix(w, h, k), out_w, out_h, image=geometric.rot90(t.image, k), mask=mask)


# ---------------------------------------------------------------- affine warps


def _affine_draw_matrix(
    rng: np.random.Generator,
    w: int,
    h: int,
    scale: XYSpan,
    keep_ratio: bool,
    balanced: bool,
    rotate: Span,
    shear: XYSpan,
    translate_percent: XYSpan | None,
    translate_px: XYSpan | None,
) -> dict[str, Any]:
    def one_scale(span: Span) -> float:
        lo, hi = span
        if balanced and lo < 1.0 < hi:
            span = (lo, 1.0) if rng.random() < 0.5 else (1.0, hi)
        elif balanced and lo == hi:
            return lo
        return float(rng.uniform(*span))

    sx = one_scale(scale[0])
    sy = sx if keep_ratio else one_scale(scale[1])
    angle = float(rng.uniform(*rotate))
    shx, shy = float(rng.uniform(*shear[0])), float(rng.uniform(*shear[1]))
    if translate_percent is not None:
        # Whole pixels, as albumentations rounds a fractional shift (toward zero).
        tx = int(float(rng.uniform(*translate_percent[0])) * w)
        ty = int(float(rng.uniform(*translate_percent[1])) * h)
    elif translate_px is not None:
        tx = int(rng.integers(int(translate_px[0][0]), int(translate_px[0][1]) + 1))
        ty = int(rng.integers(int(translate_px[1][0]), int(translate_px[1][1]) + 1))
    else:
        tx = ty = 0
    return {"angle": angle, "scale": [sx, sy], "translate": [tx, ty], "shear": [shx, shy]}


def _affine_apply(t: Targets, params: Mapping[str, Any], op: _Op) -> Targets:
    h, w = t.shape
    sx, sy = (float(v) for v in params.get("scale", (1.0, 1.0)))
    tx, ty = (float(v) for v in params.get("translate", (0.0, 0.0)))
    shx, shy = (float(v) for v in params.get("shear", (0.0, 0.0)))
    m = geometric.affine_matrix(w, h, float(params["angle"]), (sx, sy), (tx, ty), (shx, shy))
    return _warped(
        t,
        m,
        w,
        h,
        op=op.name,
        interpolation=getattr(op, "interpolation", 1),
        border=getattr(op, "border_mode", 0),
        fill=getattr(op, "fill", 0.0),
        fill_mask=getattr(op, "fill_mask", None),
    )


def _rotate_box_rule(r: _Fields) -> None:
    r.only("rotate_method", "largest_box")


@register
@dataclass(frozen=True)
class Affine(_Op):
    """Scale, rotate, shear about the centre, then translate; one warp for pixels, mask and boxes.

    ``scale`` and ``shear`` are per-axis ranges (``((x_lo, x_hi), (y_lo, y_hi))``), ``rotate`` a
    range in degrees (counter-clockwise positive); the shift is ``translate_percent`` (of the width
    and height) or ``translate_px`` (whole pixels), at most one of them.
    """

    name: ClassVar[str] = "Affine"
    geometric: ClassVar[bool] = True
    p: float = 0.5
    scale: XYSpan = ((1.0, 1.0), (1.0, 1.0))
    translate_percent: XYSpan | None = None
    translate_px: XYSpan | None = None
    rotate: Span = (0.0, 0.0)
    shear: XYSpan = ((0.0, 0.0), (0.0, 0.0))
    interpolation: int = 1
    border_mode: int = 0
    fill: Fill = 0.0
    fill_mask: int | None = None
    keep_ratio: bool = False
    balanced_scale: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Per-axis ranges as albumentations writes them: ``{"x": [lo, hi], "y": [lo, hi]}``."""
        d = super().to_dict()
        for key in ("scale", "translate_percent", "translate_px", "shear"):
            v = getattr(self, key)
            d[key] = None if v is None else {"x": list(v[0]), "y": list(v[1])}
        return d

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        zero: XYSpan = ((0.0, 0.0), (0.0, 0.0))
        scale = r.xy("scale", ((1.0, 1.0), (1.0, 1.0)), 1e-6)
        keep_ratio = r.flag("keep_ratio", False)
        if keep_ratio and scale[0] != scale[1]:
            raise r.error("scale", "keep_ratio needs the same x and y range")
        percent = r.xy("translate_percent", zero, -1.0, 1.0) if r.d.get("translate_percent") is not None else None
        px = r.xy("translate_px", zero) if r.d.get("translate_px") is not None else None
        r.seen.update(("translate_percent", "translate_px"))
        if percent is not None and px is not None and px != zero:
            raise r.error("translate_px", "give translate_percent or translate_px, not both")
        if px is not None and any(float(v) != int(v) for axis in px for v in axis):
            raise r.error("translate_px", f"must be whole pixels, got {_shown(_plain(px))}")
        _rotate_box_rule(r)
        r.only("fit_output", False)
        _nearest_masks_only(r)
        return {
            "p": r.probability(0.5),
            "scale": scale,
            "translate_percent": percent,
            "translate_px": None if percent is not None else px,
            "rotate": r.span("rotate", (0.0, 0.0), "same"),
            "shear": r.xy("shear", zero, -89.0, 89.0),
            "interpolation": _interpolation(r),
            "border_mode": _border(r, 0, "mode"),
            "fill": r.fill("fill", 0.0, "cval"),
            "fill_mask": _fill_mask(r, "cval_mask"),
            "keep_ratio": keep_ratio,
            "balanced_scale": r.flag("balanced_scale", False),
        }

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``angle`` and ``shear`` in degrees, per-axis ``scale``, ``translate`` in whole pixels."""
        h, w = t.shape
        return _affine_draw_matrix(
            rng,
            w,
            h,
            self.scale,
            self.keep_ratio,
            self.balanced_scale,
            self.rotate,
            self.shear,
            self.translate_percent,
            self.translate_px,
        )

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """One warp of pixels, mask and boxes by the matrix of ``params``."""
        return _affine_apply(t, params, self)


@register
@dataclass(frozen=True)
class ShiftScaleRotate(_Op):
    """Shift (a share of the width/height), scale by ``1 + scale_limit``, rotate: an :class:`Affine`
    with one scale for both axes."""

    name: ClassVar[str] = "ShiftScaleRotate"
    geometric: ClassVar[bool] = True
    v1_defaults: ClassVar[Mapping[str, tuple[Any, tuple[str, ...]]]] = {"border_mode": (4, ())}
    p: float = 0.5
    shift_limit_x: Span = (-0.0625, 0.0625)
    shift_limit_y: Span = (-0.0625, 0.0625)
    scale_limit: Span = (-0.1, 0.1)
    rotate_limit: Span = (-45.0, 45.0)
    interpolation: int = 1
    border_mode: int = 0
    fill: Fill = 0.0
    fill_mask: int | None = None

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        both = r.span("shift_limit", (-0.0625, 0.0625), "symmetric", -1.0, 1.0)
        scale = r.span("scale_limit", (-0.1, 0.1), "symmetric")
        if 1.0 + scale[0] <= 0.0:
            raise r.error("scale_limit", f"1 + low must be > 0 (a scale), got {_shown(_plain(scale))}")
        _rotate_box_rule(r)
        _nearest_masks_only(r)
        return {
            "p": r.probability(0.5),
            "shift_limit_x": r.span("shift_limit_x", both, "symmetric", -1.0, 1.0),
            "shift_limit_y": r.span("shift_limit_y", both, "symmetric", -1.0, 1.0),
            "scale_limit": scale,
            "rotate_limit": r.span("rotate_limit", (-45.0, 45.0), "symmetric"),
            "interpolation": _interpolation(r),
            "border_mode": _border(r, 0),
            "fill": r.fill("fill", 0.0, "value"),
            "fill_mask": _fill_mask(r, "mask_value"),
        }

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """The :class:`Affine` record: one scale for both axes, no shear, the shift in whole pixels."""
        h, w = t.shape
        lo, hi = self.scale_limit
        return _affine_draw_matrix(
            rng,
            w,
            h,
            ((1.0 + lo, 1.0 + hi), (1.0 + lo, 1.0 + hi)),
            True,
            False,
            self.rotate_limit,
            ((0.0, 0.0), (0.0, 0.0)),
            (self.shift_limit_x, self.shift_limit_y),
            None,
        )

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """The :class:`Affine` warp."""
        return _affine_apply(t, params, self)


@register
@dataclass(frozen=True)
class Rotate(_Op):
    """Rotate about the centre by an angle drawn from ``limit`` (degrees), on the same canvas."""

    name: ClassVar[str] = "Rotate"
    geometric: ClassVar[bool] = True
    v1_defaults: ClassVar[Mapping[str, tuple[Any, tuple[str, ...]]]] = {"border_mode": (4, ())}
    p: float = 0.5
    limit: Span = (-90.0, 90.0)
    interpolation: int = 1
    border_mode: int = 0
    fill: Fill = 0.0
    fill_mask: int | None = None

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        _rotate_box_rule(r)
        r.only("crop_border", False)
        _nearest_masks_only(r)
        return {
            "p": r.probability(0.5),
            "limit": r.span("limit", (-90.0, 90.0), "symmetric"),
            "interpolation": _interpolation(r),
            "border_mode": _border(r, 0),
            "fill": r.fill("fill", 0.0, "value"),
            "fill_mask": _fill_mask(r, "mask_value"),
        }

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``{"angle": degrees}``, uniform in ``limit``."""
        return {"angle": float(rng.uniform(*self.limit))}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """The :class:`Affine` warp with scale 1 and no shift or shear."""
        return _affine_apply(t, params, self)


# ---------------------------------------------------------------- crops


_PAD_POSITIONS = ("center", "top_left", "top_right", "bottom_left", "bottom_right", "random")


@register
@dataclass(frozen=True)
class RandomCrop(_Op):
    """A ``width x height`` window at a uniformly drawn position; the canvas becomes that size.

    With ``pad_if_needed``, an image smaller than the window is first padded (``border_mode``,
    ``fill``, ``fill_mask``) at ``pad_position``; without it, a window larger than the image is an error.
    """

    name: ClassVar[str] = "RandomCrop"
    geometric: ClassVar[bool] = True
    height: int
    width: int
    p: float = 1.0
    pad_if_needed: bool = False
    pad_position: str = "center"
    border_mode: int = 0
    fill: Fill = 0.0
    fill_mask: int | None = None

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        return {
            "height": r.integer("height", None, 1),
            "width": r.integer("width", None, 1),
            "p": r.probability(1.0),
            "pad_if_needed": r.flag("pad_if_needed", False),
            "pad_position": r.choice("pad_position", "center", {k: k for k in _PAD_POSITIONS}),
            "border_mode": _border(r, 0),
            "fill": r.fill("fill", 0.0),
            "fill_mask": _fill_mask(r),
        }

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """The window's top-left ``x``, ``y`` in pixels of the image (negative into the padding); a ConfigError
        when the window is larger than the image and ``pad_if_needed`` is off."""
        h, w = t.shape
        ch, cw = self.height, self.width
        if (ch > h or cw > w) and not self.pad_if_needed:
            raise ConfigError(
                f"RandomCrop: the {cw}x{ch} crop is larger than the {w}x{h} image; make the crop smaller "
                "or set pad_if_needed: true"
            )
        ph, pw = max(h, ch), max(w, cw)

        def pad_before(extra: int, start: bool) -> int:
            if self.pad_position == "random":
                return int(rng.integers(0, extra + 1))
            if self.pad_position == "center":
                return extra // 2
            return 0 if start else extra

        top = pad_before(ph - h, self.pad_position in ("top_left", "top_right"))
        left = pad_before(pw - w, self.pad_position in ("top_left", "bottom_left"))
        y = int(rng.integers(0, ph - ch + 1)) - top
        x = int(rng.integers(0, pw - cw + 1)) - left
        return {"x": x, "y": y}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """The window becomes the canvas; pixels outside the image come from ``border_mode`` and ``fill``."""
        x, y = int(params["x"]), int(params["y"])
        cw, ch = self.width, self.height
        b = BORDER_NAMES[self.border_mode]
        image = geometric.crop(t.image, x, y, cw, ch, _image_fill(self.name, self.fill, t.image), b)
        mask = None
        if t.mask is not None:
            mask = geometric.crop(t.mask, x, y, cw, ch, _mask_fill(self.name, self.fill_mask, t), b)
        return _moved(t, geometric.crop_matrix(x, y, cw, ch, cw, ch), cw, ch, image=image, mask=mask)


@register
@dataclass(frozen=True)
class RandomResizedCrop(_Op):
    """A window of a drawn share of the area (``scale``) and aspect ratio (``ratio``, drawn on a log
    scale), resized to ``size`` = ``(height, width)``; after 10 draws that do not fit, the central
    crop of the nearest allowed ratio. The canvas becomes ``size``."""

    name: ClassVar[str] = "RandomResizedCrop"
    geometric: ClassVar[bool] = True
    size: tuple[int, int]
    p: float = 1.0
    scale: Span = (0.08, 1.0)
    ratio: Span = (0.75, 4.0 / 3.0)
    interpolation: int = 1
    area_for_downscale: str | None = None

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        k, size = r.raw("size")
        if size is _MISSING:
            size = (r.integer("height", None, 1), r.integer("width", None, 1))
        else:
            if r.d.get("height") is not None or r.d.get("width") is not None:
                raise r.error("size", "give size or height and width, not both")
            r.seen.update(("height", "width"))
            if not (
                isinstance(size, (list, tuple))
                and len(size) == 2
                and all(_is_number(v) and float(v) == int(v) and v >= 1 for v in size)
            ):
                raise r.error(k, f"must be [height, width], whole numbers >= 1, got {_shown(size)}")
            size = (int(size[0]), int(size[1]))
        _nearest_masks_only(r)
        scale = r.span("scale", (0.08, 1.0), "same", 0.0)
        if scale[1] <= 0:
            raise r.error("scale", f"must allow a share > 0 of the area, got {_shown(_plain(scale))}")
        return {
            "size": size,
            "p": r.probability(1.0),
            "scale": scale,
            "ratio": r.span("ratio", (0.75, 4.0 / 3.0), "same", 1e-6),
            "interpolation": _interpolation(r),
            "area_for_downscale": r.choice("area_for_downscale", None, {"image": "image"}),
        }

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """The window ``x``, ``y``, ``w``, ``h`` in pixels of the image."""
        h, w = t.shape
        area = float(h * w)
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target = area * float(rng.uniform(*self.scale))
            aspect = math.exp(float(rng.uniform(lo, hi)))
            cw = int(round(math.sqrt(target * aspect)))
            ch = int(round(math.sqrt(target / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                return {"x": int(rng.integers(0, w - cw + 1)), "y": int(rng.integers(0, h - ch + 1)), "w": cw, "h": ch}
        shape = w / h
        if shape < self.ratio[0]:
            cw, ch = w, max(1, min(h, int(round(w / self.ratio[0]))))
        elif shape > self.ratio[1]:
            cw, ch = max(1, min(w, int(round(h * self.ratio[1])))), h
        else:
            cw, ch = w, h
        return {"x": (w - cw) // 2, "y": (h - ch) // 2, "w": cw, "h": ch}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Crop, then resize to ``size`` (``area`` when ``area_for_downscale="image"`` shrinks); the mask by
        nearest neighbour."""
        x, y, cw, ch = (int(params[k]) for k in ("x", "y", "w", "h"))
        out_h, out_w = self.size
        window = geometric.crop(t.image, x, y, cw, ch)
        interp = INTERPOLATION_NAMES[self.interpolation]
        if self.area_for_downscale == "image" and (cw > out_w or ch > out_h):
            interp = "area"
        image = geometric.resize(window, out_w, out_h, interp)
        mask = None
        if t.mask is not None:
            mask = geometric.resize_nearest(geometric.crop(t.mask, x, y, cw, ch), out_w, out_h)
        return _moved(t, geometric.crop_matrix(x, y, cw, ch, out_w, out_h), out_w, out_h, image=image, mask=mask)


# ---------------------------------------------------------------- perspective


@register
@dataclass(frozen=True)
class Perspective(_Op):
    """Each corner moved inward by ``|N(0, sigma)|`` of the width/height (wrapped below 0.32),
    ``sigma`` drawn from ``scale``; the quadrilateral they span is stretched onto the canvas
    (``keep_size``) or onto its own size."""

    name: ClassVar[str] = "Perspective"
    geometric: ClassVar[bool] = True
    p: float = 0.5
    scale: Span = (0.05, 0.1)
    keep_size: bool = True
    interpolation: int = 1
    border_mode: int = 0
    fill: Fill = 0.0
    fill_mask: int | None = None

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        r.only("fit_output", False)
        _nearest_masks_only(r)
        return {
            "p": r.probability(0.5),
            "scale": r.span("scale", (0.05, 0.1), "zero", 0.0),
            "keep_size": r.flag("keep_size", True),
            "interpolation": _interpolation(r),
            "border_mode": _border(r, 0, "pad_mode"),
            "fill": r.fill("fill", 0.0, "pad_val"),
            "fill_mask": _fill_mask(r, "mask_pad_val"),
        }

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """The four source corners ``points`` (pixels, clockwise from top-left) and the output ``width`` and
        ``height`` (the image's with ``keep_size``, else the moved corners' longest sides)."""
        h, w = t.shape
        sigma = float(rng.uniform(*self.scale))
        j = np.mod(np.abs(rng.normal(0.0, sigma, (4, 2))), 0.32)
        fx = np.array([j[0, 0], 1.0 - j[1, 0], 1.0 - j[2, 0], j[3, 0]]) * w
        fy = np.array([j[0, 1], j[1, 1], 1.0 - j[2, 1], 1.0 - j[3, 1]]) * h
        points = [[float(x), float(y)] for x, y in zip(fx, fy, strict=True)]
        if self.keep_size:
            out_w, out_h = w, h
        else:
            p = np.array(points)
            out_w = max(2, int(round(max(np.hypot(*(p[1] - p[0])), np.hypot(*(p[2] - p[3]))))))
            out_h = max(2, int(round(max(np.hypot(*(p[3] - p[0])), np.hypot(*(p[2] - p[1]))))))
        return {"points": points, "width": out_w, "height": out_h}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """One perspective warp of pixels, mask and boxes, onto a ``width`` x ``height`` canvas."""
        out_w, out_h = int(params["width"]), int(params["height"])
        dst = np.array([[0.0, 0.0], [out_w, 0.0], [out_w, out_h], [0.0, out_h]])
        m = geometric.perspective_matrix(np.asarray(params["points"], np.float64), dst)
        return _warped(
            t,
            m,
            out_w,
            out_h,
            op=self.name,
            interpolation=self.interpolation,
            border=self.border_mode,
            fill=self.fill,
            fill_mask=self.fill_mask,
        )


# ---------------------------------------------------------------- pixel values


@register
@dataclass(frozen=True)
class RandomBrightnessContrast(_Op):
    """``x * (1 + c) + b``: ``c`` from ``contrast_limit``, ``b`` from ``brightness_limit`` times the
    dtype's maximum (``brightness_by_max``) or the image's mean."""

    name: ClassVar[str] = "RandomBrightnessContrast"
    p: float = 0.5
    brightness_limit: Span = (-0.2, 0.2)
    contrast_limit: Span = (-0.2, 0.2)
    brightness_by_max: bool = True

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        r.only("ensure_safe_range", False)
        return {
            "p": r.probability(0.5),
            "brightness_limit": r.span("brightness_limit", (-0.2, 0.2), "symmetric"),
            "contrast_limit": r.span("contrast_limit", (-0.2, 0.2), "symmetric"),
            "brightness_by_max": r.flag("brightness_by_max", True),
        }

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``alpha`` (the contrast factor) and ``beta`` (the offset in the image's own units)."""
        alpha = 1.0 + float(rng.uniform(*self.contrast_limit))
        beta = float(rng.uniform(*self.brightness_limit))
        base = color.max_value(t.image.dtype) if self.brightness_by_max else float(np.mean(t.image))
        return {"alpha": alpha, "beta": beta * float(base)}

    def changes(self, t: Targets) -> bool:
        """False when both limits are 0."""
        return any(self.brightness_limit) or any(self.contrast_limit)

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """``x * alpha + beta``, rounded and saturated to the dtype."""
        return t.replace(image=color.brightness_contrast(t.image, float(params["alpha"]), float(params["beta"])))


@register
@dataclass(frozen=True)
class HueSaturationValue(_Op):
    """Shift hue, saturation and value by amounts drawn from their limits, in 8-bit HSV units
    (:func:`color.shift_hsv`); a gray image changes only its value."""

    name: ClassVar[str] = "HueSaturationValue"
    p: float = 0.5
    hue_shift_limit: Span = (-20.0, 20.0)
    sat_shift_limit: Span = (-30.0, 30.0)
    val_shift_limit: Span = (-20.0, 20.0)

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        return {
            "p": r.probability(0.5),
            "hue_shift_limit": r.span("hue_shift_limit", (-20.0, 20.0), "symmetric"),
            "sat_shift_limit": r.span("sat_shift_limit", (-30.0, 30.0), "symmetric"),
            "val_shift_limit": r.span("val_shift_limit", (-20.0, 20.0), "symmetric"),
        }

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``hue``, ``sat``, ``val`` shifts in 8-bit HSV units."""
        return {
            "hue": float(rng.uniform(*self.hue_shift_limit)),
            "sat": float(rng.uniform(*self.sat_shift_limit)),
            "val": float(rng.uniform(*self.val_shift_limit)),
        }

    def changes(self, t: Targets) -> bool:
        """A gray image changes only through value."""
        if any(self.val_shift_limit):
            return True
        colour = t.image.ndim == 3 and t.image.shape[2] == 3
        return colour and (any(self.hue_shift_limit) or any(self.sat_shift_limit))  # gray: only value moves it

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Shift in HSV and back; a gray image moves only in value."""
        hsv = (float(params[k]) for k in ("hue", "sat", "val"))
        return t.replace(image=color.shift_hsv(t.image, *hsv))


@register
@dataclass(frozen=True)
class GaussNoise(_Op):
    """Additive Gaussian noise. 2.0 form: ``std_range`` and ``mean_range`` as shares of the dtype's
    maximum. 1.4 form (``var_limit`` set): a variance in 8-bit units squared and a fixed ``mean``
    in 8-bit units (scaled by 257 on 16-bit images)."""

    name: ClassVar[str] = "GaussNoise"
    p: float = 0.5
    std_range: Span = (0.2, 0.44)
    mean_range: Span = (0.0, 0.0)
    per_channel: bool = True
    var_limit: Span | None = None
    mean: float | None = None

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        r.only("noise_scale_factor", 1.0)
        old = r.d.get("var_limit") is not None or r.d.get("mean") is not None
        new = r.d.get("std_range") is not None or r.d.get("mean_range") is not None
        if old and new:
            key = "var_limit" if r.d.get("var_limit") is not None else "mean"
            raise r.error(key, "is the 1.4 form of std_range/mean_range; give one form")
        kw: dict[str, Any] = {"p": r.probability(0.5), "per_channel": r.flag("per_channel", True)}
        if old:
            kw["var_limit"] = r.span("var_limit", (10.0, 50.0), "zero", 0.0)
            kw["mean"] = r.number("mean", 0.0)
            r.seen.update(("std_range", "mean_range"))
        else:
            kw["std_range"] = r.span("std_range", (0.2, 0.44), "same", 0.0, 1.0)
            kw["mean_range"] = r.span("mean_range", (0.0, 0.0), "same", -1.0, 1.0)
            r.seen.update(("var_limit", "mean"))
        return kw

    def to_dict(self) -> dict[str, Any]:
        """Writes only the keys of the form the config used (1.x ``var_limit``/``mean`` or 2.0 ranges)."""
        d = super().to_dict()
        for key in ("var_limit", "mean") if self.var_limit is None else ("std_range", "mean_range"):
            del d[key]
        return d

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``std`` and ``mean`` in the image's own units, and the ``seed`` of the noise."""
        top = float(color.max_value(t.image.dtype))
        if self.var_limit is not None:
            std = math.sqrt(float(rng.uniform(*self.var_limit))) * top / 255.0
            mean = float(self.mean or 0.0) * top / 255.0
        else:
            std = float(rng.uniform(*self.std_range)) * top
            mean = float(rng.uniform(*self.mean_range)) * top
        return {"std": std, "mean": mean, "seed": int(rng.integers(0, 2**31))}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Add the noise drawn from ``seed``, saturated; without ``per_channel`` all channels get the same."""
        image = color.gauss_noise(
            t.image, float(params["std"]), float(params["mean"]), int(params["seed"]), self.per_channel
        )
        return t.replace(image=image)


@register
@dataclass(frozen=True)
class GaussianBlur(_Op):
    """Gaussian blur: a kernel size drawn from ``blur_limit`` (made odd; 0: from sigma) and a sigma
    from ``sigma_limit`` (0: from the kernel size)."""

    name: ClassVar[str] = "GaussianBlur"
    v1_defaults: ClassVar[Mapping[str, tuple[Any, tuple[str, ...]]]] = {
        "blur_limit": ([3, 7], ()),
        "sigma_limit": ([0.0, 0.0], ()),
    }
    p: float = 0.5
    blur_limit: tuple[int, int] = (0, 0)
    sigma_limit: Span = (0.5, 3.0)

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        blur = r.span("blur_limit", (0.0, 0.0), "zero", 0.0)
        if any(v != int(v) for v in blur):
            raise r.error("blur_limit", f"must be whole kernel sizes, got {_shown(_plain(blur))}")
        sigma = r.span("sigma_limit", (0.5, 3.0), "zero", 0.0)
        if blur[1] == 0 and sigma[1] == 0:
            raise r.error("sigma_limit", "a blur needs a kernel size (blur_limit) or a sigma above 0")
        return {"p": r.probability(0.5), "blur_limit": (int(blur[0]), int(blur[1])), "sigma_limit": sigma}

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``ksize`` (odd, or 0 to derive it from sigma) and ``sigma`` in pixels."""
        sigma = float(rng.uniform(*self.sigma_limit))
        ksize = int(rng.integers(self.blur_limit[0], self.blur_limit[1] + 1))
        if ksize and ksize % 2 == 0:
            ksize += 1
        return {"ksize": ksize, "sigma": sigma}

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Blur with the drawn kernel; the mask and boxes stay."""
        return t.replace(image=color.gaussian_blur(t.image, int(params["ksize"]), float(params["sigma"])))


_RANDOM_FILLS = ("random", "random_uniform")


@register
@dataclass(frozen=True)
class CoarseDropout(_Op):
    """Rectangular holes filled with ``fill`` (a number, one per channel, ``"random"`` pixels or one
    ``"random_uniform"`` colour per hole). Hole sizes are pixels when a range's high end is >= 1,
    else shares of the height/width. Boxes stay; the mask's holes take ``fill_mask`` if given."""

    name: ClassVar[str] = "CoarseDropout"
    v1_defaults: ClassVar[Mapping[str, tuple[Any, tuple[str, ...]]]] = {
        "num_holes_range": ([1, 1], ("max_holes", "min_holes")),
        "hole_height_range": ([8, 8], ("max_height", "min_height")),
        "hole_width_range": ([8, 8], ("max_width", "min_width")),
    }
    p: float = 0.5
    num_holes_range: tuple[int, int] = (1, 2)
    hole_height_range: Span = (0.1, 0.2)
    hole_width_range: Span = (0.1, 0.2)
    fill: Fill | str = 0.0
    fill_mask: int | None = None

    @classmethod
    def _read(cls, r: _Fields) -> dict[str, Any]:
        holes = cls._old_range(r, "holes", "num_holes_range", (1, 2))
        if holes[0] < 1 or any(v != int(v) for v in holes):
            raise r.error("num_holes_range", f"must be whole numbers >= 1, got {_shown(_plain(holes))}")
        k, fill = r.raw("fill", "fill_value")
        if isinstance(fill, str):
            if fill not in _RANDOM_FILLS:
                raise r.error(
                    k,
                    f"dlpack supports a number, a list of numbers, or {' or '.join(_RANDOM_FILLS)}; got {_shown(fill)}",
                )
        else:
            fill = r.fill("fill", 0.0, "fill_value")
        return {
            "p": r.probability(0.5),
            "num_holes_range": (int(holes[0]), int(holes[1])),
            "hole_height_range": cls._old_range(r, "height", "hole_height_range", (0.1, 0.2)),
            "hole_width_range": cls._old_range(r, "width", "hole_width_range", (0.1, 0.2)),
            "fill": fill,
            "fill_mask": _fill_mask(r, "mask_fill_value"),
        }

    @staticmethod
    def _old_range(r: _Fields, what: str, key: str, default: Span) -> Span:
        """A 2.0 range, or the 1.4 ``min_<what>``/``max_<what>`` pair (min defaults to max)."""
        _, hi = r.raw(f"max_{what}")
        _, lo = r.raw(f"min_{what}")
        if hi is _MISSING and lo is _MISSING:
            span = r.span(key, default, "same", 0.0)
        else:
            if r.d.get(key) is not None:
                raise r.error(key, f"give {key} or the 1.4 max_{what}/min_{what}, not both")
            r.seen.add(key)
            if hi is _MISSING:
                raise r.error(f"max_{what}", f"is required with min_{what}")
            top = r._check_number(f"max_{what}", hi, 0.0, None)
            bottom = top if lo is _MISSING else r._check_number(f"min_{what}", lo, 0.0, None)
            if bottom > top:
                raise r.error(f"min_{what}", f"must not exceed max_{what}, got {_shown(lo)} > {_shown(hi)}")
            span = (bottom, top)
        if span[1] >= 1 and any(v != int(v) for v in span):
            raise r.error(key, f"pixel sizes (a high end >= 1) must be whole numbers, got {_shown(_plain(span))}")
        return span

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """``holes`` as ``[x0, y0, x1, y1]`` pixels, and a ``seed`` when ``fill`` is random."""
        h, w = t.shape
        n = int(rng.integers(self.num_holes_range[0], self.num_holes_range[1] + 1))

        def sizes(span: Span, dim: int) -> np.ndarray:
            if span[1] >= 1:
                return rng.integers(int(min(span[0], dim)), int(min(span[1], dim)) + 1, size=n)
            return (dim * rng.uniform(span[0], span[1], size=n)).astype(np.int64)

        hh, ww = sizes(self.hole_height_range, h), sizes(self.hole_width_range, w)
        y0 = rng.integers(0, h - hh + 1)
        x0 = rng.integers(0, w - ww + 1)
        holes = [[int(a), int(b), int(a + c), int(b + d)] for a, b, c, d in zip(x0, y0, ww, hh, strict=True)]
        params: dict[str, Any] = {"holes": holes}
        if isinstance(self.fill, str):
            params["seed"] = int(rng.integers(0, 2**31))
        return params

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Fill the holes in the image, and in the mask when ``fill_mask`` is set; boxes stay."""
        holes = [[int(v) for v in hole] for hole in params["holes"]]
        img = t.image
        top = color.max_value(img.dtype)
        if self.fill == "random":
            noise = np.random.default_rng(int(params["seed"])).integers(0, top + 1, img.shape).astype(img.dtype)
            image = color.fill_holes(img, holes, noise)
        elif self.fill == "random_uniform":
            rng = np.random.default_rng(int(params["seed"]))
            image = img
            for hole in holes:
                colour = np.asarray(rng.integers(0, top + 1, size=(img.shape[2],)), np.float64)
                image = color.fill_holes(image, [hole], colour.tolist())
        else:
            assert not isinstance(self.fill, str)
            image = color.fill_holes(img, holes, _image_fill(self.name, self.fill, img))
        mask = t.mask
        if mask is not None and self.fill_mask is not None:
            mask = color.fill_holes(mask, holes, _mask_fill(self.name, self.fill_mask, t))
        return t.replace(image=image, mask=mask)


#: The operations of this module by albumentations class name.
ALBUMENTATIONS_OPS: dict[str, type[_Op]] = {
    c.name: c
    for c in (
        HorizontalFlip,
        VerticalFlip,
        RandomRotate90,
        Affine,
        ShiftScaleRotate,
        Rotate,
        RandomCrop,
        RandomResizedCrop,
        RandomBrightnessContrast,
        HueSaturationValue,
        GaussNoise,
        GaussianBlur,
        Perspective,
        CoarseDropout,
    )
}


def release_defaults(d: Mapping[str, Any], major: int) -> dict[str, Any]:
    """``d`` (one transform entry) with the keys it leaves out filled with the defaults of the
    albumentations release ``major`` that wrote it, where they differ from 2.0's (1.4 rotated with a
    mirrored border, blurred with 3..7 px kernels, cut one 8 x 8 hole, turned 90 degrees half the time)."""
    out = dict(d)
    name = str(d.get("__class_fullname__", "")).rsplit(".", 1)[-1]
    cls = ALBUMENTATIONS_OPS.get(name)
    if major < 2 and cls is not None:
        for key, (value, aliases) in cls.v1_defaults.items():
            if all(out.get(k) is None for k in (key, *aliases)):
                out[key] = value
    return out
