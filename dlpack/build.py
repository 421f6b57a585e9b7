"""The build pipeline: scan -> probe -> plan -> decode/resize (workers) -> write -> manifest -> publish.

Each stage is a function of its inputs. Workers receive paths, indices and frozen option objects,
never open handles; they open what they need themselves (STYLE.md, rule 4).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from . import __version__
from .backends import ArraySpec, StoreWriter, get_backend
from .errors import BadInputsError, DlpackError, InputFileError, StoreExistsError
from .manifest import ImageSpec, Manifest
from .options import BuildOptions
from .sources.folder import (
    DecodeError,
    SourceItem,
    check_header,
    decode_image,
    incomplete_reason,
    normalise_header,
    scan_folder,
)
from .sources.probe import HEADER_BYTES, ImageHeader, probe_header
from .transforms.functional import (
    UpscaleError,
    convert_channels,
    convert_depth,
    plan_geometry,
    resize_image,
)

__all__ = ["build", "BuildResult"]

_PARTIAL = ".dlpack-partial-"
_OLD = ".dlpack-old-"


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


# ---------------------------------------------------------------- stage 2: probe (workers)


@dataclass(frozen=True)
class _Probe:
    header: ImageHeader | None
    nbytes: int
    error: str | None


def _tail_ok(path: Path, header: ImageHeader) -> str | None:
    """Truncation check from the file's last bytes; the whole file is read only when they are unusual."""
    if header.format not in ("jpeg", "png"):
        return None
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64))
        if incomplete_reason(f.read(), header.format, whole=False) is None:
            return None
        f.seek(0)
        return incomplete_reason(f.read(), header.format)


def _probe_files(root: str, rels: Sequence[str], max_pixels: int) -> list[_Probe]:
    out = []
    for rel in rels:
        path = Path(root, rel)
        try:
            with open(path, "rb") as f:
                head = f.read(HEADER_BYTES)
            size = path.stat().st_size
        except OSError as exc:
            out.append(_Probe(None, 0, f"cannot read: {exc.strerror or exc}"))
            continue
        if not head:
            out.append(_Probe(None, 0, "empty file (0 bytes)"))
            continue
        header = probe_header(head)
        if header is None and size > len(head):
            # TIFF keeps its first IFD after the pixels, and JPEG metadata can exceed the head.
            with open(path, "rb") as f:
                header = probe_header(f.read())
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
        out.append(_Probe(header, size, _tail_ok(path, header)))
    return out


# ---------------------------------------------------------------- stage 3: plan


@dataclass(frozen=True)
class _Plan:
    """Everything a worker needs to turn a file into a stored image."""

    root: str
    spec: ImageSpec
    mode: str
    size: tuple[int, int] | None
    max_side: int | None
    allow_upscale: bool
    max_pixels: int


def _majority(values: Sequence[int], default: int) -> int:
    if not values:
        return default
    counts = Counter(values).most_common()
    best = counts[0][1]
    # Ties go to the richer representation (colour, 16-bit), which loses nothing.
    return max(v for v, n in counts if n == best)


def _make_plan(root: str, headers: Sequence[ImageHeader], opts: BuildOptions) -> tuple[_Plan, dict[int, str]]:
    """Choose channels, dtype and layout; returns the plan and upscale errors by position."""
    channels = opts.channels if opts.channels != "keep" else _majority([h.channels for h in headers], 3)
    depth = _majority([h.bit_depth for h in headers], 8)
    dtype = "|u1" if depth == 8 else "<u2"
    mode = opts.resize_mode
    errors: dict[int, str] = {}
    sizes: set[tuple[int, int]] = set()
    for k, h in enumerate(headers):
        w, hh = h.oriented_size
        try:
            g = plan_geometry(hh, w, mode, opts.size, opts.max_side, opts.allow_upscale)
        except UpscaleError as exc:
            errors[k] = str(exc)
            continue
        sizes.add((g.out_h, g.out_w))
    assert isinstance(channels, int)
    if len(sizes) == 1:
        ((oh, ow),) = sizes
        spec = ImageSpec("fixed", channels, dtype, oh, ow)
    else:
        spec = ImageSpec("variable", channels, dtype)
    plan = _Plan(root, spec, mode, opts.size, opts.max_side, opts.allow_upscale, opts.max_pixels)
    return plan, errors


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


def process_file(plan: _Plan, rel: str, header: ImageHeader | None) -> tuple[np.ndarray, _Sample]:
    """Read, decode, convert and resize one file into its stored form."""
    with open(Path(plan.root, rel), "rb") as f:
        data = f.read()
    if not data:
        raise DecodeError("empty file (0 bytes)")
    # Colour order is swapped after resizing: the same result on fewer pixels.
    img = decode_image(data, header, plan.max_pixels, rgb=False)
    h, w = img.shape[:2]
    try:
        g = plan_geometry(h, w, plan.mode, plan.size, plan.max_side, plan.allow_upscale)
    except UpscaleError as exc:
        raise DecodeError(str(exc)) from exc
    img = resize_image(img, g)
    if img.shape[2] == 3:
        img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    spec = plan.spec
    conversions: list[str] = []
    if img.shape[2] != spec.channels:
        conversions.append(f"{'gray' if img.shape[2] == 1 else 'rgb'}->{'rgb' if spec.channels == 3 else 'gray'}")
        img = convert_channels(img, spec.channels)
    if img.dtype != np.dtype(spec.dtype):
        conversions.append(f"{img.dtype.itemsize * 8}bit->{np.dtype(spec.dtype).itemsize * 8}bit")
        img = convert_depth(img, spec.dtype)
    if spec.shape is not None and img.shape != spec.shape:
        raise DecodeError(
            f"image is {w}x{h} and would be stored as {img.shape[1]}x{img.shape[0]}, but this store holds "
            f"{spec.width}x{spec.height} images (its header said otherwise); pass --size or --resize fit"
        )
    img = np.ascontiguousarray(img)
    meta = _Sample(
        (h, w),
        img.shape,
        (g.scale_y, g.scale_x, float(g.off_y), float(g.off_x)),
        zlib.crc32(img.data),
        tuple(conversions),
    )
    return img, meta


def _process_block(
    plan: _Plan,
    writer: StoreWriter | None,
    start: int,
    items: Sequence[tuple[str, ImageHeader | None]],
    keep_pixels: bool,
) -> list[_Sample | InputFileError]:
    """Process a block of samples; if ``writer`` is given, write them here as one block."""
    results: list[_Sample | InputFileError] = []
    block = None
    if writer is not None and plan.spec.shape is not None:
        # Slots of files that fail stay unset: a store with failures is never published as is.
        block = np.empty((len(items), *plan.spec.shape), dtype=plan.spec.dtype)
    for k, (rel, header) in enumerate(items):
        try:
            img, meta = process_file(plan, rel, header)
        except DecodeError as exc:
            results.append(InputFileError(rel, str(exc)))
            continue
        except OSError as exc:
            results.append(InputFileError(rel, f"cannot read: {exc.strerror or exc}"))
            continue
        if block is not None:
            block[k] = img
        results.append(replace(meta, pixels=img) if keep_pixels else meta)
    if writer is not None and block is not None:
        writer.write_block("images", start, block)
    return results


def _validate(plan: _Plan, pairs: Sequence[tuple[str, ImageHeader | None]], opts: BuildOptions) -> list[InputFileError]:
    """Decode every file without writing; the failures."""
    from joblib import delayed

    step = 16
    calls = [delayed(_process_block)(plan, None, s, pairs[s : s + step], False) for s in range(0, len(pairs), step)]
    found: list[InputFileError] = []
    with _progress(len(pairs), "checking pixels", opts.quiet) as bar:
        for block in _parallel(opts.n_jobs, calls):
            found.extend(r for r in block if isinstance(r, InputFileError))
            bar.update(len(block))
    return found


# ---------------------------------------------------------------- helpers


def _parallel(n_jobs: int, calls: list[Any]) -> Iterator[Any]:
    """Run delayed calls in order; in-process for one job (no pickling, honest --jobs 1 figures)."""
    if n_jobs == 1 or len(calls) <= 1:
        for fn, args, kwargs in calls:
            yield fn(*args, **kwargs)
        return
    from joblib import Parallel

    yield from Parallel(n_jobs=n_jobs, return_as="generator", pre_dispatch="2*n_jobs")(calls)


def _progress(total: int, desc: str, quiet: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="img", disable=quiet or not sys.stderr.isatty(), leave=False)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _clean_stale(out: Path) -> None:
    """Remove temporaries of earlier builds of ``out`` that were killed (their process is gone)."""
    prefix = f".{out.name}{_PARTIAL}"
    for p in out.parent.iterdir():
        if not p.name.startswith(prefix):
            continue
        pid = p.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            _remove(p)


def _publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Move the finished store into place; an old store is replaced only after the new one is complete."""
    if out.exists() or out.is_symlink():
        if not overwrite:
            _remove(tmp)
            raise StoreExistsError(f"{out} appeared while building; pass --overwrite to replace it")
        old = out.parent / f".{out.name}{_OLD}{os.getpid()}"
        os.replace(out, old)
        os.replace(tmp, out)
        _remove(old)
    else:
        os.replace(tmp, out)


# ---------------------------------------------------------------- the pipeline


def _write_store(
    backend: Any,
    tmp: Path,
    plan: _Plan,
    items: Sequence[SourceItem],
    headers: Sequence[ImageHeader | None],
    opts: BuildOptions,
) -> tuple[list[_Sample | InputFileError], StoreWriter]:
    """Stage 4+5: decode/resize in workers and write into a fresh store at ``tmp``."""
    spec = plan.spec
    writer: StoreWriter = backend.open_writer(tmp, "w-", opts.shard_bytes)
    writer.open()
    fixed = spec.shape is not None
    if fixed:
        writer.create_array(ArraySpec("images", spec.dtype, spec.shape, key="image", compression=opts.compression), len(items))
    else:
        writer.create_array(ArraySpec("image", spec.dtype, (), ragged=True, compression=opts.compression), len(items))
    in_workers = fixed and writer.parallel_safe("images")
    step = writer.block_len("images") if fixed else 16
    from joblib import delayed

    pairs = [(it.rel, h) for it, h in zip(items, headers, strict=True)]
    calls = [
        delayed(_process_block)(plan, writer if in_workers else None, s, pairs[s : s + step], not in_workers)
        for s in range(0, len(pairs), step)
    ]
    results: list[_Sample | InputFileError] = []
    appended = 0
    with _progress(len(pairs), "packing", opts.quiet) as bar:
        for s, block in zip(range(0, len(pairs), step), _parallel(opts.n_jobs, calls), strict=True):
            if not in_workers:
                if fixed:
                    arr = np.zeros((len(block), *spec.shape), dtype=spec.dtype)  # type: ignore[misc]
                    for k, r in enumerate(block):
                        if isinstance(r, _Sample) and r.pixels is not None:
                            arr[k] = r.pixels
                    writer.write_block("images", s, arr)
                else:
                    good = [r.pixels for r in block if isinstance(r, _Sample) and r.pixels is not None]
                    writer.write_block("image", appended, good)
                    appended += len(good)
                block = [replace(r, pixels=None) if isinstance(r, _Sample) else r for r in block]
            results.extend(block)
            bar.update(len(block))
    return results, writer


def _write_meta(
    writer: StoreWriter,
    items: Sequence[SourceItem],
    samples: Sequence[_Sample],
    classes: Sequence[str],
    shapes: Sequence[tuple[int, ...]] | None,
) -> None:
    """Write the per-sample metadata arrays."""
    class_id = {c: i for i, c in enumerate(classes)}
    n = len(items)
    fixed = {
        "labels": (np.array([class_id.get(it.label, -1) if it.label else -1 for it in items], dtype="<i4"), "label"),
        "original_size": (np.array([s.original_size for s in samples], dtype="<i4").reshape(-1, 2), None),
        "transform": (np.array([s.transform for s in samples], dtype="<f8").reshape(-1, 4), None),
        "checksum": (np.array([s.checksum for s in samples], dtype="<u4"), None),
    }
    if shapes is not None:
        fixed["image_shapes"] = (np.array(shapes, dtype="<i4").reshape(-1, 3), None)
    for name, (arr, key) in fixed.items():
        writer.create_array(ArraySpec(name, arr.dtype.str, arr.shape[1:], key=key), n)
        writer.write_block(name, 0, arr)
    writer.create_array(ArraySpec("source", "|u1", (), ragged=True), n)
    writer.write_block("source", 0, [np.frombuffer(it.rel.encode("utf-8"), dtype=np.uint8) for it in items])


def build(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: BuildOptions | None = None,
    **kwargs: Any,
) -> BuildResult:
    """Pack the images under ``src`` into one store at ``out``.

    Parameters
    ----------
    src
        Folder tree of images; class sub-folders become labels (``labels="auto"``).
    out
        Store path: a ``.zarr`` folder (default) or a ``.h5``/``.hdf5`` file.
    options
        A :class:`~dlpack.BuildOptions`; keyword arguments override its fields
        (``build("raw", "train.zarr", size=(512, 512), jobs=2)``).

    Returns
    -------
    BuildResult
        With ``skipped`` listing inputs left out under ``on_error="skip"``.

    Raises
    ------
    BadInputsError
        Unreadable inputs under ``on_error="fail"`` (every one found is listed).
    StoreExistsError
        ``out`` exists and ``overwrite`` is false.
    """
    opts = replace(options or BuildOptions(), **kwargs) if kwargs else (options or BuildOptions())
    t0 = time.perf_counter()
    out_path = Path(out)
    backend = get_backend(opts.format_for(out_path), write=True)
    if (out_path.exists() or out_path.is_symlink()) and not opts.overwrite:
        raise StoreExistsError(f"{out_path} already exists; pass --overwrite (overwrite=True) to replace it")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(out_path)
    root = os.fspath(src)

    # 1. scan, 2. probe
    items, classes, errors = scan_folder(root, opts.labels, opts.follow_symlinks)
    rels = [it.rel for it in items]
    from joblib import delayed

    step = 256
    probe_calls = [delayed(_probe_files)(root, rels[s : s + step], opts.max_pixels) for s in range(0, len(rels), step)]
    probes: list[_Probe] = []
    with _progress(len(rels), "checking", opts.quiet) as bar:
        for block in _parallel(min(opts.n_jobs, max(1, len(probe_calls))), probe_calls):
            probes.extend(block)
            bar.update(len(block))
    good = [k for k, p in enumerate(probes) if p.error is None]
    errors += [InputFileError(items[k].rel, p.error) for k, p in enumerate(probes) if p.error is not None]

    def plan_for(keep: list[int]) -> tuple[_Plan, list[int]]:
        """3. plan from the files still in; upscale refusals become input errors."""
        plan, upscale = _make_plan(root, [probes[k].header for k in keep], opts)  # type: ignore[misc]
        errors.extend(InputFileError(items[keep[j]].rel, msg) for j, msg in upscale.items())
        return plan, [k for j, k in enumerate(keep) if j not in upscale]

    def fail(extra: Sequence[InputFileError] = ()) -> BadInputsError:
        return BadInputsError(sorted([*errors, *extra], key=lambda e: e.path), root)

    plan, good = plan_for(good)
    if errors and opts.on_error == "fail":
        # Decode the rest too (without writing), so the one error lists every bad file.
        raise fail(_validate(plan, [(items[k].rel, probes[k].header) for k in good], opts))

    tmp = out_path.parent / f".{out_path.name}{_PARTIAL}{os.getpid()}"
    # 4-5. decode and write. Files that pass the probe but fail to decode (damage inside the
    # compressed data) are rare: under on_error=skip the store is planned and built again without
    # them, so the result is byte-identical to a build of the good files alone.
    try:
        for attempt in range(3):
            _remove(tmp)
            if attempt:
                plan, good = plan_for(good)
            use = [items[k] for k in good]
            if not use:
                raise fail()
            results, writer = _write_store(backend, tmp, plan, use, [probes[k].header for k in good], opts)
            failed = {j: r for j, r in enumerate(results) if isinstance(r, InputFileError)}
            if not failed:
                break
            writer.abort()
            errors.extend(failed.values())
            if opts.on_error == "fail":
                raise fail()
            good = [k for j, k in enumerate(good) if j not in failed]
        else:  # pragma: no cover - decoding is deterministic, a second pass finds nothing new
            raise DlpackError("files kept failing to decode; rerun with --on-error fail to see them")

        samples = [r for r in results if isinstance(r, _Sample)]
        variable = plan.spec.layout == "variable"
        shapes = None
        if variable:
            shapes = [s.shape for s in samples]
        _write_meta(writer, use, samples, classes, shapes)
        conversions = Counter(c for s in samples for c in s.conversions)
        resize_info = {
            "mode": opts.resize_mode,
            "size": list(opts.size) if opts.size else None,
            "max_side": opts.max_side,
            "allow_upscale": opts.allow_upscale,
            "interpolation": "area (shrink), linear (enlarge)",
        }
        manifest = Manifest(
            count=len(use),
            image=plan.spec,
            backend=backend.name,
            classes=tuple(classes),
            labels="folders" if classes else "none",
            resize=resize_info,
            compression=opts.compression,
            shard_images=writer.block_len("images") if not variable else 0,
            skipped=tuple(sorted(errors, key=lambda e: e.path)),
            conversions=dict(sorted(conversions.items())),
            dlpack_version=__version__,
        )
        writer.commit(manifest)
        _publish(tmp, out_path, opts.overwrite)
    except BaseException:
        with contextlib.suppress(Exception):
            writer.abort()
        _remove(tmp)
        raise
    in_bytes = sum(probes[k].nbytes for k in good)
    return BuildResult(
        path=out_path,
        count=len(use),
        skipped=manifest.skipped,
        seconds=time.perf_counter() - t0,
        input_bytes=in_bytes,
        output_bytes=backend.open_reader(out_path).nbytes_on_disk(),
        conversions=dict(conversions),
    )
