"""Anomaly folder source: ``good``/``ok`` folders of flawless images, one folder per defect type.

The rules (also in docs/labels.md, "Anomaly folders"), those of HALCON's anomaly dataset reader:

- Images are found by the folder source's walk of ``root``; ``masks_dir``, when inside ``root``, is
  left out. Top folders ``train``, ``val``, ``validation``, ``test`` (any case) holding every image
  are splits, as MVTec AD's ``train/`` and ``test/``; the folder below them is the defect folder.
- The defect folder is the top folder below ``root`` (or below the split folder). ``good`` or
  ``ok`` (any case) means ok (label ``"ok"``), any other name nok (``"nok"``); classes are
  ``("ok", "nok")`` with ids 0 and 1, and each item's ``defect`` is the folder's name.
- An image directly in ``root`` (or in a split folder) has no defect folder: a SourceError names it.
- A tree without any ok image (no ``good``/``ok`` folder) is a SourceError naming the folders it
  holds: every image would be a defect, a tree of class folders read with the wrong kind.
- Ground truth (optional, ``masks_dir``): for ``test/crack/000.png`` the first of
  ``masks_dir/test/crack/000.*``, ``masks_dir/test/crack/000_mask.*``, ``masks_dir/crack/000.*``,
  ``masks_dir/crack/000_mask.*`` that exists (MVTec AD's ``ground_truth/crack/000_mask.png`` is the
  last). An image without ground truth has none (nonzero pixels = defect; none means all ok).
  Ground-truth files that match no image are not used; a note says how many.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._names import shown
from ..errors import InputFileError, SourceError
from ._entries import bucket_files, file_problem, label_files, listing, place, stem, walk_images
from .base import SourceFiles, SourceItem, SourceScan

__all__ = ["AnomalyFolderSource", "OK_FOLDERS"]

#: Defect folder names (compared in lower case) that hold the flawless images.
OK_FOLDERS = frozenset({"good", "ok"})


def _no_ok_folder(root: Path, seen: dict[str, int]) -> None:
    """Refuse a tree without one ok folder: every image would be a defect, which is a tree of class
    folders read with the wrong kind far more often than an anomaly set with nothing to learn ok from."""
    names = sorted(seen)
    folders = ", ".join(f"{shown(n)} ({seen[n]})" for n in names[:10])
    more = f" and {len(names) - 10} more" if len(names) > 10 else ""
    raise SourceError(
        f"--labels anomaly found no ok folder in {shown(str(root))!r}: every image would be a defect. "
        f"Its defect folders are {folders}{more}; none is named good or ok (any case), the folder of the "
        "flawless images. Rename that folder to good, or read class folders with --labels folders"
    )


@dataclass(frozen=True, init=False)
class AnomalyFolderSource:
    """Images in ``good``/``ok`` and defect folders under ``root``, with optional ground truth in ``masks_dir``."""

    root: Path
    masks_dir: Path | None
    follow_symlinks: bool
    exclude: tuple[str, ...]
    #: read a bucket prefix (an ``s3://`` URL for ``root`` or ``masks_dir``) with these
    storage_options: object = None

    def __init__(
        self,
        root: str | os.PathLike[str],
        masks_dir: str | os.PathLike[str] | None = None,
        follow_symlinks: bool = False,
        exclude: tuple[str, ...] = (),
        storage_options: object = None,
    ) -> None:
        object.__setattr__(self, "root", place(root))
        object.__setattr__(self, "masks_dir", None if masks_dir is None else place(masks_dir))
        object.__setattr__(self, "follow_symlinks", bool(follow_symlinks))
        object.__setattr__(self, "exclude", tuple(exclude))
        object.__setattr__(self, "storage_options", storage_options)

    @property
    def files(self) -> SourceFiles | None:
        """The bucket's files when ``root`` is a URL (None: the local folder ``root``)."""
        return bucket_files(self.root, self.storage_options)

    def scan(self) -> SourceScan:
        """List the images with their ok/nok label, defect folder and ground truth.

        Raises
        ------
        SourceError
            The folder (or ``masks_dir``) is missing or holds no images, or images have no defect folder.
        """
        masks, options = self.masks_dir, self.storage_options
        index = label_files(masks, options) if masks is not None else {}
        walked = walk_images(self.root, masks, self.follow_symlinks, self.exclude, "ground-truth folder", options)
        truth_files = None if masks is None else bucket_files(masks, options)
        strays = []
        items: list[SourceItem] = []
        errors = list(walked.errors)
        used: set[str] = set()
        folders: dict[str, int] = {}  # images per defect folder (under its split folder)
        for item in walked.items:
            parts = item.rel.split("/")
            inner = parts[1:] if item.split is not None else parts
            if len(inner) < 2:
                strays.append(item.rel)
                continue
            defect = inner[0]
            folder = f"{parts[0]}/{defect}" if item.split is not None else defect
            folders[folder] = folders.get(folder, 0) + 1
            ann: dict[str, Any] = {"defect": defect}
            for key in (
                stem(item.rel),
                stem(item.rel) + "_mask",
                stem("/".join(inner)),
                stem("/".join(inner)) + "_mask",
            ):
                cands = index.get(key)
                if cands:
                    break
            if cands and len(cands) > 1 and masks is not None:
                both = ", ".join(f"{shown(str(masks))}/{shown(c)}" for c in cands)
                errors.append(InputFileError(item.rel, f"two ground-truth images match it: {both}; keep one"))
                used.update(cands)
                continue
            if cands and masks is not None:
                used.add(cands[0])
                problem = file_problem(
                    masks if truth_files is None else truth_files, cands[0], "the ground-truth folder"
                )
                if problem is not None:
                    where = f"{shown(str(masks))}/{shown(cands[0])}"
                    errors.append(InputFileError(item.rel, f"ground-truth image {where}: {problem}"))
                    continue
                ann["anomaly_mask"] = cands[0]
            label = "ok" if defect.lower() in OK_FOLDERS else "nok"
            items.append(SourceItem(item.rel, label, ann, item.split))
        if strays:
            where = "the split folders" if any(i.split for i in walked.items) else "the folder"
            raise SourceError(
                f"{len(strays)} image(s) sit directly in {where} of {shown(str(self.root))!r}: {listing(strays)}. "
                "Anomaly labels come from the folder that holds each image (good or ok: ok, any other "
                "name: a defect); move them into such a folder"
            )
        if folders and not any(f.rsplit("/", 1)[-1].lower() in OK_FOLDERS for f in folders):
            _no_ok_folder(self.root, folders)
        unused = sorted(r for rels in index.values() for r in rels if r not in used)
        notes: tuple[str, ...] = ()
        if unused and masks is not None:
            notes = (f"{len(unused)} ground-truth image(s) in {shown(str(masks))!r} match no image: {listing(unused)}",)
        return SourceScan(
            tuple(items),
            ("ok", "nok"),
            tuple(sorted(errors, key=lambda e: e.path)),
            "anomaly",
            walked.excluded,
            walked.ignored,
            class_ids=(0, 1),
            task="anomaly",
            label_root=None if masks is None else str(masks),
            notes=notes,
        )
