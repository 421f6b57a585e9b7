"""albumentations ``to_dict`` documents (JSON or YAML, as ``A.save`` writes them), read two ways.

:func:`pipeline_from_albumentations` reads the document with dlpack's own operations
(:mod:`.ops`), so a user's pipeline file works without albumentations installed. The top level is a
``Compose``, optionally with ``OneOf`` groups inside; its ``bbox_params`` give ``min_area`` and
``min_visibility``. dlpack's boxes are always pascal_voc pixel corners, so the ``format`` only says
how the user fed albumentations and is accepted whatever it is. A feature dlpack does not implement
(keypoints, additional targets, a ``Compose`` applied with p < 1) is a
:class:`~dlpack.errors.ConfigError` naming it.

:class:`AlbumentationsEngine` instead runs the whole document with albumentations itself
(``--augment-engine albumentations``), seeded per variant from the generator it is called with.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, MissingExtraError
from .base import DEFAULT_MIN_AREA, DEFAULT_MIN_VISIBILITY, OneOf, Pipeline, Targets, Transform, check_number
from .ops import ALBUMENTATIONS_OPS, release_defaults

__all__ = ["is_albumentations", "pipeline_from_albumentations", "AlbumentationsEngine"]

_COMPOSES = ("Compose", "ReplayCompose")
#: How albumentations was told the boxes are written; dlpack's are pascal_voc pixel corners whatever it says.
_BOX_FORMATS = ("pascal_voc", "coco", "yolo", "albumentations")
#: Compose keys that change nothing dlpack computes.
_HARMLESS = ("is_check_shapes", "strict", "save_key", "save_applied_params", "seed", "mask_interpolation")
#: The largest array of a parameter an engine record keeps (a noise map is left out; a matrix stays).
_RECORD_ARRAY_LIMIT = 64


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _name(entry: Any) -> str | None:
    if isinstance(entry, Mapping) and isinstance(entry.get("__class_fullname__"), str):
        return str(entry["__class_fullname__"]).rsplit(".", 1)[-1]
    return None


def is_albumentations(doc: Any) -> bool:
    """Whether ``doc`` is an albumentations document: an object with ``__version__`` and ``transform``."""
    return isinstance(doc, Mapping) and "__version__" in doc and "transform" in doc


def _release(doc: Mapping[str, Any], where: str) -> int:
    """The major release that wrote ``doc`` (1 or 2): missing keys take that release's defaults."""
    version = doc.get("__version__")
    head = str(version).split(".", 1)[0] if isinstance(version, (str, int, float)) else ""
    if not head.isdigit():
        raise ConfigError(
            f'{where}: __version__ must be the albumentations release, e.g. "2.0.8"; got {_shown(version)}'
        )
    return int(head)


def _compose(doc: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    top = doc["transform"]
    if _name(top) not in _COMPOSES:
        raise ConfigError(
            f"{where}: transform must be a Compose (with OneOf groups inside), got {_shown(_name(top) or top)}"
        )
    assert isinstance(top, Mapping)
    return top


def pipeline_from_albumentations(doc: Mapping[str, Any], where: str) -> Pipeline:
    """The :class:`~dlpack.transforms.base.Pipeline` an albumentations document describes.

    ``where`` names the document in messages (its file name). Every operation, key and value is
    checked: a :class:`~dlpack.errors.ConfigError` names the entry (``transform.transforms[2]``),
    the operation and the key.
    """
    if not is_albumentations(doc):
        raise ConfigError(f"{where}: not an albumentations document (it needs __version__ and transform)")
    major = _release(doc, where)
    top = _compose(doc, f"{where}: transform")
    at = f"{where}: transform ({_name(top)})"
    known = (
        "__class_fullname__",
        "p",
        "transforms",
        "bbox_params",
        "keypoint_params",
        "additional_targets",
        *_HARMLESS,
    )
    extra = [k for k in top if k not in known]
    if extra:
        raise ConfigError(f"{at}.{extra[0]}: not a Compose key dlpack reads (it reads: {', '.join(known[1:])})")
    if top.get("p", 1.0) != 1.0:
        raise ConfigError(
            f"{at}.p: dlpack supports only 1.0 (every variant goes through the pipeline), got {_shown(top['p'])}"
        )
    if top.get("keypoint_params") is not None:
        raise ConfigError(
            f"{at}.keypoint_params: dlpack has no keypoints; supports only null, got {_shown(top['keypoint_params'])}"
        )
    if top.get("additional_targets"):
        raise ConfigError(
            f"{at}.additional_targets: dlpack augments one image with its boxes and mask; supports only {{}}, "
            f"got {_shown(top['additional_targets'])}"
        )
    min_area, min_visibility = _box_rules(top.get("bbox_params"), f"{at}.bbox_params")
    items = top.get("transforms")
    if not isinstance(items, list):
        raise ConfigError(f"{at}.transforms must be a list of transforms, got {_shown(items)}")
    ops = tuple(_transform(x, f"{where}: transform.transforms[{k}]", major) for k, x in enumerate(items))
    return Pipeline(ops, min_area, min_visibility, kind="albumentations")


def _box_rules(params: Any, at: str) -> tuple[float, float]:
    """``(min_area, min_visibility)`` from ``bbox_params`` (dlpack's defaults without it)."""
    if params is None:
        return DEFAULT_MIN_AREA, DEFAULT_MIN_VISIBILITY
    if not isinstance(params, Mapping):
        raise ConfigError(f"{at} must be an object, got {_shown(params)}")
    known = (
        "format",
        "label_fields",
        "min_area",
        "min_visibility",
        "min_width",
        "min_height",
        "check_each_transform",
        "clip",
        "max_accept_ratio",
        "filter_invalid_bboxes",
    )
    extra = [k for k in params if k not in known]
    if extra:
        raise ConfigError(f"{at}.{extra[0]}: not a bbox_params key dlpack reads (it reads: {', '.join(known)})")
    fmt = params.get("format", "pascal_voc")
    if fmt not in _BOX_FORMATS:
        raise ConfigError(f"{at}.format must be one of {', '.join(_BOX_FORMATS)}, got {_shown(fmt)}")
    labels = params.get("label_fields")
    if labels is not None and not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)):
        raise ConfigError(f"{at}.label_fields must be a list of names, got {_shown(labels)}")
    for key in ("check_each_transform", "clip", "filter_invalid_bboxes"):
        if key in params and not isinstance(params[key], bool):
            raise ConfigError(f"{at}.{key} must be true or false, got {_shown(params[key])}")
    for key in ("min_width", "min_height"):
        if params.get(key, 0) not in (0, None):
            raise ConfigError(f"{at}.{key}: dlpack supports only 0 (use min_area), got {_shown(params[key])}")
    if params.get("max_accept_ratio") is not None:
        raise ConfigError(f"{at}.max_accept_ratio: dlpack supports only null, got {_shown(params['max_accept_ratio'])}")
    # albumentations' own default area is 0 (keep every box with an area); a file that says so gets it.
    area = check_number(params.get("min_area", 0.0), f"{at}.min_area", 0.0)
    visibility = check_number(params.get("min_visibility", 0.0), f"{at}.min_visibility", 0.0, 1.0)
    return area, visibility


def _transform(entry: Any, where: str, major: int) -> Transform:
    name = _name(entry)
    if name is None:
        raise ConfigError(
            f"{where}: each transform is an object with a '__class_fullname__' string, got {_shown(entry)}"
        )
    assert isinstance(entry, Mapping)
    if name == "OneOf":
        extra = [k for k in entry if k not in ("__class_fullname__", "p", "transforms", "always_apply")]
        if extra:
            raise ConfigError(f"{where} (OneOf).{extra[0]}: not a OneOf key dlpack reads (it reads: p, transforms)")
        items = entry.get("transforms")
        if not isinstance(items, list) or not items:
            raise ConfigError(f"{where} (OneOf).transforms must be a non-empty list of transforms")
        p = (
            1.0
            if entry.get("always_apply") is True
            else check_number(entry.get("p", 0.5), f"{where} (OneOf).p", 0.0, 1.0)
        )
        return OneOf(tuple(_transform(x, f"{where}.transforms[{k}]", major) for k, x in enumerate(items)), p)
    cls = ALBUMENTATIONS_OPS.get(name)
    if cls is None:
        where_to = "at the top only" if name in _COMPOSES else "not at all"
        known = ", ".join(["OneOf", *sorted(ALBUMENTATIONS_OPS)])
        raise ConfigError(
            f"{where}: unknown transform {name!r} (dlpack reads a Compose {where_to} here); dlpack reads {known}, "
            "or run the whole pipeline with --augment-engine albumentations, with albumentations installed"
        )
    return cls.from_dict(release_defaults(entry, major), where)


# ---------------------------------------------------------------- the albumentations engine


def _albumentations() -> Any:
    """albumentations, imported on first use; its update check (a network call at import) is off
    unless ``NO_ALBUMENTATIONS_UPDATE`` is set otherwise."""
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    try:
        import albumentations
    except ImportError as exc:
        raise MissingExtraError("albumentations", "albumentations", "--augment-engine albumentations") from exc
    return albumentations


_SKIP = object()


def _json_ready(value: Any) -> Any:
    """``value`` as JSON types; arrays over :data:`_RECORD_ARRAY_LIMIT` elements and objects JSON
    cannot hold are left out (``_SKIP``)."""
    if isinstance(value, np.ndarray):
        return value.tolist() if value.size <= _RECORD_ARRAY_LIMIT else _SKIP
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_json_ready(v) for v in value]
        return _SKIP if any(v is _SKIP for v in items) or len(items) > _RECORD_ARRAY_LIMIT else items
    if isinstance(value, Mapping):
        out = {str(k): _json_ready(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not _SKIP}
    return _SKIP


class AlbumentationsEngine:
    """Runs an albumentations document with albumentations itself; called like a Pipeline.

    Each call draws a 32-bit seed from the generator it is given (``variant_rng(seed, i, v)`` in a
    build) and seeds albumentations with it, so a variant is a function of (seed, i, v) for one
    albumentations release. Boxes go in and out as pascal_voc pixel corners with their labels and
    crowd flags as label fields (the document's ``bbox_params`` keep their ``min_area`` and
    ``min_visibility``); the mask goes along. The record is ``[{"op": "albumentations", "seed": s},
    {"op": name, **params}, ...]``: the seed, then the transforms albumentations says it applied
    (2.x), their small parameters JSON-ready.
    """

    engine: ClassVar[str] = "albumentations"

    def __init__(self, doc: Mapping[str, Any], where: str = "config") -> None:
        if not is_albumentations(doc):
            raise ConfigError(
                f"{where}: --augment-engine albumentations needs an albumentations document (__version__, transform)"
            )
        _compose(doc, f"{where}: transform")
        self.doc: dict[str, Any] = json.loads(json.dumps(doc))
        self.where = where
        self._pipeline: Any = None
        _albumentations()  # fail now, not in the first worker

    def __getstate__(self) -> dict[str, Any]:
        return {"doc": self.doc, "where": self.where, "_pipeline": None}  # each process builds its own

    @staticmethod
    def version() -> str:
        """The installed albumentations release (for the manifest's ``versions``)."""
        return str(_albumentations().__version__)

    def to_dict(self) -> dict[str, Any]:
        """What the manifest records as the operations: the document albumentations runs."""
        return {"kind": "albumentations", "engine": self.engine, "document": self.doc}

    def _compose(self) -> Any:
        if self._pipeline is not None:
            return self._pipeline
        A = _albumentations()
        doc = json.loads(json.dumps(self.doc))
        top = doc["transform"]
        given = top.get("bbox_params") or {"min_area": DEFAULT_MIN_AREA, "min_visibility": DEFAULT_MIN_VISIBILITY}
        boxes = {**given, "format": "pascal_voc", "label_fields": ["box_labels", "box_crowd"]}
        try:
            import inspect

            if "clip" in inspect.signature(A.BboxParams).parameters:
                boxes["clip"] = True  # stored boxes lie on the canvas; float rounding must not refuse one
        except (TypeError, ValueError):
            pass
        top["bbox_params"] = boxes
        try:
            compose = A.from_dict(doc)
        except Exception as exc:  # albumentations raises many kinds for a document it cannot build
            raise ConfigError(
                f"{self.where}: albumentations {A.__version__} cannot build this pipeline: {exc}"
            ) from None
        if hasattr(compose, "save_applied_params"):
            compose.save_applied_params = True
        self._pipeline = compose
        return compose

    def __call__(self, t: Targets, rng: np.random.Generator) -> tuple[Targets, list[dict[str, Any]]]:
        """One variant from albumentations seeded by ``rng``; the record is that seed and what it reports
        it applied (a ConfigError names the file when albumentations fails)."""
        compose = self._compose()
        seed = int(rng.integers(0, 2**32 - 1))
        if hasattr(compose, "set_random_seed"):
            compose.set_random_seed(seed)
        else:  # 1.x draws from the global generators
            random.seed(seed)
            np.random.seed(seed)
        n = 0 if t.boxes is None else len(t.boxes)
        labels = t.box_labels if t.box_labels is not None else np.zeros(n, np.int32)
        crowd = t.box_crowd if t.box_crowd is not None else np.zeros(n, np.uint8)
        data: dict[str, Any] = {
            "image": t.image,
            "bboxes": [] if t.boxes is None else np.asarray(t.boxes, np.float64).tolist(),
            "box_labels": [int(x) for x in labels],
            "box_crowd": [int(x) for x in crowd],
        }
        if t.mask is not None:
            data["mask"] = t.mask
        try:
            out = compose(**data)
        except Exception as exc:  # noqa: BLE001 - whatever albumentations raises, say where
            raise ConfigError(
                f"{self.where}: albumentations failed on a {t.image.shape[1]}x{t.image.shape[0]} "
                f"{t.image.dtype} image with {t.image.shape[2]} channel(s): {exc}"
            ) from None
        image = np.asarray(out["image"])
        if image.ndim == 2:
            image = image[:, :, None]
        if image.dtype != t.image.dtype:
            raise ConfigError(f"{self.where}: albumentations returned a {image.dtype} image for a {t.image.dtype} one")
        mask = None if t.mask is None else np.ascontiguousarray(np.asarray(out["mask"]), t.mask.dtype)
        boxes = np.asarray(out["bboxes"], np.float64).reshape(
            -1, np.shape(out["bboxes"])[-1] if len(out["bboxes"]) else 4
        )
        result = t.replace(
            image=np.ascontiguousarray(image),
            mask=mask,
            boxes=None if t.boxes is None else np.ascontiguousarray(boxes[:, :4], np.float32),
            box_labels=None if t.box_labels is None else np.asarray(out["box_labels"], np.int32),
            box_crowd=None if t.box_crowd is None else np.asarray(out["box_crowd"], np.uint8),
            visibility=None,
        )
        record: list[dict[str, Any]] = [{"op": "albumentations", "seed": seed}]
        for name, params in out.get("applied_transforms", []) or []:
            ready = _json_ready(params) if isinstance(params, Mapping) else {}
            record.append({"op": str(name), **{k: v for k, v in ready.items() if k != "op"}})
        return result, record
