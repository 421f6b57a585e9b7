"""The build pipeline: scan -> probe -> plan -> decode/resize -> write -> manifest -> publish.

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
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from . import __version__
from ._lock import BuildLock, old_path, partial_path
from .backends import ArraySpec, Backend, StoreWriter, backend_for_path, get_backend, owned_store
from .errors import BadInputsError, DlpackError, InputFileError, OptionError, SourceError, StoreError, StoreExistsError
from .manifest import ImageSpec, Manifest
from .options import BuildOptions
from .sources.base import Source, SourceItem, SourceScan
from .sources.decode import DecodeError, TargetSpec, check_header, incomplete_reason, normalise_header, prepare_image
from .sources.folder import FolderSource
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
        }

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
            return cls(
                target=TargetSpec.from_dict(dict(d["target"])),
                image=ImageSpec(**d["image"]),
                order=d["order"],
                source=d["source"],
                **fields,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"the recorded build plan is malformed: {exc!r}") from exc

    def fingerprint(self) -> str:
        """SHA-256 (hex) of the plan's canonical JSON: equal plans, equal fingerprints, across runs and machines."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class BuildResult:
    """What a build did: where the store is, how many images it holds, what was skipped, how fast."""

    path: Path
    count: int
    skipped: tuple[InputFileError, ...]
    seconds: float
    input_bytes: int
    output_bytes: int
    conversions: dict[str, int] = field(default_factory=dict)
    plan: BuildPlan | None = None

    @property
    def images_per_s(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else float("inf")

    def summary(self) -> str:
        """One closing line: images, input MB, output MB, seconds, images/s."""
        skipped = f", {len(self.skipped)} skipped" if self.skipped else ""
        return (
            f"packed {self.count} images{skipped}: {self.input_bytes / 1e6:.1f} MB in -> "
            f"{self.output_bytes / 1e6:.1f} MB out in {self.seconds:.1f} s ({self.images_per_s:.0f} images/s) "
            f"-> {self.path}"
        )


@dataclass(frozen=True)
class _Selection:
    """Which scanned items are still in (positions in ``SourceScan.items``, in order), and every input error so far."""

    keep: tuple[int, ...]
    errors: tuple[InputFileError, ...]

    def drop(self, failed: Mapping[int, InputFileError]) -> _Selection:
        """A selection without the positions in ``failed``, whose errors are added."""
        return _Selection(tuple(k for k in self.keep if k not in failed), self.errors + tuple(failed.values()))


def _bad_inputs(errors: Sequence[InputFileError], root: Path) -> BadInputsError:
    return BadInputsError(sorted(errors, key=lambda e: e.path), os.fspath(root))


# ---------------------------------------------------------------- stage 1: scan


def as_source(src: Source | str | os.PathLike[str], opts: BuildOptions) -> Source:
    """The source a build reads: a path means a :class:`FolderSource` with the options' labels and symlink rule."""
    if isinstance(src, (str, os.PathLike)):
        return FolderSource(src, opts.labels, opts.follow_symlinks)
    if isinstance(src, Source):
        return src
    raise OptionError(f"src must be a folder path or a dlpack.sources.Source, got {type(src).__name__}")


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
    return scan


# ---------------------------------------------------------------- stage 2: probe (workers)


@dataclass(frozen=True)
class _Probe:
    header: ImageHeader | None
    nbytes: int
    error: str | None


_FILE_KINDS = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
}


def _open_regular(path: Path) -> BinaryIO:
    """Open ``path`` for reading only if it is a regular file; anything else raises OSError saying what it is.

    A named pipe blocks its reader until a writer comes (forever, in a build) and opening a device
    can have side effects, so the kind is checked before opening, and again on the open descriptor
    (O_NONBLOCK keeps that open from blocking) in case the path was swapped in between.
    """

    def refuse(mode: int) -> OSError:
        kind = _FILE_KINDS.get(stat.S_IFMT(mode), "not a plain file")
        return OSError(errno.EINVAL, f"not a regular file ({kind}); only regular files are packed", os.fspath(path))

    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise refuse(mode)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise refuse(mode)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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
            # TIFF keeps its first IFD after the pixels, and JPEG metadata can exceed the head.
            try:
                with _open_regular(path) as f:
                    header = probe_header(f.read())
            except OSError as exc:
                out.append(_Probe(None, size, f"cannot read: {exc.strerror or exc}"))
                continue
        if header is not None:
            header = normalise_header(header, head)
        if header is None:
            out.append(_Probe(None, size, "not an image: the header is not PNG, JPEG, BMP, TIFF, WebP or PNM"))
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


def prepare_file(root: str, plan: BuildPlan, rel: str, header: ImageHeader | None) -> tuple[np.ndarray, _Sample]:
    """Read one file and turn it into its stored form with :func:`~dlpack.sources.decode.prepare_image`."""
    with _open_regular(Path(root, rel)) as f:
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
    )
    return img, meta


def decode_block(
    root: str,
    plan: BuildPlan,
    pairs: Sequence[tuple[str, ImageHeader | None]],
    out: np.ndarray | None = None,
    keep_pixels: bool = False,
) -> list[_Sample | InputFileError]:
    """Prepare a run of files: their metadata or why each failed.

    Pixels go into ``out[k]`` when given (a fixed-size block; failed slots keep their zeros), and
    onto the returned samples when ``keep_pixels``.
    """
    results: list[_Sample | InputFileError] = []
    for k, (rel, header) in enumerate(pairs):
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
    writer: StoreWriter, root: str, plan: BuildPlan, start: int, pairs: Sequence[tuple[str, ImageHeader | None]]
) -> list[_Sample | InputFileError]:
    """Decode a block and write it as one block (in a worker, for writers that allow it)."""
    block = _fixed_block(plan, len(pairs))
    results = decode_block(root, plan, pairs, out=block)
    # A block with a failure is not written: the store is then discarded (or rebuilt) anyway.
    if not any(isinstance(r, InputFileError) for r in results):
        writer.write_block("images", start, block)
    return results


def write_images(
    backend: type[Backend],
    tmp: Path,
    plan: BuildPlan,
    root: str,
    pairs: Sequence[tuple[str, ImageHeader | None]],
    opts: BuildOptions,
) -> tuple[list[_Sample | InputFileError], StoreWriter | None]:
    """5. Create the store at ``tmp`` and write every image, decoded by workers.

    Returns the per-sample results and the open writer; when any file failed to decode, the
    writer is aborted, ``tmp`` removed, and None returned in its place.
    """
    writer: StoreWriter = backend.open_writer(tmp, "w-", plan.shard_bytes)
    try:
        writer.open()
        images = _image_array(plan.image, plan.compression)
        writer.create_array(images, plan.count)
        fixed = not images.ragged
        in_workers = fixed and writer.parallel_safe(images.name)
        step = writer.block_len(images.name) if fixed else 16
        appended = 0
        from joblib import delayed

        starts = range(0, len(pairs), step)
        if in_workers:
            calls = [delayed(_write_block_worker)(writer, root, plan, s, pairs[s : s + step]) for s in starts]
        else:
            calls = [delayed(decode_block)(root, plan, pairs[s : s + step], None, True) for s in starts]
        results: list[_Sample | InputFileError] = []
        failed = False
        with _progress(len(pairs), "packing", opts.quiet) as bar:
            for s, block in zip(starts, _parallel(opts.n_jobs, calls), strict=True):
                failed = failed or any(isinstance(r, InputFileError) for r in block)
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
                results.extend(block)
                bar.update(len(block))
    except BaseException:
        abort_store(writer, tmp)
        raise
    if failed:
        abort_store(writer, tmp)
        return results, None
    return results, writer


def commit_store(writer: StoreWriter, tmp: Path, arrays: dict[str, tuple[ArraySpec, Any]], manifest: Manifest) -> None:
    """Write the per-sample arrays, then the manifest: the store at ``tmp`` is complete after this."""
    try:
        for spec, values in arrays.values():
            writer.create_array(spec, manifest.count)
            writer.write_block(spec.name, 0, values)
        writer.commit(manifest)
    except BaseException:
        abort_store(writer, tmp)
        raise


def abort_store(writer: StoreWriter, tmp: Path) -> None:
    """Close the writer after a failure and remove its partial store."""
    with contextlib.suppress(Exception):
        writer.abort()
    _remove(tmp)


def pack_stage(
    backend: type[Backend],
    tmp: Path,
    root: Path,
    scan: SourceScan,
    probes: Sequence[_Probe],
    plan: BuildPlan,
    sel: _Selection,
    opts: BuildOptions,
) -> tuple[BuildPlan, _Selection, list[_Sample], StoreWriter]:
    """4-5. Decode and write the selected items under ``plan``.

    Files that pass the probe but fail to decode (damage inside the compressed data) are rare:
    under ``on_error="skip"`` they leave the selection and the store is planned and written again
    without them, so the result is byte-identical to a build of the good files alone.
    """
    for _attempt in range(3):
        if not sel.keep:
            raise _bad_inputs(sel.errors, root)
        pairs = [(scan.items[k].rel, probes[k].header) for k in sel.keep]
        results, writer = write_images(backend, tmp, plan, os.fspath(root), pairs, opts)
        if writer is not None:
            return plan, sel, [r for r in results if isinstance(r, _Sample)], writer
        sel = sel.drop({k: r for k, r in zip(sel.keep, results, strict=True) if isinstance(r, InputFileError)})
        if opts.on_error == "fail":
            raise _bad_inputs(sel.errors, root)
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
) -> dict[str, tuple[ArraySpec, Any]]:
    """The per-sample metadata arrays, by name: their specs and values."""
    class_id = {c: i for i, c in enumerate(classes)}
    fixed: dict[str, tuple[np.ndarray, str | None]] = {
        "labels": (
            np.array([class_id[it.label] if it.label is not None else -1 for it in items], dtype="<i4"),
            "label",
        ),
        "original_size": (np.array([s.original_size for s in samples], dtype="<i4").reshape(-1, 2), None),
        "transform": (np.array([s.transform for s in samples], dtype="<f8").reshape(-1, 4), None),
        "checksum": (np.array([s.checksum for s in samples], dtype="<u4"), None),
    }
    if shapes is not None:
        fixed["image_shapes"] = (np.array(shapes, dtype="<i4").reshape(-1, 3), None)
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
    arrays = _meta_arrays(items, samples, scan.classes, [s.shape for s in samples] if variable else None)
    conversions = Counter(c for s in samples for c in s.conversions)
    target = plan.target
    manifest = Manifest(
        count=plan.count,
        image=plan.image,
        backend=plan.backend,
        classes=scan.classes,
        labels=scan.labels,
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
        return "it is a folder without dlpack's marker"
    if path.is_file():
        with open(path, "rb") as f:
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
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True
    return isinstance(meta, dict) and meta.get("node_type") == "group" and not meta.get("attributes")


def _hdf5_readable(path: Path) -> bool:
    import h5py

    try:
        with h5py.File(path, "r"):
            return True
    except OSError:
        return False


def clear_leftovers(out: Path) -> None:
    """Undo what a killed build of ``out`` left behind; call only while holding the build lock.

    An overwritten store that was waiting for its replacement comes back to ``out`` (or is removed
    when the replacement made it), and a stale partial is removed once it is proven to be dlpack's.
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
    tmp = partial_path(out)
    if tmp.exists() or tmp.is_symlink():
        reason = _not_ours(tmp)
        if reason is not None:
            raise StoreError(
                f"{tmp} is where this build writes, but it is not a dlpack partial store ({reason}); "
                "remove or rename it, then build again"
            )
        _remove(tmp)


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
        what = "a folder" if out.is_dir() else "a file" if out.is_file() else "neither a file nor a folder"
        raise StoreExistsError(
            f"{out} exists and is not a dlpack store ({what} without dlpack's marker); --overwrite replaces "
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


# ---------------------------------------------------------------- helpers


def _parallel(n_jobs: int, calls: list[Any]) -> Iterator[Any]:
    """Run delayed calls in order; in-process for one job (no pickling, honest --jobs 1 figures)."""
    if n_jobs == 1 or len(calls) <= 1:
        for fn, args, kwargs in calls:
            yield fn(*args, **kwargs)
        return
    from joblib import Parallel, parallel_config

    # Every worker watches this process from its start, so a killed build leaves no workers.
    with parallel_config(backend="loky", initializer=_start_watchdog, initargs=(os.getpid(),)):
        runner = Parallel(n_jobs=n_jobs, return_as="generator", pre_dispatch="2*n_jobs")
    yield from runner(calls)


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


def _progress(total: int, desc: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=quiet or not sys.stderr.isatty(), leave=False)


# ---------------------------------------------------------------- the pipeline


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
        options do not apply (the source decides).
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
    backend = backend_for_path(out_path, opts.format, write=True)
    source = as_source(src, opts)
    check_paths(source, out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with BuildLock(out_path):
        clear_leftovers(out_path)
        if out_path.exists() or out_path.is_symlink():
            if not opts.overwrite:
                raise StoreExistsError(f"{out_path} already exists; pass --overwrite (overwrite=True) to replace it")
            check_replaceable(out_path)
        root = source.root
        scan = scan_stage(source)
        probes = probe_stage(root, scan.items, opts)
        plan, sel = plan_stage(scan, probes, _probed(scan, probes), opts, backend.name)
        if sel.errors and opts.on_error == "fail":
            pairs = [(scan.items[k].rel, probes[k].header) for k in sel.keep]
            raise _bad_inputs([*sel.errors, *validate_stage(os.fspath(root), plan, pairs, opts)], root)
        tmp = partial_path(out_path)
        plan, sel, samples, writer = pack_stage(backend, tmp, root, scan, probes, plan, sel, opts)
        try:
            arrays, manifest = manifest_stage(plan, scan, sel, samples)
        except BaseException:
            abort_store(writer, tmp)
            raise
        commit_store(writer, tmp, arrays, manifest)
        try:
            publish_stage(tmp, out_path, opts.overwrite)
        except BaseException:
            _remove(tmp)
            raise
    return BuildResult(
        path=out_path,
        count=plan.count,
        skipped=manifest.skipped,
        seconds=time.perf_counter() - t0,
        input_bytes=sum(probes[k].nbytes for k in sel.keep),
        output_bytes=backend.open_reader(out_path).nbytes_on_disk(),
        conversions=dict(manifest.conversions),
        plan=plan,
    )
