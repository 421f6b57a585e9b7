"""Augmentation operations as serialisable classes, a name registry, and pipelines.

An operation is a frozen dataclass over the pure functions of :mod:`.functional`. It draws its
random parameters from a NumPy generator (:meth:`Transform.draw`, JSON-ready values), then applies
them as a pure function (:meth:`Transform.apply`), so what a variant went through is a record of
``{"op": name, **params}`` entries that reproduces it without the generator. Labels follow every
geometric operation: boxes by their corners, clipped to the canvas, masks by nearest neighbour.

A :class:`Pipeline` applies its operations in order, each with its probability ``p``, and drops the
boxes that end below ``min_area`` pixels or ``min_visibility`` of their unclipped area, together
with their labels. The generator of variant ``v`` of sample ``i`` is :func:`variant_rng` of
``(seed, i, v)``: a variant never depends on the worker, the job count or the order of work.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

import numpy as np

from ..errors import ConfigError

__all__ = [
    "Targets",
    "Transform",
    "OneOf",
    "Pipeline",
    "REGISTRY",
    "register",
    "transform_from_dict",
    "variant_rng",
    "DEFAULT_MIN_AREA",
    "DEFAULT_MIN_VISIBILITY",
]

#: torchvision's ``SanitizeBoundingBoxes`` default: a box must keep at least one pixel of area.
DEFAULT_MIN_AREA = 1.0
#: albumentations' default: no box is dropped for being partly outside.
DEFAULT_MIN_VISIBILITY = 0.0
#: Keeps the variants' random streams apart from the loader's (dlpack.read.loader uses other tags).
_VARIANT_TAG = 0x617567


def variant_rng(seed: int, index: int, variant: int, attempt: int = 0) -> np.random.Generator:
    """The generator of variant ``variant`` of sample ``index``: a pure function of its arguments.

    ``attempt`` > 0 is a redraw of that variant (one that came out equal to another view of its
    sample); attempt 0 is the first draw.
    """
    key = [int(seed), int(index), int(variant), _VARIANT_TAG]
    return np.random.default_rng(key if not attempt else [*key, int(attempt)])


@dataclass(frozen=True)
class Targets:
    """What an operation works on: one image and its labels, in stored-image pixels.

    ``image`` is H x W x C (C 1 or 3), ``uint8`` or ``uint16``. ``boxes`` are float32 k x 4,
    corner-based ``[x_min, y_min, x_max, y_max]``; ``box_labels`` (int32) and ``box_crowd``
    (uint8) have one entry per box and move with it. ``mask`` is H x W, ``uint8`` or ``uint16``.
    ``visibility`` is the share of each box's area still inside the canvas after the operations so
    far (1.0 for an untouched box); ``fill_mask`` is the mask value of pixels a geometric operation
    uncovers when the operation names none (the store's ``mask_ignore``, else 0).
    """

    image: np.ndarray
    boxes: np.ndarray | None = None
    box_labels: np.ndarray | None = None
    box_crowd: np.ndarray | None = None
    mask: np.ndarray | None = None
    visibility: np.ndarray | None = None
    fill_mask: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        """``(height, width)`` of the image."""
        return int(self.image.shape[0]), int(self.image.shape[1])

    def replace(self, **changes: Any) -> Targets:
        """A copy with ``changes`` (the dataclass fields by name)."""
        return dataclasses.replace(self, **changes)

    def moved(self, boxes: np.ndarray, visible: np.ndarray, keep: np.ndarray | None = None, **changes: Any) -> Targets:
        """These targets with ``boxes`` moved: ``visible`` multiplies each box's visibility, and
        ``keep`` (bool per input box) drops boxes together with their labels."""
        vis = self.visibility if self.visibility is not None else np.ones(len(visible), np.float64)
        vis = vis * np.asarray(visible, np.float64)
        labels, crowd = self.box_labels, self.box_crowd
        if keep is not None:
            boxes, vis = boxes[keep], vis[keep]
            labels = labels[keep] if labels is not None else None
            crowd = crowd[keep] if crowd is not None else None
        return dataclasses.replace(
            self,
            boxes=np.ascontiguousarray(boxes, np.float32).reshape(-1, 4),
            visibility=vis,
            box_labels=labels,
            box_crowd=crowd,
            **changes,
        )


class Transform:
    """One augmentation operation; subclasses are frozen dataclasses with a ``p`` field.

    ``name`` is the registry name, the one a config file uses (albumentations' class name, or a
    HALCON parameter's). ``geometric`` operations move pixels, so labels follow them.
    """

    name: ClassVar[str] = ""
    geometric: ClassVar[bool] = False
    p: float

    def draw(self, rng: np.random.Generator, t: Targets) -> dict[str, Any]:
        """The random parameters of one application to ``t`` (JSON-ready: ints, floats, lists, str)."""
        return {}

    def changes(self, t: Targets) -> bool:
        """Whether some draw can change ``t`` (False: saturation of a gray image, a range of only 0).

        A pipeline never draws an operation that cannot change the image it gets: it would stand
        as the variant's operation and leave a copy of the original.
        """
        return True

    def apply(self, t: Targets, params: Mapping[str, Any]) -> Targets:
        """Apply with ``params`` (from :meth:`draw` or a record): a pure function of its arguments."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """The albumentations ``to_dict`` form: ``{"__class_fullname__": name, field: value, ...}``."""
        d: dict[str, Any] = {"__class_fullname__": self.name}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            d[f.name] = list(value) if isinstance(value, tuple) else value
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Transform:
        """Build from :meth:`to_dict` output; ``where`` locates ``d`` in its file for error messages.

        The default reads the dataclass fields by name (lists become tuples) and refuses other keys;
        subclasses that accept more (albumentations' defaults) override it.
        """
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        extra = sorted(set(d) - names - {"__class_fullname__"})
        if extra:
            raise ConfigError(f"{where}: {cls.name} has no field {extra[0]!r}; its fields: {', '.join(sorted(names))}")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names}
        try:
            return cls(**kw)
        except TypeError as exc:
            raise ConfigError(f"{where}: {cls.name}: {exc}") from None


T = TypeVar("T", bound=type[Transform])

#: Operation classes by registry name.
REGISTRY: dict[str, type[Transform]] = {}


def register(cls: T) -> T:
    """Class decorator: make ``cls`` readable from configs under ``cls.name``."""
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"transform name {cls.name!r} is empty or taken")
    REGISTRY[cls.name] = cls
    return cls


def transform_from_dict(d: Any, where: str) -> Transform:
    """The operation a ``{"__class_fullname__": NAME, ...}`` entry describes; unknown names are a
    :class:`~dlpack.errors.ConfigError` naming the entry and listing what dlpack reads."""
    if not isinstance(d, Mapping) or not isinstance(d.get("__class_fullname__"), str):
        raise ConfigError(f"{where}: each transform is an object with a '__class_fullname__' string, got {d!r}")
    name = d["__class_fullname__"].rsplit(".", 1)[-1]  # albumentations may write a module path
    cls = REGISTRY.get(name)
    if cls is None:
        known = ", ".join(sorted(REGISTRY))
        raise ConfigError(
            f"{where}: unknown transform {name!r}; dlpack reads {known} (or run the whole pipeline with "
            "--augment-engine albumentations, with albumentations installed)"
        )
    return cls.from_dict(d, where)


def check_probability(value: Any, where: str) -> float:
    """``value`` as a probability 0..1, or a ConfigError naming ``where``."""
    return check_number(value, where, 0.0, 1.0)


def check_number(value: Any, where: str, lo: float | None = None, hi: float | None = None) -> float:
    """A real number in ``[lo, hi]``, or a ConfigError that names ``where`` and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or value != value:
        raise ConfigError(f"{where} must be a number, got {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond a float
        finite = False
    if not finite:
        got = f"an integer of {value.bit_length()} bits" if isinstance(value, int) else repr(value)
        raise ConfigError(f"{where} must be a finite number, got {got}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
        raise ConfigError(f"{where} must be in {span}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class OneOf(Transform):
    """Exactly one of ``transforms``, drawn with weights proportional to their ``p`` (albumentations'
    ``OneOf``; HALCON's "one operation per augmented sample" with equal weights)."""

    name: ClassVar[str] = "OneOf"
    transforms: tuple[Transform, ...] = ()
    p: float = 0.5

    def __post_init__(self) -> None:
        check_probability(self.p, "OneOf.p")
        if not self.transforms:
            raise ConfigError("OneOf needs at least one transform")

    def choose(self, rng: np.random.Generator, t: Targets | None = None) -> Transform | None:
        """One member, weighted by ``p``, among those that can change ``t`` (None: none can)."""
        members = self.transforms if t is None else tuple(op for op in self.transforms if op.changes(t))
        if not members:
            return None
        weights = np.array([op.p for op in members], np.float64)
        if weights.sum() <= 0:
            weights = np.ones(len(members))
        return members[int(rng.choice(len(members), p=weights / weights.sum()))]

    def changes(self, t: Targets) -> bool:
        """Whether any member can change ``t``."""
        return any(op.changes(t) for op in self.transforms)

    def to_dict(self) -> dict[str, Any]:
        """The albumentations form: ``p`` and the members' own ``to_dict``."""
        return {"__class_fullname__": self.name, "p": self.p, "transforms": [t.to_dict() for t in self.transforms]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> Transform:
        """Reads ``transforms`` (each entry by :func:`transform_from_dict`) and ``p`` (0.5 when absent)."""
        items = d.get("transforms")
        if not isinstance(items, list):
            raise ConfigError(f"{where}.transforms must be a list of transforms")
        return cls(
            tuple(transform_from_dict(x, f"{where}.transforms[{k}]") for k, x in enumerate(items)),
            check_probability(d.get("p", 0.5), f"{where}.p"),
        )


register(OneOf)


def _areas(boxes: np.ndarray | None) -> np.ndarray | None:
    if boxes is None:
        return None
    b = np.asarray(boxes, np.float64).reshape(-1, 4)
    return np.clip(b[:, 2] - b[:, 0], 0, None) * np.clip(b[:, 3] - b[:, 1], 0, None)


#: Square pixels an area may lose to float32 rounding (a mirror's ``W - x``) and still count as unchanged.
_AREA_SLACK = 1e-3


def _finish_boxes(t: Targets, min_area: float, min_visibility: float, before: np.ndarray | None = None) -> Targets:
    """Drop the boxes the operations left without area, below ``min_area`` pixels or below
    ``min_visibility``, with their labels.

    ``before`` is each box's area in the original (operations keep the box count): a box already
    below ``min_area`` there is dropped only if an operation made it smaller still, so a variant
    never loses a label its original has just because the box is small.
    """
    if t.boxes is None:
        return t
    b = t.boxes
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    vis = t.visibility if t.visibility is not None else np.ones(len(b))
    area = w.astype(np.float64) * h
    small = area < min_area
    if before is not None and len(before) == len(b):
        small &= area < before - _AREA_SLACK
    keep = (w > 0) & (h > 0) & ~small & (vis >= min_visibility)
    return t.moved(b, np.ones(len(b)), keep).replace(visibility=None)


@dataclass(frozen=True)
class Pipeline:
    """Operations applied in order, each with its ``p``; what a config file describes.

    ``kind`` says which vocabulary the config used (``"albumentations"`` or ``"halcon"``);
    ``min_area`` (pixels) and ``min_visibility`` (0..1) drop boxes at the end, as albumentations'
    ``bbox_params`` do.
    """

    ops: tuple[Transform, ...]
    min_area: float = DEFAULT_MIN_AREA
    min_visibility: float = DEFAULT_MIN_VISIBILITY
    kind: str = "albumentations"
    #: Records the engine that produced a variant (an albumentations delegate says "albumentations").
    engine: ClassVar[str] = "dlpack"

    def __post_init__(self) -> None:
        check_number(self.min_area, "min_area", 0.0)
        check_probability(self.min_visibility, "min_visibility")

    def __call__(self, t: Targets, rng: np.random.Generator) -> tuple[Targets, list[dict[str, Any]]]:
        """One variant of ``t`` and the record of what was applied (``[]``: nothing was)."""
        record: list[dict[str, Any]] = []
        before = _areas(t.boxes)
        if t.boxes is not None and t.visibility is None:
            t = t.replace(visibility=np.ones(len(t.boxes), np.float64))
        for op in self.ops:
            if rng.random() >= op.p:
                continue
            chosen = op.choose(rng, t) if isinstance(op, OneOf) else op
            if chosen is None or not chosen.changes(t):
                continue  # it could only leave the image as it is
            params = chosen.draw(rng, t)
            t = chosen.apply(t, params)
            record.append({"op": chosen.name, **params})
        return _finish_boxes(t, self.min_area, self.min_visibility, before), record

    def replay(self, t: Targets, record: Sequence[Mapping[str, Any]]) -> Targets:
        """Apply a record made by :meth:`__call__` again (no generator involved)."""
        before = _areas(t.boxes)
        if t.boxes is not None and t.visibility is None:
            t = t.replace(visibility=np.ones(len(t.boxes), np.float64))
        for entry in record:
            params = {k: v for k, v in entry.items() if k != "op"}
            t = REGISTRY[entry["op"]].apply(self._op(entry["op"]), t, params)
        return _finish_boxes(t, self.min_area, self.min_visibility, before)

    def _op(self, name: str) -> Transform:
        for op in self.ops:
            for cand in op.transforms if isinstance(op, OneOf) else (op,):
                if cand.name == name:
                    return cand
        raise ConfigError(f"the record names {name!r}, which this pipeline does not have")

    def to_dict(self) -> dict[str, Any]:
        """The normalised operation list the manifest records."""
        return {
            "kind": self.kind,
            "engine": self.engine,
            "min_area": self.min_area,
            "min_visibility": self.min_visibility,
            "transforms": [op.to_dict() for op in self.ops],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "pipeline") -> Pipeline:
        """Read :meth:`to_dict` output back (the manifest's normalised form)."""
        items = d.get("transforms")
        if not isinstance(items, list):
            raise ConfigError(f"{where}.transforms must be a list")
        return cls(
            tuple(transform_from_dict(x, f"{where}.transforms[{k}]") for k, x in enumerate(items)),
            check_number(d.get("min_area", DEFAULT_MIN_AREA), f"{where}.min_area", 0.0),
            check_probability(d.get("min_visibility", DEFAULT_MIN_VISIBILITY), f"{where}.min_visibility"),
            str(d.get("kind", "albumentations")),
        )


#: What the augment build calls: a pipeline, or an engine with the same call (albumentations).
Augmenter = Callable[[Targets, np.random.Generator], tuple[Targets, list[dict[str, Any]]]]
