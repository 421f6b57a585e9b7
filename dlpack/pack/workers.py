"""Stage 4: decode and resize, in worker processes: one call per file (:func:`prepare_file`), a block of files per worker call."""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import _parallel
from .._parallel import Ticks
from ..backends import StoreWriter
from ..errors import InputFileError
from ..options import BuildOptions
from ..sources.decode import DecodeError, prepare_image
from ..sources.probe import ImageHeader
from .inputs import open_input
from .plan import BuildPlan


@dataclass(frozen=True)
class Sample:
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
    def from_record(cls, rec: Sequence[Any]) -> Sample:
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


def prepare_file(root: str, plan: BuildPlan, rel: str, header: ImageHeader | None) -> tuple[np.ndarray, Sample]:
    """Read one file and turn it into its stored form with :func:`~dlpack.sources.decode.prepare_image`."""
    with open_input(Path(root, rel)) as f:
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
    meta = Sample(
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
    ticks: Ticks | None = None,
) -> list[Sample | InputFileError]:
    """Prepare a run of files: their metadata or why each failed.

    Pixels go into ``out[k]`` when given (a fixed-size block; failed slots keep their zeros), and
    onto the returned samples when ``keep_pixels``. ``ticks`` hears how many files are done every
    :attr:`Ticks.EVERY` files, so the bar moves within a block of tens of thousands of small images.
    """
    results: list[Sample | InputFileError] = []
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
    with _parallel.progress(len(pairs), "checking pixels", opts.quiet) as bar:
        for block in _parallel.parallel(opts.n_jobs, calls):
            found.extend(r for r in block if isinstance(r, InputFileError))
            bar.update(len(block))
    return found


def fixed_block(plan: BuildPlan, n: int) -> np.ndarray:
    shape = plan.image.shape
    if shape is None:
        raise ValueError("a variable-size store has no fixed block")
    return np.zeros((n, *shape), dtype=plan.image.dtype)


def write_block_worker(
    writer: StoreWriter,
    root: str,
    plan: BuildPlan,
    start: int,
    pairs: Sequence[tuple[str, ImageHeader | None]],
    ticks: Ticks | None = None,
) -> list[Sample | InputFileError]:
    """Decode a block and write it as one block (in a worker, for writers that allow it)."""
    block = fixed_block(plan, len(pairs))
    results = decode_block(root, plan, pairs, out=block, ticks=ticks)
    # A block with a failure is not written: the store is then discarded (or rebuilt) anyway.
    if not any(isinstance(r, InputFileError) for r in results):
        writer.write_block("images", start, block)
    return results
