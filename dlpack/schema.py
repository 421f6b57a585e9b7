"""The store's schema in one place: the arrays a dlpack store may hold, their sample keys, which
of them are codes into a manifest list, and which ``add_array`` never writes.

Readers (:mod:`dlpack.backends.base`, :mod:`dlpack.read.dataset`, :mod:`dlpack.torch`) and
``add_array`` ask here instead of spelling array names themselves, so a new array of the format
is added in one table (docs/format.md, "Arrays a build writes"). Imports nothing of dlpack: every
layer may use it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "ARRAYS",
    "BASE_KEYS",
    "CODED",
    "PROTECTED_ARRAYS",
    "TASKS",
    "ArrayRole",
    "AUGMENT",
    "VARIANT_BASES",
    "variant_array",
    "variant_of",
    "image_array",
    "required_arrays",
]


@dataclass(frozen=True)
class ArrayRole:
    """What one array name means in a store.

    ``key`` is its key in ``ds[i]`` and batches (None: internal). ``dtypes`` are the dtypes the
    format writes it with (readers pass any numeric dtype through). ``codes`` names the manifest
    list its values index (``classes``, ``splits``, ``defects``), checked whenever the array is
    read; ``lowest`` is the smallest valid code (-1 means "none" where a sample may have none).
    ``protected`` arrays identify the samples or record where their pixels came from, so
    ``add_array`` never writes them.
    """

    name: str
    key: str | None
    ragged: bool
    dtypes: tuple[str, ...]
    codes: str | None = None
    lowest: int = -1
    protected: bool = False


IMAGES = "images"  # fixed layout: [N, H, W, C]
IMAGE = "image"  # variable layout: ragged flat pixels, with IMAGE_SHAPES
IMAGE_SHAPES = "image_shapes"
LABELS = "labels"
SPLIT = "split"
SOURCE = "source"
CHECKSUM = "checksum"
BOXES = "boxes"
MASK = "mask"
DEFECT = "defect"

_ROLES = (
    ArrayRole(IMAGES, "image", False, ("|u1", "<u2"), protected=True),
    ArrayRole(IMAGE, None, True, ("|u1", "<u2"), protected=True),
    ArrayRole(IMAGE_SHAPES, None, False, ("<i4",), protected=True),
    ArrayRole(LABELS, "label", False, ("<i4",), codes="classes"),
    ArrayRole(SPLIT, "split", False, ("|i1",), codes="splits"),
    ArrayRole(BOXES, "boxes", True, ("<f4",)),
    ArrayRole("box_labels", "box_labels", True, ("<i4",), codes="classes", lowest=0),
    ArrayRole("box_crowd", "box_crowd", True, ("|u1",)),
    ArrayRole(MASK, "mask", False, ("|u1", "<u2")),
    ArrayRole(DEFECT, "defect", False, ("<i4",), codes="defects"),
    ArrayRole("orientation", None, False, ("|u1",), protected=True),
    ArrayRole(SOURCE, None, True, ("|u1",), protected=True),
    ArrayRole("transform", None, False, ("<f8",), protected=True),
    ArrayRole(CHECKSUM, None, False, ("<u4",), protected=True),
    ArrayRole("original_size", None, False, ("<i4",), protected=True),
    ArrayRole("source_stat", None, False, ("<i8",), protected=True),
    ArrayRole("source_sha256", None, False, ("|u1",), protected=True),
    # SHA-256 of a sample's annotations and label files: how --update sees that only the labels changed.
    ArrayRole("label_sha256", None, False, ("|u1",), protected=True),
)

#: Every array name the format gives a meaning, by name.
ARRAYS: Mapping[str, ArrayRole] = {r.name: r for r in _ROLES}
#: Arrays whose values are codes into a manifest list, checked against it when read.
CODED: Mapping[str, ArrayRole] = {r.name: r for r in _ROLES if r.codes is not None}
#: Arrays add_array never writes: the pixels, what identifies a sample, what ``--update`` trusts.
PROTECTED_ARRAYS = frozenset(r.name for r in _ROLES if r.protected)
#: Stored names whose bytes are covered by per-image CRCs rather than read whole against a SHA-256.
PIXEL_ARRAYS = (IMAGES, IMAGE + "_data")
#: Keys every sample has; no other array may take them.
BASE_KEYS = ("image", "label", "index", "source")
#: Values of the manifest's ``task``.
TASKS = ("classification", "detection", "segmentation", "anomaly", "none")


def store_task(arrays: Iterable[str], classes: Sequence[str], labelled: bool, recorded: str | None) -> str:
    """The task of a store with these array names and classes: the one rule every reader uses.

    From the arrays: a ``defect`` array, or the classes exactly ``ok``/``nok`` without boxes, is
    anomaly; ``boxes`` detection (a mask beside them is the boxes' masks); a ``mask``
    segmentation; class labels classification; nothing ``none``. A recorded task other than
    ``classification``/``none`` wins; those two give way to label arrays added later with
    ``add_array`` (which leaves the manifest's task as it was), and are what older stores imply.
    """
    names = set(arrays)
    if DEFECT in names or (set(classes) == {"ok", "nok"} and BOXES not in names):
        implied = "anomaly"
    elif BOXES in names:
        implied = "detection"
    elif MASK in names:
        implied = "segmentation"
    else:
        implied = "classification" if classes and labelled else "none"
    if recorded and (recorded not in ("classification", "none") or implied in ("classification", "none")):
        return recorded
    return implied


#: Arrays a store's augmentation variants have, one set per variant ``v`` (1..K): ``NAME_v{v}``
#: (docs/format.md, "Augmentation variants"). ``augment`` holds the record of what was applied (JSON
#: text per sample); ``checksum`` the CRC-32 of each variant image. None of them has a sample key:
#: ``ds.variant(i, v)`` and ``loader(augment="cached")`` read them.
AUGMENT = "augment"
VARIANT_BASES = (IMAGES, MASK, BOXES, "box_labels", "box_crowd", CHECKSUM, AUGMENT)
_VARIANT = re.compile(r"(?P<base>[a-z][a-z0-9_]*?)_v(?P<v>[1-9][0-9]*)")


def variant_array(base: str, v: int) -> str:
    """The name of array ``base`` (one of :data:`VARIANT_BASES`) of variant ``v >= 1``: ``images_v3``."""
    if base not in VARIANT_BASES or not isinstance(v, int) or v < 1:
        raise ValueError(f"no variant array {base!r} for variant {v!r}")
    return f"{base}_v{v}"


def variant_of(name: str) -> tuple[str, int] | None:
    """``(base, v)`` when ``name`` is a variant array's name (``boxes_v2`` -> ``("boxes", 2)``), else None."""
    m = _VARIANT.fullmatch(name)
    if m is None or m["base"] not in VARIANT_BASES:
        return None
    return m["base"], int(m["v"])


def image_array(layout: str) -> str:
    """The array holding a store's pixels: ``images`` (fixed layout) or ``image`` (variable)."""
    return IMAGES if layout == "fixed" else IMAGE


def required_arrays(layout: str) -> tuple[str, ...]:
    """The arrays every complete store of ``layout`` has."""
    extra = (IMAGE_SHAPES,) if layout == "variable" else ()
    return (image_array(layout), LABELS, CHECKSUM, SOURCE, *extra)
