"""Output sizes an augmentation config fixes in its settings, known before any image is made.

Every variant keeps the stored size; a worker otherwise finds a wrong size only after making the
first variant, at whatever size the config asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .base import OneOf, Pipeline, Transform

__all__ = ["output_size_problem"]


#: albumentations transforms whose settings fix the size of what they return.
_SIZED = ("Resize", "RandomResizedCrop", "RandomSizedCrop", "CenterCrop", "RandomCrop")
#: albumentations containers that apply their transforms in order (the others pick among them).
_SEQUENCES = ("Compose", "Sequential")
#: No intermediate image may be larger (the most pixels a build decodes, ``max_pixels``'s default).
_MAX_PIXELS = 2**28

_Outcome = tuple[tuple[int, int], str] | None  # (height, width) and the operation; None: size kept


def _whole_size(value: Any) -> tuple[int, int] | None:
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer() for v in value)
    ):
        return int(value[0]), int(value[1])
    return None


def _doc_size(node: Mapping[str, Any], name: str) -> tuple[int, int] | None:
    """The ``(height, width)`` an albumentations entry's settings give, None where they give none."""
    size = node.get("size") if name in ("RandomResizedCrop", "RandomSizedCrop") else None
    return _whole_size(size if size is not None else (node.get("height"), node.get("width")))


def _outcomes(node: Any) -> tuple[set[_Outcome], list[tuple[tuple[int, int], str]]]:
    """What sizes ``node`` (a dlpack operation or pipeline, or an albumentations entry) can leave an
    image at, and every size it makes on the way."""
    if isinstance(node, Pipeline):
        kind, children, p, name, size = "seq", list(node.ops), 1.0, "", None
    elif isinstance(node, OneOf):
        kind, children, p, name, size = "any", list(node.transforms), node.p, "OneOf", None
    elif isinstance(node, Transform):
        kind, children, p, name = "op", [], node.p, node.name
        size = getattr(node, "size", None) if name == "RandomResizedCrop" else None
        if name == "RandomCrop":
            size = (getattr(node, "height", 0), getattr(node, "width", 0))
    elif isinstance(node, Mapping):
        name = str(node.get("__class_fullname__", "")).rsplit(".", 1)[-1]
        children = list(node.get("transforms") or []) if isinstance(node.get("transforms"), list) else []
        kind = "seq" if name in _SEQUENCES else "any" if children else "op"
        raw_p = node.get("p", 1.0)
        p = float(raw_p) if isinstance(raw_p, (int, float)) and not isinstance(raw_p, bool) else 1.0
        size = _doc_size(node, name) if name in _SIZED else None
    else:
        return {None}, []
    if kind == "op":
        made = [(size, name)] if size is not None else []
        ends: set[_Outcome] = {(size, name)} if size is not None else {None}
    elif kind == "seq":
        ends, made = {None}, []
        for child in children:
            after, sizes = _outcomes(child)
            made += sizes
            ends = (after - {None}) | (ends if None in after else set())
    else:
        ends, made = set(), []
        for child in children:
            after, sizes = _outcomes(child)
            made += sizes
            ends |= after
    if p < 1.0:
        ends.add(None)  # skipped: the size it came in with
    return ends, made


def output_size_problem(augmenter: Any, height: int, width: int) -> str | None:
    """Why ``augmenter`` cannot keep a ``width x height`` store's size, known from its settings alone.

    Every variant keeps the stored size, which a worker otherwise finds out only after it made the
    first one, at whatever size the config asks for (a ``RandomResizedCrop`` to 100000x100000
    allocates 30 GB first). Sizes that only the images decide (crops by a share) are not known
    here; the worker checks them.
    """
    node = augmenter.doc.get("transform") if isinstance(getattr(augmenter, "doc", None), Mapping) else augmenter
    ends, made = _outcomes(node)
    for (h, w), name in made:
        if h * w > _MAX_PIXELS:
            return f"{name} makes {w}x{h} images, more than {_MAX_PIXELS:,} pixels; the store holds {width}x{height}"
    for end in ends:
        if end is not None and end[0] != (height, width):
            (h, w), name = end
            return (
                f"{name} makes {w}x{h} images, but the store holds {width}x{height} images and every variant "
                f"keeps the stored size: make its size [{height}, {width}] (height, width), or resize back after it"
            )
    return None
