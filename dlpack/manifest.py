"""The store manifest: a frozen, versioned description of a store, serialised as sorted JSON.

The manifest is written last, so its presence marks a complete store (docs/format.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from . import schema
from .errors import FormatVersionError, InputFileError, OptionError, StoreError

__all__ = ["FORMAT_VERSION", "ArraySpec", "ImageSpec", "Manifest", "sha256_hex", "store_generation"]

#: Bumped only when the meaning of an existing array or field changes, so a reader of the previous
#: version could misread a new store. Additions are optional arrays and fields that an older reader
#: ignores (checksums, the generation, the label arrays and fields), so they stay within version 1.
FORMAT_VERSION = 1
FORMAT_NAME = "dlpack"
_HEX64 = re.compile(r"[0-9a-f]{64}")
#: An array's checksum: the SHA-256 of its bytes, or ``shards:`` and the SHA-256 of its shards' row
#: hashes (a store written to object storage; dlpack.backends.base.shard_digest).
_DIGEST = re.compile(r"(shards:)?[0-9a-f]{64}")
_COMPRESSIONS = ("none", "lz4", "zstd")


def sha256_hex(data: bytes | str) -> str:
    """SHA-256 hex digest of ``data`` (str as UTF-8)."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def store_generation(count: int, digests: Mapping[str, str]) -> str:
    """A store's generation: a digest of its sample count and every stored array's SHA-256, so two
    stores share it only when every array holds the same bytes."""
    doc = json.dumps({"count": count, "arrays": dict(sorted(digests.items()))}, sort_keys=True, separators=(",", ":"))
    return sha256_hex(doc)


@dataclass(frozen=True)
class ImageSpec:
    """What every stored image looks like.

    ``layout`` is ``"fixed"`` (``images`` is [N, H, W, C]) or ``"variable"`` (flat ``image_data``
    with ``image_offsets`` and ``image_shapes``). ``dtype`` is a NumPy dtype string (``"|u1"``, ``"<u2"``).
    """

    layout: str
    channels: int
    dtype: str
    height: int | None = None
    width: int | None = None

    @property
    def shape(self) -> tuple[int, int, int] | None:
        """(H, W, C) for fixed-size stores, else None."""
        if self.layout != "fixed" or self.height is None or self.width is None:
            return None
        return (self.height, self.width, self.channels)


_ARRAY_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
#: Suffixes of the two stored arrays behind a ragged array; no array name may end in them.
RAGGED_SUFFIXES = ("_data", "_offsets")


@dataclass(frozen=True)
class ArraySpec:
    """One named per-sample array of a store.

    A fixed array holds one value of trailing ``shape`` per sample and is stored as ``NAME``
    with shape ``[N, *shape]``. A ragged array holds a variable number of rows of ``shape`` per
    sample, stored CSR-style as ``NAME_data`` (``[rows, *shape]``) and ``NAME_offsets``
    (``[N + 1]`` int64, sample ``i`` is ``data[offsets[i]:offsets[i + 1]]``). ``key`` is the name the
    array has in a sample dict (``ds[i]``, loader batches); ``None`` keeps it out of samples.
    """

    name: str
    dtype: str
    shape: tuple[int, ...] = ()
    ragged: bool = False
    key: str | None = None
    compression: str = "none"
    #: SHA-256 hex of each stored array's bytes (C order, little-endian), by stored name; filled in
    #: by the writer's ``commit``. It says which bytes an array holds, not what kind of array it is,
    #: so it takes no part in comparing specs.
    sha256: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _ARRAY_NAME.fullmatch(self.name):
            raise OptionError(
                f"array name must be 1-64 lower-case letters, digits or '_', starting with a letter; got {self.name!r}"
            )
        try:
            dt = np.dtype(self.dtype)
        except TypeError as exc:
            raise OptionError(f"array {self.name!r}: {self.dtype!r} is not a NumPy dtype") from exc
        # Complex numbers are refused here, as the readers refuse them: store (real, imag) as a trailing axis.
        if dt.hasobject or dt.kind not in "biuf":
            raise OptionError(
                f"array {self.name!r}: dtype {dt} is not a plain numeric type (bool, integer or float; "
                "store complex values as a trailing axis of 2 floats)"
            )
        object.__setattr__(self, "dtype", dt.str)
        shape = tuple(self.shape)
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape):
            raise OptionError(f"array {self.name!r}: trailing shape must be positive integers, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if math.prod(self.shape) * dt.itemsize >= 2**40:
            raise OptionError(f"array {self.name!r}: one sample of shape {self.shape} would take over 1 TiB")
        if self.compression not in _COMPRESSIONS:
            raise OptionError(f"array {self.name!r}: compression must be none, lz4 or zstd, got {self.compression!r}")
        if self.key is not None and not isinstance(self.key, str):
            raise OptionError(f"array {self.name!r}: key must be a string or null, got {self.key!r}")
        digests = dict(self.sha256)
        for stored, digest in digests.items():
            if stored not in self.stored_names() or not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
                raise OptionError(f"array {self.name!r}: bad checksum entry {stored!r}: {digest!r}")
        object.__setattr__(self, "sha256", digests)

    @property
    def item_nbytes(self) -> int:
        """Bytes of one sample (fixed) or one row (ragged)."""
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def stored_names(self) -> tuple[str, ...]:
        """The names of the arrays that hold it on disk."""
        if self.ragged:
            return (self.name + "_data", self.name + "_offsets")
        return (self.name,)

    def to_dict(self) -> dict[str, Any]:
        """The manifest entry (the name is its key); ``sha256`` only once the array's checksums are recorded."""
        d: dict[str, Any] = {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "layout": "ragged" if self.ragged else "fixed",
            "key": self.key,
            "compression": self.compression,
        }
        if self.sha256:
            d["sha256"] = dict(sorted(self.sha256.items()))
        return d

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> ArraySpec:
        """The spec of manifest entry ``d``, every field checked: a StoreError names the array and the field."""
        if not isinstance(d, dict):
            raise StoreError(f"array {name!r}: its entry must be an object, got {type(d).__name__}")
        if d.get("layout") not in ("fixed", "ragged"):
            raise StoreError(f"array {name!r}: layout must be fixed or ragged, got {d.get('layout')!r}")
        shape = d.get("shape", [])
        if not isinstance(shape, list) or len(shape) > 32:
            raise StoreError(f"array {name!r}: shape must be a list of at most 32 integers, got {shape!r}")
        digests = d.get("sha256", {})
        if not isinstance(digests, dict):
            raise StoreError(f"array {name!r}: sha256 must be an object, got {digests!r}")
        return cls(
            name,
            _typed(d.get("dtype"), str, f"array {name!r} dtype"),
            tuple(shape),
            d["layout"] == "ragged",
            d.get("key"),
            _typed(d.get("compression", "none"), str, f"array {name!r} compression"),
            digests,
        )


def _typed(value: Any, kind: type, what: str) -> Any:
    """``value`` when it is a ``kind`` (bool is no int here), else a StoreError naming ``what``."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise StoreError(f"{what} must be {'an integer' if kind is int else 'a ' + kind.__name__}, got {value!r}")
    return value


def _image_spec(d: Any) -> ImageSpec:
    """An ImageSpec from the manifest's ``image`` object, every field checked."""
    if not isinstance(d, dict):
        raise StoreError(f"image must be an object, got {d!r}")
    layout = d.get("layout")
    if layout not in ("fixed", "variable"):
        raise StoreError(f"image.layout must be fixed or variable, got {layout!r}")
    channels = _typed(d.get("channels"), int, "image.channels")
    if channels not in (1, 3):
        raise StoreError(f"image.channels must be 1 or 3, got {channels}")
    dtype = d.get("dtype")
    if dtype not in ("|u1", "<u2"):
        raise StoreError(f"image.dtype must be '|u1' or '<u2', got {dtype!r}")
    size: list[int | None] = []
    for axis in ("height", "width"):
        v = d.get(axis)
        if layout == "fixed":
            if not 0 < _typed(v, int, f"image.{axis}") <= 2**31:
                raise StoreError(f"image.{axis} must be a positive integer, got {v!r}")
        elif v is not None:
            raise StoreError(f"image.{axis} must be null in a variable-size store, got {v!r}")
        size.append(v)
    return ImageSpec(layout, channels, dtype, size[0], size[1])


@dataclass(frozen=True)
class Manifest:
    """Versioned description of a store; ``arrays`` maps each per-sample array's name to its spec.

    ``splits`` names the codes of the ``split`` array (present when the source assigns splits):
    code ``k`` means ``splits[k]``, ``-1`` no split.

    ``plan`` is the build plan the store was written under (``dlpack.pack.BuildPlan.to_dict()``),
    so a later resume or update can check that it continues the same plan; empty for stores
    written before it was recorded.
    """

    count: int
    image: ImageSpec
    backend: str
    classes: tuple[str, ...] = ()
    labels: str = "none"
    splits: tuple[str, ...] = ()
    resize: dict[str, Any] = field(default_factory=dict)
    compression: str = "none"
    shard_rows: int = 0
    arrays: dict[str, ArraySpec] = field(default_factory=dict)
    skipped: tuple[InputFileError, ...] = ()
    conversions: dict[str, int] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    #: One entry per ``build --update``: ``{"time", "added", "replaced", "removed"}``.
    history: tuple[dict[str, Any], ...] = ()
    checksum: str = "crc32"
    dlpack_version: str = ""
    #: :func:`store_generation` of the arrays as committed ("" in stores written before it was recorded).
    generation: str = ""
    #: The original id of each class of ``classes`` (COCO category id, HALCON class id, mask pixel
    #: value); empty means ``0 .. len(classes) - 1`` (see :attr:`resolved_class_ids`).
    class_ids: tuple[int, ...] = ()
    #: What the labels are for (one of :data:`dlpack.schema.TASKS`); None: not recorded (see :attr:`resolved_task`).
    task: str | None = None
    #: The ``mask`` value of pixels that are no part of the image (padding); None: not recorded.
    mask_ignore: int | None = None
    #: Anomaly stores: the defect folder names a ``defect`` code indexes.
    defects: tuple[str, ...] = ()
    #: ``(id, name)`` of the label-image ids, when the source named them.
    mask_classes: tuple[tuple[int, str], ...] = ()
    #: Stores with augmentation variants: ``{"format", "k", "seed", "engine", "config", "operations",
    #: "fill_mask", "versions"}`` (docs/format.md, "Augmentation variants"); None without variants.
    augment: dict[str, Any] | None = None
    #: Per-channel statistics of the stored pixels, ``{"mean": [C], "std": [C], "count": pixels}`` in
    #: units of the stored dtype (dlpack.pack.stats); None: not computed (stores built before them).
    stats: dict[str, Any] | None = None
    format_version: int = FORMAT_VERSION
    format: str = FORMAT_NAME

    def __post_init__(self) -> None:
        ids = tuple(self.class_ids)
        if ids:
            if any(not isinstance(i, (int, np.integer)) or isinstance(i, bool) for i in ids):
                raise OptionError(f"class_ids must be integers, got {list(ids)!r}")
            ids = tuple(int(i) for i in ids)
            if len(ids) != len(self.classes):
                raise OptionError(f"class_ids has {len(ids)} ids for {len(self.classes)} classes; one id per class")
            if len(set(ids)) != len(ids):
                raise OptionError(f"class_ids must be unique, got {list(ids)!r}")
        object.__setattr__(self, "class_ids", ids)
        if self.task is not None and self.task not in schema.TASKS:
            raise OptionError(f"task must be one of {', '.join(schema.TASKS)}, got {self.task!r}")
        ignore = self.mask_ignore
        if ignore is not None and (not isinstance(ignore, (int, np.integer)) or isinstance(ignore, bool)):
            raise OptionError(f"mask_ignore must be an integer or null, got {ignore!r}")
        if ignore is not None and not 0 <= ignore <= 65535:
            raise OptionError(f"mask_ignore must be 0..65535 (a mask is uint8 or uint16), got {ignore}")
        defects = tuple(self.defects)
        if any(not isinstance(d, str) for d in defects) or len(set(defects)) != len(defects):
            raise OptionError(f"defects must be unique names, got {list(defects)!r}")
        object.__setattr__(self, "defects", defects)
        pairs = []
        for p in self.mask_classes:
            if (
                not isinstance(p, (list, tuple))
                or len(p) != 2
                or not isinstance(p[0], (int, np.integer))
                or isinstance(p[0], bool)
                or not isinstance(p[1], str)
            ):
                raise OptionError(f"each mask_classes entry must be [id, name], got {p!r}")
            pairs.append((int(p[0]), p[1]))
        if len({i for i, _ in pairs}) != len(pairs):
            raise OptionError(f"mask_classes ids must be unique, got {pairs!r}")
        object.__setattr__(self, "mask_classes", tuple(pairs))
        if self.augment is not None:
            k = self.augment.get("k") if isinstance(self.augment, dict) else None
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise OptionError(f"augment must be a dict whose k is an integer >= 1, got {self.augment!r}")
        if self.stats is not None:
            _check_stats(self.stats, self.image.channels)

    @property
    def variants(self) -> int:
        """The number K of augmentation variants per image (0 without variants)."""
        return int(self.augment["k"]) if self.augment else 0

    @property
    def resolved_class_ids(self) -> tuple[int, ...]:
        """``class_ids``, or ``0 .. len(classes) - 1`` in stores that do not record them."""
        return self.class_ids or tuple(range(len(self.classes)))

    @property
    def resolved_task(self) -> str:
        """``task`` as :func:`dlpack.schema.store_task` reads it from the recorded task and the arrays
        (stores that record none: ``"classification"`` when labelled, else ``"none"``, unless label
        arrays added later say more)."""
        return schema.store_task(self.arrays, self.classes, self.labels != "none", self.task)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; the optional label fields appear only when set, so a store without
        them has the bytes it had before they existed."""
        d = asdict(self)
        d["shard_images"] = d.pop("shard_rows")  # the format's name for it
        for name, absent in _OPTIONAL.items():
            if d[name] == absent:
                del d[name]
        d["classes"] = list(self.classes)
        d["splits"] = list(self.splits)
        if "class_ids" in d:
            d["class_ids"] = list(self.class_ids)
        if "defects" in d:
            d["defects"] = list(self.defects)
        if "mask_classes" in d:
            d["mask_classes"] = [[i, name] for i, name in self.mask_classes]
        d["arrays"] = {name: spec.to_dict() for name, spec in self.arrays.items()}
        d["skipped"] = [{"path": e.path, "reason": e.reason} for e in self.skipped]
        return d

    def to_json(self) -> str:
        """Sorted, indented JSON: the same manifest always gives the same bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def check_version(cls, d: Any, where: str = "") -> None:
        """Refuse what is not a dlpack manifest, or one of a newer ``format_version``."""
        where = f" in {where}" if where else ""
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            raise StoreError(f"not a dlpack manifest{where}")
        version = d.get("format_version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise StoreError(f"manifest{where} has no integer format_version")
        if version > FORMAT_VERSION:
            raise FormatVersionError(
                f"store{where} uses format version {version}, but this dlpack reads up to "
                f"{FORMAT_VERSION}; upgrade with: pip install -U dlpack-datasets"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "") -> Manifest:
        """Validate every field's type and range, and build; a newer ``format_version`` is refused."""
        cls.check_version(d, where)
        try:
            return cls(**_manifest_kwargs(d))
        except (KeyError, TypeError, IndexError, ValueError, OptionError, StoreError) as exc:
            w = f" in {where}" if where else ""
            raise StoreError(f"manifest{w} is malformed: {exc}") from exc

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "", sha256: str | None = None) -> Manifest:
        """Parse JSON text written by :meth:`to_json`; with ``sha256``, the text must have that digest
        (checked after the version, so a newer store still says it is newer)."""
        w = f" in {where}" if where else ""
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise StoreError(f"manifest{w} is not valid JSON: {exc}") from exc
        cls.check_version(d, where)
        if sha256 is not None:
            got = sha256_hex(text)
            if got != sha256:
                raise StoreError(
                    f"manifest{w} does not match its checksum (sha256 {got[:12]}..., recorded {sha256[:12]}...): "
                    "it was edited or damaged; rebuild the store"
                )
        return cls.from_dict(d, where)


#: Optional fields and their value when absent: left out of the JSON then (older stores lack them).
_OPTIONAL: dict[str, Any] = {
    "class_ids": (),
    "task": None,
    "mask_ignore": None,
    "defects": (),
    "mask_classes": (),
    "augment": None,
    "stats": None,
}


def _check_stats(stats: Any, channels: int) -> None:
    """``stats`` must be ``{"mean": [C numbers], "std": [C numbers >= 0], "count": int >= 0}``."""
    if not isinstance(stats, dict) or set(stats) != {"mean", "std", "count"}:
        raise OptionError(f"stats must be an object of mean, std and count, got {stats!r}")
    for key in ("mean", "std"):
        v = stats[key]
        if (
            not isinstance(v, list)
            or len(v) != channels
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)
        ):
            raise OptionError(f"stats.{key} must be {channels} finite numbers (one per channel), got {v!r}")
    if any(x < 0 for x in stats["std"]):
        raise OptionError(f"stats.std must be >= 0, got {stats['std']!r}")
    count = stats["count"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise OptionError(f"stats.count must be an integer >= 0, got {count!r}")


def _manifest_kwargs(d: dict[str, Any]) -> dict[str, Any]:
    """Manifest constructor arguments from a parsed manifest, every known field type-checked."""
    known = {f.name for f in fields(Manifest)} - {"shard_rows"}
    kw = {k: v for k, v in d.items() if k in known}
    count = _typed(kw.get("count"), int, "count")
    if not 0 <= count < 2**63:
        raise StoreError(f"count must be between 0 and 2**63, got {count}")
    kw["image"] = _image_spec(kw.get("image"))
    for name in ("backend", "labels", "checksum", "dlpack_version", "generation", "format"):
        if name in kw:
            _typed(kw[name], str, name)
    if kw.get("generation", "") and not _HEX64.fullmatch(kw["generation"]):
        raise StoreError(f"generation must be 64 hex digits, got {kw['generation']!r}")
    if kw.get("compression", "none") not in _COMPRESSIONS:
        raise StoreError(f"compression must be none, lz4 or zstd, got {kw.get('compression')!r}")
    kw["shard_rows"] = _typed(d.get("shard_images", 0), int, "shard_images")
    if kw["shard_rows"] < 0:
        raise StoreError(f"shard_images must be >= 0, got {kw['shard_rows']}")
    for name in ("resize", "plan", "conversions", "arrays"):
        _typed(kw.get(name, {}), dict, name)
    for k, v in kw.get("conversions", {}).items():
        if _typed(v, int, f"conversions[{k!r}]") < 0:
            raise StoreError(f"conversions[{k!r}] must be >= 0, got {v}")
    classes = _typed(kw.get("classes", []), list, "classes")
    for c in classes:
        _typed(c, str, "each class name")
    kw["classes"] = tuple(classes)
    splits = _typed(kw.get("splits", []), list, "splits")
    for name in splits:
        _typed(name, str, "each split name")
    kw["splits"] = tuple(splits)
    # The label fields: absent in older stores (the defaults then hold); Manifest checks their values.
    for name in ("class_ids", "defects", "mask_classes"):
        kw[name] = tuple(_typed(kw.get(name, []), list, name))
    if kw.get("task") is not None:
        _typed(kw["task"], str, "task")
    if kw.get("augment") is not None:
        aug = _typed(kw["augment"], dict, "augment")
        k = _typed(aug.get("k"), int, "augment.k")
        if k < 1:
            raise StoreError(f"augment.k must be >= 1, got {k}")
        _typed(aug.get("seed"), int, "augment.seed")
    history = _typed(kw.get("history", []), list, "history")
    for h in history:
        _typed(h, dict, "each history entry")
    kw["history"] = tuple(dict(h) for h in history)
    skipped = []
    for e in _typed(kw.get("skipped", []), list, "skipped"):
        if not isinstance(e, dict) or set(e) != {"path", "reason"}:
            raise StoreError(f"each skipped entry must be {{path, reason}}, got {e!r}")
        skipped.append(
            InputFileError(_typed(e["path"], str, "skipped path"), _typed(e["reason"], str, "skipped reason"))
        )
    kw["skipped"] = tuple(skipped)
    kw["arrays"] = {n: ArraySpec.from_dict(n, a) for n, a in kw.get("arrays", {}).items()}
    return kw
