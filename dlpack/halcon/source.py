"""A HALCON DLDataset (its JSON form) as input: images, class ids and names, splits and labels.

A DLDataset is a dictionary that references image files by path: ``image_dir`` (the images' base
folder), ``class_names`` and ``class_ids`` (aligned tuples; ids are any ints), and ``samples``, one
dictionary per image with ``image_id`` (unique int), ``image_file_name`` (relative to
``image_dir``, ``/`` separators), an optional ``split`` (``train``, ``validation``, ``test``) and
the keys of its task:

========================  ==============================================================
task                      sample keys
========================  ==============================================================
classification            ``image_label_id`` (a class id)
detection (rectangle1)    ``bbox_label_id``, ``bbox_row1``, ``bbox_col1``, ``bbox_row2``,
                          ``bbox_col2`` (tuples of one length, possibly empty)
semantic segmentation     ``segmentation_file_name`` (relative to the top-level
                          ``segmentation_dir``; a label image whose pixel value is the class id)
anomaly detection         ``anomaly_label`` (``ok`` / ``nok``), optional ``anomaly_file_name``
                          (relative to the top-level ``anomaly_dir``)
========================  ==============================================================

HALCON boxes are pixel-centred (the pixel ``(r, c)`` has its centre at ``(r, c)``; an image spans
``[-0.5, H-0.5]``), rows first; dlpack's are corner-based ``[x_min, y_min, x_max, y_max]``, so
``x_min = col1 + 0.5``, ``y_min = row1 + 0.5``, ``x_max = col2 + 0.5``, ``y_max = row2 + 0.5``.
HALCON reads the pixel array of a file as stored, so the labels are given in the file's frame
(``"frame": "file"``): an EXIF orientation is applied to them as to the image.

Folders: ``image_dir``, ``segmentation_dir`` and ``anomaly_dir`` are absolute, or relative to the
folder holding the JSON file (``''`` is that folder). A JSON file in a bucket (an ``s3://`` URL)
resolves relative folders to prefixes beside it; an absolute one stays a local folder, and an
``s3://`` URL is a prefix. A JSON scalar where a tuple is expected is a one-element tuple (a HALCON
tuple of length one may be written so).

What is refused, and how. The whole source (:class:`~dlpack.errors.SourceError`) when it cannot be
read as one dataset: malformed JSON (with line and column), top-level keys that are not a
DLDataset's, class names and ids that are missing, of different lengths or repeated, a duplicate
``image_id`` (the id names a sample: two samples with one id cannot both be meant), samples of two
tasks in one file, and oriented boxes (``rectangle2``: not supported yet). A single sample
(:class:`~dlpack.errors.InputFileError` in :attr:`SourceScan.errors`, so ``--on-error skip`` can
leave it out) when only it is wrong: unknown keys, a missing or non-integer ``image_id``, a file
name that is not a relative path inside its folder, a missing image or label file, a file that
is a link out of its folder (the rule COCO and CSV entries follow), a split or
anomaly label HALCON does not have, a class id not in ``class_ids``, box tuples of different
lengths, and a box with ``row1 >= row2`` or ``col1 >= col2``. The keys ``dlpack_variant_of`` and
``dlpack_variant`` that ``dlpack export --include-variants`` writes are dlpack's own and accepted
(non-negative integers): such a sample is read as any other. Each error names the sample by
``image_id`` and file name. Boxes are not clipped here (the image size is not read at scan
time); the build clips them to the image when it resizes.
"""

from __future__ import annotations

import math
import os
import posixpath
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._names import shown
from ..errors import InputFileError, LabelFileError, SourceError, SourceNotFoundError
from ..sources._entries import bucket_files, file_problem, load_json, name_problem, place
from ..sources.base import SourceFiles, SourceItem, SourceScan
from ..storage.location import is_url

__all__ = [
    "DLDatasetInfo",
    "DLDatasetSource",
    "read_dldataset",
    "dldataset_json",
    "TASK_KEYS",
    "SAMPLE_KEYS",
    "SPLITS",
]

#: The keys a sample of each task may have beyond :data:`SAMPLE_KEYS`.
TASK_KEYS: dict[str, tuple[str, ...]] = {
    "classification": ("image_label_id",),
    "detection": ("bbox_label_id", "bbox_row1", "bbox_col1", "bbox_row2", "bbox_col2"),
    "segmentation": ("segmentation_file_name",),
    "anomaly": ("anomaly_label", "anomaly_file_name"),
    "none": (),
}
#: The keys every sample may have.
SAMPLE_KEYS: tuple[str, ...] = ("image_id", "image_file_name", "split")
#: The keys ``dlpack export --include-variants`` adds to a variant (its original's ``image_id``, and
#: v): read back as ordinary samples, so dlpack reads its own exports.
VARIANT_KEYS: tuple[str, ...] = ("dlpack_variant_of", "dlpack_variant")
#: Keys of oriented boxes (``rectangle2``), which dlpack does not read yet.
ORIENTED_KEYS: tuple[str, ...] = ("bbox_row", "bbox_col", "bbox_phi", "bbox_length1", "bbox_length2")
#: HALCON's split names, kept as they are.
SPLITS: tuple[str, ...] = ("train", "validation", "test")
#: Top-level keys of a DLDataset (the last three are written by HALCON's own preprocessing).
TOP_KEYS: tuple[str, ...] = (
    "image_dir",
    "class_names",
    "class_ids",
    "samples",
    "segmentation_dir",
    "anomaly_dir",
    "preprocess_param",
    "dlsample_dir",
    "class_weights",
)
_BOX = ("bbox_row1", "bbox_col1", "bbox_row2", "bbox_col2")
_FILE_NAME = "dataset.json"


@dataclass(frozen=True)
class DLDatasetInfo:
    """A DLDataset JSON file read and checked as a whole (its samples are checked by the scan).

    ``image_dir``, ``segmentation_dir`` and ``anomaly_dir`` are resolved folders (None when the
    dataset has none); ``task`` is the one task its samples' keys belong to (``"none"`` when they
    carry no labels).
    """

    path: Path
    image_dir: Path
    task: str
    class_names: tuple[str, ...]
    class_ids: tuple[int, ...]
    samples: tuple[Mapping[str, Any], ...] = field(repr=False, compare=False)
    segmentation_dir: Path | None = None
    anomaly_dir: Path | None = None

    @property
    def label_root(self) -> Path | None:
        """The folder that label files (label images, ground truth) are relative to."""
        return self.segmentation_dir if self.task == "segmentation" else self.anomaly_dir


def dldataset_json(path: str | os.PathLike[str]) -> Path:
    """The JSON file of a DLDataset given as the file itself or a folder holding ``dataset.json``.

    A URL names the object itself when it ends in ``.json``, else the prefix holding ``dataset.json``
    (as text: a missing object is named when it is read)."""
    if is_url(path):
        url = str(path).rstrip("/")
        return url if url.lower().endswith(".json") else f"{url}/{_FILE_NAME}"  # type: ignore[return-value]
    p = Path(path)
    if p.is_dir():
        p = p / _FILE_NAME
        if not p.is_file():
            raise SourceError(f"{os.fspath(path)!r} is a folder without {_FILE_NAME}; give the DLDataset's JSON file")
    elif not p.exists():
        raise SourceNotFoundError(f"DLDataset {os.fspath(path)!r} does not exist")
    return p


def _tuple(value: Any) -> list[Any]:
    """A HALCON tuple as a list: a JSON scalar is a tuple of one."""
    return list(value) if isinstance(value, list) else [value]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _folder(base: Path, value: Any, key: str, where: str) -> Path:
    if not isinstance(value, str):
        raise LabelFileError(f"{where}: {key} must be a string (a folder path), got {value!r}")
    if is_url(value):
        return value  # type: ignore[return-value]
    if is_url(base) and not Path(value).is_absolute():  # a prefix beside the JSON object
        parts = [q for q in value.split("/") if q not in ("", ".")]
        return "/".join([str(base), *parts]) if parts else base  # type: ignore[return-value]
    p = Path(value)
    return p if p.is_absolute() else base / p


def _sample_name(k: int, sample: Mapping[str, Any]) -> str:
    """``image_id 7 (a/b.png)``: how messages name a sample."""
    iid = sample.get("image_id")
    name = sample.get("image_file_name")
    head = f"image_id {iid!r}" if iid is not None else f"samples[{k}]"
    return f"{head} ({shown(name)})" if isinstance(name, str) else head


def _task(samples: Sequence[Mapping[str, Any]], top: Mapping[str, Any], where: str) -> str:
    """The one task the samples' keys (and the top-level label folders) belong to."""
    first: dict[str, str] = {}
    for k, s in enumerate(samples):
        oriented = [key for key in ORIENTED_KEYS if key in s]
        if oriented:
            count = sum(1 for t in samples if any(key in t for key in ORIENTED_KEYS))
            raise LabelFileError(
                f"{where}: sample {_sample_name(k, s)} has oriented boxes ({', '.join(oriented)}): oriented "
                f"boxes (rectangle2) are not supported yet ({count} sample(s) have them); convert them to "
                "axis-aligned boxes (bbox_row1, bbox_col1, bbox_row2, bbox_col2)"
            )
        for task, keys in TASK_KEYS.items():
            if any(key in s for key in keys):
                first.setdefault(task, _sample_name(k, s))
    for key, task in (("segmentation_dir", "segmentation"), ("anomaly_dir", "anomaly")):
        if key in top:
            first.setdefault(task, f"the top-level key {key}")
    if len(first) > 1:
        named = "; ".join(f"{task} ({who})" for task, who in first.items())
        raise LabelFileError(f"{where} mixes the keys of several tasks: {named}; a DLDataset holds one task")
    return next(iter(first), "none")


def read_dldataset(path: str | os.PathLike[str], storage_options: object = None) -> DLDatasetInfo:
    """Read a DLDataset's JSON file (or a folder holding ``dataset.json``) and check it as a whole.

    Raises :class:`~dlpack.errors.SourceError` for what makes the file unusable as one dataset
    (the module docstring lists it); the samples themselves are checked by
    :meth:`DLDatasetSource.scan`.
    """
    p = dldataset_json(path)
    where = repr(str(p))
    top = load_json(p, "DLDataset", storage_options)
    if not isinstance(top, dict):
        raise LabelFileError(f"DLDataset {where} must hold a JSON object, got {type(top).__name__}")
    unknown = sorted(set(top) - set(TOP_KEYS))
    if unknown:
        raise LabelFileError(
            f"DLDataset {where} has top-level key(s) a DLDataset does not have: {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(TOP_KEYS)})"
        )
    missing = [k for k in ("image_dir", "class_names", "class_ids", "samples") if k not in top]
    if missing:
        raise LabelFileError(f"DLDataset {where} lacks the key(s) {', '.join(missing)}")
    names = _tuple(top["class_names"])
    ids = _tuple(top["class_ids"])
    if not all(isinstance(n, str) and n for n in names):
        raise LabelFileError(f"DLDataset {where}: class_names must be non-empty strings, got {top['class_names']!r}")
    if not all(_is_int(i) for i in ids):
        raise LabelFileError(f"DLDataset {where}: class_ids must be integers, got {top['class_ids']!r}")
    if len(names) != len(ids):
        raise LabelFileError(
            f"DLDataset {where}: {len(names)} class_names but {len(ids)} class_ids; they must be aligned"
        )
    for what, values in (("class_names", names), ("class_ids", ids)):
        dup = sorted({repr(v) for v in values if values.count(v) > 1})
        if dup:
            raise LabelFileError(f"DLDataset {where}: {what} repeats {', '.join(dup)}; each class must be listed once")
    samples = top["samples"]
    if not isinstance(samples, list):
        raise LabelFileError(f"DLDataset {where}: samples must be a list of objects, got {type(samples).__name__}")
    for k, s in enumerate(samples):
        if not isinstance(s, dict):
            raise LabelFileError(f"DLDataset {where}: samples[{k}] must be an object, got {type(s).__name__}")
    if not samples:
        raise LabelFileError(f"DLDataset {where} holds no samples")
    seen: dict[Any, int] = {}
    for k, s in enumerate(samples):
        iid = s.get("image_id")
        if _is_int(iid):
            if iid in seen:
                raise LabelFileError(
                    f"DLDataset {where}: image_id {iid} is used twice, by {_sample_name(seen[iid], samples[seen[iid]])} "
                    f"and samples[{k}] ({shown(s.get('image_file_name'))}); each sample needs its own id"
                )
            seen[iid] = k
    task = _task(samples, top, f"DLDataset {where}")
    if task == "anomaly" and not {"ok", "nok"} <= set(names):
        raise LabelFileError(f"DLDataset {where}: an anomaly dataset names its classes ok and nok, got {names!r}")
    base: Path = str(p).rpartition("/")[0] if is_url(p) else p.parent  # type: ignore[assignment]
    seg = anomaly = None
    if task == "segmentation":
        if "segmentation_dir" not in top:
            raise LabelFileError(f"DLDataset {where} has segmentation_file_name samples but no segmentation_dir")
        seg = _folder(base, top["segmentation_dir"], "segmentation_dir", f"DLDataset {where}")
    if "anomaly_dir" in top:
        anomaly = _folder(base, top["anomaly_dir"], "anomaly_dir", f"DLDataset {where}")
    elif any("anomaly_file_name" in s for s in samples):
        raise LabelFileError(f"DLDataset {where} has anomaly_file_name samples but no anomaly_dir")
    return DLDatasetInfo(
        path=p,
        image_dir=_folder(base, top["image_dir"], "image_dir", f"DLDataset {where}"),
        task=task,
        class_names=tuple(names),
        class_ids=tuple(ids),
        samples=tuple(samples),
        segmentation_dir=seg,
        anomaly_dir=anomaly,
    )


class _Bad(Exception):
    """One sample's problem (becomes an :class:`InputFileError`)."""


def _inside(name: Any, key: str, folder: str) -> str:
    """``name`` as a normalised relative path inside its folder, or :class:`_Bad`."""
    if not isinstance(name, str) or not name:
        raise _Bad(f"{key} must be a non-empty string (a path relative to {folder}), got {name!r}")
    bad = name_problem(name)
    if bad is not None:
        raise _Bad(f"{key}: {bad}")
    rel = posixpath.normpath(name)
    if posixpath.isabs(name) or Path(name).is_absolute() or rel == ".." or rel.startswith("../") or rel == ".":
        raise _Bad(f"{key} {shown(name)!r} is not a relative path inside {folder}; name a file below it")
    return rel


def _regular(root: Path, rel: str, what: str, folder: str, storage_options: object = None) -> None:
    """``root / rel`` is a regular file inside ``root`` (``folder`` names it), or :class:`_Bad`.

    A bucket prefix ``root`` (a URL) is read with ``storage_options``: only a missing object is refused."""
    bucket = bucket_files(root, storage_options)
    if bucket is not None:
        try:
            bucket.stat(rel)
        except OSError as exc:
            reason = (
                "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc.strerror or exc}"
            )
            raise _Bad(f"the {what} {str(root).rstrip('/') + '/' + rel!r} {reason}") from None
        return
    path = root / rel
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read: {exc.strerror or exc}"
        raise _Bad(f"the {what} {os.fspath(path)!r} {reason}") from None
    if not stat.S_ISREG(mode):
        raise _Bad(f"the {what} {os.fspath(path)!r} is not a regular file")
    problem = file_problem(root, rel, folder)  # a link out of its folder, as COCO and CSV refuse it
    if problem is not None:
        raise _Bad(f"the {what} {os.fspath(path)!r}: {problem}")


def _class_index(value: Any, info: DLDatasetInfo, key: str) -> int:
    if not _is_int(value) or value not in info.class_ids:
        raise _Bad(f"{key} {value!r} is not one of the class_ids {list(info.class_ids)}")
    return info.class_ids.index(value)


def _boxes(s: Mapping[str, Any], info: DLDatasetInfo) -> dict[str, Any]:
    """A detection sample's boxes in dlpack's corner form and labels as class indices."""
    keys = ("bbox_label_id", *_BOX)
    present = [k for k in keys if k in s]
    if not present:
        return {"frame": "file", "boxes": [], "box_labels": []}
    if len(present) < len(keys):
        raise _Bad(f"has {', '.join(present)} but not {', '.join(k for k in keys if k not in s)}")
    cols = {k: _tuple(s[k]) for k in keys}
    lengths = {len(v) for v in cols.values()}
    if len(lengths) > 1:
        raise _Bad("box tuples of different lengths: " + ", ".join(f"{k} {len(v)}" for k, v in cols.items()))
    boxes, labels = [], []
    for j in range(len(cols["bbox_label_id"])):
        r1, c1, r2, c2 = (cols[k][j] for k in _BOX)
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (r1, c1, r2, c2)
        ):
            raise _Bad(f"box {j}: coordinates must be finite numbers, got {[r1, c1, r2, c2]!r}")
        if r1 >= r2 or c1 >= c2:
            raise _Bad(f"box {j}: row1 {r1} >= row2 {r2}" if r1 >= r2 else f"box {j}: col1 {c1} >= col2 {c2}")
        labels.append(_class_index(cols["bbox_label_id"][j], info, f"box {j}: bbox_label_id"))
        boxes.append([float(c1) + 0.5, float(r1) + 0.5, float(c2) + 0.5, float(r2) + 0.5])
    return {"frame": "file", "boxes": boxes, "box_labels": labels}


def _item(s: Mapping[str, Any], info: DLDatasetInfo, root: Path, storage_options: object = None) -> SourceItem:
    """One sample as an item, or :class:`_Bad` naming its first problem."""
    allowed = (*SAMPLE_KEYS, *TASK_KEYS[info.task])
    unknown = sorted(set(s) - set(allowed) - set(VARIANT_KEYS))
    if unknown:
        raise _Bad(
            f"unknown key(s) {', '.join(map(repr, unknown))} for a {info.task} DLDataset (a sample has "
            f"{', '.join(allowed)})"
        )
    for key in VARIANT_KEYS:
        if key in s and not (_is_int(s[key]) and s[key] >= 0):
            raise _Bad(f"{key} must be a non-negative integer (dlpack export writes it), got {s[key]!r}")
    if not _is_int(s.get("image_id")):
        raise _Bad(f"image_id must be an integer, got {s.get('image_id')!r}")
    rel = _inside(s.get("image_file_name"), "image_file_name", "image_dir")
    split = s.get("split")
    if split is not None and split not in SPLITS:
        raise _Bad(f"split {split!r} is not one of {', '.join(SPLITS)}")
    label: str | None = None
    annotations: dict[str, Any] | None = None
    if info.task == "classification":
        if "image_label_id" not in s:
            raise _Bad("a classification sample needs image_label_id")
        label = info.class_names[_class_index(s["image_label_id"], info, "image_label_id")]
    elif info.task == "detection":
        annotations = _boxes(s, info)
    elif info.task == "segmentation":
        assert info.segmentation_dir is not None
        mask = _inside(s.get("segmentation_file_name"), "segmentation_file_name", "segmentation_dir")
        _regular(info.segmentation_dir, mask, "label image", "segmentation_dir", storage_options)
        annotations = {"frame": "file", "mask": mask}
    elif info.task == "anomaly":
        value = s.get("anomaly_label")
        if value not in ("ok", "nok"):
            raise _Bad(f"anomaly_label must be 'ok' or 'nok', got {value!r}")
        label = value
        annotations = {"frame": "file"}
        if "anomaly_file_name" in s:
            assert info.anomaly_dir is not None
            gt = _inside(s["anomaly_file_name"], "anomaly_file_name", "anomaly_dir")
            _regular(info.anomaly_dir, gt, "ground-truth file", "anomaly_dir", storage_options)
            annotations["anomaly_mask"] = gt
    _regular(root, rel, "image file", "image_dir", storage_options)
    return SourceItem(rel, label, annotations, split)


@dataclass(frozen=True, init=False)
class DLDatasetSource:
    """A HALCON DLDataset JSON file as a :class:`~dlpack.sources.Source`.

    ``json_path`` is the JSON file or a folder holding ``dataset.json``; ``images_root`` replaces
    the dataset's ``image_dir`` (for a dataset moved from the machine that wrote it). Items come
    in the samples' order, ``rel`` relative to :attr:`root`; classes and ids keep the dataset's
    order; splits keep HALCON's names (``validation`` stays ``validation``). The JSON file and its
    folders may be ``s3://`` URLs (relative folders are then prefixes beside the JSON object), read
    with ``storage_options``.
    """

    json_path: Path
    images_root: Path | None
    storage_options: object = field(default=None, compare=False, repr=False)
    #: The file as last read (the build asks for ``root`` per file: the JSON is parsed once).
    _info: list[DLDatasetInfo] = field(default_factory=list, compare=False, repr=False)

    def __init__(
        self,
        json_path: str | os.PathLike[str],
        images_root: str | os.PathLike[str] | None = None,
        storage_options: object = None,
    ) -> None:
        object.__setattr__(self, "json_path", place(json_path))
        object.__setattr__(self, "images_root", None if images_root is None else place(images_root))
        object.__setattr__(self, "storage_options", storage_options)
        object.__setattr__(self, "_info", [])

    def info(self) -> DLDatasetInfo:
        """The dataset read and checked as a whole (read once; :meth:`scan` reads it again)."""
        if not self._info:
            self._info.append(read_dldataset(self.json_path, self.storage_options))
        return self._info[0]

    @property
    def root(self) -> Path:
        """The folder image paths are relative to: ``images_root`` when given, else the dataset's ``image_dir``."""
        return self.images_root if self.images_root is not None else self.info().image_dir

    @property
    def files(self) -> SourceFiles | None:
        """The bucket's files when :attr:`root` is a URL (None: the local folder)."""
        return bucket_files(self.root, self.storage_options)

    def scan(self) -> SourceScan:
        """List the samples as items; samples that cannot be used go to :attr:`SourceScan.errors`."""
        self._info.clear()
        info = self.info()
        root = self.images_root if self.images_root is not None else info.image_dir
        if not is_url(root) and not root.is_dir():
            what = "images_root" if self.images_root is not None else f"the image_dir of {os.fspath(info.path)!r}"
            raise SourceError(f"{what} {os.fspath(root)!r} is not a folder")
        items: list[SourceItem] = []
        errors: list[InputFileError] = []
        owners: dict[str, str] = {}
        for k, s in enumerate(info.samples):
            name = s.get("image_file_name")
            path = shown(name) if isinstance(name, str) and name else f"samples[{k}]"
            head = f"image_id {s['image_id']}" if _is_int(s.get("image_id")) else f"samples[{k}]"
            try:
                item = _item(s, info, root, self.storage_options)
                if item.rel in owners:
                    raise _Bad(f"the same image file as {owners[item.rel]}; each image is one sample")
            except _Bad as exc:
                errors.append(InputFileError(path, f"{head}: {exc}"))
                continue
            owners[item.rel] = head
            items.append(item)
        label_root = info.label_root
        return SourceScan(
            tuple(items),
            info.class_names,
            tuple(errors),
            "dldataset",
            class_ids=info.class_ids,
            task=info.task,
            label_root=None if label_root is None else str(label_root),
        )
