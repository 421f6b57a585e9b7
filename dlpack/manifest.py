"""The store manifest: a frozen, versioned description of a store, serialised as sorted JSON.

The manifest is written last, so its presence marks a complete store (docs/format.md).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .errors import FormatVersionError, InputFileError, StoreError

__all__ = ["FORMAT_VERSION", "ImageSpec", "Manifest"]

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


@dataclass(frozen=True)
class Manifest:
    """Versioned description of a store; ``arrays`` maps array names to their shape and dtype.

    ``plan`` is the build plan the store was written under (``dlpack.build.BuildPlan.to_dict()``),
    so a later resume or update can check that it continues the same plan; empty for stores
    written before it was recorded.
    """

    count: int
    image: ImageSpec
    backend: str
    classes: tuple[str, ...] = ()
    labels: str = "none"
    resize: dict[str, Any] = field(default_factory=dict)
    compression: str = "none"
    shard_images: int = 0
    arrays: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: tuple[InputFileError, ...] = ()
    conversions: dict[str, int] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)
    checksum: str = "crc32"
    dlpack_version: str = ""
    format_version: int = FORMAT_VERSION
    format: str = FORMAT_NAME

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = asdict(self)
        d["classes"] = list(self.classes)
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
            kwargs["classes"] = tuple(kwargs.get("classes", ()))
            kwargs["skipped"] = tuple(InputFileError(**e) for e in kwargs.get("skipped", ()))
            if not isinstance(kwargs.get("plan", {}), dict):
                raise TypeError(f"plan must be an object, got {type(kwargs['plan']).__name__}")
            return cls(**kwargs)
        except (KeyError, TypeError) as exc:
            raise StoreError(f"manifest{where} is malformed: {exc}") from exc

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "") -> Manifest:
        """Parse JSON text written by :meth:`to_json`."""
        try:
            d = json.loads(text)
        except ValueError as exc:
            raise StoreError(f"manifest{' in ' + where if where else ''} is not valid JSON: {exc}") from exc
        return cls.from_dict(d, where)
