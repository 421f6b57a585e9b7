"""Folder source: a recursive tree of image files, labels from class folders, splits from split folders.

The rules (also in docs/format.md, "Labels and splits of a folder"):

- Items are the files under ``root`` whose suffix is an image suffix dlpack packs, hidden files and
  folders (names starting with ``.``) excluded, in sorted order of relative path.
- Every other input a user could expect to be packed is reported (the build fails on it, or lists it
  in ``skipped`` under ``on_error="skip"``): folders that cannot be read, symlinks that are not
  followed, loops, images in formats dlpack does not pack (GIF, JPEG 2000, HEIF, ...), files that are
  not regular files, and names that are not valid UTF-8. Other files (``.txt``, ``.json``, ...)
  are not packed; the scan lists them (``SourceScan.ignored``) so the summary can count them.
- ``exclude`` patterns (fnmatch, case-sensitive) are matched against each path relative to the root
  with ``/`` separators; a matching file is left out, a matching folder with everything under it.
- Label folders are not classes: a folder named ``masks``, ``mask``, ``labels``, ``ground_truth``,
  ``gt`` or ``annotations`` (any case), or an image named ``*_mask.*``, that no pattern excludes is
  refused, because packing it would make label images into a class (and resize them as photos).
- Split: when every image sits under a top folder named ``train``, ``val``, ``validation`` or
  ``test`` (any case), that folder is the image's split and the rules below apply below it.
- Class (``class_folder="top"``, the default): the top folder below the root (or below the split
  folder): ``cat/x.png`` is ``cat``, ``cat/lot_7/night/x.png`` is ``cat`` too, ``train/cat/x.png``
  is ``cat`` in split ``train``. For the one-level layout this is what HALCON's
  ``read_dl_dataset_classification`` gives by default (``last_folder``, the folder that directly
  contains the image); deeper trees differ on purpose, because the folders below a class are
  usually lots, cameras or shifts, not classes. ``class_folder="last"`` is HALCON's rule: the
  folder that directly contains the image (``cat/lot_7/x.png`` is ``lot_7``).
"""

from __future__ import annotations

import errno
import fnmatch
import heapq
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._names import code_points, normal_form, shown
from ..errors import InputFileError, OptionError, SourceError, SourceNotFoundError
from ..options import IMAGE_SUFFIXES
from ..storage.spill import PART, Column
from ._items import ItemTable, Paths
from .base import SourceItem, SourceScan

__all__ = [
    "FolderSource",
    "SourceItem",
    "SPLIT_NAMES",
    "UNSUPPORTED_SUFFIXES",
    "LABEL_FOLDER_NAMES",
    "LABEL_FILE_PATTERN",
    "label_path",
    "label_paths_error",
    "FOLLOW_ADVICE",
    "CLASS_FOLDERS",
    "LABEL_SOURCES_HINT",
]

_LABELS = ("auto", "folders", "none")
#: Which folder of an image's path names its class: the top one, or the one that holds the image.
CLASS_FOLDERS = ("top", "last")

#: Top-level folder names (compared in lower case) that name a split rather than a class.
SPLIT_NAMES: frozenset[str] = frozenset({"train", "val", "validation", "test"})

#: Suffixes of image formats dlpack does not pack, with the format's name: reported, never ignored.
UNSUPPORTED_SUFFIXES: dict[str, str] = {
    ".gif": "GIF",
    ".jp2": "JPEG 2000",
    ".j2k": "JPEG 2000",
    ".jpf": "JPEG 2000",
    ".jpx": "JPEG 2000",
    ".heic": "HEIF",
    ".heif": "HEIF",
    ".avif": "AVIF",
    ".jxl": "JPEG XL",
    ".exr": "OpenEXR",
    ".hdr": "Radiance HDR",
    ".pic": "Radiance HDR",
    ".ico": "ICO",
    ".svg": "SVG",
    ".psd": "Photoshop PSD",
    ".tga": "TGA",
    ".dng": "camera raw (DNG)",
    ".cr2": "camera raw (CR2)",
    ".nef": "camera raw (NEF)",
    ".arw": "camera raw (ARW)",
}

_MAX_LISTED = 5

#: Folder names (compared in lower case) that hold labels (masks, ground truth), not a class of images.
LABEL_FOLDER_NAMES: frozenset[str] = frozenset({"masks", "mask", "labels", "ground_truth", "gt", "annotations"})
#: File names (compared in lower case) of label images.
LABEL_FILE_PATTERN = "*_mask.*"


def _shown(rel: str) -> str:
    r"""``rel`` as printable UTF-8: bytes that are not UTF-8 (surrogate-escaped by the OS layer) become ``\xNN``."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _is_utf8(rel: str) -> bool:
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _listing(paths: Sequence[str]) -> str:
    """The first few paths and how many more: ``a.png, b.png and 3 more``."""
    head = ", ".join(shown(_shown(p)) for p in paths[:_MAX_LISTED])
    return head + (f" and {len(paths) - _MAX_LISTED} more" if len(paths) > _MAX_LISTED else "")


def _kind(name: str) -> str:
    """``"image"``, ``"unsupported"``, ``"maybe-folder"`` (no suffix) or ``"other"``, from the name."""
    suffix = os.path.splitext(name)[1].lower()
    if suffix in IMAGE_SUFFIXES:
        return "image"
    if suffix in UNSUPPORTED_SUFFIXES:
        return "unsupported"
    return "maybe-folder" if not suffix else "other"


def _hidden(name: str) -> bool:
    """Whether a file or folder name is hidden (``.git``, ``.DS_Store``): never walked, never listed."""
    return name.startswith(".")


@dataclass
class _Walk:
    """What a scan has found so far (one scan's mutable state; never leaves :meth:`FolderSource.scan`)."""

    real_root: str
    follow: bool
    exclude: tuple[str, ...] = ()
    #: refuse label folders and label images (else they are walked and listed like any other)
    check_labels: bool = True
    files: _Runs = field(default_factory=lambda: _Runs())
    #: paths an exclude pattern left out (folders with a trailing "/")
    excluded: list[str] = field(default_factory=list)
    #: files that are not images, not packed
    ignored: list[str] = field(default_factory=list)
    #: label folders (with a trailing "/") and label images found and not excluded
    label_paths: list[str] = field(default_factory=list)
    errors: list[InputFileError] = field(default_factory=list)
    #: real path of every folder walked -> the relative path it is packed under ("" for the root)
    dirs: dict[str, str] = field(default_factory=dict)
    #: real path of every file packed -> its relative path (filled only when following links)
    owners: dict[str, str] = field(default_factory=dict)
    #: symlinks met while walking, as a heap of (relative path, path): handled after the real tree
    links: list[tuple[str, str]] = field(default_factory=list)
    #: (folder, name, other name, "folders" or "files") of names in one folder that differ only in
    #: Unicode normalisation
    twins: list[tuple[str, str, str, str]] = field(default_factory=list)
    #: folder of a bucket listing -> the names seen in it (None: left out, with everything under it)
    folders: dict[str, dict[str, str] | None] = field(default_factory=lambda: {"": {}})

    def error(self, rel: str, reason: str) -> None:
        self.errors.append(InputFileError(_shown(rel), reason))

    def walk(self, top: str, top_rel: str, top_real: str) -> None:
        """Walk the folder ``top`` (packed as ``top_rel``, really at ``top_real``) without following links."""
        self.dirs[top_real] = top_rel
        stack = [(top, top_rel, top_real)]
        while stack:
            path, rel_dir, real_dir = stack.pop()
            try:
                with os.scandir(path) as it:
                    entries = list(it)
            except OSError as exc:
                if not rel_dir:
                    raise SourceError(f"cannot read the source folder {path!r}: {exc.strerror or exc}") from exc
                self.error(rel_dir + "/", f"cannot read folder: {exc.strerror or exc}; none of its images are packed")
                continue
            names: dict[str, str] = {}  # normal form -> the name seen with it, in this folder
            for entry in entries:
                name = entry.name
                if _hidden(name):
                    continue
                rel = f"{rel_dir}/{name}" if rel_dir else name
                if entry.is_symlink():
                    if self.excludes(rel):
                        continue
                    if _kind(name) != "other":  # a link to an image, or maybe to a folder
                        self.twin(names, rel_dir, name, "names")
                    heapq.heappush(self.links, (rel, entry.path))
                    continue
                try:
                    # d_type from the listing: no stat call per file unless the file system lacks it
                    is_dir = entry.is_dir(follow_symlinks=False)
                    regular = not is_dir and entry.is_file(follow_symlinks=False)
                except OSError as exc:
                    if _kind(name) != "other" and not self.excludes(rel):
                        self.error(rel, f"cannot read: {exc.strerror or exc}")
                    continue
                if not self.entry(names, rel_dir, name, is_dir):
                    continue
                real = os.path.join(real_dir, name)
                if is_dir:
                    self.dirs[real] = rel
                    stack.append((entry.path, rel, real))
                else:
                    self.file(rel, real, regular)

    def entry(self, names: dict[str, str], rel_dir: str, name: str, is_dir: bool) -> bool:
        """The rules of one entry (not hidden, not a link) of the folder ``rel_dir``, whose names so far
        are ``names``: False when an exclude pattern leaves it out or it is a label folder, else True
        (a folder to go into, a file for :meth:`file`)."""
        rel = f"{rel_dir}/{name}" if rel_dir else name
        if self.excludes(rel + "/" if is_dir else rel, folder=is_dir):
            return False
        if is_dir or _kind(name) in ("image", "unsupported"):  # what is packed or reported
            self.twin(names, rel_dir, name, "folders" if is_dir else "files")
        if is_dir and name.lower() in LABEL_FOLDER_NAMES and self.check_labels:
            self.label_paths.append(rel + "/")
            return False
        return True

    def key(self, key: str) -> None:
        """One object key of a bucket listing (relative to the source prefix): the rules of a walk,
        applied to each folder on its path (once per folder) and then to the object as a regular file.

        A bucket has no folders, links or irregular files: its folders are the ``/``-separated parts
        of the keys, and an object whose key ends in ``/`` is a folder marker, not a file.
        """
        if key.endswith("/"):
            return
        parts = key.split("/")
        if "" in parts:
            if _kind(parts[-1]) != "other":
                self.error(key, "the object key has an empty part ('//'), which no file path has; rename it")
            return
        rel_dir = ""
        names = self.folders[""]
        for part in parts[:-1]:
            rel = f"{rel_dir}/{part}" if rel_dir else part
            if rel not in self.folders:
                kept = names is not None and not _hidden(part) and self.entry(names, rel_dir, part, True)
                self.folders[rel] = {} if kept else None
            names = self.folders[rel]
            if names is None:
                return
            rel_dir = rel
        name = parts[-1]
        if names is not None and not _hidden(name) and self.entry(names, rel_dir, name, False):
            self.file(key, key, True)

    def excludes(self, rel: str, folder: bool = False) -> bool:
        """Whether an exclude pattern matches ``rel`` (a folder as ``name/``, matched with and without the ``/``)."""
        if not self.exclude:
            return False
        names = (rel, rel.rstrip("/")) if folder else (rel,)
        if any(fnmatch.fnmatchcase(n, pat) for n in names for pat in self.exclude):
            self.excluded.append(rel)
            return True
        return False

    def twin(self, names: dict[str, str], rel_dir: str, name: str, what: str) -> None:
        """Note ``name`` in the folder ``rel_dir``; a name seen there that differs only in normalisation is a twin."""
        other = names.setdefault(normal_form(name), name)
        if other != name:
            self.twins.append((rel_dir, min(other, name), max(other, name), what))

    def file(self, rel: str, real: str, regular: bool) -> None:
        """A file (or a link to one) at ``rel`` whose real path is ``real``."""
        name = rel.rsplit("/", 1)[-1]
        kind = _kind(name)
        if kind in ("other", "maybe-folder"):
            if regular:
                self.ignored.append(rel)
            return
        if kind == "image" and self.check_labels and fnmatch.fnmatchcase(name.lower(), LABEL_FILE_PATTERN):
            self.label_paths.append(rel)
            return
        if not regular:
            self.error(rel, "not a regular file (a FIFO, socket or device); not read")
        elif kind == "unsupported":
            fmt = UNSUPPORTED_SUFFIXES[os.path.splitext(rel)[1].lower()]
            self.error(rel, f"unsupported format {fmt}; convert it to PNG")
        elif not _is_utf8(rel):
            self.error(rel, "the file name is not valid UTF-8 (source paths are stored as UTF-8); rename it")
        elif real in self.owners:
            self.error(rel, f"the same file as {self.owners[real]!r}, which is packed; not packed twice")
        else:
            if self.follow:
                self.owners[real] = rel
            self.files.append(rel)

    def inside(self, real: str) -> bool:
        return real == self.real_root or real.startswith(self.real_root.rstrip("/") + "/")

    def link(self, rel: str, path: str) -> None:
        """A symlink at ``rel``: followed only with ``follow``, only inside the root, and never twice."""
        name = rel.rsplit("/", 1)[-1]
        try:
            target = os.path.realpath(path, strict=True)
            mode = os.stat(target).st_mode
        except OSError as exc:
            if _kind(name) != "other":
                what = "symlink loop" if exc.errno == errno.ELOOP else "broken symlink (its target does not exist)"
                self.error(rel, f"{what}; not read")
            return
        is_dir = stat.S_ISDIR(mode)
        shown = rel + "/" if is_dir else rel
        if not is_dir and _kind(name) in ("other", "maybe-folder"):
            return
        if not self.inside(target):
            self.error(shown, f"symlink to {_shown(target)!r} leaves the source folder; copy the files in")
        elif not self.follow:
            what = "a folder" if is_dir else "a file"
            self.error(shown, f"is a symlink to {what}{FOLLOW_ADVICE}")
        elif not is_dir:
            self.file(rel, target, stat.S_ISREG(mode))
        elif name.lower() in LABEL_FOLDER_NAMES and self.check_labels:
            self.label_paths.append(shown)
        elif target in self.dirs:
            owner = self.dirs[target]
            if not owner or rel.startswith(owner + "/"):
                self.error(shown, f"symlink loop: links to its own enclosing folder {owner or '.'!r}; not followed")
            else:
                self.error(shown, f"links to the folder {owner!r}, whose images are packed from there; not followed")
        else:
            self.walk(path, rel, target)


@dataclass(frozen=True, init=False)
class FolderSource:
    """A folder tree of images; the first :class:`~dlpack.sources.Source`.

    Items are the image files under ``root`` (hidden files and folders excluded), in sorted order
    of relative path. An image's class is its top folder (``cat/x.png`` and ``cat/lot_7/x.png`` are
    ``cat``; with ``class_folder="last"`` the folder that directly holds the image: ``lot_7``). When every image is under a top folder named ``train``, ``val``, ``validation`` or
    ``test`` (any case), that folder is the image's split instead, and the class is the folder below.
    ``labels="auto"`` labels the images when every one sits in a class folder, leaves them
    unlabelled when none does, and refuses a mix; ``"folders"`` requires class folders, ``"none"``
    leaves every image unlabelled. ``exclude`` holds fnmatch patterns of paths (relative to
    ``root``, ``/`` separators) to leave out; label folders and label images (``masks/``,
    ``ground_truth/``, ``*_mask.*``, ...) must be excluded or moved, or the scan refuses them. Symlinks are followed only with ``follow_symlinks``, never out of
    ``root``, never in a loop, and nothing is packed twice: a file or folder reached by its real path
    is packed from there, one reached only through links from the sorted-first link; every other
    path to it is reported in :attr:`SourceScan.errors`, like every other input that is not packed.
    """

    root: Path
    labels: str
    follow_symlinks: bool
    exclude: tuple[str, ...]
    #: False lists label folders and label images like other images (an update of a store that
    #: already holds some refuses only new ones: :func:`label_path`).
    check_labels: bool
    #: "top" (the first folder below the root or split folder) or "last" (the image's own folder)
    class_folder: str

    def __init__(
        self,
        root: str | os.PathLike[str],
        labels: str = "auto",
        follow_symlinks: bool = False,
        exclude: Sequence[str] = (),
        check_labels: bool = True,
        class_folder: str = "top",
    ) -> None:
        if labels not in _LABELS:
            raise OptionError(f"labels must be one of {', '.join(_LABELS)}; got {labels!r}")
        if class_folder not in CLASS_FOLDERS:
            raise OptionError(f"class_folder must be one of {', '.join(CLASS_FOLDERS)}; got {class_folder!r}")
        if isinstance(exclude, str) or not all(isinstance(p, str) and p for p in exclude):
            raise OptionError(f"exclude must be a list of non-empty glob patterns, got {exclude!r}")
        object.__setattr__(self, "root", Path(root))
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "follow_symlinks", bool(follow_symlinks))
        object.__setattr__(self, "exclude", tuple(exclude))
        object.__setattr__(self, "check_labels", bool(check_labels))
        object.__setattr__(self, "class_folder", class_folder)

    def scan(self) -> SourceScan:
        """List the image files and their labels and splits.

        Raises
        ------
        SourceError
            The folder is missing, unreadable or holds no images, or its labels would be ambiguous
            (images both in and outside class folders).
        """
        root = self.root
        if not root.exists():
            raise SourceNotFoundError(f"source folder {os.fspath(root)!r} does not exist")
        if not root.is_dir():
            raise SourceError(f"source {os.fspath(root)!r} is not a folder")
        walk = _Walk(os.path.realpath(root), self.follow_symlinks, self.exclude, self.check_labels)
        walk.walk(os.fspath(root), "", walk.real_root)
        # Links last and in sorted order: a real path always wins over a link to the same place,
        # and among links the sorted-first one.
        while walk.links:
            walk.link(*heapq.heappop(walk.links))
        return walked(walk, os.fspath(root), self.labels, self.class_folder)


def listing_walk(exclude: Sequence[str] = (), check_labels: bool = True) -> _Walk:
    """A scan of a bucket listing: feed each key (relative to the prefix) to its ``key()``, then
    :func:`walked` makes the scan, by the rules of a folder's walk."""
    return _Walk("", False, tuple(exclude), check_labels)


def walked(walk: _Walk, root: str, labels: str, class_folder: str) -> SourceScan:
    """The scan of a finished walk of ``root`` (a folder or a bucket prefix, as messages name it):
    twins and label folders refused, the paths sorted, labelled and split by the folder rules."""
    if walk.twins:
        folder, a, b, what = min(walk.twins)
        where = (root.rstrip("/") + "/" + folder if _is_url(root) else os.path.join(root, folder)) if folder else root
        raise _twins_error(what, repr(shown(where)), a, b)
    if walk.label_paths:
        raise label_paths_error(root, sorted(walk.label_paths))
    rels = Paths(walk.files.merged())
    errors = tuple(sorted(walk.errors, key=lambda e: e.path))
    if not len(rels) and not errors:
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
        left = f"; the exclude patterns left out {len(walk.excluded)} path(s)" if walk.excluded else ""
        raise SourceError(f"no images found in {root!r} (looked for {suffixes}){left}")
    items, classes = _label(rels, root, labels, class_folder)
    return SourceScan(
        items,
        classes,
        errors,
        "folders" if classes else "none",
        excluded=tuple(sorted(walk.excluded)),
        ignored=tuple(sorted(walk.ignored)),
        task="classification" if classes else "none",
    )


def _is_url(root: str) -> bool:
    return "://" in root


def _label(rels: Paths, root: str, labels: str, class_folder: str) -> tuple[ItemTable, tuple[str, ...]]:
    """Items with their splits and labels, and the sorted class names, by the rules of :class:`FolderSource`.

    Passes over the paths in order, keeping codes (in columns, :mod:`dlpack.storage.spill`) rather
    than split path parts: a million paths split into lists would cost more memory than the
    rest of the build.
    """
    where = repr(root)
    by_split = bool(len(rels)) and all("/" in r and r.split("/", 1)[0].lower() in SPLIT_NAMES for r in rels)
    split_of: dict[str, int] = {}
    split_codes = Column(np.int16)
    tops: set[str] = set()
    strays: list[str] = []  # the first few, for the message
    n_strays = 0
    class_of: dict[str, int] = {}
    codes = Column(np.int32)  # in order of first sight
    top_rule = class_folder == "top"
    for first in range(0, len(rels), PART):
        part = list(rels.rels(first, first + PART))
        splits = np.full(len(part), -1, dtype=np.int16)
        seen = np.full(len(part), -1, dtype=np.int32)
        for j, r in enumerate(part):
            inner = r
            if by_split:
                top, inner = r.split("/", 1)
                tops.add(top + "/")
                splits[j] = split_of.setdefault(top.lower(), len(split_of))
            if "/" not in inner:
                n_strays += 1
                if len(strays) <= _MAX_LISTED:
                    strays.append(r)
                continue
            name = inner.split("/", 1)[0] if top_rule else inner.rsplit("/", 2)[-2]
            seen[j] = class_of.setdefault(name, len(class_of))
        split_codes.append(splits)
        codes.append(seen)
    split_names = tuple(split_of)
    n = len(rels)
    if by_split:
        where = f"the split folders ({', '.join(sorted(tops))}) of {where}"
    if labels == "none" or (labels == "auto" and n_strays == n):
        return ItemTable(rels, _filled(n, -1), (), split_codes, split_names), ()
    if n_strays:
        if labels == "folders":
            rule = "--labels folders needs every image inside a class folder"
        else:
            others = n - n_strays
            rule = (
                f"the other {others} {'is' if others == 1 else 'are'} in class folders, and --labels auto "
                "takes each image's class from its folder"
            )
        more = f" and {n_strays - _MAX_LISTED} more" if n_strays > _MAX_LISTED else ""
        raise SourceError(
            f"{n_strays} image{'s sit' if n_strays > 1 else ' sits'} directly in {where}: "
            f"{_listing(strays[:_MAX_LISTED])}{more}; {rule}. Move them into class folders, or pass --labels none "
            "to build an unlabelled store"
        )
    classes = tuple(sorted(class_of))
    # Codes in order of first sight -> indices into the sorted class names.
    remap = np.array([classes.index(name) for name in class_of], dtype=np.int32)
    label_codes = Column(np.int32)
    for part_codes in codes.parts():
        label_codes.append(remap[part_codes])
    codes.close()
    items = ItemTable(rels, label_codes, classes, split_codes, split_names)
    # Class folders under different split folders are never in one listing: compare the classes too.
    seen_names: dict[str, str] = {}
    for name in classes:
        other = seen_names.setdefault(normal_form(name), name)
        if other != name:
            raise _twins_error("class folders", where, other, name)
    return items, classes


def _filled(n: int, value: int) -> Column:
    """A column of ``n`` int32 ``value`` (made a part at a time)."""
    col = Column(np.int32)
    for a in range(0, n, PART):
        col.append(np.full(min(PART, n - a), value, dtype=np.int32))
    return col


#: Paths a scan holds as strings before it sorts them into a run kept as bytes (see :class:`_Runs`).
RUN = 1 << 17

#: Runs kept apart at most (each holds two open files): more are merged into one as they come.
MAX_RUNS = 64

#: Paths read back from each run at once while the runs are merged.
_MERGE_STEP = 4096


class _Runs:
    """The scan's paths, sorted by an external merge sort: every :data:`RUN` paths are sorted and
    kept as :class:`~dlpack.sources._items.Paths` (in a file once large), and the runs are merged
    at the end. A scan holds at most one run as strings, whatever the number of files."""

    def __init__(self) -> None:
        self._open: list[str] = []
        self._runs: list[Paths] = []

    def append(self, rel: str) -> None:
        self._open.append(rel)
        if len(self._open) >= RUN:
            self._open.sort()
            self._runs.append(Paths(self._open, spill=True))  # runs exist only for large scans
            self._open = []
            if len(self._runs) >= MAX_RUNS:  # one run of them all: a file each, read a step each at the end
                self._runs = [Paths(heapq.merge(*(_read_run(r) for r in self._runs)), spill=True)]

    def __len__(self) -> int:
        return len(self._open) + sum(len(r) for r in self._runs)

    def merged(self) -> Iterator[str]:
        """Every path, in sorted order (once: the runs are given up as they are read)."""
        self._open.sort()
        runs, self._runs = self._runs, []
        last, self._open = self._open, []
        if not runs:
            return iter(last)
        return heapq.merge(*(_read_run(r) for r in runs), last)


def _read_run(run: Paths) -> Iterator[str]:
    for a in range(0, len(run), _MERGE_STEP):
        data, offsets = run.utf8(range(a, a + _MERGE_STEP))
        raw = data.tobytes()
        bounds = offsets.tolist()
        for j in range(len(bounds) - 1):
            yield raw[bounds[j] : bounds[j + 1]].decode("utf-8")


#: Which ``--labels`` source reads label folders, named in the error that refuses them.
LABEL_SOURCES_HINT = (
    "label images whose pixel value is the class id are read by --labels masks:DIR (matched to the images "
    "by relative path), anomaly ground truth by --labels anomaly --anomaly-masks DIR"
)


def label_path(rel: str) -> str | None:
    """The label folder (``a/masks/``) or label image (``a/0_mask.png``) that ``rel`` is or lies in, else None."""
    parts = rel.split("/")
    for n, part in enumerate(parts[:-1]):
        if part.lower() in LABEL_FOLDER_NAMES:
            return "/".join(parts[: n + 1]) + "/"
    return rel if fnmatch.fnmatchcase(parts[-1].lower(), LABEL_FILE_PATTERN) else None


#: How the reason for a symlink the scan does not follow ends (an update, which keeps the store's
#: symlink rule, gives other advice in its place).
FOLLOW_ADVICE = "; pass --follow-symlinks to pack what it links to"


def label_paths_error(root: str, paths: Sequence[str], update: bool = False) -> SourceError:
    """Label folders and label images found in a source (they would become a class, or be packed as
    photos): the error naming them and the ``--exclude`` patterns that leave them out. An update
    keeps the store's patterns and label source, so there those are advice for a rebuild."""
    folders = [p for p in paths if p.endswith("/")]
    files = [p for p in paths if not p.endswith("/")]
    found = []
    # One pattern per folder name: the path itself when there is one, "*/name" for the nested ones.
    by_name: dict[str, list[str]] = {}
    for p in folders:
        by_name.setdefault(p.rstrip("/").rsplit("/", 1)[-1], []).append(p.rstrip("/"))
    patterns: list[str] = []
    for name, rels in by_name.items():
        nested = [r for r in rels if "/" in r]
        patterns += [name] if len(rels) > len(nested) else []
        patterns += nested if len(nested) == 1 else [f"*/{name}"] if nested else []
    patterns = [shown(_shown(p)) for p in patterns]
    if folders:
        found.append(f"label folder(s) {_listing(folders)}")
    if files:
        found.append(f"{len(files)} label image(s) named {LABEL_FILE_PATTERN} ({_listing(files)})")
        case_ok = all(fnmatch.fnmatchcase(p.rsplit("/", 1)[-1], LABEL_FILE_PATTERN) for p in files)
        patterns.append(LABEL_FILE_PATTERN if case_ok else "*_[mM][aA][sS][kK].*")
    flags = " ".join(f"--exclude '{p}'" for p in patterns)
    head = (
        f"{root!r} holds label data, not images of a class: {'; '.join(found)}. Packed, it would become a "
        "class of its own (and label images would be resized like photos)."
    )
    if update:
        return SourceError(
            f"{head} An update keeps the store's --exclude patterns and labels: move it out of the source "
            f"folder, or rebuild with --overwrite {flags}. To use it as labels, rebuild with --overwrite: "
            f"{LABEL_SOURCES_HINT}"
        )
    return SourceError(
        f"{head} Leave it out with {flags}, or move it out of the source folder. To use it as labels: "
        f"{LABEL_SOURCES_HINT}"
    )


def _twins_error(what: str, where: str, a: str, b: str) -> SourceError:
    """Two names that look the same: NFC ``café`` and NFD ``cafe`` + U+0301 are different names to the file system."""
    return SourceError(
        f"two {what} in {where} have names that differ only in Unicode normalisation: "
        f"{shown(a)!r} ({code_points(a)}) and {shown(b)!r} ({code_points(b)}). They look the same in every "
        "listing, and a copy made by a tool that normalises names (macOS, zip, sync tools) would no longer "
        "match them; rename or merge one of them"
    )
