"""The store manifest: a frozen, versioned description of a store, serialised as sorted JSON.

The manifest is written last, so its presence marks a complete store (docs/format.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from .errors import FormatVersionError, InputFileError, OptionError, StoreError

__all__ = ["FORMAT_VERSION", "ArraySpec", "ImageSpec", "Manifest"]

#: Bumped whenever a reader of the previous version could misread a new store.
FORMAT_VERSION = 1
FORMAT_NAME = "dlpack"


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

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _ARRAY_NAME.fullmatch(self.name):
            raise OptionError(
                f"array name must be 1-64 lower-case letters, digits or '_', starting with a letter; got {self.name!r}"
            )
        try:
            dt = np.dtype(self.dtype)
        except TypeError as exc:
            raise OptionError(f"array {self.name!r}: {self.dtype!r} is not a NumPy dtype") from exc
        if dt.hasobject or dt.kind not in "biufc":
            raise OptionError(f"array {self.name!r}: dtype {dt} is not a plain numeric type")
        object.__setattr__(self, "dtype", dt.str)
        shape = tuple(self.shape)
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in shape):
            raise OptionError(f"array {self.name!r}: trailing shape must be positive integers, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        if self.compression not in ("none", "lz4", "zstd"):
            raise OptionError(f"array {self.name!r}: compression must be none, lz4 or zstd, got {self.compression!r}")

    @property
    def item_nbytes(self) -> int:
        """Bytes of one sample (fixed) or one row (ragged)."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def stored_names(self) -> tuple[str, ...]:
        """The names of the arrays that hold it on disk."""
        if self.ragged:
            return (self.name + "_data", self.name + "_offsets")
        return (self.name,)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "shape": list(self.shape),
            "layout": "ragged" if self.ragged else "fixed",
            "key": self.key,
            "compression": self.compression,
        }

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> ArraySpec:
        if d.get("layout") not in ("fixed", "ragged"):
            raise StoreError(f"array {name!r}: layout must be fixed or ragged, got {d.get('layout')!r}")
        return cls(
            name,
            d["dtype"],
            tuple(d.get("shape", ())),
            d["layout"] == "ragged",
            d.get("key"),
            d.get("compression", "none"),
        )


def _legacy_arrays(arrays: dict[str, Any], image: ImageSpec, compression: str) -> dict[str, ArraySpec]:
    """Array specs of a store written before named arrays (entries held the stored shape, N first)."""
    out: dict[str, ArraySpec] = {}
    keys = {"labels": "label"}
    for name, d in arrays.items():
        if name.endswith("_data") and name[: -len("_data")] + "_offsets" in arrays:
            base = name[: -len("_data")]
            out[base] = ArraySpec(base, d["dtype"], tuple(d["shape"][1:]), True)
        elif name.endswith("_offsets") and name[: -len("_offsets")] + "_data" in arrays:
            continue
        else:
            out[name] = ArraySpec(name, d["dtype"], tuple(d["shape"][1:]), False, keys.get(name))
    if image.layout == "fixed" and image.shape is not None:
        out["images"] = ArraySpec("images", image.dtype, image.shape, False, "image", compression)
    elif "image" in out:
        out["image"] = ArraySpec("image", image.dtype, (), True, None, compression)
    return out


@dataclass(frozen=True)
class Manifest:
    """Versioned description of a store; ``arrays`` maps each per-sample array's name to its spec.

    ``splits`` names the codes of the ``split`` array (present when the source assigns splits):
    code ``k`` means ``splits[k]``, ``-1`` no split.

    ``plan`` is the build plan the store was written under (``dlpack.build.BuildPlan.to_dict()``),
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
    shard_images: int = 0
    arrays: dict[str, ArraySpec] = field(default_factory=dict)
    skipped: tuple[InputFileError, ...] = ()
    conversions: dict[str, int] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    #: One entry per ``build --update``: ``{"time", "added", "replaced", "removed"}``.
    history: tuple[dict[str, Any], ...] = ()
    checksum: str = "crc32"
    dlpack_version: str = ""
    format_version: int = FORMAT_VERSION
    format: str = FORMAT_NAME

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = asdict(self)
        d["classes"] = list(self.classes)
        d["splits"] = list(self.splits)
        d["arrays"] = {name: spec.to_dict() for name, spec in self.arrays.items()}
        d["skipped"] = [{"path": e.path, "reason": e.reason} for e in self.skipped]
        return d

    def to_json(self) -> str:
        """Sorted, indented JSON: the same manifest always gives the same bytes."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "") -> Manifest:
        """Validate and build; a newer ``format_version`` is refused."""
        where = f" in {where}" if where else ""
        if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
            raise StoreError(f"not a dlpack manifest{where}")
        version = d.get("format_version")
        if not isinstance(version, int):
            raise StoreError(f"manifest{where} has no integer format_version")
        if version > FORMAT_VERSION:
            raise FormatVersionError(
                f"store{where} uses format version {version}, but this dlpack reads up to "
                f"{FORMAT_VERSION}; upgrade with: pip install -U dlpack-datasets"
            )
        try:
            known = {f.name for f in fields(cls)}
            kwargs = {k: v for k, v in d.items() if k in known}
            kwargs["image"] = ImageSpec(**kwargs["image"])
            arrays = kwargs.get("arrays", {})
            if not isinstance(arrays, dict):
                raise TypeError("arrays must be an object")
            if all(isinstance(a, dict) and "layout" in a for a in arrays.values()):
                kwargs["arrays"] = {n: ArraySpec.from_dict(n, a) for n, a in arrays.items()}
            else:
                kwargs["arrays"] = _legacy_arrays(arrays, kwargs["image"], kwargs.get("compression", "none"))
            kwargs["classes"] = tuple(kwargs.get("classes", ()))
            kwargs["splits"] = tuple(kwargs.get("splits", ()))
            kwargs["skipped"] = tuple(InputFileError(**e) for e in kwargs.get("skipped", ()))
            kwargs["history"] = tuple(dict(h) for h in kwargs.get("history", ()))
            if not isinstance(kwargs.get("plan", {}), dict):
                raise TypeError(f"plan must be an object, got {type(kwargs['plan']).__name__}")
            return cls(**kwargs)
        except (KeyError, TypeError, IndexError, OptionError) as exc:
            raise StoreError(f"manifest{where} is malformed: {exc}") from exc

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "") -> Manifest:
        """Parse JSON text written by :meth:`to_json`."""
        try:
            d = json.loads(text)
        except ValueError as exc:
            raise StoreError(f"manifest{' in ' + where if where else ''} is not valid JSON: {exc}") from exc
        return cls.from_dict(d, where)
