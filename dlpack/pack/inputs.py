"""Stages 1-2: what the build reads: the source (scan, ``--split``), every file's header (probe), and OUT and SRC checked against each other."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, overload

import numpy as np

from .. import _parallel
from .._files import refuse_url
from .._names import shown as shown_name
from ..backends import BACKENDS
from ..errors import BadInputsError, InputFileError, OptionError, SourceError, SourceNotFoundError
from ..options import SPLIT_PART_NAMES, BuildOptions
from ..sources._items import ItemTable
from ..sources.anomaly import AnomalyFolderSource
from ..sources.base import Source, SourceFiles, SourceItem, SourceScan
from ..sources.base import open_input as open_input  # where it lived: the regular-files rule of input files
from ..sources.decode import DecodeError, check_header, incomplete_reason, no_header_reason, normalise_header
from ..sources.folder import FolderSource
from ..sources.masks import MaskFolderSource
from ..sources.probe import HEADER_BYTES, ImageHeader, probe_header
from ..sources.remote import BucketFolderSource
from ..storage.location import Location, is_url
from ..storage.objects import ObjectStorage, StorageAccessError
from ..storage.runner import Pool
from ..storage.spill import PART, Column


@dataclass(frozen=True)
class Selection:
    """Which scanned items are still in (positions in ``SourceScan.items``, in order), and every input error so far."""

    #: A ``range`` while every item is in, a :class:`Kept` once some are out (nothing per item in
    #: either), or a tuple.
    keep: Sequence[int]
    errors: tuple[InputFileError, ...]

    def drop(self, failed: Mapping[int, InputFileError]) -> Selection:
        """A selection without the positions in ``failed``, whose errors are added."""
        if not failed:
            return Selection(self.keep, self.errors)
        keep = self.keep
        if isinstance(keep, range) and keep.start == 0 and keep.step == 1:
            kept: Sequence[int] = Kept(len(keep), list(failed))
        elif isinstance(keep, Kept):
            kept = keep.without(list(failed))
        else:
            kept = tuple(k for k in keep if k not in failed)
        return Selection(kept, self.errors + tuple(failed.values()))


class Kept(Sequence[int]):
    """Positions ``0 .. n - 1`` but the dropped ones, ascending: a range with holes, which costs
    memory per hole, not per position (a million images with a few bad files keep a few numbers).

    A slice is a NumPy array of positions; iteration reads them a part at a time.
    """

    __slots__ = ("_n", "_dropped", "_shifted")

    def __init__(self, n: int, dropped: Iterable[int]) -> None:
        held = np.unique(np.fromiter(dropped, dtype=np.int64))
        self._n = n
        self._dropped = held[(held >= 0) & (held < n)]
        # The j-th kept position is j plus the number of dropped positions d_i with d_i - i <= j.
        self._shifted = self._dropped - np.arange(len(self._dropped), dtype=np.int64)

    def without(self, dropped: Iterable[int]) -> Kept:
        """These positions less ``dropped`` (positions, not indices into this sequence)."""
        return Kept(self._n, [*self._dropped.tolist(), *dropped])

    def __len__(self) -> int:
        return self._n - len(self._dropped)

    def _positions(self, js: np.ndarray) -> np.ndarray:
        return js + np.searchsorted(self._shifted, js, side="right")

    @overload
    def __getitem__(self, k: int) -> int: ...

    @overload
    def __getitem__(self, k: slice) -> Any: ...

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, slice):
            return self._positions(np.arange(*k.indices(len(self)), dtype=np.int64))
        n = len(self)
        j = int(k) + n if k < 0 else int(k)
        if not 0 <= j < n:
            raise IndexError(f"position {k} of {n}")
        return int(self._positions(np.array([j], dtype=np.int64))[0])

    def __iter__(self) -> Iterator[int]:
        for a in range(0, len(self), PART):
            yield from self[a : a + PART].tolist()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Kept({self._n} positions but {len(self._dropped)})"


def bad_inputs(errors: Sequence[InputFileError], root: Path | str, nothing_left: bool = False) -> BadInputsError:
    """The error listing every bad input; ``nothing_left`` when no input is good (then skipping cannot help)."""
    return BadInputsError(sorted(errors, key=lambda e: e.path), os.fspath(root), nothing_left)


def as_source(src: Source | str | os.PathLike[str], opts: BuildOptions) -> Source:
    """The source a build reads.

    A path is read with the labels the options name (:func:`dlpack.sources.label_source`: a
    :class:`FolderSource` for ``auto``/``folders``/``none``); a DLDataset folder or its
    ``dataset.json`` given as the path (with ``labels="auto"``) is read as that dataset. A Source
    object lists its own items: the options that shape a folder path's listing are checked
    against it by :func:`source_options`.
    """
    if isinstance(src, (str, os.PathLike)) and is_url(src):
        return bucket_source(Location.parse(src, opts.storage_options), opts)
    if isinstance(src, (str, os.PathLike)):
        from ..halcon.source import DLDatasetSource
        from ..halcon.view import is_dldataset
        from ..sources.labels_kind import label_source

        if opts.labels == "auto" and is_dldataset(src):
            return DLDatasetSource(src)
        return label_source(src, opts)
    if isinstance(src, Source):
        return src
    raise OptionError(f"src must be a folder path or a dlpack.sources.Source, got {type(src).__name__}")


def bucket_source(where: Location, opts: BuildOptions) -> Source:
    """The source of a bucket prefix (``s3://bucket/raw/``): its images by the folder rules, or by
    the label source ``--labels`` names (COCO, CSV, masks, anomaly, DLDataset; its label files local
    or in the bucket), read with the storage options of the build (one endpoint and one set of
    credentials for SRC, the label files and OUT)."""
    from ..sources.labels_kind import parse_labels

    kind, _ = parse_labels(opts.labels)
    if opts.follow_symlinks:
        raise OptionError(f"SRC {where} is in a bucket, which has no symbolic links: drop --follow-symlinks")
    if kind not in ("auto", "folders", "none"):
        from ..sources.labels_kind import label_source

        # The label kinds read their files (a local path or a URL) and list the prefix themselves.
        return label_source(where.url, opts)
    if kind == "auto" and _holds_dldataset(where):
        from ..halcon.source import DLDatasetSource

        return DLDatasetSource(where.url, storage_options=opts.storage_options)
    return BucketFolderSource(where, kind, opts.exclude, opts.class_folder)


def _holds_dldataset(where: Location) -> bool:
    """Whether a bucket prefix holds a DLDataset (its ``dataset.json``), or is a ``.json`` object itself,
    as :func:`~dlpack.halcon.view.is_dldataset` says of a local path: one HEAD (None in a missing
    bucket: the folder source's listing names it)."""
    if where.suffix.lower() == ".json":
        return ObjectStorage(Location(where.url.rsplit("/", 1)[0], where.options)).head(where.name) is not None
    return ObjectStorage(where).head("dataset.json") is not None


#: Options that shape what a folder path lists; with a Source object they would do nothing.
_LISTING_OPTIONS = ("labels", "follow_symlinks", "exclude", "class_folder", "anomaly_masks", "instance_masks")


def source_options(source: Source, opts: BuildOptions) -> BuildOptions:
    """``opts`` as the build of ``source`` records them: a source object's own folder rules.

    ``labels``, ``follow_symlinks`` and ``exclude`` shape what a folder path lists. A Source object
    lists its items itself, so one of them given with another value than the source's (for any
    source but a :class:`FolderSource`: than its default) would be ignored, and is refused.
    """
    defaults = BuildOptions()
    own: dict[str, Any] = (
        {
            "labels": source.labels,
            "follow_symlinks": source.follow_symlinks,
            "exclude": source.exclude,
            "class_folder": source.class_folder,
        }
        if isinstance(source, (FolderSource, BucketFolderSource))
        else {}
    )
    kind = type(source).__name__
    for name in _LISTING_OPTIONS:
        given = getattr(opts, name)
        if given == getattr(defaults, name) or (name in own and given == own[name]):
            continue
        if name == "exclude" and not own:
            raise OptionError(f"exclude applies to a folder source; a {kind} lists its own items: leave them out there")
        if name == "exclude":
            raise OptionError(
                f"the FolderSource excludes {list(own['exclude'])} but exclude={list(opts.exclude)} was given; "
                "give the patterns in one place"
            )
        if name in own:
            raise OptionError(
                f"the FolderSource has {name}={own[name]!r} but {name}={given!r} was given; give it in one place"
            )
        raise OptionError(
            f"{name}={given!r} applies to a folder path; a {kind} lists its own items and labels, "
            f"so it would be ignored: drop {name}, or give it to the source"
        )
    if own:
        # The plan records the source's own patterns and symlink rule.
        opts = replace(
            opts, exclude=own["exclude"], follow_symlinks=own["follow_symlinks"], class_folder=own["class_folder"]
        )
    return opts


#: The ``split`` array is int8 with -1 for "no split".
_MAX_SPLITS = 127


def split_names(items: Sequence[SourceItem]) -> tuple[str, ...]:
    """The sorted split names the items use; the ``split`` array stores an index into them."""
    if isinstance(items, ItemTable):  # from the codes, a part at a time, without making the items
        used: set[int] = set()
        for part in items.split_codes.parts():
            used.update(np.unique(part).tolist())
        return tuple(sorted(items.split_names[c] for c in used if c >= 0))
    return tuple(sorted({it.split for it in items if it.split is not None}))


def scan_stage(source: Source) -> SourceScan:
    """1. List the source's items, and refuse a listing a store cannot hold."""
    scan = source.scan()
    where = os.fspath(source.root)
    if not scan.items and not scan.errors:
        raise SourceError(f"the source {where!r} lists no items")
    classes = set(scan.classes)
    if len(classes) != len(scan.classes):
        raise SourceError(f"the source {where!r} lists a class name twice: {list(scan.classes)}")
    # Paths in rising order (a folder's scan) are unique when each is above the one before: no set
    # of every path is needed unless the order breaks.
    seen: set[str] | None = None
    last: str | None = None
    for k, item in enumerate(scan.items):
        rel = item.rel
        if not rel or rel.startswith("/") or any(part in ("", ".", "..") for part in rel.split("/")):
            raise SourceError(
                f"the source {where!r} lists {rel!r}; item paths are relative to the source root, "
                "with '/' separators and no empty, '.' or '..' parts"
            )
        if seen is None and last is not None and rel <= last:
            seen = {it.rel for it in scan.items[:k]}
        if seen is not None:
            if rel in seen:
                raise SourceError(f"the source {where!r} lists {rel!r} twice")
            seen.add(rel)
        last = rel
        if item.label is not None and item.label not in classes:
            raise SourceError(
                f"the source {where!r} labels {rel!r} {item.label!r}, which is not one of its classes {list(scan.classes)}"
            )
    splits = split_names(scan.items)
    if len(splits) > _MAX_SPLITS:
        raise SourceError(f"the source {where!r} lists {len(splits)} split names; a store holds at most {_MAX_SPLITS}")
    return scan


def _split_draw(seed: int, rel: str) -> float:
    """A number in [0, 1) fixed by the seed and the file's path: where the file falls in a ``--split``."""
    digest = hashlib.sha256(f"{seed}\0{rel}".encode("utf-8", "surrogateescape")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _split_counts_of(n: int, percent: Sequence[int]) -> list[int]:
    """``n`` samples shared by ``percent`` in whole samples (largest remainder; ties to the earlier part)."""
    counts = [n * p // 100 for p in percent]  # whole numbers only: the same on every machine
    order = sorted(range(len(percent)), key=lambda j: (-(n * percent[j] % 100), j))
    for j in order[: n - sum(counts)]:
        counts[j] += 1
    return counts


def _source_splits_error(scan: SourceScan, where: str, what: str) -> OptionError:
    tops = sorted({it.rel.split("/")[0] + "/" for it in scan.items if it.split is not None})
    return OptionError(
        f"{where!r} already gives splits by its folders ({', '.join(shown_name(t) for t in tops[:10])}); {what}"
    )


def _with_splits(items: Sequence[SourceItem], splits: Sequence[str | None]) -> Sequence[SourceItem]:
    """``items`` with the splits ``splits``: columns stay columns."""
    if isinstance(items, ItemTable):
        return items.with_splits(splits)
    return tuple(replace(it, split=name) for it, name in zip(items, splits, strict=True))


def split_stage(scan: SourceScan, percent: Sequence[int], seed: int, where: str) -> SourceScan:
    """1b. Give every item a split (``--split``): by class, each class shared by ``percent``.

    Within a class, items are ordered by a draw fixed by the seed and their path (never by the
    order of the workers), and the first ones go to train, then val, then test, so every class is
    split in the same proportions (in whole samples). A split the source gives is never overridden.
    """
    if any(it.split is not None for it in scan.items):
        raise _source_splits_error(scan, where, "drop --split (split=...) to keep them, or move the images out of them")
    names = SPLIT_PART_NAMES[len(percent)]
    by_class: dict[str | None, list[int]] = {}
    for k, it in enumerate(scan.items):
        by_class.setdefault(it.label, []).append(k)
    assigned: list[str | None] = [None] * len(scan.items)
    for ks in by_class.values():
        ks.sort(key=lambda k: (_split_draw(seed, scan.items[k].rel), scan.items[k].rel))
        pos = 0
        for name, n in zip(names, _split_counts_of(len(ks), percent), strict=True):
            for k in ks[pos : pos + n]:
                assigned[k] = name
            pos += n
    return replace(scan, items=_with_splits(scan.items, assigned))


def split_per_file(scan: SourceScan, percent: Sequence[int], seed: int, where: str) -> SourceScan:
    """Every item's split by its own draw (the rule for samples an update appends to a ``--split`` store)."""
    if any(it.split is not None for it in scan.items):
        raise _source_splits_error(
            scan,
            where,
            "the store's splits were made with --split; move the images out of those folders, "
            "or rebuild with --overwrite",
        )
    names = SPLIT_PART_NAMES[len(percent)]
    bounds = np.cumsum(percent) / 100
    assigned = [
        names[min(int(np.searchsorted(bounds, _split_draw(seed, it.rel), side="right")), len(names) - 1)]
        for it in scan.items
    ]
    return replace(scan, items=_with_splits(scan.items, assigned))


@dataclass(frozen=True)
class Probe:
    """One file's probe: its header (None when unreadable), its size in bytes, why it is unusable."""

    header: ImageHeader | None
    nbytes: int
    error: str | None


_FORMATS = ("png", "jpeg", "bmp", "tiff", "webp", "pnm")


#: A probe's fixed-width fields, one row per file: width and height as the file gives them (a PNM
#: header can say anything); format code, channels, has_alpha, bit depth, orientation and pages (at
#: most MAX_TIFF_PAGES + 1); the file's size; whether it has a header.
_PROBE_ROW = np.dtype([("size", "<i8", (2,)), ("head", "<i2", (6,)), ("nbytes", "<i8"), ("has", "?")])


class ProbeTable(Sequence[Probe]):
    """Probes as one column of fixed-width rows (:mod:`dlpack.storage.spill`: in a file once large), with
    the rare errors and odd headers kept by position."""

    __slots__ = ("_rows", "_errors", "_odd")

    def __init__(self, n: int = 0) -> None:
        del n  # the rows are appended as the probes come
        self._rows = Column(_PROBE_ROW)
        self._errors: dict[int, str] = {}
        #: headers whose format is not one of the known ones (kept whole)
        self._odd: dict[int, ImageHeader] = {}

    @classmethod
    def of(cls, probes: Iterable[Probe], n: int = 0) -> ProbeTable:
        """A table of ``probes``."""
        table = cls(n)
        table.extend(probes)
        return table

    def extend(self, probes: Iterable[Probe]) -> None:
        """Append ``probes`` as rows (an odd header or an error kept by position beside them)."""
        block = list(probes)
        rows = np.zeros(len(block), dtype=_PROBE_ROW)
        first = len(self._rows)
        for j, p in enumerate(block):
            k = first + j
            rows["nbytes"][j] = p.nbytes
            if p.error is not None:
                self._errors[k] = p.error
            h = p.header
            if h is None:
                continue
            rows["has"][j] = True
            small = (h.channels, int(h.has_alpha), h.bit_depth, h.orientation, h.pages)
            if h.format not in _FORMATS or not all(0 <= v < 2**15 for v in small):
                self._odd[k] = h
                continue
            rows["size"][j] = (h.width, h.height)
            rows["head"][j] = (_FORMATS.index(h.format), h.channels, h.has_alpha, h.bit_depth, h.orientation, h.pages)
        self._rows.append(rows)

    @property
    def _n(self) -> int:
        return len(self._rows)

    def header(self, k: int) -> ImageHeader | None:
        """File ``k``'s header, made from its row without making its :class:`Probe`."""
        row = self._rows.at(k)
        if not row["has"]:
            return None
        if k in self._odd:
            return self._odd[k]
        w, h = row["size"].tolist()
        f, c, a, d, o, p = row["head"].tolist()
        return ImageHeader(_FORMATS[f], w, h, c, bool(a), d, o, p)

    def _probe(self, k: int) -> Probe:
        return Probe(self.header(k), int(self._rows.at(k)["nbytes"]), self._errors.get(k))

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, k: int) -> Probe: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[Probe, ...]: ...

    def __getitem__(self, k: int | slice) -> Probe | tuple[Probe, ...]:
        if isinstance(k, slice):
            return tuple(self._probe(j) for j in range(*k.indices(self._n)))
        j = k + self._n if k < 0 else k
        if not 0 <= j < self._n:
            raise IndexError(f"probe {k} of {self._n}")
        return self._probe(j)

    def __iter__(self) -> Iterator[Probe]:
        for k in range(self._n):
            yield self._probe(k)

    @property
    def errors(self) -> Mapping[int, str]:
        """Why each failed probe failed, by position."""
        return self._errors

    def nbytes(self, keep: Sequence[int] | np.ndarray) -> int:
        """The summed file sizes of items ``keep`` (ascending), read a part at a time."""
        total = 0
        for a in range(0, len(keep), PART):
            total += int(self._rows.take(keep[a : a + PART])["nbytes"].sum())
        return total


def _tail_ok(files: SourceFiles, rel: str, header: ImageHeader) -> str | None:
    """Truncation check from the file's last bytes; the whole file is read only when they are unusual."""
    if header.format not in ("jpeg", "png"):
        return None
    if incomplete_reason(files.read_tail(rel, 64), header.format, whole=False) is None:
        return None
    return incomplete_reason(files.read(rel)[0], header.format)


def _probe_files(files: SourceFiles, rels: Sequence[str], max_pixels: int) -> list[Probe]:
    out = []
    for rel in rels:
        try:
            head, size = files.read_head(rel, HEADER_BYTES)
        except StorageAccessError:
            raise  # the bucket refused or could not be reached: no file's fault, the build stops
        except OSError as exc:
            out.append(Probe(None, 0, f"cannot read: {exc.strerror or exc}"))
            continue
        if not head:
            out.append(Probe(None, 0, "empty file (0 bytes)"))
            continue
        header = probe_header(head)
        if header is None and size > len(head):
            # TIFF keeps its first IFD after the pixels, JPEG metadata can exceed the head, and a
            # WebP's EXIF chunk follows its image data.
            try:
                head = files.read(rel)[0]
                header = probe_header(head)
            except StorageAccessError:
                raise
            except OSError as exc:
                out.append(Probe(None, size, f"cannot read: {exc.strerror or exc}"))
                continue
        if header is not None:
            header = normalise_header(header, head)
        if header is None:
            out.append(Probe(None, size, no_header_reason(head)))
            continue
        try:
            check_header(header, max_pixels)
        except DecodeError as exc:
            out.append(Probe(header, size, str(exc)))
            continue
        try:
            out.append(Probe(header, size, _tail_ok(files, rel, header)))
        except StorageAccessError:
            raise
        except OSError as exc:
            out.append(Probe(header, size, f"cannot read: {exc.strerror or exc}"))
    return out


#: Files per probe call.
PROBE_STEP = 256


def _rels(items: Sequence[SourceItem], start: int, stop: int) -> list[str]:
    rel = getattr(items, "rel", None)  # an ItemTable gives a path without making its item
    return [rel(k) for k in range(start, stop)] if rel is not None else [it.rel for it in items[start:stop]]


def probe_stage(
    files: SourceFiles,
    items: Sequence[SourceItem],
    *,
    max_pixels: int,
    n_jobs: int,
    quiet: bool,
    pool: Pool | None = None,
) -> ProbeTable:
    """2. Read every file's header (in workers): size, channels, depth, and why a file is unusable.

    The paths of a call are listed only when the pool asks for it, and its probes go into columns.
    ``pool``: a cluster's pool (``--scheduler``) reads them there, not on this machine.
    """
    from joblib import delayed

    step = PROBE_STEP
    n = len(items)
    calls = (delayed(_probe_files)(files, _rels(items, s, min(s + step, n)), max_pixels) for s in range(0, n, step))
    n_calls = -(-n // step)
    probes = ProbeTable(n)
    # While the pool is still starting (see build), reading headers here beats waiting for it.
    jobs = 1 if _parallel.warming() else min(n_jobs, max(1, n_calls))
    with _parallel.progress(n, "checking", quiet) as bar:
        for block in _parallel.parallel(jobs, calls, n_calls) if pool is None else pool.imap(calls, n_calls):
            probes.extend(block)
            bar.update(len(block))
    return probes


def probed(scan: SourceScan, probes: Sequence[Probe]) -> Selection:
    """The first selection: every item whose probe passed; the scan's and the probe's errors."""
    failed = probes.errors if isinstance(probes, ProbeTable) else {k: p.error for k, p in enumerate(probes) if p.error}
    bad = [InputFileError(scan.items[k].rel, failed[k]) for k in sorted(failed)]
    keep = Kept(len(probes), failed) if failed else range(len(probes))
    return Selection(keep, scan.errors + tuple(bad))


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


#: A source URL dlpack reads: an S3 (or S3-compatible) bucket prefix.
_S3_URL = re.compile(r"^s3://", re.IGNORECASE)
_SOURCE_INSTEAD = (
    "a source is a local path or an s3:// prefix (s3://bucket/raw/); copy the images to local disk or to an "
    "S3-compatible bucket"
)


def check_given(
    src: Source | str | os.PathLike[str],
    out: str | os.PathLike[str],
    storage_options: Mapping[str, object] | Iterable[str] | None = None,
) -> None:
    """Refuse an empty source or output path, a URL of an unsupported kind for either (and storage
    options where neither is a URL), before anything is made.

    A source URL (``s3://bucket/raw/``) is read with the same storage options as OUT: one endpoint
    and one set of credentials for both.
    """
    src_url = isinstance(src, (str, os.PathLike)) and is_url(src)
    if isinstance(src, (str, os.PathLike)) and src_url:
        if not _S3_URL.match(os.fspath(src)):
            refuse_url(src, "the source", _SOURCE_INSTEAD)
        Location.parse(src, storage_options)  # an OptionError for a bad bucket name or options
    elif isinstance(src, (str, os.PathLike)) and not os.fspath(src):
        raise SourceNotFoundError(
            "the source path is empty; give the folder of images (use '.' for the current folder)"
        )
    if is_url(out) or (storage_options and not src_url):
        Location.parse(out, storage_options)  # an OptionError for a bad URL or options
        return
    if not os.fspath(out):
        raise OptionError("the output path is empty; give the store to write, e.g. train.zarr")


def check_paths(source: Source, out: Path | Location) -> None:
    """Refuse an ``out`` that is the source's root or contains it, or (for a folder) lies inside it.

    Replacing OUT would delete the source images in the first two cases. A folder source walks its
    whole tree, so a store inside it would become input of the next build of that folder. A source
    and an OUT in the same bucket are compared by their keys; a local one and a URL never overlap.

    Raises
    ------
    OptionError
        With both paths, as given and resolved.
    """
    if is_url(source.root) or isinstance(out, Location):
        if is_url(source.root) and isinstance(out, Location):
            _check_keys(Location.parse(source.root), out)
        return
    src = Path(source.root)
    src_real, out_real = src.resolve(), out.resolve()
    both = f"OUT {os.fspath(out)!r} and SRC {os.fspath(src)!r}"
    if (os.fspath(out), os.fspath(src)) != (str(out_real), str(src_real)):
        both += f" (resolved: {out_real} and {src_real})"
    if out_real == src_real or _same_file(out, src):
        raise OptionError(f"OUT is SRC: {both}; writing the store there would delete the source images")
    if out_real in src_real.parents or any(_same_file(out, p) for p in src_real.parents):
        raise OptionError(
            f"OUT contains SRC: {both}; replacing OUT would delete the source images; choose an OUT outside SRC"
        )
    if isinstance(source, (FolderSource, MaskFolderSource, AnomalyFolderSource)) and src_real in out_real.parents:
        raise OptionError(
            f"OUT is inside SRC: {both}; the next build of SRC would read the store as input; choose an OUT outside SRC"
        )


def _check_keys(src: Location, out: Location) -> None:
    """:func:`check_paths` of a bucket source and an OUT URL: by bucket and key prefix."""
    if src.bucket != out.bucket:
        return
    both = f"OUT {out} and SRC {src}"
    a, b = src.key, out.key
    if a == b:
        raise OptionError(f"OUT is SRC: {both}; writing the store there would delete the source images")
    if not b or a.startswith(b + "/"):
        raise OptionError(
            f"OUT contains SRC: {both}; replacing OUT would delete the source images; choose an OUT outside SRC"
        )
    if not a or b.startswith(a + "/"):
        raise OptionError(
            f"OUT is inside SRC: {both}; the next build of SRC would read the store as input; choose an OUT outside SRC"
        )


def check_out_suffix(out: Path | Location, *, format: str | None, update: bool) -> None:
    """Refuse an OUT whose suffix names no format (``x.txt``): it would silently become a Zarr folder of that name.

    A suffix-less OUT gets the default format; ``format`` names the format whatever the suffix, and
    an update keeps the format of the store already there.
    """
    if format is not None or update:
        return
    shown_out = str(out) if isinstance(out, Location) else os.fspath(out)
    suffix = os.path.splitext(shown_out.rstrip("/\\"))[1].lower()
    known = {s: b.name for b in BACKENDS.values() for s in b.suffixes}
    if suffix and suffix not in known:
        shown = ", ".join(f"{s} ({name})" for s, name in sorted(known.items()))
        raise OptionError(
            f"OUT {shown_name(shown_out)!r} ends in {shown_name(suffix)!r}, which names no store format; "
            f"use one of the suffixes {shown}, or name the format with format=FORMAT"
        )


#: What to do instead of a write into an existing store in an object store.
_REMOTE_INSTEAD = "build locally and upload the store, or build into a new prefix"


def check_remote_options(out: Location, opts: BuildOptions) -> None:
    """Refuse what a build into an object store does not do (an OptionError saying what to do instead):
    HDF5 (one file, written in place), ``--update``, ``--augment``."""
    hdf5 = opts.format == "hdf5" or (opts.format is None and out.suffix in BACKENDS["hdf5"].suffixes)
    if hdf5:
        raise OptionError(
            f"OUT {out}: HDF5 stores are not written to an object store (an .h5 file is written in place); "
            "write a Zarr store there (OUT ending in .zarr), or build the .h5 locally and upload it"
        )
    if opts.update:
        raise OptionError(f"--update of a store in an object store ({out}) is not supported; {_REMOTE_INSTEAD}")
    if opts.augment:
        raise OptionError(f"--augment into a store in an object store ({out}) is not supported; {_REMOTE_INSTEAD}")
