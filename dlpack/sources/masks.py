"""Mask folder source: images with one label image each (semantic segmentation, pixel value = class id).

The rules (also in docs/labels.md, "Label images"):

- Images are found by the folder source's walk of ``images_root`` (same suffixes, split folders,
  symlink and exclude rules); ``masks_dir``, when it lies inside ``images_root``, is left out.
- Each image ``a/b/img.jpg`` is matched to the label image ``masks_dir/a/b/img.<any image suffix>``
  (relative path without extension). No label image, or two (``img.png`` and ``img.tif``), is an
  :class:`~dlpack.errors.InputFileError` of that image naming both paths.
- A label image's pixel value is the class id (8 or 16 bit). Class names come from ``classes.txt``
  (line k is the name of id k) or ``classes.json`` (a list of names, ids 0.., or an object
  ``{"id": name}`` with any int ids) in ``masks_dir``; without one ``classes`` is empty and the ids are
  stored as they are (the decode stage checks ids only against a list).
- Label images that match no image are not used; a note says how many. A folder whose label images
  match no image at all (or that holds none) is a SourceError saying so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._names import shown
from ..errors import InputFileError, LabelFileError, SourceError
from ..storage.location import is_url
from ._entries import (
    bucket_files,
    file_problem,
    has_objects,
    label_files,
    listing,
    load_json,
    place,
    read_text,
    stem,
    walk_images,
)
from .base import SourceFiles, SourceItem, SourceScan

__all__ = ["MaskFolderSource", "read_class_list"]

#: The largest class id a label image can hold (its pixels are 8 or 16 bit).
_MAX_ID = 2**16 - 1


def _exists(path: Path, storage_options: object) -> bool:
    """Whether the file (or the object, for a URL) ``path`` exists."""
    if not is_url(path):
        return path.exists()
    parent, _, name = str(path).rpartition("/")
    files = bucket_files(parent, storage_options)
    assert files is not None
    try:
        files.stat(name)
    except FileNotFoundError:
        return False
    return True


def _in(folder: Path, name: str) -> Path:
    """``folder / name``, for a local folder or a bucket prefix (a URL, kept as text)."""
    return f"{str(folder).rstrip('/')}/{name}" if is_url(folder) else folder / name  # type: ignore[return-value]


def read_class_list(folder: Path, storage_options: object = None) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """Class names and ids from ``classes.txt`` or ``classes.json`` in ``folder``, sorted by id; None without one.

    ``folder`` may be a bucket prefix (a URL), read with ``storage_options``.

    Raises
    ------
    SourceError
        Both files exist, or the one given is malformed (empty or repeated names, ids that are not ints).
    """
    txt, js = _in(folder, "classes.txt"), _in(folder, "classes.json")
    has_txt, has_js = _exists(txt, storage_options), _exists(js, storage_options)
    if has_txt and has_js:
        raise LabelFileError(f"{shown(str(folder))!r} holds both classes.txt and classes.json; keep one")
    if has_txt:
        lines = read_text(txt, "class list", storage_options).splitlines()
        while lines and not lines[-1].strip():
            lines.pop()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                raise LabelFileError(f"class list {shown(str(txt))!r}: line {n} is empty (line k names class id k-1)")
        pairs = [(k, line.strip()) for k, line in enumerate(lines)]
        where = txt
    elif has_js:
        doc: Any = load_json(js, "class list", storage_options)
        where = js
        if isinstance(doc, list) and all(isinstance(v, str) and v.strip() for v in doc):
            pairs = list(enumerate(v.strip() for v in doc))
        elif isinstance(doc, dict) and all(isinstance(v, str) and v.strip() for v in doc.values()):
            pairs = []
            for key, name in doc.items():
                try:
                    cid = int(key)
                except ValueError:
                    raise LabelFileError(
                        f"class list {shown(str(js))!r}: key {shown(key)!r} is not an integer class id"
                    ) from None
                if not 0 <= cid <= _MAX_ID:
                    raise LabelFileError(
                        f"class list {shown(str(js))!r}: class id {shown(key)!r} is not a pixel value of a "
                        f"label image (0..{_MAX_ID})"
                    )
                pairs.append((cid, name.strip()))
            pairs.sort()
        else:
            raise LabelFileError(
                f"class list {shown(str(js))!r} must be a list of names or an object "
                '{"id": "name"} with non-empty names'
            )
    else:
        return None
    if not pairs:
        raise LabelFileError(f"class list {shown(str(where))!r} names no class")
    seen: dict[str, int] = {}
    for cid, name in pairs:
        if name in seen:
            raise LabelFileError(
                f"class list {shown(str(where))!r}: ids {seen[name]} and {cid} have the same name "
                f"{shown(name)!r}; class names must be unique"
            )
        seen[name] = cid
    if len({cid for cid, _ in pairs}) != len(pairs):
        raise LabelFileError(f"class list {shown(str(where))!r} names one class id twice")
    return tuple(n for _, n in pairs), tuple(c for c, _ in pairs)


def _no_label_image_matches(
    masks: Path, root: Path, index: dict[str, list[str]], first: str, storage_options: object = None
) -> None:
    """Refuse a label folder that labels no image: the folder is wrong (another kind of labels, not
    copied, another layout), which one line says better than an error per image."""
    where, src = shown(str(masks)), shown(str(root))
    if not index:
        others = has_objects(str(masks), storage_options) if is_url(masks) else any(masks.rglob("*"))
        held = "no image file at all" + (
            " (only other files, e.g. annotations in another format)" if others else " (it is empty)"
        )
    else:
        found = sorted(r for rels in index.values() for r in rels)
        held = f"{len(found)} image file(s), none at an image's path: {listing(found)}"
    raise SourceError(
        f"label folder {where!r} holds no label image for any image of {src!r}: it holds {held}. A label "
        f"image has its image's path relative to {src!r} with any image extension (for {shown(first)!r}: "
        f"{where}/{shown(stem(first))}.png)"
    )


@dataclass(frozen=True, init=False)
class MaskFolderSource:
    """Images under ``images_root`` with label images in ``masks_dir`` (see the module docstring).

    Either may be a bucket prefix (an ``s3://`` URL), listed and read with ``storage_options``."""

    root: Path
    masks_dir: Path
    follow_symlinks: bool
    exclude: tuple[str, ...]
    storage_options: object = None

    def __init__(
        self,
        images_root: str | os.PathLike[str],
        masks_dir: str | os.PathLike[str],
        follow_symlinks: bool = False,
        exclude: tuple[str, ...] = (),
        storage_options: object = None,
    ) -> None:
        object.__setattr__(self, "root", place(images_root))
        object.__setattr__(self, "masks_dir", place(masks_dir))
        object.__setattr__(self, "follow_symlinks", bool(follow_symlinks))
        object.__setattr__(self, "exclude", tuple(exclude))
        object.__setattr__(self, "storage_options", storage_options)

    @property
    def files(self) -> SourceFiles | None:
        """The bucket's files when the image folder is a URL (None: the local folder ``root``)."""
        return bucket_files(self.root, self.storage_options)

    def scan(self) -> SourceScan:
        """List the images with their label images.

        Raises
        ------
        SourceError
            The image folder or the mask folder is missing or holds no images, or the class list is malformed.
        """
        masks, options = self.masks_dir, self.storage_options
        index = label_files(masks, options)
        found = read_class_list(masks, options)
        walked = walk_images(self.root, masks, self.follow_symlinks, self.exclude, "mask folder", options)
        mask_files = bucket_files(masks, options)
        items: list[SourceItem] = []
        errors = list(walked.errors)
        used: set[str] = set()
        shown_dir = shown(str(masks))
        for item in walked.items:
            key = stem(item.rel)
            cands = index.get(key, [])
            if not cands:
                errors.append(
                    InputFileError(
                        item.rel,
                        f"no label image for it: looked for {shown_dir}/{shown(key)}.<png, tif, ...> "
                        f"(the image's path relative to {shown(str(self.root))!r}, any image extension)",
                    )
                )
                continue
            if len(cands) > 1:
                both = ", ".join(f"{shown_dir}/{shown(c)}" for c in cands)
                errors.append(InputFileError(item.rel, f"two label images match it: {both}; keep one"))
                used.update(cands)
                continue
            used.add(cands[0])
            problem = file_problem(masks if mask_files is None else mask_files, cands[0], "the mask folder")
            if problem is not None:
                errors.append(InputFileError(item.rel, f"label image {shown_dir}/{shown(cands[0])}: {problem}"))
                continue
            items.append(SourceItem(item.rel, None, {"mask": cands[0]}, item.split))
        if walked.items and not used:
            _no_label_image_matches(masks, self.root, index, walked.items[0].rel, options)
        unused = sorted(r for rels in index.values() for r in rels if r not in used)
        notes = (f"{len(unused)} label image(s) in {shown_dir!r} match no image: {listing(unused)}",) if unused else ()
        classes, class_ids = found if found is not None else ((), ())
        return SourceScan(
            tuple(items),
            classes,
            tuple(sorted(errors, key=lambda e: e.path)),
            "masks",
            walked.excluded,
            walked.ignored,
            class_ids=class_ids,
            task="segmentation",
            label_root=str(masks),
            notes=notes,
        )
