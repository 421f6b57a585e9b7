"""Shared checks of label sources: file names given in an annotation file, the annotation file itself,
and the index of a label-image folder.

A COCO file, a CSV or a mask folder names image files the scan did not find by walking; each name is
checked here the same way: relative, inside the image folder, an existing regular file.
"""

from __future__ import annotations

import fnmatch
import os
import re
import stat
from pathlib import Path
from typing import Any

from .._json import MAX_FILE_BYTES, decode_text, parse_json, read_text_file
from .._names import shown
from ..errors import LabelFileError, SourceError, SourceNotFoundError, StoreError
from ..options import IMAGE_SUFFIXES
from ..storage.location import Location, is_url
from ._where import files_at
from .base import LocalFiles, SourceFiles, SourceScan

__all__ = [
    "name_problem",
    "relative_name",
    "file_problem",
    "check_root",
    "read_text",
    "load_json",
    "label_files",
    "stem",
    "listing",
    "walk_images",
    "bucket_files",
    "has_objects",
    "place",
]

_MAX_LISTED = 5


_SURROGATE = re.compile("[\ud800-\udfff]")


def name_problem(name: str) -> str | None:
    """Why ``name`` (from a label file) cannot be a file name at all, else None.

    A NUL ends a name at the system's interface, so no file has one; a lone surrogate (written as
    an escape in JSON) is not a character, and source paths are stored as UTF-8.
    """
    if "\x00" in name:
        return "the file name holds a NUL character (\\x00), which no file name can"
    found = _SURROGATE.search(name)
    if found is not None:
        return (
            f"the file name holds a lone surrogate ({shown(found.group())}), which is not a character; "
            "source paths are stored as UTF-8"
        )
    return None


def relative_name(name: object) -> tuple[str | None, str | None]:
    r"""``(rel, None)``: ``name`` as a clean relative path with ``/`` separators; or ``(None, reason)``.

    Refused: anything not a non-empty string, absolute paths (``/x``, ``C:/x``, ``\\host\x``) and
    names with a ``..`` part, which would read files outside the image folder.
    """
    if not isinstance(name, str) or not name.strip():
        return None, f"the file name must be a non-empty string, got {name!r}"
    bad = name_problem(name)
    if bad is not None:
        return None, bad
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
        return None, "the file name is an absolute path; it must be relative to the image folder"
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts or any(".." in p.split("\\") for p in parts):
        return None, "the file name leaves the image folder (a '..' part); it must stay inside it"
    if not parts:
        return None, f"the file name {name!r} names no file"
    return "/".join(parts), None


def bucket_files(where: str | os.PathLike[str] | Location, storage_options: object = None) -> SourceFiles | None:
    """The files of the bucket prefix ``where`` read with ``storage_options``; None for a local path."""
    if isinstance(where, Location) or is_url(where):
        return files_at(Location.parse(where, storage_options or None))  # type: ignore[arg-type]
    return None


def place(where: str | os.PathLike[str]) -> Path | str:
    """A folder or file given by the user as the sources keep it: a local Path, a URL as its text
    (``Path("s3://b/k")`` would be the local folder ``s3:/b/k``)."""
    return str(where) if isinstance(where, Location) or is_url(where) else Path(where)


def file_problem(root: Path | SourceFiles, rel: str, folder: str = "the image folder") -> str | None:
    """Why ``root / rel`` cannot be read as an input file (missing, not a file, a link out of
    ``root``), else None: the one link rule of every label source, whose ``folder`` names ``root``.

    ``root`` may be a bucket's files: an object has no links, so only a missing one is refused."""
    if isinstance(root, LocalFiles):
        root = Path(root.root)
    if not isinstance(root, (str, os.PathLike)):
        try:
            root.stat(rel)
        except FileNotFoundError:
            return f"file not found in {shown(root.root)!r}"
        except (OSError, StoreError) as exc:
            return f"cannot read: {getattr(exc, 'strerror', None) or exc}"
        return None
    path = os.path.join(os.fspath(root), rel)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"file not found in {shown(os.fspath(root))!r}"
    except OSError as exc:
        return f"cannot read: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        return "not a regular file"
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if not real.startswith(real_root.rstrip(os.sep) + os.sep):
        return f"the file is a link to {shown(real)!r}, outside {folder}; copy the file in"
    return None


def read_text(path: str | os.PathLike[str], what: str, storage_options: object = None) -> str:
    """The UTF-8 text of the annotation file ``path`` (a BOM is dropped); a :class:`LabelFileError` if
    unusable, a :class:`SourceNotFoundError` if missing.

    Read as images are (:func:`dlpack._json.read_text_file`): a regular file, or a pipe with a writer
    (``csv:<(command)``), within the size limit; a named pipe nobody writes to or a device is refused.
    A URL is read from its bucket with ``storage_options``, with the same errors.
    """
    if is_url(path):
        return _url_text(str(path), what, storage_options).removeprefix("\ufeff")
    name = f"{what} {shown(os.fspath(path))!r}"
    return read_text_file(path, name, LabelFileError, pipes=True, missing=SourceNotFoundError).removeprefix("\ufeff")


def _url_text(url: str, what: str, storage_options: object) -> str:
    """The text of the object ``url``, with the errors of a local annotation file."""
    name = f"{what} {shown(url)!r}"
    parent, _, key = url.rstrip("/").rpartition("/")
    files = bucket_files(parent, storage_options)
    assert files is not None
    try:
        if files.stat(key).size > MAX_FILE_BYTES:
            raise LabelFileError(f"{name} is larger than {MAX_FILE_BYTES} bytes")
        data, _ = files.read(key)
    except FileNotFoundError:
        raise SourceNotFoundError(f"{name} does not exist") from None
    except (OSError, StoreError) as exc:
        raise LabelFileError(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    return decode_text(data, name, LabelFileError)


def load_json(path: str | os.PathLike[str], what: str, storage_options: object = None) -> Any:
    """The parsed JSON of ``path`` (a file or an object's URL), read strictly
    (:func:`dlpack._json.parse_json`): malformed JSON, a key given twice, a number no label has or
    deep nesting is a :class:`LabelFileError` naming the file."""
    name = f"{what} {shown(os.fspath(path) if not is_url(path) else str(path))!r}"
    return parse_json(read_text(path, what, storage_options), name, LabelFileError)


def stem(rel: str) -> str:
    """``rel`` without its file extension: ``a/b/img.jpg`` -> ``a/b/img``."""
    head, _, name = rel.rpartition("/")
    base = os.path.splitext(name)[0] or name
    return f"{head}/{base}" if head else base


def _bucket_keys(folder: str, storage_options: object) -> list[str]:
    """Every key under the bucket prefix ``folder`` (relative to it), sorted; a prefix without one is
    a :class:`SourceNotFoundError` as a missing folder is (a bucket has no empty folders)."""
    from ..storage.objects import ObjectStorage

    location = Location.parse(folder, storage_options or None)  # type: ignore[arg-type]
    keys = sorted(info.key for info in ObjectStorage(location).list() if not info.key.endswith("/"))
    if not keys:
        raise SourceNotFoundError(f"label folder {shown(folder)!r} does not exist (no object under it)")
    return keys


def label_files(folder: Path, storage_options: object = None) -> dict[str, list[str]]:
    """The image files under ``folder`` (hidden ones left out), by relative path without extension.

    ``folder`` may be a bucket prefix (a URL), listed with ``storage_options``: its keys are the
    paths, a key with a hidden part (``.x/...``) left out as a hidden folder is.

    Raises
    ------
    SourceError
        ``folder`` does not exist or is not a folder.
    """
    if is_url(folder):
        found_keys: dict[str, list[str]] = {}
        for key in _bucket_keys(str(folder), storage_options):
            parts = key.split("/")
            if any(p.startswith(".") or not p for p in parts) or os.path.splitext(key)[1].lower() not in IMAGE_SUFFIXES:
                continue
            found_keys.setdefault(stem(key), []).append(key)
        return found_keys
    where = shown(os.fspath(folder))
    if not folder.exists():
        raise SourceNotFoundError(f"label folder {where!r} does not exist")
    if not folder.is_dir():
        raise SourceError(f"label folder {where!r} is not a folder")
    found: dict[str, list[str]] = {}
    for top, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel_dir = os.path.relpath(top, folder).replace(os.sep, "/")
        for name in sorted(files):
            if name.startswith(".") or os.path.splitext(name)[1].lower() not in IMAGE_SUFFIXES:
                continue
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            found.setdefault(stem(rel), []).append(rel)
    return found


def listing(paths: list[str]) -> str:
    """The first few paths and how many more."""
    head = ", ".join(shown(p) for p in paths[:_MAX_LISTED])
    return head + (f" and {len(paths) - _MAX_LISTED} more" if len(paths) > _MAX_LISTED else "")


def check_root(root: Path, missing: list[str], named: int, what: str) -> None:
    """Refuse ``root`` when none of the ``named`` files is in it but all are in one folder nearby.

    File names relative to another folder than SRC (``images/x.png`` with SRC ``.../images``, or
    ``x.png`` with SRC one folder above the images) make every image "not found": the fix is the
    SRC folder, which one error says, instead of one error per image that asks to fix the files.
    """
    if not missing or len(missing) != named:
        return
    base = os.fspath(root)
    # Named as the user named SRC (relative stays relative), one and two folders up, then one below.
    up = os.path.normpath(os.path.join(base, os.pardir))
    candidates = [up, os.path.normpath(os.path.join(up, os.pardir))]
    try:
        with os.scandir(base) as entries:
            candidates += sorted(e.path for e in entries if e.is_dir() and not e.name.startswith("."))[:100]
    except OSError:
        pass
    for alt in dict.fromkeys(candidates):
        if all(os.path.isfile(os.path.join(alt, rel)) for rel in missing):
            break
    else:
        return
    raise SourceError(
        f"{what} names {len(missing)} image(s), none of them in {shown(base)!r} (its file names are relative "
        f"to SRC, the image folder), but all of them are in {shown(alt)!r}: pass {shown(alt)!r} as SRC"
    )


def _literal_pattern(rel: str) -> str:
    """``rel`` as an fnmatch pattern that matches only itself (``[``, ``*``, ``?`` escaped)."""
    return "".join(f"[{ch}]" if ch in "[]*?" else ch for ch in rel)


def has_objects(folder: str, storage_options: object) -> bool:
    """Whether the bucket prefix ``folder`` holds any object."""
    try:
        return bool(_bucket_keys(folder, storage_options))
    except SourceNotFoundError:
        return False


def walk_images(
    root: Path,
    label_dir: Path | None,
    follow_symlinks: bool,
    exclude: tuple[str, ...],
    what: str,
    storage_options: object = None,
) -> SourceScan:
    """The image files under ``root`` by the folder source's walk (labels ``none``), ``label_dir`` left out.

    A label folder inside ``root`` holds labels, not images: it is excluded from the walk (and not
    listed as excluded). Label folders elsewhere in ``root`` are refused as by the folder source.
    A bucket prefix ``root`` (a URL) is listed by the bucket's folder source with ``storage_options``.
    """
    from .folder import FolderSource

    skip: str | None = None
    if is_url(root):
        from .remote import BucketFolderSource

        top = str(root).rstrip("/") + "/"
        sub = "" if label_dir is None else str(label_dir).rstrip("/") + "/"
        if sub == top:
            raise SourceError(f"{what} {shown(str(label_dir))!r} is the image folder itself; give its own folder")
        if sub.startswith(top):
            skip = _literal_pattern(sub[len(top) :].rstrip("/"))
        location = Location.parse(root, storage_options or None)  # type: ignore[arg-type]
        scan = BucketFolderSource(location, "none", exclude + ((skip,) if skip else ())).scan()
    elif label_dir is not None and root.is_dir() and label_dir.is_dir():
        if os.path.realpath(root) == os.path.realpath(label_dir):
            raise SourceError(f"{what} {shown(os.fspath(label_dir))!r} is the image folder itself; give its own folder")
        # By the names given first (a linked label folder inside root), then by real paths.
        for top, sub in (
            (os.path.abspath(root), os.path.abspath(label_dir)),
            (os.path.realpath(root), os.path.realpath(label_dir)),
        ):
            if sub.startswith(top.rstrip(os.sep) + os.sep):
                skip = _literal_pattern(os.path.relpath(sub, top).replace(os.sep, "/"))
                break
    if not is_url(root):
        scan = FolderSource(root, "none", follow_symlinks, exclude + ((skip,) if skip else ())).scan()
    if skip is None:
        return scan
    excluded = tuple(p for p in scan.excluded if not fnmatch.fnmatchcase(p.rstrip("/"), skip))
    return SourceScan(scan.items, (), scan.errors, scan.labels, excluded, scan.ignored)
