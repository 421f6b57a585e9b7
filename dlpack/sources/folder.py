"""Folder source: a recursive tree of image files, labels from class folders."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputFileError, OptionError, SourceError
from ..options import IMAGE_SUFFIXES
from .base import SourceItem, SourceScan

# The decoding helpers lived here in the first release; callers still import them from this module.
from .decode import DecodeError, check_header, decode_image, incomplete_reason, normalise_header, read_source_file

__all__ = [
    "FolderSource",
    "SourceItem",
    "scan_folder",
    "read_source_file",
    "decode_image",
    "DecodeError",
    "check_header",
    "incomplete_reason",
    "normalise_header",
]

_LABELS = ("auto", "folders", "none")


@dataclass(frozen=True, init=False)
class FolderSource:
    """A folder tree of images; the first :class:`~dlpack.sources.Source`.

    Items are the image files under ``root`` (hidden files and folders excluded), in sorted order
    of relative path. ``labels="auto"`` takes the first-level folder as the class when every image
    sits in a sub-folder, ``"folders"`` requires that, ``"none"`` leaves every image unlabelled.
    Symlinks are packed only with ``follow_symlinks`` and never when they leave the tree.
    """

    root: Path
    labels: str
    follow_symlinks: bool

    def __init__(self, root: str | os.PathLike[str], labels: str = "auto", follow_symlinks: bool = False) -> None:
        if labels not in _LABELS:
            raise OptionError(f"labels must be one of {', '.join(_LABELS)}; got {labels!r}")
        object.__setattr__(self, "root", Path(root))
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "follow_symlinks", bool(follow_symlinks))

    def scan(self) -> SourceScan:
        """List the image files; raises :class:`~dlpack.errors.SourceError` for a missing or empty folder."""
        root = base = self.root
        if not base.exists():
            raise SourceError(f"source folder {os.fspath(root)!r} does not exist")
        if not base.is_dir():
            raise SourceError(f"source {os.fspath(root)!r} is not a folder")
        real_base = base.resolve()
        rels: list[str] = []
        errors: list[InputFileError] = []
        for dirpath, dirnames, filenames in os.walk(base, followlinks=self.follow_symlinks):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                if name.startswith(".") or os.path.splitext(name)[1].lower() not in IMAGE_SUFFIXES:
                    continue
                full = Path(dirpath, name)
                rel = full.relative_to(base).as_posix()
                if full.is_symlink():
                    target = full.resolve()
                    if not target.is_relative_to(real_base):
                        errors.append(
                            InputFileError(rel, f"symlink to {target} leaves the source folder; copy the file in")
                        )
                        continue
                    if not self.follow_symlinks:
                        errors.append(InputFileError(rel, "is a symlink; pass --follow-symlinks to pack linked files"))
                        continue
                rels.append(rel)
        rels.sort()
        if not rels and not errors:
            raise SourceError(
                f"no images found in {os.fspath(root)!r} (looked for {', '.join(sorted(IMAGE_SUFFIXES))})"
            )
        nested = all("/" in r for r in rels)
        if self.labels == "folders" and not nested:
            flat = [r for r in rels if "/" not in r][:5]
            raise SourceError(
                f"labels=folders needs every image inside a class folder, but {', '.join(flat)} "
                f"sit directly in {os.fspath(root)!r}; move them or use --labels none"
            )
        use_folders = self.labels == "folders" or (self.labels == "auto" and nested and bool(rels))
        items = tuple(SourceItem(r, r.split("/", 1)[0] if use_folders else None) for r in rels)
        classes = tuple(sorted({i.label for i in items if i.label is not None}))
        return SourceScan(items, classes, tuple(errors), "folders" if classes else "none")


def scan_folder(
    root: str | os.PathLike[str], labels: str = "auto", follow_symlinks: bool = False
) -> tuple[list[SourceItem], tuple[str, ...], list[InputFileError]]:
    """``FolderSource(root, labels, follow_symlinks).scan()`` as (items, classes, errors) lists."""
    scan = FolderSource(root, labels, follow_symlinks).scan()
    return list(scan.items), scan.classes, list(scan.errors)
