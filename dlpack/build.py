"""The build pipeline: scan (-> split) -> probe -> plan -> decode/resize -> write -> manifest -> publish.

Each stage is a module-level function of its inputs that returns new values; nothing is shared
between stages but what one returns and the next takes. The plan is a frozen :class:`BuildPlan`,
recorded in the manifest. Workers receive paths, indices and frozen plans, never open handles; they
open what they need themselves. Every call into the store writer lives in the write stage.

A build holds the lock on its output path (:mod:`dlpack._lock`) from before it looks at any earlier
partial until the store is published, so two builds never write the same partial, and a partial
found while holding the lock is a dead build's.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import hashlib
import json
import os
import shutil
import stat
import sys
import threading
import time
import unicodedata
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from . import __version__
from ._files import NotRegularFileError, file_kind, open_regular, read_regular
from ._lock import BuildLock, old_path, partial_path
from ._names import shown as shown_name
from .backends import BACKENDS, ArraySpec, Backend, StoreWriter, backend_for_path, get_backend, owned_store
from .backends.base import writing
from .errors import (
    BadInputsError,
    DlpackError,
    InputFileError,
    OptionError,
    SourceError,
    StoreError,
    StoreExistsError,
    StoreNotFoundError,
)
from .manifest import ImageSpec, Manifest
from .options import SPLIT_PART_NAMES, BuildOptions, parse_split
from .sources.base import Source, SourceItem, SourceScan
from .sources.decode import (
    DecodeError,
    TargetSpec,
    check_header,
    incomplete_reason,
    no_header_reason,
    normalise_header,
    prepare_image,
)
from .sources.folder import SPLIT_NAMES, FolderSource, label_path, label_paths_error
from .sources.probe import HEADER_BYTES, ImageHeader, probe_header
from .transforms.functional import UpscaleError

__all__ = ["build", "BuildResult", "BuildPlan"]


@dataclass(frozen=True)
class BuildPlan:
    """Everything decided before any pixel is written; recorded in the manifest as ``plan``.

    A later resume or update of the store compares its own plan (or :meth:`fingerprint`) with the
    recorded one to know that it continues the same build.

    Attributes
    ----------
    target : TargetSpec
        Geometry (resize mode, size, max side, upscaling), channels, dtype and pixel limit.
    image : ImageSpec
        The stored layout: fixed ``height x width`` or variable, channels, dtype.
    backend, compression : str
        Store format and codec.
    shard_bytes : int
        The shard size asked for.
    shard_images : int
        Images per shard (fixed layout), or inner chunks per shard of the flat pixel array (variable).
    count : int
        Number of samples.
    order : str
        SHA-256 (hex) of the stored samples' relative paths in sample order, as a compact JSON list.
    source : str
        SHA-256 (hex) of what the source listed: every item's path, label, split, annotations and
        file size, the class names and the inputs the scan refused.
    follow_symlinks : bool
        Whether a folder source followed symlinks: part of what the source lists, so an update
        scans with the same rule (recorded only when true).
    exclude : tuple of str
        The exclude patterns of a folder source, which an update scans with too (recorded only when given).
    split, split_seed : tuple of int, int
        The percentages and seed of a split the build made (``--split``; recorded only when given):
        an update gives appended samples their split by the same seed.
    """

    target: TargetSpec
    image: ImageSpec
    backend: str
    compression: str
    shard_bytes: int
    shard_images: int
    count: int
    order: str
    source: str
    follow_symlinks: bool = False
    exclude: tuple[str, ...] = ()
    split: tuple[int, ...] = ()
    split_seed: int = 0

    @property
    def split_names(self) -> tuple[str, ...]:
        """The sorted names of the split the build made; () when it made none."""
        return tuple(sorted(SPLIT_PART_NAMES[len(self.split)])) if self.split else ()

    def __post_init__(self) -> None:
        if (self.target.channels, self.target.dtype) != (self.image.channels, self.image.dtype):
            raise ValueError(
                f"plan target is {self.target.channels} channels {self.target.dtype} but the stored image "
                f"is {self.image.channels} channels {self.image.dtype}"
            )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_dict` inverts it."""
        return {
            "target": self.target.to_dict(),
            "image": asdict(self.image),
            "backend": self.backend,
            "compression": self.compression,
            "shard_bytes": self.shard_bytes,
            "shard_images": self.shard_images,
            "count": self.count,
            "order": self.order,
            "source": self.source,
        } | (
            ({"follow_symlinks": True} if self.follow_symlinks else {})
            | ({"exclude": list(self.exclude)} if self.exclude else {})
            | ({"split": {"percent": list(self.split), "seed": self.split_seed}} if self.split else {})
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BuildPlan:
        """Rebuild a plan from :meth:`to_dict` output (e.g. ``Manifest.plan``).

        Raises
        ------
        StoreError
            ``d`` is not a complete plan.
        """
        try:
            fields = {k: d[k] for k in ("backend", "compression", "shard_bytes", "shard_images", "count")}
            follow = d.get("follow_symlinks", False)
            if not isinstance(follow, bool):
                raise TypeError(f"follow_symlinks must be true or false, got {follow!r}")
            exclude = d.get("exclude", [])
            if not isinstance(exclude, list) or not all(isinstance(p, str) for p in exclude):
                raise TypeError(f"exclude must be a list of patterns, got {exclude!r}")
            split = d.get("split", {"percent": [], "seed": 0})
            pcts, seed = split["percent"], split["seed"]
            if pcts:
                pcts = list(parse_split(pcts))
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise TypeError(f"the split seed must be an integer, got {seed!r}")
            return cls(
                follow_symlinks=follow,
                exclude=tuple(exclude),
                split=tuple(pcts),
                split_seed=seed,
                target=TargetSpec.from_dict(dict(d["target"])),
                image=ImageSpec(**d["image"]),
                order=d["order"],
                source=d["source"],
                **fields,
            )
        except (KeyError, TypeError, ValueError, OptionError) as exc:
            raise StoreError(f"the recorded build plan is malformed: {exc!r}") from exc

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the plan's canonical JSON: equal plans, equal fingerprints, across runs and machines."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: Class names the summary lists before "... and N more".
_SUMMARY_CLASSES = 20


@dataclass(frozen=True)
class BuildResult:
    """What a build did: where the store is, how many images it holds, what was skipped, how fast,
    its classes and how many samples each split holds."""

    path: Path
    count: int
    skipped: tuple[InputFileError, ...]
    seconds: float
    input_bytes: int
    output_bytes: int
    conversions: dict[str, int] = field(default_factory=dict)
    plan: BuildPlan | None = None
    #: What became of a killed build's partial store: "resumed: k of n blocks already written",
    #: "started over: <why>", "published already: ..." (the killed build had published OUT), or
    #: "" when there was none.
    resume: str = ""
    #: What ``update`` changed: "updated: a added, r replaced, d removed; k of n blocks written", or "".
    update: str = ""
    classes: tuple[str, ...] = ()
    splits: dict[str, int] = field(default_factory=dict)
    #: Paths the exclude patterns left out (folders with a trailing "/"), and files that are not images.
    excluded: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    #: How many stored sizes a variable-size store holds (0 for a fixed-size store).
    distinct_sizes: int = 0

    @property
    def images_per_s(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")

    @property
    def notes(self) -> list[str]:
        """What the user should know about the inputs left out and the store's shape (summary lines, ``notes`` in --json)."""
        out = []
        if self.ignored:
            n = len(self.ignored)
            out.append(f"skipped {n} non-image file{'s' if n != 1 else ''} (--verbose lists them)")
        if self.excluded:
            n = len(self.excluded)
            out.append(f"excluded {n} path{'s' if n != 1 else ''} matching --exclude (--verbose lists them)")
        if self.distinct_sizes > 1:
            out.append(
                f"variable-size store ({self.distinct_sizes} distinct sizes): batches are lists; "
                "pass --size WxH or --max-side N for tensors"
            )
        return out

    def summary(self, verbose: bool = False) -> str:
        """Closing lines: images, input MB, output MB, seconds, images/s; the classes; the splits and
        their sizes; the :attr:`notes`; with ``verbose``, every excluded path and non-image file.

        The classes are printed so that a wrong guess of the folder rules is visible at once.
        """
        skipped = f", {len(self.skipped)} skipped" if self.skipped else ""
        lines = [
            f"packed {self.count} images{skipped}: {self.input_bytes / 1e6:.1f} MB in -> "
            f"{self.output_bytes / 1e6:.1f} MB out in {self.seconds:.1f} s ({self.images_per_s:.0f} images/s) "
            f"-> {shown_name(self.path)}"
        ]
        lines[0] += "".join(f" ({note})" for note in (self.resume, self.update) if note)
        if self.classes:
            # Escaped one by one: a class folder named with a newline cannot fake a line of the summary.
            shown = ", ".join(shown_name(c) for c in self.classes[:_SUMMARY_CLASSES])
            more = (
                f", ... and {len(self.classes) - _SUMMARY_CLASSES} more" if len(self.classes) > _SUMMARY_CLASSES else ""
            )
            lines.append(f"classes ({len(self.classes)}): {shown}{more}")
        else:
            lines.append("classes: none (unlabelled)")
        if self.splits:
            lines.append("splits: " + ", ".join(f"{shown_name(name)} {n}" for name, n in sorted(self.splits.items())))
        lines += self.notes
        if verbose:
            lines += [f"  excluded {shown_name(p)}" for p in self.excluded]
            lines += [f"  not an image: {shown_name(p)}" for p in self.ignored]
        return "\n".join(lines)


@dataclass(frozen=True)
class _Selection:
    """Which scanned items are still in (positions in ``SourceScan.items``, in order), and every input error so far."""

    keep: tuple[int, ...]
    errors: tuple[InputFileError, ...]

    def drop(self, failed: Mapping[int, InputFileError]) -> _Selection:
        """A selection without the positions in ``failed``, whose errors are added."""
        return _Selection(tuple(k for k in self.keep if k not in failed), self.errors + tuple(failed.values()))


def _bad_inputs(errors: Sequence[InputFileError], root: Path, nothing_left: bool = False) -> BadInputsError:
    """The error listing every bad input; ``nothing_left`` when no input is good (then skipping cannot help)."""
    return BadInputsError(sorted(errors, key=lambda e: e.path), os.fspath(root), nothing_left)


# ---------------------------------------------------------------- stage 1: scan


def as_source(src: Source | str | os.PathLike[str], opts: BuildOptions) -> Source:
    """The source a build reads: a path means a :class:`FolderSource` with the options' labels and symlink rule."""
    if isinstance(src, (str, os.PathLike)):
        return FolderSource(src, opts.labels, opts.follow_symlinks, opts.exclude)
    if isinstance(src, Source):
        return src
    raise OptionError(f"src must be a folder path or a dlpack.sources.Source, got {type(src).__name__}")


#: The ``split`` array is int8 with -1 for "no split".
_MAX_SPLITS = 127


def _split_names(items: Sequence[SourceItem]) -> tuple[str, ...]:
    """The sorted split names the items use; the ``split`` array stores an index into them."""
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
    seen: set[str] = set()
    for item in scan.items:
        rel = item.rel
        if not rel or rel.startswith("/") or any(part in ("", ".", "..") for part in rel.split("/")):
            raise SourceError(
                f"the source {where!r} lists {rel!r}; item paths are relative to the source root, "
                "with '/' separators and no empty, '.' or '..' parts"
            )
        if rel in seen:
            raise SourceError(f"the source {where!r} lists {rel!r} twice")
        seen.add(rel)
        if item.label is not None and item.label not in classes:
            raise SourceError(
                f"the source {where!r} labels {rel!r} {item.label!r}, which is not one of its classes {list(scan.classes)}"
            )
    splits = _split_names(scan.items)
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
    items = tuple(replace(it, split=name) for it, name in zip(scan.items, assigned, strict=True))
    return replace(scan, items=items)


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
    items = tuple(
        replace(
            it, split=names[min(int(np.searchsorted(bounds, _split_draw(seed, it.rel), side="right")), len(names) - 1)]
        )
        for it in scan.items
    )
    return replace(scan, items=items)


# ---------------------------------------------------------------- stage 2: probe (workers)


@dataclass(frozen=True)
class _Probe:
    header: ImageHeader | None
    nbytes: int
    error: str | None


def _open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file; anything else raises OSError saying what it is.

    A named pipe blocks its reader until a writer comes (forever, in a build) and opening a device
    can have side effects: see :func:`dlpack._files.open_regular`.
    """
    try:
        fd = open_regular(path)
    except NotRegularFileError as exc:
        raise OSError(errno.EINVAL, f"{exc.strerror}; only regular files are packed", os.fspath(path)) from None
    return os.fdopen(fd, "rb")


def _tail_ok(path: Path, header: ImageHeader) -> str | None:
    """Truncation check from the file's last bytes; the whole file is read only when they are unusual."""
    if header.format not in ("jpeg", "png"):
        return None
    with _open_regular(path) as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - 64))
        if incomplete_reason(f.read(), header.format, whole=False) is None:
            return None
        f.seek(0)
        return incomplete_reason(f.read(), header.format)


def _probe_files(root: str, rels: Sequence[str], max_pixels: int) -> list[_Probe]:
    out = []
    for rel in rels:
        path = Path(root, rel)
        try:
            with _open_regular(path) as f:
                head = f.read(HEADER_BYTES)
                size = os.fstat(f.fileno()).st_size
        except OSError as exc:
            out.append(_Probe(None, 0, f"cannot read: {exc.strerror or exc}"))
            continue
        if not head:
            out.append(_Probe(None, 0, "empty file (0 bytes)"))
            continue
        header = probe_header(head)
        if header is None and size > len(head):
            # TIFF keeps its first IFD after the pixels, JPEG metadata can exceed the head, and a
            # WebP's EXIF chunk follows its image data.
            try:
                with _open_regular(path) as f:
                    head = f.read()
                header = probe_header(head)
            except OSError as exc:
                out.append(_Probe(None, size, f"cannot read: {exc.strerror or exc}"))
                continue
        if header is not None:
            header = normalise_header(header, head)
        if header is None:
            out.append(_Probe(None, size, no_header_reason(head)))
            continue
        try:
            check_header(header, max_pixels)
        except DecodeError as exc:
            out.append(_Probe(header, size, str(exc)))
            continue
        try:
            out.append(_Probe(header, size, _tail_ok(path, header)))
        except OSError as exc:
            out.append(_Probe(header, size, f"cannot read: {exc.strerror or exc}"))
    return out


def probe_stage(root: Path, items: Sequence[SourceItem], opts: BuildOptions) -> tuple[_Probe, ...]:
    """2. Read every file's header (in workers): size, channels, depth, and why a file is unusable."""
    from joblib import delayed

    rels = [it.rel for it in items]
    step = 256
    calls = [
        delayed(_probe_files)(os.fspath(root), rels[s : s + step], opts.max_pixels) for s in range(0, len(rels), step)
    ]
    probes: list[_Probe] = []
    with _progress(len(rels), "checking", opts.quiet) as bar:
        for block in _parallel(min(opts.n_jobs, max(1, len(calls))), calls):
            probes.extend(block)
            bar.update(len(block))
    return tuple(probes)


def _probed(scan: SourceScan, probes: Sequence[_Probe]) -> _Selection:
    """The first selection: every item whose probe passed; the scan's and the probe's errors."""
    bad = [InputFileError(scan.items[k].rel, p.error) for k, p in enumerate(probes) if p.error is not None]
    keep = tuple(k for k, p in enumerate(probes) if p.error is None)
    return _Selection(keep, scan.errors + tuple(bad))


# ---------------------------------------------------------------- stage 3: plan


def _majority(values: Sequence[int], default: int) -> int:
    if not values:
        return default
    counts = Counter(values).most_common()
    best = counts[0][1]
    # Ties go to the richer representation (colour, 16-bit), which loses nothing.
    return max(v for v, n in counts if n == best)


def _order_digest(items: Sequence[SourceItem]) -> str:
    text = json.dumps([it.rel for it in items], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _json_default(value: Any) -> Any:
    """JSON for NumPy values in annotations (arrays by content digest)."""
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value)
        return {"dtype": data.dtype.str, "shape": list(data.shape), "sha256": hashlib.sha256(data.data).hexdigest()}
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def _source_digest(scan: SourceScan, probes: Sequence[_Probe]) -> str:
    h = hashlib.sha256()
    head = {"classes": list(scan.classes), "labels": scan.labels, "refused": sorted(e.path for e in scan.errors)}
    h.update(json.dumps(head, sort_keys=True, ensure_ascii=False).encode("utf-8"))
    for item, probe in zip(scan.items, probes, strict=True):
        record = [item.rel, item.label, item.split, probe.nbytes, item.annotations]
        try:
            line = json.dumps(record, sort_keys=True, ensure_ascii=False, default=_json_default)
        except (TypeError, ValueError) as exc:
            raise SourceError(f"the annotations of {item.rel!r} are not JSON-serialisable: {exc}") from exc
        h.update(b"\n" + line.encode("utf-8"))
    return h.hexdigest()


#: The most bytes one write block may take in memory (a block is at least one image, whatever its size).
MAX_BLOCK_BYTES = 2**31


def _check_block_bytes(backend: type[Backend], spec: ImageSpec, count: int, opts: BuildOptions) -> None:
    """Refuse a plan whose write block (one shard's images, held in memory at once) is too large."""
    images = _image_array(spec, opts.compression)
    if images.ragged:
        return  # variable sizes are written in runs of a few images, each within max_pixels
    item = images.item_nbytes
    block = backend.block_rows(images, count, opts.shard_bytes) * item
    if block > max(MAX_BLOCK_BYTES, item):
        raise OptionError(
            f"one write block would take {block / 2**30:.1f} GiB ({block // item} images of {item} bytes); "
            f"lower shard_bytes (--shard-bytes, now {opts.shard_bytes}) to at most {MAX_BLOCK_BYTES}"
        )


def plan_stage(
    scan: SourceScan, probes: Sequence[_Probe], sel: _Selection, opts: BuildOptions, backend: str
) -> tuple[BuildPlan, _Selection]:
    """3. Choose channels, dtype, geometry, layout and shard size from the items still in.

    Items the target would have to enlarge (without ``allow_upscale``) leave the selection as input
    errors. The same inputs always give the same plan.
    """
    headers: list[ImageHeader] = []
    for k in sel.keep:
        header = probes[k].header
        if header is None:
            raise ValueError(f"item {scan.items[k].rel!r} is selected but has no probed header")
        headers.append(header)
    channels = opts.channels if opts.channels != "keep" else _majority([h.channels for h in headers], 3)
    depth = _majority([h.bit_depth for h in headers], 8)
    target = TargetSpec(
        mode=opts.resize_mode,
        size=opts.size,
        max_side=opts.max_side,
        allow_upscale=opts.allow_upscale,
        channels=int(channels),
        dtype="|u1" if depth == 8 else "<u2",
        max_pixels=opts.max_pixels,
    )
    upscale: dict[int, InputFileError] = {}
    sizes: set[tuple[int, int]] = set()
    for k, h in zip(sel.keep, headers, strict=True):
        w, hh = h.oriented_size
        try:
            g = target.geometry(hh, w)
        except UpscaleError as exc:
            upscale[k] = InputFileError(scan.items[k].rel, str(exc))
            continue
        if g.out_h * g.out_w > target.max_pixels:
            # Refused here, before any buffer of that size exists: the options ask for it, not the file.
            raise OptionError(
                f"{scan.items[k].rel!r} would be stored as {g.out_w}x{g.out_h} = {g.out_h * g.out_w} pixels, "
                f"more than max_pixels={target.max_pixels} (--max-pixels); choose a smaller size or max_side, "
                "or raise max_pixels if the machine has the memory"
            )
        sizes.add((g.out_h, g.out_w))
    sel = sel.drop(upscale)
    if len(sizes) == 1:
        ((oh, ow),) = sizes
        spec = ImageSpec("fixed", target.channels, target.dtype, oh, ow)
    else:
        spec = ImageSpec("variable", target.channels, target.dtype)
    kept = [scan.items[k] for k in sel.keep]
    _check_block_bytes(get_backend(backend), spec, len(kept), opts)
    plan = BuildPlan(
        target=target,
        image=spec,
        backend=backend,
        compression=opts.compression,
        shard_bytes=opts.shard_bytes,
        shard_images=get_backend(backend).block_rows(_image_array(spec, opts.compression), len(kept), opts.shard_bytes),
        count=len(kept),
        order=_order_digest(kept),
        source=_source_digest(scan, probes),
        follow_symlinks=opts.follow_symlinks,
        exclude=opts.exclude,
        split=opts.split or (),
        split_seed=(opts.split_seed or 0) if opts.split else 0,
    )
    return plan, sel


# ---------------------------------------------------------------- stage 4: decode, resize (workers)


@dataclass(frozen=True)
class _Sample:
    """Per-sample metadata a worker returns (pixels travel only when the main process writes)."""

    original_size: tuple[int, int]
    shape: tuple[int, int, int]
    transform: tuple[float, float, float, float]
    checksum: int
    conversions: tuple[str, ...]
    pixels: np.ndarray | None = None
    #: The source file as read: (size in bytes, mtime in ns) and the SHA-256 (hex) of its bytes.
    stat: tuple[int, int] = (0, 0)
    sha256: str = ""

    def record(self) -> list[Any]:
        """The sample as a JSON list (a journal line); :meth:`from_record` inverts it."""
        return [
            list(self.original_size), list(self.shape), list(self.transform),
            self.checksum, list(self.conversions), list(self.stat), self.sha256,
        ]  # fmt: skip

    @classmethod
    def from_record(cls, rec: Sequence[Any]) -> _Sample:
        size, shape, transform, checksum, conversions, stat, sha = rec
        return cls(
            (int(size[0]), int(size[1])),
            (int(shape[0]), int(shape[1]), int(shape[2])),
            (float(transform[0]), float(transform[1]), float(transform[2]), float(transform[3])),
            int(checksum),
            tuple(str(c) for c in conversions),
            None,
            (int(stat[0]), int(stat[1])),
            str(sha),
        )


def prepare_file(root: str, plan: BuildPlan, rel: str, header: ImageHeader | None) -> tuple[np.ndarray, _Sample]:
    """Read one file and turn it into its stored form with :func:`~dlpack.sources.decode.prepare_image`."""
    with _open_regular(Path(root, rel)) as f:
        st = os.fstat(f.fileno())
        data = f.read()
    prepared = prepare_image(data, plan.target, header)
    img, g = prepared.pixels, prepared.geometry
    spec = plan.image
    if spec.shape is not None and img.shape != spec.shape:
        h, w = prepared.original_size
        raise DecodeError(
            f"image is {w}x{h} and would be stored as {img.shape[1]}x{img.shape[0]}, but this store holds "
            f"{spec.width}x{spec.height} images (its header said otherwise); pass --size or --resize fit"
        )
    meta = _Sample(
        prepared.original_size,
        (img.shape[0], img.shape[1], img.shape[2]),
        (g.scale_y, g.scale_x, float(g.off_y), float(g.off_x)),
        zlib.crc32(img.data),
        prepared.conversions,
        stat=(st.st_size, st.st_mtime_ns),
        sha256=hashlib.sha256(data).hexdigest(),
    )
    return img, meta


def decode_block(
    root: str,
    plan: BuildPlan,
    pairs: Sequence[tuple[str, ImageHeader | None]],
    out: np.ndarray | None = None,
    keep_pixels: bool = False,
    ticks: _Ticks | None = None,
) -> list[_Sample | InputFileError]:
    """Prepare a run of files: their metadata or why each failed.

    Pixels go into ``out[k]`` when given (a fixed-size block; failed slots keep their zeros), and
    onto the returned samples when ``keep_pixels``. ``ticks`` hears how many files are done every
    :attr:`_Ticks.EVERY` files, so the bar moves within a block of tens of thousands of small images.
    """
    results: list[_Sample | InputFileError] = []
    for k, (rel, header) in enumerate(pairs):
        if ticks is not None and k and k % ticks.EVERY == 0:
            ticks(k)
        try:
            img, meta = prepare_file(root, plan, rel, header)
        except DecodeError as exc:
            results.append(InputFileError(rel, str(exc)))
            continue
        except OSError as exc:
            results.append(InputFileError(rel, f"cannot read: {exc.strerror or exc}"))
            continue
        if out is not None:
            out[k] = img
        results.append(replace(meta, pixels=img) if keep_pixels else meta)
    return results


def validate_stage(
    root: str, plan: BuildPlan, pairs: Sequence[tuple[str, ImageHeader | None]], opts: BuildOptions
) -> list[InputFileError]:
    """Decode every file without writing; the failures (so one error can list every bad file)."""
    from joblib import delayed

    step = 16
    calls = [delayed(decode_block)(root, plan, pairs[s : s + step]) for s in range(0, len(pairs), step)]
    found: list[InputFileError] = []
    with _progress(len(pairs), "checking pixels", opts.quiet) as bar:
        for block in _parallel(opts.n_jobs, calls):
            found.extend(r for r in block if isinstance(r, InputFileError))
            bar.update(len(block))
    return found


# ---------------------------------------------------------------- stage 5: write (every store-writer call is here)


def _fixed_block(plan: BuildPlan, n: int) -> np.ndarray:
    shape = plan.image.shape
    if shape is None:
        raise ValueError("a variable-size store has no fixed block")
    return np.zeros((n, *shape), dtype=plan.image.dtype)


def _write_block_worker(
    writer: StoreWriter,
    root: str,
    plan: BuildPlan,
    start: int,
    pairs: Sequence[tuple[str, ImageHeader | None]],
    ticks: _Ticks | None = None,
) -> list[_Sample | InputFileError]:
    """Decode a block and write it as one block (in a worker, for writers that allow it)."""
    block = _fixed_block(plan, len(pairs))
    results = decode_block(root, plan, pairs, out=block, ticks=ticks)
    # A block with a failure is not written: the store is then discarded (or rebuilt) anyway.
    if not any(isinstance(r, InputFileError) for r in results):
        writer.write_block("images", start, block)
    return results


# A build resumes from the journal of its partial store (docs/format.md, "Resume"): the journal sits
# beside the partial as .NAME.dlpack-journal, its first line records the frozen plan, and each
# further line one image block (a whole shard) that was completely written, with the metadata of
# its samples. Only blocks written by worker-safe writers (Zarr shards, HDF5 contiguous raw blocks)
# are journalled: ragged (variable-size) images are one stream, and compressed HDF5 blocks pass
# through the HDF5 library, whose file a kill can leave inconsistent; those builds start over.

_JOURNAL_KEY = "dlpack_journal"
_JOURNAL_VERSION = 1


def journal_path(out: str | os.PathLike[str]) -> Path:
    """The journal of builds into ``out``: ``.NAME.dlpack-journal``, beside the partial store."""
    p = Path(out)
    return p.parent / f".{p.name}.dlpack-journal"


class _Restart(Exception):
    """An earlier partial store cannot be continued; the message says why (for the summary)."""


def _fsync_dir(path: Path) -> None:
    """Make a new directory entry durable (no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _Journal:
    """The partial store's journal, open for appending: each line is written, flushed and fsync'd
    alone, so a kill leaves at most one torn last line, which reading drops."""

    def __init__(self, path: Path, blocks: int = 0) -> None:
        self.path = path
        self.blocks = blocks
        self._f = open(path, "ab")  # noqa: SIM115 - held for the build's life, closed by close()

    @classmethod
    def create(cls, path: Path, header: Mapping[str, Any], blocks: Mapping[int, Sequence[_Sample]] = {}) -> _Journal:  # noqa: B006 - read only
        """Write a journal of ``header`` and ``blocks`` beside ``path`` and move it into place."""
        tmp = path.with_name(path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        # A new file of ours, never one a link at that name points to.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
        with writing(path), os.fdopen(os.open(tmp, flags, 0o644), "wb") as f:
            f.write(_journal_line(header))
            for start, samples in sorted(blocks.items()):
                f.write(_journal_line(_block_record(start, samples)))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        return cls(path, len(blocks))

    def append_block(self, start: int, samples: Sequence[_Sample]) -> None:
        """Record that samples ``start ..`` (a whole block) are written, with their metadata."""
        self._append(_block_record(start, samples))
        self.blocks += 1

    def mark_commit(self) -> None:
        """Record that the metadata arrays and the manifest are being written."""
        self._append({"commit": True})

    def _append(self, record: Mapping[str, Any]) -> None:
        with writing(self.path):
            self._f.write(_journal_line(record))
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()


def _journal_line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


def _block_record(start: int, samples: Sequence[_Sample]) -> dict[str, Any]:
    return {"start": start, "samples": [s.record() for s in samples]}


def _journal_header(plan: BuildPlan, block_len: int) -> dict[str, Any]:
    return {
        _JOURNAL_KEY: _JOURNAL_VERSION,
        "fingerprint": plan.fingerprint(),
        "block_len": block_len,
        "plan": plan.to_dict(),
    }


@dataclass(frozen=True)
class _JournalState:
    """What a journal says: its header, the journalled blocks (first sample -> samples), whether a commit began."""

    header: dict[str, Any]
    blocks: dict[int, list[_Sample]]
    commit: bool


def _is_journal(path: Path) -> bool:
    """Whether ``path`` is a dlpack journal, perhaps cut short by a kill while its first line was written."""
    if path.is_symlink() or not path.is_file() or path.lstat().st_nlink != 1:
        return False  # a link, or a file with other names: not a journal dlpack wrote
    marker = _journal_line({_JOURNAL_KEY: _JOURNAL_VERSION})[:-2]
    try:
        fd = open_regular(path, follow_symlinks=False)
    except NotRegularFileError:  # swapped for a named pipe since the check: never block on it
        return False
    with os.fdopen(fd, "rb") as f:
        head = f.read(len(marker))
    return marker.startswith(head)


def _read_journal(path: Path) -> _JournalState:
    """Parse a journal; :class:`_Restart` when it is missing or unusable."""
    try:
        data = read_regular(path, follow_symlinks=False)
    except FileNotFoundError:
        raise _Restart("the killed build left no journal") from None
    except OSError as exc:
        raise _Restart(f"its journal cannot be read ({exc.strerror or exc})") from exc
    lines = data[: data.rfind(b"\n") + 1].splitlines()  # a torn last line is dropped
    try:
        header = json.loads(lines[0])
        if not isinstance(header, dict) or header.get(_JOURNAL_KEY) != _JOURNAL_VERSION:
            raise _Restart("its journal is of another version")
        blocks: dict[int, list[_Sample]] = {}
        commit = False
        for line in lines[1:]:
            record = json.loads(line)
            if record.get("commit"):
                commit = True
                continue
            blocks[int(record["start"])] = [_Sample.from_record(r) for r in record["samples"]]
    except _Restart:
        raise
    except (IndexError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _Restart(f"its journal is damaged ({exc!r})") from exc
    return _JournalState(header, blocks, commit)


def _changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
    return ", ".join(keys) or "fingerprint"


def _resumable(writer: StoreWriter, images: ArraySpec) -> bool:
    """Whether blocks of ``images`` are written as independent units that survive a kill of the build."""
    return not images.ragged and writer.parallel_safe(images.name)


def _verified_blocks(
    writer: StoreWriter,
    images: ArraySpec,
    state: _JournalState,
    root: str,
    pairs: Sequence[tuple[str, ImageHeader | None]],
) -> dict[int, list[_Sample]]:
    """The journalled blocks still good: whole aligned blocks whose source files kept their size and
    mtime and whose stored samples read back with their recorded checksums."""
    step = writer.block_len(images.name)
    done: dict[int, list[_Sample]] = {}
    for start, samples in sorted(state.blocks.items()):
        stop = start + len(samples)
        if start % step or start >= len(pairs) or stop != min(start + step, len(pairs)):
            continue
        try:
            stats = [os.stat(Path(root, rel)) for rel, _ in pairs[start:stop]]
        except OSError:
            continue
        if any((st.st_size, st.st_mtime_ns) != s.stat for st, s in zip(stats, samples, strict=True)):
            continue
        try:
            stored = writer.read_block(images.name, start, stop)
        except StoreError:
            continue
        if all(
            zlib.crc32(np.ascontiguousarray(row).data) == s.checksum for row, s in zip(stored, samples, strict=True)
        ):
            done[start] = samples
    return done


@dataclass
class _Partial:
    """The partial store a build writes: its open writer, its journal (None when not resumable), the
    blocks already written (first sample -> samples), and what became of a killed build's partial."""

    writer: StoreWriter
    journal: _Journal | None
    done: dict[int, list[_Sample]]
    note: str
    #: Whether the store is already complete (a killed build's committed partial): publish it as it is.
    committed: bool = False


def _continue_partial(
    backend: type[Backend],
    out: Path,
    plan: BuildPlan,
    images: ArraySpec,
    root: str,
    pairs: Sequence[tuple[str, ImageHeader | None]],
    opts: BuildOptions,
) -> _Partial:
    """Reopen a killed build's partial store to continue it, or raise :class:`_Restart` saying why not."""
    if opts.no_resume:
        raise _Restart("--no-resume")
    jpath = journal_path(out)
    state = _read_journal(jpath)
    if state.header.get("fingerprint") != plan.fingerprint():
        old = state.header.get("plan")
        changed = _changed_fields(old, plan.to_dict()) if isinstance(old, dict) else "fingerprint"
        raise _Restart(f"the plan changed ({changed})")
    if images.ragged:
        raise _Restart("variable-size images are written as one stream")
    writer = backend.open_writer(partial_path(out), "r+", plan.shard_bytes)
    try:
        writer.open()
        # Temporary files of writes the kill cut short are not part of any block.
        writer.remove_temp_files()
        n_blocks = -(-len(pairs) // max(1, int(state.header.get("block_len") or 1)))
        if writer.arrays:  # its manifest was written: the killed build had finished the store
            complete = _complete_partial(writer, backend, out, plan, images, state, root, pairs)
            if complete is not None:
                journal = _Journal.create(jpath, state.header, complete)
                journal.mark_commit()
                note = f"resumed: {n_blocks} of {n_blocks} blocks already written (the store was complete)"
                return _Partial(writer, journal, complete, note, committed=True)
        if (state.commit or writer.arrays) and not writer.undo_commit([images.name]):
            raise _Restart(f"it was killed while the {backend.name} library wrote the store's metadata")
        writer.attach_array(images, plan.count)
        if not _resumable(writer, images) or writer.block_len(images.name) != state.header.get("block_len"):
            raise _Restart(f"its {backend.name} image blocks cannot be continued")
        done = _verified_blocks(writer, images, state, root, pairs)
    except _Restart:
        writer.abort()
        raise
    except (StoreError, OptionError) as exc:
        writer.abort()
        raise _Restart(f"its partial store cannot be reopened ({exc})") from exc
    except BaseException:
        writer.abort()
        raise
    # Rewritten without the lines that did not hold up, so it says exactly what the partial holds.
    journal = _Journal.create(jpath, state.header, done)
    n_blocks = -(-len(pairs) // writer.block_len(images.name))
    return _Partial(writer, journal, done, f"resumed: {len(done)} of {n_blocks} blocks already written")


def _complete_partial(
    writer: StoreWriter,
    backend: type[Backend],
    out: Path,
    plan: BuildPlan,
    images: ArraySpec,
    state: _JournalState,
    root: str,
    pairs: Sequence[tuple[str, ImageHeader | None]],
) -> dict[int, list[_Sample]] | None:
    """The blocks of a partial store that a killed build had committed, when it is exactly what this
    build would publish: its manifest records this plan, every array matches its checksum, and every
    journalled block's source files are unchanged. None when it is not (it is then taken back or
    started over)."""
    try:
        with backend.open_reader(partial_path(out)) as reader:
            manifest = reader.manifest
            recorded = BuildPlan.from_dict(manifest.plan).fingerprint() if manifest.plan else None
            if recorded != plan.fingerprint() or set(manifest.arrays) != set(writer.arrays) or reader.verify_arrays():
                return None
    except StoreError:
        return None
    spec = writer.arrays.get(images.name)
    if spec is None or (spec.dtype, spec.shape, spec.ragged) != (images.dtype, images.shape, images.ragged):
        return None
    if not _resumable(writer, spec) or writer.block_len(images.name) != state.header.get("block_len"):
        return None
    done = _verified_blocks(writer, spec, state, root, pairs)
    step = writer.block_len(images.name)
    return done if len(done) == -(-len(pairs) // step) else None


def open_partial(
    backend: type[Backend],
    out: Path,
    plan: BuildPlan,
    root: str,
    pairs: Sequence[tuple[str, ImageHeader | None]],
    opts: BuildOptions,
) -> _Partial:
    """5a. The partial store to write ``plan`` into, with the image array created or reopened.

    A partial left by a killed build of ``out`` (kept by :func:`clear_leftovers` because it has a
    journal) is continued when its journal records this very plan (same fingerprint) and
    ``no_resume`` is off: its journalled blocks that still check out are kept. Otherwise it is
    removed and a new partial created, with a journal when its blocks can be continued later.
    """
    tmp, jpath = partial_path(out), journal_path(out)
    images = _image_array(plan.image, plan.compression)
    note = ""
    if tmp.exists() or tmp.is_symlink():
        try:
            return _continue_partial(backend, out, plan, images, root, pairs, opts)
        except _Restart as exc:
            note = f"started over: {exc}"
    _remove(jpath)
    _remove(tmp)
    writer = backend.open_writer(tmp, "w-", plan.shard_bytes)
    try:
        writer.open()
        writer.create_array(images, plan.count)
        journal = None
        if _resumable(writer, images):
            # Created after the image array: a journal always describes a partial that holds it.
            journal = _Journal.create(jpath, _journal_header(plan, writer.block_len(images.name)))
    except BaseException:
        abort_store(writer, tmp)
        _remove(jpath)
        raise
    return _Partial(writer, journal, {}, note)


def _keep_for_resume(exc: BaseException, partial: _Partial) -> bool:
    """Whether a build stopped by ``exc`` keeps its partial store to continue later: when it was
    interrupted (Ctrl-C) and has a journal; a build that failed on its own removes it."""
    return isinstance(exc, KeyboardInterrupt) and partial.journal is not None


def discard_partial(partial: _Partial, out: Path, exc: BaseException | None = None) -> None:
    """Close the partial's writer and journal after ``exc``, and remove both unless they are kept for a resume."""
    keep = exc is not None and _keep_for_resume(exc, partial)
    if partial.journal is not None:
        partial.journal.close()
    if keep:
        with contextlib.suppress(Exception):
            partial.writer.abort()
        return
    abort_store(partial.writer, partial_path(out))
    _remove(journal_path(out))


def write_images(
    backend: type[Backend],
    out: Path,
    plan: BuildPlan,
    root: str,
    pairs: Sequence[tuple[str, ImageHeader | None]],
    opts: BuildOptions,
) -> tuple[list[_Sample | InputFileError], _Partial | None, str]:
    """5. Write every image into the partial store of ``out``, decoded by workers.

    Blocks a killed build already wrote are kept (see :func:`open_partial`); every other block is
    decoded and written, and journalled once written. Returns the per-sample results, the open
    partial, and what became of an earlier partial (for the summary). When any file failed to
    decode, the partial is removed and None returned in its place.
    """
    partial = open_partial(backend, out, plan, root, pairs, opts)
    writer, journal = partial.writer, partial.journal
    try:
        images = writer.arrays[_image_array(plan.image, plan.compression).name]
        fixed = not images.ragged
        in_workers = fixed and writer.parallel_safe(images.name)
        step = writer.block_len(images.name) if fixed else 16
        appended = 0
        from joblib import delayed

        starts = [s for s in range(0, len(pairs), step) if s not in partial.done]
        results: list[_Sample | InputFileError] = []
        slots: dict[int, list[_Sample | InputFileError]] = {s: list(v) for s, v in partial.done.items()}
        failed = False
        with (
            _progress(len(pairs), "packing", opts.quiet) as bar,
            _BlockProgress(bar, len(starts), _pooled(opts.n_jobs, len(starts))) as progress,
        ):
            if in_workers:
                calls = [
                    delayed(_write_block_worker)(writer, root, plan, s, pairs[s : s + step], progress.ticks(j))
                    for j, s in enumerate(starts)
                ]
            else:
                calls = [
                    delayed(decode_block)(root, plan, pairs[s : s + step], None, True, progress.ticks(j))
                    for j, s in enumerate(starts)
                ]
            bar.update(sum(len(v) for v in slots.values()))
            for slot, (s, block) in enumerate(zip(starts, _parallel(opts.n_jobs, calls), strict=True)):
                bad = any(isinstance(r, InputFileError) for r in block)
                failed = failed or bad
                if not in_workers:
                    if not failed and fixed:
                        arr = _fixed_block(plan, len(block))
                        for k, r in enumerate(block):
                            if isinstance(r, _Sample) and r.pixels is not None:
                                arr[k] = r.pixels
                        writer.write_block(images.name, s, arr)
                    elif not failed:
                        pixels = [r.pixels for r in block if isinstance(r, _Sample) and r.pixels is not None]
                        writer.write_block(images.name, appended, pixels)
                        appended += len(pixels)
                    block = [replace(r, pixels=None) if isinstance(r, _Sample) else r for r in block]
                if journal is not None and not bad:
                    journal.append_block(s, [r for r in block if isinstance(r, _Sample)])
                slots[s] = block
                progress.finished(slot, len(block))
        for s in sorted(slots):
            results.extend(slots[s])
    except BaseException as exc:
        discard_partial(partial, out, exc)
        raise
    if failed:
        discard_partial(partial, out)
        return results, None, partial.note
    return results, partial, partial.note


def commit_store(partial: _Partial, out: Path, arrays: dict[str, tuple[ArraySpec, Any]], manifest: Manifest) -> None:
    """Write the per-sample arrays, then the manifest: the partial store is complete after this."""
    writer = partial.writer
    if partial.committed:
        if partial.journal is not None:
            partial.journal.close()
        writer.abort()
        return
    try:
        if partial.journal is not None:
            partial.journal.mark_commit()
        for spec, values in arrays.values():
            writer.create_array(spec, manifest.count)
            writer.write_block(spec.name, 0, values)
        writer.commit(manifest)
    except BaseException as exc:
        discard_partial(partial, out, exc)
        raise
    if partial.journal is not None:
        partial.journal.close()


def abort_store(writer: StoreWriter, tmp: Path) -> None:
    """Close the writer after a failure and remove its partial store."""
    with contextlib.suppress(Exception):
        writer.abort()
    _remove(tmp)


def pack_stage(
    backend: type[Backend],
    out: Path,
    root: Path,
    scan: SourceScan,
    probes: Sequence[_Probe],
    plan: BuildPlan,
    sel: _Selection,
    opts: BuildOptions,
) -> tuple[BuildPlan, _Selection, list[_Sample], _Partial, str]:
    """4-5. Decode and write the selected items under ``plan`` into the partial store of ``out``.

    Files that pass the probe but fail to decode (damage inside the compressed data) are rare:
    under ``on_error="skip"`` they leave the selection and the store is planned and written again
    without them, so the result is byte-identical to a build of the good files alone. Also returns
    what became of a killed build's partial store ("" when there was none).
    """
    note = ""
    for _attempt in range(3):
        if not sel.keep:
            raise _bad_inputs(sel.errors, root, nothing_left=True)
        pairs = [(scan.items[k].rel, probes[k].header) for k in sel.keep]
        results, partial, found = write_images(backend, out, plan, os.fspath(root), pairs, opts)
        note = note or found
        if partial is not None:
            return plan, sel, [r for r in results if isinstance(r, _Sample)], partial, note
        sel = sel.drop({k: r for k, r in zip(sel.keep, results, strict=True) if isinstance(r, InputFileError)})
        if opts.on_error == "fail":
            raise _bad_inputs(sel.errors, root, nothing_left=not sel.keep)
        plan, sel = plan_stage(scan, probes, sel, opts, backend.name)
    # Decoding is deterministic: a second pass finds nothing new.
    raise DlpackError("files kept failing to decode; rerun with --on-error fail to see them")  # pragma: no cover


# ---------------------------------------------------------------- stage 6: manifest


def _image_array(image: ImageSpec, compression: str) -> ArraySpec:
    """The array holding the pixels: ``images`` [N, H, W, C], or ragged flat ``image`` for variable sizes."""
    if image.shape is not None:
        return ArraySpec("images", image.dtype, image.shape, key="image", compression=compression)
    return ArraySpec("image", image.dtype, (), ragged=True, compression=compression)


def _meta_arrays(
    items: Sequence[SourceItem],
    samples: Sequence[_Sample],
    classes: Sequence[str],
    shapes: Sequence[tuple[int, ...]] | None,
    splits: Sequence[str] = (),
) -> dict[str, tuple[ArraySpec, Any]]:
    """The per-sample metadata arrays, by name: their specs and values (``split`` only when ``splits``)."""
    class_id = {c: i for i, c in enumerate(classes)}
    fixed: dict[str, tuple[np.ndarray, str | None]] = {
        "labels": (
            np.array([class_id[it.label] if it.label is not None else -1 for it in items], dtype="<i4"),
            "label",
        ),
        "original_size": (np.array([s.original_size for s in samples], dtype="<i4").reshape(-1, 2), None),
        "transform": (np.array([s.transform for s in samples], dtype="<f8").reshape(-1, 4), None),
        "checksum": (np.array([s.checksum for s in samples], dtype="<u4"), None),
        # What --update compares the source files with: (size, mtime_ns), then the content hash.
        "source_stat": (np.array([s.stat for s in samples], dtype="<i8").reshape(-1, 2), None),
        "source_sha256": (
            np.frombuffer(b"".join(bytes.fromhex(s.sha256) for s in samples), dtype=np.uint8).reshape(-1, 32),
            None,
        ),
    }
    if shapes is not None:
        fixed["image_shapes"] = (np.array(shapes, dtype="<i4").reshape(-1, 3), None)
    if splits:
        split_id = {name: i for i, name in enumerate(splits)}
        codes = [split_id[it.split] if it.split is not None else -1 for it in items]
        fixed["split"] = (np.array(codes, dtype="|i1"), "split")
    arrays: dict[str, tuple[ArraySpec, Any]] = {
        name: (ArraySpec(name, arr.dtype.str, arr.shape[1:], key=key), arr) for name, (arr, key) in fixed.items()
    }
    sources = [np.frombuffer(it.rel.encode("utf-8"), dtype=np.uint8) for it in items]
    arrays["source"] = (ArraySpec("source", "|u1", (), ragged=True), sources)
    return arrays


def manifest_stage(
    plan: BuildPlan, scan: SourceScan, sel: _Selection, samples: Sequence[_Sample]
) -> tuple[dict[str, tuple[ArraySpec, Any]], Manifest]:
    """6. The per-sample arrays and the manifest of the written samples (the writer lists the arrays)."""
    items = [scan.items[k] for k in sel.keep]
    variable = plan.image.layout == "variable"
    splits = plan.split_names or _split_names(scan.items)
    arrays = _meta_arrays(items, samples, scan.classes, [s.shape for s in samples] if variable else None, splits)
    conversions = Counter(c for s in samples for c in s.conversions)
    target = plan.target
    manifest = Manifest(
        count=plan.count,
        image=plan.image,
        backend=plan.backend,
        classes=scan.classes,
        labels=scan.labels,
        splits=splits,
        resize={
            "mode": target.mode,
            "size": list(target.size) if target.size else None,
            "max_side": target.max_side,
            "allow_upscale": target.allow_upscale,
            "interpolation": "area (shrink), linear (enlarge)",
        },
        compression=plan.compression,
        shard_images=0 if variable else plan.shard_images,
        skipped=tuple(sorted(sel.errors, key=lambda e: e.path)),
        conversions=dict(sorted(conversions.items())),
        plan=plan.to_dict(),
        dlpack_version=__version__,
    )
    return arrays, manifest


# ---------------------------------------------------------------- stage 7: publish


def _remove(path: Path) -> None:
    """Remove a store or partial; a Zarr folder loses its manifest first and its marker last.

    So a removal cut short by a kill leaves a folder that readers call incomplete and that the next
    build still recognises as dlpack's (and removes).
    """
    if not path.is_dir() or path.is_symlink():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    with contextlib.suppress(OSError):
        (path / "manifest.json").unlink()
    for child in sorted(path.iterdir()):
        if child.name == "zarr.json":
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                child.unlink()
    with contextlib.suppress(OSError):
        (path / "zarr.json").unlink()
    shutil.rmtree(path, ignore_errors=True)


def _not_ours(path: Path) -> str | None:
    """Why ``path`` cannot be proven to be a dlpack partial store, or None when it is one."""
    if path.is_symlink():
        return "it is a symbolic link"
    if owned_store(path) is not None:
        return None
    if path.is_dir():
        # A build killed while creating its group leaves an empty folder or a bare zarr.json.
        entries = [p.name for p in path.iterdir()]
        if not entries or (entries == ["zarr.json"] and _bare_group(path / "zarr.json")):
            return None
        odd = _irregular_files(path)
        return "it is a folder without dlpack's marker" + (f" ({', '.join(odd)})" if odd else "")
    if path.is_file():
        links = path.lstat().st_nlink
        if links != 1:
            return f"it is a file with {links} hard links"
        try:
            fd = open_regular(path, follow_symlinks=False)
        except OSError as exc:  # swapped for a named pipe since the check, or unreadable
            return f"it cannot be read ({exc})"
        with os.fdopen(fd, "rb") as f:
            head = f.read(8)
        if not head:
            return None  # a build killed before the first byte
        if head == b"\x89HDF\r\n\x1a\n" and not _hdf5_readable(path):
            # HDF5 writes its metadata when the file is flushed: a build killed before that leaves a
            # superblock pointing past the end of the file, and no object anyone could read.
            return None
        return "it is a file without dlpack's marker"
    return "it is neither a file nor a folder"


def _bare_group(meta_path: Path) -> bool:
    """Whether ``meta_path`` is the zarr.json a build killed while creating its group leaves: cut
    short, or a group without attributes; never a named pipe or a link (not dlpack's)."""
    try:
        text = read_regular(meta_path, follow_symlinks=False)
    except NotRegularFileError:
        return False
    except OSError:
        return True
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError):
        return True
    return isinstance(meta, dict) and meta.get("node_type") == "group" and not meta.get("attributes")


def _hdf5_readable(path: Path) -> bool:
    """Whether HDF5 can open the file at ``path`` (a regular file, checked by the caller)."""
    import h5py

    try:
        with h5py.File(path, "r"):
            return True
    except Exception:  # whatever h5py raises, the file is not readable
        return False


def _unmarked(path: Path) -> str:
    """What ``path``, found without dlpack's marker, is: "a folder without dlpack's marker", naming
    a named pipe or link inside it that kept its marker from being read."""
    if path.is_dir():
        odd = _irregular_files(path)
        return "a folder without dlpack's marker" + (f"; {', '.join(odd)}, which no dlpack store holds" if odd else "")
    kind = "a file" if path.is_file() else file_kind(path.lstat().st_mode)
    return f"{kind} without dlpack's marker"


def _irregular_files(path: Path, limit: int = 3) -> list[str]:
    """Up to ``limit`` entries of folder ``path`` (not below it) that are neither regular files nor
    folders, as "NAME is a named pipe": why a folder that may be a store is not recognised."""
    found = []
    with contextlib.suppress(OSError), os.scandir(path) as entries:
        for entry in entries:
            mode = entry.stat(follow_symlinks=False).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(f"{entry.path} is {file_kind(mode)}")
                if len(found) == limit:
                    break
    return sorted(found)


def clear_leftovers(out: Path) -> str | None:
    """Undo what a killed build of ``out`` left behind; call only while holding the build lock.

    An overwritten store that was waiting for its replacement comes back to ``out`` (or is removed
    when the replacement made it). A stale partial proven to be dlpack's is kept when it has a
    journal (the build then continues it or starts over, see :func:`open_partial`), else removed;
    a journal whose partial is gone is removed. Returns the plan fingerprint of a journal whose
    build had committed and then published its store (killed before it removed its journal), so
    that the same build run again can say it is done; else None.
    """
    old = old_path(out)
    if old.exists() or old.is_symlink():
        reason = _not_ours(old)
        if reason is not None:
            raise StoreError(
                f"{old} is where a build keeps the store it replaces, but it is not a dlpack store ({reason}); "
                "remove or rename it, then build again"
            )
        if out.exists() or out.is_symlink() or owned_store(old) is None:
            _remove(old)
        else:
            os.replace(old, out)  # killed after OUT was moved aside: the old store comes back
    tmp, journal = partial_path(out), journal_path(out)
    for path in (journal, journal.with_name(journal.name + ".tmp")):
        if (path.exists() or path.is_symlink()) and not _is_journal(path):
            why = (
                "it is a symbolic link" if path.is_symlink()
                else "it is not a regular file" if not path.is_file()
                else f"it is a file with {path.lstat().st_nlink} hard links" if path.lstat().st_nlink != 1
                else "it does not start with a journal header"
            )  # fmt: skip
            raise StoreError(
                f"{path} is where this build keeps its journal, but it is not a dlpack journal ({why}); "
                "it was left untouched: remove or rename it, then build again"
            )
    _remove(journal.with_name(journal.name + ".tmp"))
    if tmp.exists() or tmp.is_symlink():
        reason = _not_ours(tmp)
        if reason is not None:
            raise StoreError(
                f"{tmp} is where this build writes, but it is not a dlpack partial store ({reason}); "
                "remove or rename it, then build again"
            )
        if journal.exists():
            return None  # a killed build's blocks: open_partial continues them or starts over
        _remove(tmp)
    published = None
    if journal.exists() and owned_store(out) is not None:
        with contextlib.suppress(_Restart):
            state = _read_journal(journal)
            fingerprint = state.header.get("fingerprint")
            if state.commit and isinstance(fingerprint, str):
                published = fingerprint
    _remove(journal)  # its partial is gone (published or removed): nothing to continue
    return published


def _published_by_killed_build(backend: type[Backend], out: Path, plan: BuildPlan, published: str | None) -> bool:
    """Whether ``out`` is the store a killed build of this very ``plan`` committed and published
    (``published``: its journal's fingerprint, from :func:`clear_leftovers`)."""
    if published != plan.fingerprint():
        return False
    try:
        with backend.open_reader(out) as reader:
            recorded = reader.manifest.plan
        return bool(recorded) and BuildPlan.from_dict(recorded).fingerprint() == published
    except StoreError:
        return False


def check_replaceable(out: Path) -> None:
    """Refuse to replace ``out`` unless it is a complete or partial dlpack store (its marker says so).

    Raises
    ------
    StoreExistsError
        ``out`` is a symbolic link, or anything without dlpack's marker (a folder, a file, a
        plain Zarr group, an HDF5 file of someone else's).
    """
    if out.is_symlink():
        raise StoreExistsError(
            f"{out} is a symbolic link, not a dlpack store; --overwrite replaces only dlpack stores: "
            "remove the link or choose another OUT"
        )
    if owned_store(out) is None:
        raise StoreExistsError(
            f"{out} exists and is not a dlpack store ({_unmarked(out)}); --overwrite replaces "
            "only dlpack stores: move it away yourself or choose another OUT"
        )


def publish_stage(tmp: Path, out: Path, overwrite: bool) -> None:
    """7. Move the finished store into place; an old store is replaced only after the new one is complete.

    Where the platform offers an atomic exchange (Linux ``renameat2``), OUT always holds a complete
    store: the new one waits under the old name, then trades places with OUT in one step. Elsewhere
    OUT is moved aside and the new store moved in, and a build killed in between leaves the old
    store under the old name, where the next build's :func:`clear_leftovers` brings it back.
    """
    if not (out.exists() or out.is_symlink()):
        if not _rename_noreplace(tmp, out):
            os.replace(tmp, out)
        return
    if not overwrite:
        raise StoreExistsError(f"{out} appeared while building; pass --overwrite to replace it")
    check_replaceable(out)
    old = old_path(out)
    os.replace(tmp, old)
    try:
        exchanged = _exchange(old, out)
    except BaseException:
        os.replace(old, tmp)
        raise
    if exchanged:
        if owned_store(old) is None:  # something else was put at OUT since the check: put it back
            _exchange(old, out)
            os.replace(old, tmp)
            check_replaceable(out)
    else:
        os.replace(old, tmp)
        os.replace(out, old)
        if owned_store(old) is None:
            os.replace(old, out)
            check_replaceable(out)
        os.replace(tmp, out)
    _remove(old)


class PublishedInterrupt(KeyboardInterrupt):
    """Ctrl-C arrived once the new store was already published: the build or update is complete.

    Still a KeyboardInterrupt, so a script stops as its user asked; ``published`` is the complete
    store (the CLI says so and exits 0).
    """

    def __init__(self, published: Path) -> None:
        self.published = published
        super().__init__(f"interrupted after {published} was published; the store is complete")


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """:func:`publish_stage`, removing the partial ``tmp`` when it fails.

    Raises :class:`PublishedInterrupt` when Ctrl-C arrives once ``tmp`` is at ``out``
    (the very file or folder, whatever step of publishing the interrupt cut short): the store is
    complete, and the caller says so instead of "interrupted".
    """
    new = _identity(tmp)
    try:
        publish_stage(tmp, out, overwrite)
    except BaseException as exc:
        done = isinstance(exc, KeyboardInterrupt) and new is not None and _identity(out) == new
        # After a cut-short exchange, the partial's name may hold the store that was replaced.
        _remove(tmp)
        if done:
            old = old_path(out)
            if (old.exists() or old.is_symlink()) and _not_ours(old) is None:
                _remove(old)  # the replaced store, as publishing would have removed it
            raise PublishedInterrupt(out) from None
        raise


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


@functools.cache
def _renameat2_function() -> Any:
    """libc's ``renameat2`` (Linux, glibc 2.28+ or musl), or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``; False when this system or file system does not offer it."""
    fn = _renameat2_function()
    if fn is None:
        return False
    import ctypes

    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), os.fspath(src), None, os.fspath(dst))


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically; False (nothing done) where the platform cannot."""
    return _renameat2(a, b, _RENAME_EXCHANGE)


def _rename_noreplace(src: Path, dst: Path) -> bool:
    """Move ``src`` to ``dst`` unless ``dst`` exists, atomically; False (nothing done) where the platform cannot."""
    try:
        return _renameat2(src, dst, _RENAME_NOREPLACE)
    except FileExistsError:
        raise StoreExistsError(f"{dst} appeared while building; pass --overwrite to replace it") from None


# ---------------------------------------------------------------- update (build --update)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            h.update(chunk)
    return h.hexdigest()


#: What ``build --update`` does with each build option (a test holds every field of BuildOptions to
#: one entry): "plan" options must match the store's plan when given; "kept" ones keep the store's
#: value when left at their default and are refused when given with another value; "applied" ones
#: are used by this run (``allow_upscale`` and ``max_pixels`` become the store's).
UPDATE_OPTIONS: dict[str, str] = {
    "format": "kept",
    "size": "plan",
    "max_side": "plan",
    "resize": "plan",
    "channels": "plan",
    "compression": "kept",
    "shard_bytes": "kept",
    "labels": "kept",
    "follow_symlinks": "kept",
    "exclude": "kept",
    "split": "kept",
    "split_seed": "kept",
    "verbose": "applied",
    "allow_upscale": "applied",
    "max_pixels": "applied",
    "jobs": "applied",
    "force_jobs": "applied",
    "on_error": "applied",
    "quiet": "applied",
    "no_resume": "applied",
    "update": "applied",
    "compact": "applied",
    "fill": "applied",
    "drop_array": "applied",
    "overwrite": "refused",
}


def _shown_value(value: Any) -> str:
    if isinstance(value, tuple) and len(value) == 2:
        return f"{value[0]}x{value[1]}"
    return "not given" if value is None else str(value)


def _check_update_options(plan: BuildPlan, opts: BuildOptions, out: Path) -> BuildPlan:
    """The plan an update of ``out`` writes under: the store's, with the options an update applies.

    Geometry, channels, compression and shard size are the store's: an option that names another
    value is refused, naming the store's (an update cannot re-encode what it shares or keeps).
    """
    t = plan.target
    defaults = BuildOptions()
    given = {
        "size": (opts.size, t.size),
        "max_side": (opts.max_side, t.max_side),
        "resize": (opts.resize, t.mode),
        "channels": (None if opts.channels == "keep" else opts.channels, t.channels),
        "compression": (None if opts.compression == defaults.compression else opts.compression, plan.compression),
        "shard_bytes": (None if opts.shard_bytes == defaults.shard_bytes else opts.shard_bytes, plan.shard_bytes),
    }
    differ = [
        f"{name} (the store's: {_shown_value(theirs)}, given: {_shown_value(mine)})"
        for name, (mine, theirs) in given.items()
        if mine is not None and mine != theirs
    ]
    if opts.follow_symlinks and not plan.follow_symlinks:
        differ.append("follow_symlinks (the store was built without --follow-symlinks)")
    if opts.exclude and sorted(set(opts.exclude)) != sorted(set(plan.exclude)):
        theirs = ", ".join(repr(p) for p in plan.exclude) or "none"
        differ.append(f"exclude (the store's: {theirs}; given: {', '.join(repr(p) for p in opts.exclude)})")
    if opts.split is not None and opts.split != plan.split:
        theirs = ",".join(map(str, plan.split)) if plan.split else "none (its splits are its source's, or none)"
        differ.append(f"split (the store's: {theirs}; given: {','.join(map(str, opts.split))})")
    if opts.split_seed is not None and (not plan.split or opts.split_seed != plan.split_seed):
        theirs = str(plan.split_seed) if plan.split else "none (built without --split)"
        differ.append(f"split_seed (the store's: {theirs}; given: {opts.split_seed})")
    if differ:
        raise OptionError(
            f"--update keeps the plan {out} was built with; it differs in {'; '.join(differ)}: "
            "drop those options, or rebuild with --overwrite"
        )
    target = replace(
        t,
        allow_upscale=t.allow_upscale or opts.allow_upscale,
        max_pixels=t.max_pixels if opts.max_pixels == defaults.max_pixels else opts.max_pixels,
    )
    return replace(plan, target=target)


def _source_with_rules(source: Source, plan: BuildPlan) -> Source:
    """``source`` scanning with the store's symlink rule and exclude patterns: a store built following
    symlinks keeps following them, and one built with ``--exclude`` keeps leaving those paths out.

    Label folders and images are listed, not refused, by the scan: a store built before they were
    refused may hold some, and keeps them; the update refuses only new ones (:func:`_new_label_paths`).
    """
    if not isinstance(source, FolderSource):
        return source
    follow = source.follow_symlinks or plan.follow_symlinks
    return FolderSource(source.root, source.labels, follow, plan.exclude, check_labels=False)


def _new_label_paths(scan: SourceScan, added: Sequence[int], root: Path) -> None:
    """Refuse files an update would append from label folders or label images (``masks/``, ``*_mask.*``)."""
    found = sorted({p for k in added if (p := label_path(scan.items[k].rel)) is not None})
    if found:
        raise label_paths_error(os.fspath(root), found)


def _check_folder_rules(m: Manifest, scan: SourceScan, out: Path, root: Path) -> None:
    """Refuse a source whose labels or split rule now mean something else than when ``out`` was built.

    Kept samples keep their stored class and split, so a rule that changed would silently mix two
    meanings of the same folder names.
    """
    where = os.fspath(root)
    if m.labels != scan.labels:
        raise SourceError(
            f"{out} is labelled {m.labels!r} (class folders) but {where!r} now gives {scan.labels!r} labels "
            "(the labels rule: every image in a class folder, or none); an update keeps every sample's class: "
            "restore the folder layout, or rebuild with --overwrite"
        )
    splits = _split_names(scan.items)
    if bool(m.splits) == bool(splits):
        return
    if m.splits:
        tops = sorted({it.rel.split("/")[0] + ("/" if "/" in it.rel else "") for it in scan.items})
        tops = [t for t in tops if t.rstrip("/").lower() not in SPLIT_NAMES] or tops
        shown = ", ".join(shown_name(t) for t in tops[:5]) + (" ..." if len(tops) > 5 else "")
        raise SourceError(
            f"{out} was built with split folders ({', '.join(m.splits)}), but {where!r} now also has {shown} "
            "outside them, so the split rule (every image under a train, val, validation or test folder) no "
            "longer holds and every class and split would change; move those images into a split folder or out "
            "of SRC, or rebuild with --overwrite"
        )
    raise SourceError(
        f"{out} was built without split folders, but every image in {where!r} now sits under one "
        f"({', '.join(splits)}), so the split rule would turn those folders from classes into splits; "
        "rebuild with --overwrite"
    )


@dataclass(frozen=True)
class _Changes:
    """How the source differs from the store: old indices kept (in order), replaced and removed,
    new scan positions added, the new (size, mtime_ns) of kept files whose content did not change,
    and the scan position of each kept old index (its path, or the same path in another Unicode
    normalisation)."""

    kept: tuple[int, ...]
    replaced: frozenset[int]
    removed: tuple[int, ...]
    added: tuple[int, ...]
    restat: dict[int, tuple[int, int]]
    match: dict[int, int]
    #: Whether any kept sample is now listed under another spelling of its path.
    renamed: bool = False


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _match_paths(rels0: Sequence[str], scan: SourceScan) -> dict[int, int]:
    """Old index -> scan position of the same file: by path, then by the Unicode-normalised (NFC)
    path where exactly one old and one scanned path share it (a copy that normalised names)."""
    now = {it.rel: k for k, it in enumerate(scan.items)}
    match = {i: now[rel] for i, rel in enumerate(rels0) if rel in now}
    taken = set(match.values())
    old_left: dict[str, list[int]] = {}
    for i, rel in enumerate(rels0):
        if i not in match:
            old_left.setdefault(_nfc(rel), []).append(i)
    new_left: dict[str, list[int]] = {}
    for k, it in enumerate(scan.items):
        if k not in taken:
            new_left.setdefault(_nfc(it.rel), []).append(k)
    for key, olds in old_left.items():
        news = new_left.get(key, [])
        if len(olds) == 1 and len(news) == 1:
            match[olds[0]] = news[0]
    return match


def _class_aliases(old: Sequence[str], new: Sequence[str]) -> dict[str, str]:
    """Class names of the scan that are a stored class in another Unicode normalisation -> that class."""
    by_nfc: dict[str, list[str]] = {}
    for c in old:
        by_nfc.setdefault(_nfc(c), []).append(c)
    return {c: by_nfc[_nfc(c)][0] for c in new if c not in old and len(by_nfc.get(_nfc(c), ())) == 1}


def _changes(
    root: Path, scan: SourceScan, probes: Sequence[_Probe], rels0: Sequence[str], stat0: np.ndarray, sha0: np.ndarray
) -> _Changes:
    """Compare the source with the store: size and mtime first, then the content hash."""
    match = _match_paths(rels0, scan)
    kept = tuple(i for i in range(len(rels0)) if i in match)
    replaced: set[int] = set()
    restat: dict[int, tuple[int, int]] = {}
    for i in kept:
        k = match[i]
        path = Path(root, scan.items[k].rel)
        st = os.stat(path)
        if (st.st_size, st.st_mtime_ns) == tuple(int(v) for v in stat0[i]):
            continue
        if probes[k].error is None and _file_sha256(path) == bytes(sha0[i]).hex():
            restat[i] = (st.st_size, st.st_mtime_ns)  # touched or copied, same bytes: nothing to decode
        else:
            replaced.add(i)
    removed = tuple(i for i in range(len(rels0)) if i not in match)
    matched = set(match.values())
    added = tuple(k for k in range(len(scan.items)) if k not in matched)
    renamed = any(scan.items[k].rel != rels0[i] for i, k in match.items())
    return _Changes(kept, frozenset(replaced), removed, added, restat, match, renamed)


def _gone_error(ch: _Changes, rels0: Sequence[str], scan: SourceScan, root: Path) -> OptionError:
    """Why samples of the store have no file in the source: gone, or still there but refused by the scan."""
    refused = {e.path: e.reason for e in scan.errors}
    there = [i for i in ch.removed if rels0[i] in refused]
    if there:
        shown = "; ".join(f"{shown_name(rels0[i])}: {refused[rels0[i]]}" for i in there[:5])
        more = f" and {len(there) - 5} more" if len(there) > 5 else ""
        return OptionError(
            f"{len(there)} packed file(s) are still in {os.fspath(root)!r} but the scan no longer packs them "
            f"({shown}{more}); fix that, or pass --compact to drop their samples (the samples after them are "
            "renumbered)"
        )
    gone = ", ".join(shown_name(rels0[i]) for i in ch.removed[:5]) + (" ..." if len(ch.removed) > 5 else "")
    return OptionError(
        f"{len(ch.removed)} packed file(s) are gone from {os.fspath(root)!r} ({gone}); pass --compact to "
        "drop them (the samples after them are renumbered), or put them back"
    )


#: Arrays an update builds itself (``split`` too when the store has splits); every other array of a
#: store was added with ``add_array`` and is carried over, filled or dropped as the options say.
_UPDATE_BUILT = frozenset(
    {"images", "labels", "original_size", "transform", "checksum", "source_stat", "source_sha256", "source"}
)


def _user_arrays(m: Manifest, opts: BuildOptions, out: Path) -> list[ArraySpec]:
    """The arrays the update carries over (every array it does not build, but those ``drop_array`` names),
    with every ``fill`` and ``drop_array`` name checked."""
    built = _UPDATE_BUILT | ({"split"} if m.splits else set())
    user = {name: spec for name, spec in sorted(m.arrays.items()) if name not in built}
    fills = opts.fill_values
    for name in (*fills, *opts.drop_array):
        if name in built:
            raise OptionError(
                f"array {name!r} of {out} is built by dlpack; an update rebuilds it (it cannot be filled or dropped)"
            )
        if name not in user:
            have = ", ".join(user) or "none"
            raise OptionError(f"{out} has no array {name!r} added with add_array (it has: {have})")
    for name, value in fills.items():
        spec = user[name]
        if spec.ragged:
            if value is not None:
                raise OptionError(f"array {name!r} is ragged: its fill is no rows; pass fill {name}= (no value)")
            continue
        if value is None:
            raise OptionError(f"array {name!r} holds one value per sample: give its fill as {name}=NUMBER")
        cast = np.array(value).astype(spec.dtype)
        if float(cast.real if cast.dtype.kind == "c" else cast) != value:
            raise OptionError(f"fill value {value:g} does not fit array {name!r} of dtype {np.dtype(spec.dtype)}")
    return [spec for name, spec in user.items() if name not in opts.drop_array]


def _unfilled_error(missing: Sequence[ArraySpec], appended: int, replaced: int, out: Path) -> OptionError:
    names = ", ".join(s.name for s in missing)
    what = " and ".join(
        p for p in (f"{appended} appended" if appended else "", f"{replaced} replaced" if replaced else "") if p
    )
    example = ",".join(f"{s.name}=" if s.ragged else f"{s.name}=0" for s in missing)
    return OptionError(
        f"{out} has array(s) {names} (added with add_array), which this update cannot give a value for its "
        f"{what} sample(s); pass --fill {example} (fill=...) to give them that value (a ragged array: no rows), "
        f"or --drop-array {','.join(s.name for s in missing)} to drop them, then add_array the right values"
    )


def _carry_arrays(
    writer: StoreWriter,
    reader: Any,
    out: Path,
    specs: Sequence[ArraySpec],
    olds: Sequence[int | None],
    fills: Mapping[str, float | None],
) -> None:
    """Write every carried array into the new generation: row ``j`` is old sample ``olds[j]``'s, or
    the array's fill where it is None. A Zarr block of unchanged rows at unchanged indices shares
    the current store's shard file, as the images do."""
    count, n0 = len(olds), len(reader)
    for spec0 in specs:
        spec = replace(spec0, sha256={})
        name = spec.name
        rows0 = None if spec.ragged else reader.shard_len(name)
        saved = writer.shard_bytes
        if rows0:
            writer.shard_bytes = max(1, rows0 * spec.item_nbytes)  # the stored layout, whatever add_array chose
        try:
            writer.create_array(spec, count)
        finally:
            writer.shard_bytes = saved
        if spec.ragged:
            empty = np.empty((0, *spec.shape), dtype=spec.dtype)
            writer.write_block(name, 0, [reader.read(name, i) if i is not None else empty for i in olds])
            continue
        step = writer.block_len(name)
        for s in range(0, count, step):
            e = min(s + step, count)
            same = min(s + step, n0) == e and all(olds[j] == j for j in range(s, e))
            if same and writer.share_block(name, s, out):
                continue
            block = np.empty((e - s, *spec.shape), dtype=spec.dtype)
            js = [j for j in range(s, e) if olds[j] is not None]
            if js:
                got = np.empty((len(js), *spec.shape), dtype=spec.dtype)
                reader.read_into(name, [olds[j] for j in js], got)
                block[[j - s for j in js]] = got
            if len(js) < e - s:
                block[[j - s for j in range(s, e) if olds[j] is None]] = fills[name]
            writer.write_block(name, s, block)


def _update_reason(reason: str, plan: BuildPlan) -> str:
    """A decode failure's reason with advice that works under ``--update`` (which keeps the store's geometry)."""
    t, image = plan.target, plan.image
    if "would upscale it" in reason:
        head = reason.split(" (pass --allow-upscale")[0]
        return f"{head}; pass --allow-upscale with --update to enlarge it (the store's --resize {t.mode} is kept)"
    if "(its header said otherwise)" in reason:
        head = reason.split(" (its header said otherwise)")[0]
        return (
            f"{head}; an update keeps the store's {image.width}x{image.height} images: resize the file, or rebuild "
            f"with --overwrite (e.g. --size {image.width}x{image.height} --resize fit)"
        )
    return reason


def _replaced_error(bad: Sequence[InputFileError], others: int, root: Path, skip: bool) -> BadInputsError:
    """The error for replaced files that no longer decode: they keep their index, so no --on-error skips them."""
    how = "are skipped (--on-error skip)" if skip else "can be skipped with --on-error skip"
    rest = f"; the {others} other bad file(s) {how}" if others else ""
    return BadInputsError(
        sorted(bad, key=lambda e: e.path),
        os.fspath(root),
        hint=(
            "a replaced file keeps its sample index, so it cannot be skipped: fix it, or delete it and pass "
            f"--compact to drop its sample (the samples after it are renumbered){rest}"
        ),
    )


def _codes_outside(codes: np.ndarray, names: Sequence[str]) -> bool:
    """Whether a stored label or split array holds a code that names none of ``names`` (-1 is "none")."""
    return bool(len(codes)) and (int(codes.min()) < -1 or int(codes.max()) >= len(names))


def _split_counts(splits: Sequence[str], codes: np.ndarray | None) -> dict[str, int]:
    if codes is None or not len(splits):
        return {}
    counts = np.bincount(codes[codes >= 0].astype(np.int64), minlength=len(splits))
    return {name: int(n) for name, n in zip(splits, counts, strict=False) if n}


def update_stage(source: Source, out: Path, backend: type[Backend], opts: BuildOptions, t0: float) -> BuildResult:
    """Update the store at ``out`` from ``source`` (``build --update``); call while holding the build lock.

    The rule (docs/format.md, "Updates"): every sample keeps its index, class and split; files new
    in the source are appended after the last sample, in source order, and new classes get the next
    ids; a file whose size or mtime changed is decoded again in place when its SHA-256 changed too.
    Files gone from the source are refused unless ``compact``, which drops them and renumbers the
    samples after them. Every array added with ``add_array`` is carried over (appended and replaced
    samples get its ``fill``, or the update refuses), and files in a Zarr store folder that are not
    dlpack's are carried over unchanged. Only blocks that change are written: Zarr shares every
    other shard file with the current store (hard links); HDF5 cannot share, so its file is
    rewritten, unchanged rows copied without decoding. The new generation is published as a
    build's is; an update that changes nothing publishes nothing.
    """
    if not (out.exists() or out.is_symlink()):
        raise StoreNotFoundError(f"{out} does not exist; build it first (without --update)")
    own = owned_store(out)
    if own is not None and own is not backend:
        raise OptionError(
            f"{out} is a dlpack {own.name} store; --update keeps its format: drop --format {backend.name}"
        )
    if own is not backend:
        raise StoreError(
            f"{out} is not a dlpack {backend.name} store ({_unmarked(out)}); --update only updates dlpack's own stores"
        )
    reader = backend.open_reader(out)
    reader.check_labels = False  # a store whose labels are damaged is repaired by the update (below)
    try:
        m = reader.manifest
        missing = [n for n in ("source_stat", "source_sha256") if n not in m.arrays]
        why = (
            "it holds variable-size images" if m.image.layout != "fixed"
            else "it records no build plan" if not m.plan
            else f"it has no {' or '.join(missing)} (written before updates existed)" if missing
            else None
        )  # fmt: skip
        if why is not None:
            raise StoreError(f"{out} cannot be updated: {why}; rebuild it with --overwrite")
        plan0 = _check_update_options(BuildPlan.from_dict(m.plan), opts, out)
        source = _source_with_rules(source, plan0)
        root = source.root
        try:
            scan = scan_stage(source)
        except SourceError as exc:
            if m.labels == "folders" and "--labels none" in str(exc):
                raise SourceError(
                    f"{exc}. Under --update the store's labels are kept ({out} is labelled by class folders), "
                    "so --labels none would be refused: move them into class folders"
                ) from exc
            raise
        if plan0.split:
            # Kept samples keep their split; an appended one gets its split by its own draw under the seed.
            scan = split_per_file(scan, plan0.split, plan0.split_seed, os.fspath(root))
        _check_folder_rules(m, scan, out, root)
        user = _user_arrays(m, opts, out)
        probes = probe_stage(root, scan.items, opts)
        n0 = m.count
        rels0 = [reader.source(i) for i in range(n0)]
        ch = _changes(root, scan, probes, rels0, reader.meta("source_stat"), reader.meta("source_sha256"))
        if isinstance(source, FolderSource):
            _new_label_paths(scan, ch.added, root)
        if ch.removed and not opts.compact:
            raise _gone_error(ch, rels0, scan, root)
        # Inputs to decode: replaced files in place, then added ones; bad ones follow --on-error,
        # except replaced files, which cannot be dropped without renumbering.
        todo = [ch.match[i] for i in sorted(ch.replaced)] + list(ch.added)
        bad = {k: InputFileError(scan.items[k].rel, probes[k].error or "") for k in todo if probes[k].error}
        pairs = [(scan.items[k].rel, probes[k].header) for k in todo if k not in bad]
        found = validate_stage(os.fspath(root), plan0, pairs, opts)
        now = {it.rel: k for k, it in enumerate(scan.items)}
        bad.update({now[e.path]: e for e in found})
        bad = {k: InputFileError(e.path, _update_reason(e.reason, plan0)) for k, e in bad.items()}
        replaced_bad = [bad[ch.match[i]] for i in sorted(ch.replaced) if ch.match[i] in bad]
        errors = [*scan.errors, *bad.values()]
        if replaced_bad:
            raise _replaced_error(replaced_bad, len(errors) - len(replaced_bad), root, opts.on_error == "skip")
        if errors and opts.on_error == "fail":
            raise _bad_inputs(errors, root)
        added = [k for k in ch.added if k not in bad]
        # Where each sample of the new generation comes from: an old index, or a scan position to
        # decode; and the old index it had (None for appended samples).
        origin: list[tuple[str, int]] = [("new", ch.match[i]) if i in ch.replaced else ("old", i) for i in ch.kept]
        origin += [("new", k) for k in added]
        olds: list[int | None] = [*ch.kept, *([None] * len(added))]
        # A carried array's row stays with its sample only while its image does: a replaced image gets the fill.
        rows: list[int | None] = [None if i in ch.replaced else i for i in ch.kept] + [None] * len(added)
        items = [scan.items[ch.match[v]] if src == "old" else scan.items[v] for src, v in origin]
        if not items:
            raise SourceError(f"the update would leave {out} without samples")
        fills = opts.fill_values
        unfilled = [s for s in user if s.name not in fills]
        if unfilled and (added or ch.replaced):
            raise _unfilled_error(unfilled, len(added), len(ch.replaced), out)
        skipped = tuple(sorted(errors, key=lambda e: e.path))
        split0 = reader.meta("split") if m.splits else None
        labels0 = reader.meta("labels")
        damaged = _codes_outside(labels0, m.classes) or (split0 is not None and _codes_outside(split0, m.splits))
        changed = added or ch.replaced or ch.removed or ch.restat or ch.renamed or opts.drop_array or damaged
        if not changed and skipped == m.skipped:
            return BuildResult(
                path=out,
                count=n0,
                skipped=m.skipped,
                seconds=time.perf_counter() - t0,
                input_bytes=0,
                output_bytes=reader.nbytes_on_disk(),
                conversions=dict(m.conversions),
                plan=BuildPlan.from_dict(m.plan),
                update="up to date: nothing to do",
                classes=m.classes,
                splits=_split_counts(m.splits, split0),
                excluded=scan.excluded,
                ignored=scan.ignored,
            )
        images = _image_array(plan0.image, plan0.compression)
        count = len(items)
        plan = replace(
            plan0,
            count=count,
            shard_images=backend.block_rows(images, count, plan0.shard_bytes),
            order=_order_digest(items),
            source=_source_digest(scan, probes),
        )
        alias = _class_aliases(m.classes, scan.classes)
        if alias:
            items = [replace(it, label=alias[it.label]) if it.label in alias else it for it in items]
        classes = (*m.classes, *(c for c in scan.classes if c not in m.classes and c not in alias))
        splits = (*m.splits, *(s for s in _split_names(scan.items) if s not in m.splits))
        class_id = {c: i for i, c in enumerate(classes)}
        split_id = {s: i for i, s in enumerate(splits)}
        # Kept and replaced samples keep their stored class and split; appended ones get the scan's,
        # and so does a stored code outside the store's classes or splits (a damaged store is repaired).
        def kept(codes: np.ndarray | None, i: int | None, names: Sequence[str]) -> int | None:
            code = None if codes is None or i is None else int(codes[i])
            return code if code is not None and -1 <= code < len(names) else None

        labels = np.array(
            [
                code if (code := kept(labels0, i, m.classes)) is not None
                else class_id[it.label] if it.label is not None else -1
                for i, it in zip(olds, items, strict=True)
            ],
            dtype="<i4",
        )  # fmt: skip
        split_codes = (
            np.array(
                [
                    code if (code := kept(split0, i, m.splits)) is not None
                    else split_id[it.split] if it.split else -1
                    for i, it in zip(olds, items, strict=True)
                ],
                dtype="|i1",
            )  # fmt: skip
            if splits
            else None
        )
        tmp = partial_path(out)
        _remove(journal_path(out))
        _remove(tmp)
        writer = backend.open_writer(tmp, "w-", plan.shard_bytes)
        partial = _Partial(writer, None, {}, "")
        try:
            writer.open()
            writer.create_array(images, count)
            decoded, shared, written = _update_blocks(
                writer, reader, out, plan0, plan, origin, scan, probes, root, opts
            )
            _carry_arrays(writer, reader, out, user, rows, fills)
            osz, tr, crc = reader.meta("original_size"), reader.meta("transform"), reader.meta("checksum")
            stat0, sha0 = reader.meta("source_stat"), reader.meta("source_sha256")
            samples = [
                _Sample(
                    (int(osz[v][0]), int(osz[v][1])),
                    (plan.image.height or 0, plan.image.width or 0, plan.image.channels),
                    (float(tr[v][0]), float(tr[v][1]), float(tr[v][2]), float(tr[v][3])),
                    int(crc[v]),
                    (),
                    None,
                    ch.restat.get(v, (int(stat0[v][0]), int(stat0[v][1]))),
                    bytes(sha0[v]).hex(),
                )
                if src == "old"
                else decoded[v]
                for src, v in origin
            ]
            view = SourceScan(tuple(items), classes, (), scan.labels)
            arrays, manifest = manifest_stage(plan, view, _Selection(tuple(range(count)), tuple(errors)), samples)
            arrays["labels"] = (arrays["labels"][0], labels)
            arrays.pop("split", None)
            if split_codes is not None:
                arrays["split"] = (ArraySpec("split", "|i1", (), key="split"), split_codes)
            conversions = Counter(m.conversions)
            conversions.update(c for s in decoded.values() for c in s.conversions)
            entry = {
                "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "added": len(added),
                "replaced": len(ch.replaced),
                "removed": len(ch.removed),
            }
            manifest = replace(
                manifest,
                splits=splits,
                conversions=dict(sorted(conversions.items())),
                history=(*m.history, entry),
            )
        except BaseException as exc:
            discard_partial(partial, out, exc)
            raise
        commit_store(partial, out, arrays, manifest)
        try:
            carried = backend.carry_foreign(out, tmp, m)
        except BaseException:
            _remove(tmp)
            raise
    finally:
        reader.close()
    publish(tmp, out, True)
    n_blocks = shared + written
    note = (
        f"updated: {len(added)} added, {len(ch.replaced)} replaced, {len(ch.removed)} removed; "
        f"{written} of {n_blocks} blocks written"
    )
    if opts.drop_array:
        note += f"; dropped array(s) {', '.join(opts.drop_array)}"
    if carried:
        what = "1 entry that is" if len(carried) == 1 else f"{len(carried)} entries that are"
        note += f"; kept {what} not dlpack's ({', '.join(shown_name(c) for c in carried[:5])})"
    return BuildResult(
        path=out,
        count=count,
        skipped=manifest.skipped,
        seconds=time.perf_counter() - t0,
        input_bytes=sum(probes[k].nbytes for k in decoded),
        output_bytes=backend.open_reader(out).nbytes_on_disk(),
        conversions=dict(manifest.conversions),
        plan=plan,
        update=note,
        classes=manifest.classes,
        splits=_split_counts(splits, split_codes),
        excluded=scan.excluded,
        ignored=scan.ignored,
    )


def _update_blocks(
    writer: StoreWriter,
    reader: Any,
    out: Path,
    plan0: BuildPlan,
    plan: BuildPlan,
    origin: Sequence[tuple[str, int]],
    scan: SourceScan,
    probes: Sequence[_Probe],
    root: Path,
    opts: BuildOptions,
) -> tuple[dict[int, _Sample], int, int]:
    """Write the image blocks of an update: a block whose samples are all the old store's, at the
    same indices, in a block of the same extent, is shared with it when the backend can; every
    other block is assembled from old pixels and newly decoded files. Returns the decoded samples
    (by scan position) and the counts of shared and written blocks."""
    from joblib import delayed

    step = writer.block_len("images")
    n0, step0 = plan0.count, plan0.shard_images
    starts = list(range(0, len(origin), step))
    todo: list[int] = []
    shared = 0
    for s in starts:
        e = min(s + step, len(origin))
        same = step == step0 and min(s + step0, n0) == e and all(origin[j] == ("old", j) for j in range(s, e))
        if same and writer.share_block("images", s, out):
            shared += 1
        else:
            todo.append(s)
    rel = [it.rel for it in scan.items]
    decoded: dict[int, _Sample] = {}
    with (
        _progress(sum(min(step, len(origin) - s) for s in todo), "updating", opts.quiet) as bar,
        _BlockProgress(bar, len(todo), _pooled(opts.n_jobs, len(todo))) as progress,
    ):
        calls = []
        for j, s in enumerate(todo):
            ks = [v for src, v in origin[s : s + step] if src == "new"]
            pairs = [(rel[k], probes[k].header) for k in ks]
            calls.append(delayed(decode_block)(os.fspath(root), plan, pairs, None, True, progress.ticks(j)))
        for slot, (s, results) in enumerate(zip(todo, _parallel(opts.n_jobs, calls), strict=True)):
            block = _fixed_block(plan, min(step, len(origin) - s))
            olds = [(j, v) for j, (src, v) in enumerate(origin[s : s + step]) if src == "old"]
            if olds:
                got = np.empty((len(olds), *block.shape[1:]), dtype=block.dtype)
                reader.read_into("images", [v for _, v in olds], got)
                block[[j for j, _ in olds]] = got
            news = [j for j, (src, _) in enumerate(origin[s : s + step]) if src == "new"]
            for j, r in zip(news, results, strict=True):
                if not isinstance(r, _Sample) or r.pixels is None:
                    raise DlpackError(f"{r} failed to decode on the second pass")  # pragma: no cover - checked before
                block[j] = r.pixels
                decoded[origin[s + j][1]] = replace(r, pixels=None)
            writer.write_block("images", s, block)
            progress.finished(slot, len(block))
    return decoded, shared, len(todo)


# ---------------------------------------------------------------- helpers


def _pooled(n_jobs: int, n_calls: int) -> bool:
    """Whether :func:`_parallel` runs ``n_calls`` calls in worker processes (else in this process)."""
    return not (n_jobs == 1 or n_calls <= 1)


def _parallel(n_jobs: int, calls: list[Any]) -> Iterator[Any]:
    """Run delayed calls in order; in-process for one job (no pickling, honest --jobs 1 figures)."""
    if not _pooled(n_jobs, len(calls)):
        for fn, args, kwargs in calls:
            yield fn(*args, **kwargs)
        return
    from joblib import Parallel, parallel_config

    _quiet_resource_tracker()
    # Every worker watches this process from its start, so a killed build leaves no workers.
    with parallel_config(backend="loky", initializer=_start_watchdog, initargs=(os.getpid(),)):
        runner = Parallel(n_jobs=n_jobs, return_as="generator", pre_dispatch="2*n_jobs")
    yield from runner(calls)


#: How loky's resource tracker is told not to print its own clean-up (a ``-W`` option it inherits).
_TRACKER_QUIET = "ignore:resource_tracker:UserWarning"


def _quiet_resource_tracker() -> None:
    """Keep the warnings of loky's resource tracker off the terminal.

    When a build is killed (a SIGTERM to its process group, say), the tracker process outlives it,
    removes the semaphores and memory-mapping folders the pool had registered, and warns about each
    as "leaked": the clean-up is right, the warnings only alarm. The tracker is started with this
    process's ``-W`` options (``sys.warnoptions``), so the filter is set before the first pool.
    """
    if _TRACKER_QUIET not in sys.warnoptions:
        sys.warnoptions.append(_TRACKER_QUIET)


_WATCHDOG_STARTED = False
#: Seconds between a worker's checks that the build process is still there.
_WATCHDOG_INTERVAL = 0.5


def _start_watchdog(parent: int) -> None:
    """In a worker process of the build process ``parent``: exit as soon as that process is gone.

    Idle pool workers otherwise outlive a killed build for minutes (until the pool's idle timeout).
    A dead parent's children are re-parented, so a changed parent pid is the signal; a worker that
    was not started by ``parent`` itself checks that ``parent`` still exists. Nothing is started in
    ``parent`` itself, whose own parent (a shell, a scheduler) may come and go.
    """
    global _WATCHDOG_STARTED
    if _WATCHDOG_STARTED or os.getpid() == parent or sys.platform == "win32":
        return
    _WATCHDOG_STARTED = True
    child = os.getppid() == parent

    def gone() -> bool:
        if child:
            return os.getppid() != parent
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False

    def watch() -> None:
        while not gone():
            time.sleep(_WATCHDOG_INTERVAL)
        os._exit(1)

    threading.Thread(target=watch, name="dlpack-parent-watchdog", daemon=True).start()


class _Ticks:
    """How far one block's decoding is, told to the build's progress bar.

    In the build process it calls the bar's owner directly; pickled into a worker process, it writes
    the count into the block's slot of a small counter file that the build process polls. Either way
    the bytes written do not change: only the bar hears more often.
    """

    #: Files between two ticks: often enough for a smooth bar, rare enough to cost nothing.
    EVERY = 64

    def __init__(self, slot: int, path: str | None, local: Any = None) -> None:
        self.slot, self.path, self.local = slot, path, local
        self._counts: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"slot": self.slot, "path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["slot"], state["path"])  # type: ignore[misc]

    def __call__(self, done: int) -> None:
        if self.local is not None:
            self.local(self.slot, done)
        elif self.path is not None:
            if self._counts is None:
                self._counts = np.memmap(self.path, dtype="<i8", mode="r+")
            self._counts[self.slot] = done


class _BlockProgress:
    """Advances ``bar`` as the files of each block are decoded, not only when a block lands.

    ``pooled``: the blocks run in worker processes, which write their counts into a counter file
    (a memory map) that a thread of this process reads every :attr:`INTERVAL` seconds.
    """

    INTERVAL = 0.1

    def __init__(self, bar: Any, blocks: int, pooled: bool) -> None:
        self.bar = bar
        self.off = bool(getattr(bar, "disable", False))  # --quiet, or no terminal: nobody to tell
        pooled = pooled and not self.off
        self.done = np.zeros(max(1, blocks), dtype=np.int64)
        self.shown = 0
        self.lock = threading.Lock()
        self.path: str | None = None
        self.counts: np.ndarray | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if pooled and blocks:
            import tempfile

            fd, self.path = tempfile.mkstemp(prefix="dlpack-progress-")
            os.close(fd)
            self.counts = np.memmap(self.path, dtype="<i8", mode="w+", shape=(blocks,))
            self.thread = threading.Thread(target=self._poll, name="dlpack-progress", daemon=True)

    def __enter__(self) -> _BlockProgress:
        if self.thread is not None:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        self.counts = None
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def ticks(self, slot: int) -> _Ticks | None:
        if self.off:
            return None
        return _Ticks(slot, self.path, None if self.path is not None else self._local)

    def _local(self, slot: int, done: int) -> None:
        with self.lock:
            self.done[slot] = done
            self._sync()

    def finished(self, slot: int, n: int) -> None:
        """Block ``slot`` landed with ``n`` samples."""
        with self.lock:
            self.done[slot] = n
            self._sync()

    def _poll(self) -> None:
        while not self.stop.wait(self.INTERVAL):
            with self.lock:
                self._sync()

    def _sync(self) -> None:
        done = self.done if self.counts is None else np.maximum(self.done, self.counts)
        total = int(done.sum())
        if total > self.shown:
            self.bar.update(total - self.shown)
            self.shown = total


def _progress(total: int, desc: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=quiet or not sys.stderr.isatty(), leave=False)


# ---------------------------------------------------------------- the pipeline


def _existing_result(
    backend: type[Backend],
    out: Path,
    plan: BuildPlan,
    scan: SourceScan,
    sel: _Selection,
    probes: Sequence[_Probe],
    t0: float,
) -> BuildResult:
    """The result of a build whose store a killed run of the same build had already published."""
    with backend.open_reader(out) as reader:
        m = reader.manifest
        nbytes = reader.nbytes_on_disk()
    return BuildResult(
        path=out,
        count=m.count,
        skipped=m.skipped,
        seconds=time.perf_counter() - t0,
        input_bytes=0,
        output_bytes=nbytes,
        conversions=dict(m.conversions),
        plan=plan,
        resume="published already: the stopped build had finished it",
        classes=m.classes,
        splits=dict(Counter(s for k in sel.keep if (s := scan.items[k].split) is not None)),
    )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_paths(source: Source, out: Path) -> None:
    """Refuse an ``out`` that is the source's root or contains it, or (for a folder) lies inside it.

    Replacing OUT would delete the source images in the first two cases. A folder source walks its
    whole tree, so a store inside it would become input of the next build of that folder.

    Raises
    ------
    OptionError
        With both paths, as given and resolved.
    """
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
    if isinstance(source, FolderSource) and src_real in out_real.parents:
        raise OptionError(
            f"OUT is inside SRC: {both}; the next build of SRC would read the store as input; choose an OUT outside SRC"
        )


def _check_out_suffix(out: Path, opts: BuildOptions) -> None:
    """Refuse an OUT whose suffix names no format (``x.txt``): it would silently become a Zarr folder of that name.

    A suffix-less OUT gets the default format; ``format`` names the format whatever the suffix, and
    an update keeps the format of the store already there.
    """
    if opts.format is not None or opts.update:
        return
    suffix = os.path.splitext(os.fspath(out).rstrip("/\\"))[1].lower()
    known = {s: b.name for b in BACKENDS.values() for s in b.suffixes}
    if suffix and suffix not in known:
        shown = ", ".join(f"{s} ({name})" for s, name in sorted(known.items()))
        raise OptionError(
            f"OUT {shown_name(os.fspath(out))!r} ends in {shown_name(suffix)!r}, which names no store format; "
            f"use one of the suffixes {shown}, or name the format with format=FORMAT"
        )


def build(
    src: Source | str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: BuildOptions | None = None,
    **kwargs: Any,
) -> BuildResult:
    """Pack the images a source lists into one store at ``out``.

    Parameters
    ----------
    src
        A folder tree of images (class sub-folders become labels with ``labels="auto"``), or any
        :class:`~dlpack.sources.Source`; for a Source, the ``labels`` and ``follow_symlinks``
        options do not apply (the source decides), and ``exclude`` is refused.
    out
        Store path: a ``.zarr`` folder (default) or a ``.h5``/``.hdf5`` file.
    options
        A :class:`~dlpack.BuildOptions`; keyword arguments override its fields
        (``build("raw", "train.zarr", size=(512, 512), jobs=2)``).

    Returns
    -------
    BuildResult
        With ``skipped`` listing inputs left out under ``on_error="skip"``, and the ``plan``.

    Raises
    ------
    BadInputsError
        Unreadable inputs under ``on_error="fail"`` (every one found is listed).
    StoreExistsError
        ``out`` exists and ``overwrite`` is false.
    StoreLockedError
        Another build into ``out`` is running (the message names it).
    """
    opts = replace(options or BuildOptions(), **kwargs) if kwargs else (options or BuildOptions())
    t0 = time.perf_counter()
    if isinstance(src, (str, os.PathLike)) and not os.fspath(src):
        raise SourceError("the source path is empty; give the folder of images (use '.' for the current folder)")
    if not os.fspath(out):
        raise OptionError("the output path is empty; give the store to write, e.g. train.zarr")
    out_path = Path(out)
    _check_out_suffix(out_path, opts)
    backend = backend_for_path(out_path, opts.format, write=True)
    source = as_source(src, opts)
    if opts.exclude and not isinstance(source, FolderSource):
        raise OptionError(
            f"exclude applies to a folder source; a {type(source).__name__} lists its own items: leave them out there"
        )
    if isinstance(source, FolderSource) and source.exclude != opts.exclude:
        if opts.exclude:
            raise OptionError(
                f"the FolderSource excludes {list(source.exclude)} but exclude={list(opts.exclude)} was given; "
                "give the patterns in one place"
            )
        opts = replace(opts, exclude=source.exclude)  # the plan records the source's own patterns
    if isinstance(source, FolderSource) and source.follow_symlinks != opts.follow_symlinks:
        opts = replace(opts, follow_symlinks=source.follow_symlinks)  # the plan records the source's own rule
    check_paths(source, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with BuildLock(out_path):
        published = clear_leftovers(out_path)
        if opts.update:
            return update_stage(source, out_path, backend, opts, t0)
        # The CLI names its flag instead (dlpack.cli): the keyword is the library's word for it.
        exists = f"{out_path} already exists; pass overwrite=True to replace it"
        if out_path.exists() or out_path.is_symlink():
            if opts.overwrite:
                check_replaceable(out_path)
                published = None
            elif published is None:
                raise StoreExistsError(exists)
        root = source.root
        scan = scan_stage(source)
        if opts.split:
            scan = split_stage(scan, opts.split, opts.split_seed or 0, os.fspath(root))
        probes = probe_stage(root, scan.items, opts)
        plan, sel = plan_stage(scan, probes, _probed(scan, probes), opts, backend.name)
        if published is not None:
            # The same build was killed just after it published OUT: it is done.
            if not _published_by_killed_build(backend, out_path, plan, published):
                raise StoreExistsError(exists)
            return _existing_result(backend, out_path, plan, scan, sel, probes, t0)
        if sel.errors and opts.on_error == "fail":
            pairs = [(scan.items[k].rel, probes[k].header) for k in sel.keep]
            found = validate_stage(os.fspath(root), plan, pairs, opts)
            raise _bad_inputs([*sel.errors, *found], root, nothing_left=len(found) == len(pairs))
        tmp = partial_path(out_path)
        plan, sel, samples, partial, resume = pack_stage(backend, out_path, root, scan, probes, plan, sel, opts)
        try:
            arrays, manifest = manifest_stage(plan, scan, sel, samples)
        except BaseException as exc:
            discard_partial(partial, out_path, exc)
            raise
        commit_store(partial, out_path, arrays, manifest)
        try:
            publish(tmp, out_path, opts.overwrite)
        finally:
            _remove(journal_path(out_path))
        try:
            return BuildResult(
                path=out_path,
                count=plan.count,
                skipped=manifest.skipped,
                seconds=time.perf_counter() - t0,
                input_bytes=sum(probes[k].nbytes for k in sel.keep),
                output_bytes=backend.open_reader(out_path).nbytes_on_disk(),
                conversions=dict(manifest.conversions),
                plan=plan,
                resume=resume,
                classes=manifest.classes,
                splits=dict(Counter(s for k in sel.keep if (s := scan.items[k].split) is not None)),
                excluded=scan.excluded,
                ignored=scan.ignored,
                distinct_sizes=len({s.shape[:2] for s in samples}) if plan.image.layout == "variable" else 0,
            )
        except KeyboardInterrupt:
            raise PublishedInterrupt(out_path) from None
