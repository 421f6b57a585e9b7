"""What every exporter shares: the store's task and classes, the samples, file names, PNG
writing, and the output folder written beside its final place and renamed into it at the end."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from .. import schema
from .._names import shown
from ..errors import OptionError, StoreError, StoreExistsError, StoreLockedError
from ..storage.lock import sibling
from ..storage.publish import Output, clear_replaced, publish_stage

#: The tasks a store can hold (the manifest's ``task``).
TASKS = ("classification", "detection", "segmentation", "anomaly", "none")
#: The file that marks a finished dlpack export (written last, inside OUT).
MARKER = ".dlpack-export.json"
#: The file that marks a folder as an export being written (so a stale one may be removed).
PARTIAL_MARKER = ".dlpack-export-partial"
#: dlpack split names that HALCON knows, and HALCON's name for each.
HALCON_SPLITS = {"train": "train", "val": "validation", "validation": "validation", "test": "test"}
#: Folder names HALCON's anomaly reader takes as "ok".
OK_FOLDERS = ("good", "ok")


@dataclass(frozen=True)
class StoreView:
    """The facts of a store an exporter needs, read once."""

    path: str
    count: int
    task: str
    classes: tuple[str, ...]
    class_ids: tuple[int, ...]
    splits: tuple[str, ...]
    defects: tuple[str, ...]
    mask_ignore: int | None
    instance_masks: bool
    arrays: frozenset[str]
    #: The classes were read off the masks (a segmentation store without a class list).
    classes_from_masks: bool = False

    def class_id(self, index: int) -> int:
        return self.class_ids[index]


@dataclass(frozen=True)
class Sample:
    """One sample as the exporters see it."""

    index: int
    source: str
    image: np.ndarray
    label: int
    split: str | None
    boxes: np.ndarray | None = None
    box_labels: np.ndarray | None = None
    box_crowd: np.ndarray | None = None
    mask: np.ndarray | None = None
    defect: int | None = None
    #: 0 for an original; v >= 1 for augmentation variant v of sample ``index``.
    variant: int = 0


@dataclass
class Notes:
    """What an export says besides its files: each note once."""

    items: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        if text not in self.items:
            self.items.append(text)


def infer_task(manifest: Any) -> str:
    """The store's task by :func:`dlpack.schema.store_task` (a recorded task, or the label arrays)."""
    return schema.store_task(
        manifest.arrays, manifest.classes, manifest.labels != "none", getattr(manifest, "task", None)
    )


def describe(ds: Any) -> StoreView:
    """The :class:`StoreView` of an open :class:`~dlpack.Dataset`; manifest fields that older
    stores lack take their documented defaults."""
    m = ds.manifest
    classes = tuple(m.classes)
    ids = tuple(int(i) for i in (getattr(m, "class_ids", None) or range(len(classes))))
    task = infer_task(m)
    mask_classes = getattr(m, "mask_classes", None)
    if task == "segmentation" and mask_classes:
        pairs = [(int(i), str(n)) for i, n in mask_classes]
        ids, classes = tuple(i for i, _ in pairs), tuple(n for _, n in pairs)
    ignore = getattr(m, "mask_ignore", None)
    if ignore is None and "mask" in m.arrays:
        ignore = 65535 if m.arrays["mask"].dtype == "<u2" else 255
    from_masks = task == "segmentation" and not classes and "mask" in m.arrays
    if from_masks:  # HALCON needs the class ids of a segmentation: the values the masks hold
        found: set[int] = set()
        for i in range(len(ds)):
            found.update(int(v) for v in np.unique(ds[i]["mask"]))
        ids = tuple(sorted(found - {ignore}))
        classes = tuple(f"class_{i}" for i in ids)
    if len(ids) != len(classes):
        raise StoreError(f"store {ds.path}: {len(ids)} class ids for {len(classes)} classes")
    if task not in TASKS:
        raise StoreError(f"store {ds.path} records the task {task!r}; dlpack knows {', '.join(TASKS)}")
    plan = getattr(m, "plan", None) or {}
    return StoreView(
        path=str(ds.path),
        count=len(ds),
        task=task,
        classes=classes,
        class_ids=ids,
        splits=tuple(m.splits),
        defects=tuple(getattr(m, "defects", None) or ()),
        mask_ignore=None if ignore is None else int(ignore),
        instance_masks=bool(plan.get("instance_masks", False)),
        arrays=frozenset(m.arrays),
        classes_from_masks=from_masks,
    )


def note_classes(view: StoreView, notes: Notes) -> None:
    if view.classes_from_masks:
        notes.add(
            f"the store has no class names: the mask values {', '.join(map(str, view.class_ids))} are named "
            + ", ".join(view.classes)
        )


def samples(ds: Any) -> Iterator[Sample]:
    """Every sample of the store, in order."""
    for i in range(len(ds)):
        yield as_sample(i, ds[i])


def variant_samples(ds: Any, keep: Callable[[Sample], bool]) -> Iterator[Sample]:
    """The augmentation variants 1..K of every sample ``keep`` accepts (judged on the original)."""
    for i in range(len(ds)):
        original = as_sample(i, ds[i])
        if keep(original):
            for v in range(1, ds.variants + 1):
                yield as_sample(i, ds.variant(i, v), v)


def as_sample(i: int, s: dict[str, Any], variant: int = 0) -> Sample:
    """A sample dict of ``ds[i]`` or ``ds.variant(i, v)`` as the exporters see it."""

    def get(key: str) -> Any:
        v = s.get(key)
        return None if v is None else np.asarray(v)

    defect = s.get("defect")
    return Sample(
        index=i,
        source=str(s["source"]),
        image=np.asarray(s["image"]),
        label=int(s["label"]),
        split=s.get("split") if isinstance(s.get("split"), str) else None,
        boxes=None if get("boxes") is None else get("boxes").reshape(-1, 4),
        box_labels=get("box_labels"),
        box_crowd=get("box_crowd"),
        mask=get("mask"),
        defect=None if defect is None else int(np.asarray(defect).reshape(-1)[0]),
        variant=variant,
    )


# ---------------------------------------------------------------- names and files


def checked_source(view: StoreView, s: Sample) -> PurePosixPath:
    """The sample's source path, refused when it could name a file outside the export."""
    p = PurePosixPath(s.source)
    if not s.source or p.is_absolute() or any(part in ("", ".", "..") for part in s.source.split("/")):
        raise StoreError(
            f"store {view.path}: sample {s.index} has the source path {shown(s.source)!r}, "
            "which cannot name a file inside the export (absolute, empty or with '..')"
        )
    return p


def folder_name(view: StoreView, name: str, what: str) -> str:
    r"""``name`` (a class or defect name) as one folder level, refused when it could not be one
    (empty, ``.``/``..``, or holding ``/``, ``\`` or NUL: a COCO category may be named anything)."""
    if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise OptionError(
            f"store {view.path}: the {what} {shown(name)!r} cannot be a folder name; export with --to dldataset or "
            "--to coco, which keep names in JSON"
        )
    return name


def fold(name: str) -> str:
    """``name`` as a case-insensitive, normalisation-insensitive file system compares it (macOS,
    Windows): two names with one fold would be one file there."""
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", name).casefold())


def _parents(path: str) -> Iterator[str]:
    head = path.rpartition("/")[0]
    while head:
        yield head
        head = head.rpartition("/")[0]


def unique_png_names(wanted: Mapping[int, tuple[str, str]], taken: Iterable[str] = ()) -> dict[int, str]:
    """``key -> "folder/rel.png"``: one PNG name per key, none shared with another key or with ``taken``.

    ``wanted`` maps a key (a sample index) to ``(folder, rel)``: the folder the file goes in (``""``
    for the top) and the source path below it. A name is the source path with ``.png`` for its
    extension; sources whose names would then meet (``x.jpg`` and ``x.png``) keep their extension
    (``x.jpg.png``); any name still taken, whatever the sources are called, gets ``_<key>`` (and a
    count) until it is free. Names are compared as a case-insensitive file system does (``A.png``
    is ``a.png``), and a file may not take the name of a folder another file sits in: every name
    is checked against the final set, so two samples never share one file.
    """
    full = {k: f"{folder}/{rel}" if folder else rel for k, (folder, rel) in wanted.items()}
    base = {}
    for k, path in full.items():
        head, _, name = path.rpartition("/")
        stem = PurePosixPath(name).stem
        base[k] = f"{head}/{stem}" if head else stem
    bases = Counter(fold(b) for b in base.values())
    preferred = {k: base[k] if bases[fold(base[k])] == 1 else full[k] for k in wanted}
    taken = list(taken)
    used = {fold(t) for t in taken}
    used.update(fold(d) for path in (*full.values(), *taken) for d in _parents(path))
    wanted_by = Counter(fold(p + ".png") for p in preferred.values())
    out: dict[int, str] = {}
    for k, p in preferred.items():  # names only one key wants, and free: kept as they are
        if wanted_by[fold(p + ".png")] == 1 and fold(p + ".png") not in used:
            out[k] = p + ".png"
    used.update(fold(n) for n in out.values())
    # The rest: the first keeps a free name (a source named so before one that kept its extension),
    # the others get a suffix.
    for k in sorted((k for k in preferred if k not in out), key=lambda k: preferred[k] != base[k]):
        p = preferred[k]
        name, n = p + ".png", 0
        while fold(name) in used:
            n += 1
            name = f"{p}_{k}.png" if n == 1 else f"{p}_{k}_{n}.png"
        out[k] = name
        used.add(fold(name))
    return out


def png_names(view: StoreView, sources: list[tuple[int, PurePosixPath]]) -> dict[int, str]:
    """``sample index -> "a/b/name.png"``: the source path with ``.png`` for its extension, made
    unique by :func:`unique_png_names`."""
    return unique_png_names({i: ("", p.as_posix()) for i, p in sources})


def flat_names(groups: dict[int, tuple[str, PurePosixPath]]) -> dict[int, str]:
    """``sample index -> "folder/name.png"`` for layouts with one folder level (a class, a defect):
    the file's own name in that folder, made unique by :func:`unique_png_names`."""
    return unique_png_names({i: (folder, p.name) for i, (folder, p) in groups.items()})


def write_png(path: Path, pixels: np.ndarray) -> None:
    """Write ``pixels`` (H x W, H x W x 1 gray or H x W x 3 RGB; 8 or 16 bit) as a lossless PNG."""
    import cv2

    a = np.ascontiguousarray(pixels)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    elif a.ndim == 3 and a.shape[2] == 3:
        a = cv2.cvtColor(a, cv2.COLOR_RGB2BGR)  # OpenCV writes BGR
    ok, buf = cv2.imencode(".png", a)
    if not ok:
        raise StoreError(f"cannot encode {path.name} as PNG ({a.dtype}, shape {list(a.shape)})")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.tobytes())


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8")


def halcon_split(view: StoreView, s: Sample) -> str | None:
    """HALCON's split name for a sample (``val`` -> ``validation``), None without one; a split
    HALCON does not know is refused (HALCON would train on none of its samples, silently)."""
    if s.split is None:
        return None
    name = HALCON_SPLITS.get(s.split)
    if name is None:
        raise OptionError(
            f"store {view.path}: sample {s.index} ({shown(s.source)}) is in the split {shown(s.split)!r}, which "
            "HALCON does not know (it knows train, validation and test; dlpack's val becomes validation); "
            "rename the split (dlpack.add_array(store, 'split', codes, replace=True) with the store's split names) "
            "or export to coco"
        )
    return name


# ---------------------------------------------------------------- the output folder


def _is_export(path: Path) -> bool:
    return export_marker(path) is not None


def _partial(out: Path) -> Path:
    return sibling(out, "export-partial")


def _old(out: Path) -> Path:
    return sibling(out, "export-old")


def _refuse(leftover: Path) -> Exception | None:
    """None when ``leftover`` (at an export's sibling name) is dlpack's: a folder being written,
    an export, or an empty folder; else the error that refuses it."""
    folder = leftover.is_dir() and not leftover.is_symlink()
    if folder and ((leftover / PARTIAL_MARKER).exists() or _is_export(leftover) or not any(leftover.iterdir())):
        return None
    return StoreExistsError(f"{leftover} is in the way and is not a dlpack export; move it away")


def _check_replaceable(out: Path) -> None:
    if not (out.is_dir() and not out.is_symlink() and _is_export(out)):
        raise StoreExistsError(
            f"{out} is not empty and is not a dlpack export; choose an empty or new folder (dlpack replaces only "
            "its own exports)"
        )


#: An export folder, as :func:`~dlpack.storage.publish.publish_stage` publishes it.
EXPORT = Output(
    old=_old,
    refuse=_refuse,
    complete=lambda path: path.is_dir() and not path.is_symlink() and _is_export(path),
    check_replaceable=_check_replaceable,
    remove=lambda path: shutil.rmtree(path, ignore_errors=True),
    place=lambda tmp, out: os.rename(tmp, out),
)


def clear_export_leftovers(out: Path) -> Path:
    """Undo what a killed export to ``out`` left beside it (call only while holding the lock on
    ``out``: nobody writes them then): a previous export moved aside goes back to a missing ``out``,
    a half-written or replaced export is removed; anything else at those names is refused and kept.
    Returns the name the export is written under before it is published."""
    clear_replaced(out, EXPORT)
    stage = _partial(out)
    if os.path.lexists(stage):
        refused = _refuse(stage)
        if refused is not None:
            raise refused
        shutil.rmtree(stage)
    return stage


def export_marker(path: Path) -> dict[str, Any] | None:
    """The marker of the dlpack export at ``path``, or None when it is not one."""
    try:
        doc = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) and doc.get("dlpack_export") == 1 else None


@contextlib.contextmanager
def staged_output(
    out: Path, store: Path | None, overwrite: bool, marker: dict[str, Any], locked: bool = False
) -> Iterator[Path]:
    """Yield an empty folder beside ``out`` to write the export into; on success write the marker
    and publish the folder at ``out`` as a build publishes its store (replacing a previous export
    only with ``overwrite``); on failure remove it, so nothing that looks complete is left.

    ``locked``: the caller already holds the lock on ``out`` (``build --format dldataset``, which
    holds it from before its staging store is built until that store is removed)."""
    from ..storage.lock import BuildLock

    out = Path(os.path.abspath(out))
    real_store = Path(os.path.realpath(store)) if store is not None else None  # None: a store in a bucket
    real_out = Path(os.path.realpath(out))
    if real_store is not None and (
        real_out == real_store or real_store in real_out.parents or real_out in real_store.parents
    ):
        raise OptionError(f"the export folder {out} and the store {store} overlap; choose a folder outside the store")
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = BuildLock(out)
    try:
        if not locked:
            lock.acquire()
    except StoreLockedError as exc:
        raise StoreLockedError(f"another dlpack process is writing {out}: {exc}") from None
    try:
        stage = clear_export_leftovers(out)
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            raise StoreExistsError(f"{out} exists and is not a folder; choose another export folder")
        if out.is_dir() and any(out.iterdir()):
            _check_replaceable(out)
            if not overwrite:
                raise StoreExistsError(
                    f"{out} holds a previous dlpack export; pass --overwrite (overwrite=True) to replace it"
                )
        stage.mkdir()
        (stage / PARTIAL_MARKER).write_text("a dlpack export being written\n", encoding="utf-8")
        try:
            yield stage
            write_json(stage / MARKER, {"dlpack_export": 1, **marker})
            (stage / PARTIAL_MARKER).unlink()
            if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
                out.rmdir()  # empty (checked above)
            publish_stage(stage, out, overwrite, EXPORT)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    finally:
        lock.release()
