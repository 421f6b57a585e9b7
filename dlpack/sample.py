"""A small built-in demo dataset: scattered defect-inspection images in class folders.

`make_sample` writes the kind of raw folder a real user starts from, so the README's
Quick start can run ``dlpack build`` without downloading anything::

    python -m dlpack.sample demo_raw          # 240 images, about 1024x1024
    dlpack build demo_raw demo.zarr --size 512x512

Everything is generated from ``(count, size, seed)`` alone: same arguments, same files,
byte for byte.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

__all__ = ["CLASSES", "main", "make_sample"]

CLASSES: tuple[str, ...] = ("good", "scratch", "spot", "crack")

_Float = npt.NDArray[np.float32]

# Shares of the sample, chosen to look like a real raw folder: mostly 8-bit RGB PNG, with
# enough oddities (gray, 16-bit, alpha, JPEG/BMP/TIFF, odd sizes, odd names) that every
# reader and resize path in dlpack gets exercised by the Quick start.
_KIND_SHARES: Mapping[str, float] = {"gray": 0.20, "gray16": 0.025, "rgba": 0.03}
_FORMAT_SHARES: Mapping[str, float] = {".jpg": 0.20, ".bmp": 0.05, ".tif": 0.05}
_NAME_SHARES: Mapping[str, float] = {"nonascii": 0.04, "space": 0.06}
_ODD_SIZE_SHARE = 0.12
_NESTED_SHARE = 0.25
# From this many images on, every variant above appears at least once (tests rely on it).
_GUARANTEE_FROM = 24

# (width, height) factors of `size` for the odd-sized images.
_ODD_SIZES: tuple[tuple[float, float], ...] = ((1.25, 1.0), (1.0, 0.75), (0.875, 0.875), (1.125, 1.125))
_MIN_SIZE = 16

# Sub-folders as they accumulate on a real line: lots, cameras, shifts; some with spaces.
_SUBDIRS: Mapping[str, tuple[str, ...]] = {
    "good": ("lot_A", "2024-03/cam 1"),
    "scratch": ("line2", "line2/night"),
    "spot": ("cam_2",),
    "crack": ("batch 7", "batch 7/recheck"),
}
_GERMAN: Mapping[str, str] = {
    "good": "Gutteil geprüft",
    "scratch": "Kratzer länglich",
    "spot": "Fleck rötlich",
    "crack": "Riss größer",
}
_CHINESE: Mapping[str, str] = {"good": "良品", "scratch": "划痕", "spot": "斑点", "crack": "裂纹"}

# Appended to the seed for the layout plan, so it never shares a stream with an image's
# `default_rng([seed, i])` (a 3-word seed cannot equal a 2-word one).
_PLAN_STREAM = 0x504C414E
_JPEG_QUALITY = 92
# Fastest zlib level: with sensor grain, higher levels take 2-5x as long for files only
# 7-12 % smaller. Stated explicitly so the bytes do not move if cv2's default changes.
_PNG_COMPRESSION = 1


@dataclass(frozen=True)
class _Spec:
    """What one image is: class, pixel kind, format, path and size."""

    index: int
    cls: str
    kind: str  # "rgb", "gray", "gray16" or "rgba"
    ext: str
    relpath: str
    width: int
    height: int


def make_sample(out: str | os.PathLike[str], count: int = 240, size: int = 1024, seed: int = 0) -> pathlib.Path:
    """Write a deterministic demo dataset of defect-inspection images into `out`.

    Images go to ``out/<class>/...`` for the classes in `CLASSES` (about a quarter each).
    Each shows a textured metal or PCB background; ``scratch``, ``spot`` and ``crack``
    images carry that defect, ``good`` images none.

    Parameters
    ----------
    out : str or os.PathLike
        Folder to write into; created if missing. Files of an earlier run with the same
        arguments are overwritten, other files are left alone.
    count : int, default 240
        Number of images, at least 1.
    size : int, default 1024
        Side of the typical (square) image in pixels, at least 16.
    seed : int, default 0
        Non-negative seed; the file list and every byte depend only on
        ``(count, size, seed)``.

    Returns
    -------
    pathlib.Path
        `out` as a path.

    Raises
    ------
    ValueError
        If `count`, `size` or `seed` is out of range.

    Notes
    -----
    The folder is scattered on purpose, like real data:

    - about 25 % of images sit in nested sub-folders (``scratch/line2/night/``);
    - kinds: about 74 % RGB, 20 % gray, 2.5 % 16-bit gray, 3 % RGBA;
    - formats: 8-bit images are about 70 % PNG, 20 % JPEG (quality 92), 5 % BMP and
      5 % TIFF; 16-bit images alternate PNG and TIFF; RGBA images are PNG;
    - about 12 % are not ``size`` x ``size`` (e.g. 1.25 times as wide);
    - about 6 % of names contain spaces and 4 % non-ASCII characters
      (``Kratzer länglich 0003.png``, ``划痕_0007.png``).

    From 24 images on, each of these variants appears at least once.

    Examples
    --------
    >>> root = make_sample("demo_raw", count=24, size=64)  # doctest: +SKIP
    >>> sorted(p.name for p in root.iterdir())  # doctest: +SKIP
    ['crack', 'good', 'scratch', 'spot']
    """
    _check(count, size, seed)
    root = pathlib.Path(out)
    _write_all(root, count, size, seed)
    return root


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m dlpack.sample OUT [--count N] [--size S] [--seed S]``."""
    parser = argparse.ArgumentParser(
        prog="python -m dlpack.sample",
        description="Write dlpack's built-in demo dataset of defect-inspection images.",
    )
    parser.add_argument("out", help="folder to write into (created if missing)")
    parser.add_argument("--count", type=int, default=240, help="number of images (default 240)")
    parser.add_argument("--size", type=int, default=1024, help="typical image side in pixels (default 1024)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args(argv)
    try:
        _check(args.count, args.size, args.seed)
    except ValueError as exc:
        print(f"dlpack.sample: error: {exc}", file=sys.stderr)
        return 2
    nbytes = _write_all(pathlib.Path(args.out), args.count, args.size, args.seed)
    n_classes = min(args.count, len(CLASSES))
    print(f"wrote {args.count} images in {n_classes} classes ({nbytes / 1e6:.1f} MB) to {args.out}")
    return 0


def _check(count: int, size: int, seed: int) -> None:
    """Raise ValueError naming the first out-of-range argument."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if size < _MIN_SIZE:
        raise ValueError(f"size must be >= {_MIN_SIZE}, got {size}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


def _write_all(root: pathlib.Path, count: int, size: int, seed: int) -> int:
    """Render and write every planned image; return the bytes written."""
    specs = _plan(count, size, seed)
    # Threads suffice: numpy, cv2 drawing/encoding and file writes release the GIL, and each
    # image depends only on (seed, index), so the result does not depend on scheduling.
    workers = max(1, min(len(specs), os.cpu_count() or 1, 8))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        sizes = list(pool.map(lambda spec: _write_one(root, spec, seed), specs))
    return sum(sizes)


def _write_one(root: pathlib.Path, spec: _Spec, seed: int) -> int:
    """Render, encode and write one image; return its size in bytes."""
    image = _render(spec, seed)
    params: list[int] = []
    if spec.ext == ".jpg":
        params = [cv2.IMWRITE_JPEG_QUALITY, _JPEG_QUALITY]
    elif spec.ext == ".png":
        params = [cv2.IMWRITE_PNG_COMPRESSION, _PNG_COMPRESSION]
    ok, buf = cv2.imencode(spec.ext, image, params)
    if not ok:
        raise RuntimeError(f"cv2 could not encode {spec.relpath} ({spec.kind}, {image.shape})")
    path = root / spec.relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    data = buf.tobytes()
    # cv2.imwrite cannot open non-ASCII paths on every platform; Python's open can.
    with open(path, "wb") as fh:
        fh.write(data)
    return len(data)


def _plan(count: int, size: int, seed: int) -> list[_Spec]:
    """Decide class, kind, format, path and size of every image."""
    rng = np.random.default_rng([seed, count, _PLAN_STREAM])
    guarantee = count >= _GUARANTEE_FROM
    # Round-robin over a shuffled order keeps classes balanced and every class present.
    classes = [CLASSES[int(j) % len(CLASSES)] for j in rng.permutation(count)]
    kinds = _assign(count, _KIND_SHARES, "rgb", rng, guarantee)
    eight_bit = [i for i in range(count) if kinds[i] in ("rgb", "gray")]
    # Only 8-bit RGB/gray can go to any format: JPEG and BMP hold neither 16 bits nor alpha.
    formats = dict(zip(eight_bit, _assign(len(eight_bit), _FORMAT_SHARES, ".png", rng, guarantee), strict=True))
    names = _assign(count, _NAME_SHARES, "plain", rng, guarantee)
    odd = _assign(count, {"odd": _ODD_SIZE_SHARE}, "square", rng, guarantee)
    nested = _assign(count, {"nested": _NESTED_SHARE}, "top", rng, guarantee)

    specs: list[_Spec] = []
    n16 = 0
    for i in range(count):
        cls, kind = classes[i], kinds[i]
        if kind == "gray16":
            # PNG first, so a sample with a single 16-bit image still has the common case.
            ext = (".png", ".tif")[n16 % 2]
            n16 += 1
        elif kind == "rgba":
            ext = ".png"
        else:
            ext = formats[i]
        folder = cls
        if nested[i] == "nested":
            subdirs = _SUBDIRS[cls]
            folder = f"{cls}/{subdirs[int(rng.integers(len(subdirs)))]}"
        width = height = size
        if odd[i] == "odd":
            fw, fh = _ODD_SIZES[int(rng.integers(len(_ODD_SIZES)))]
            width, height = max(_MIN_SIZE, round(size * fw)), max(_MIN_SIZE, round(size * fh))
        specs.append(_Spec(i, cls, kind, ext, f"{folder}/{_name(cls, i, names[i])}{ext}", width, height))
    return specs


def _assign(n: int, shares: Mapping[str, float], default: str, rng: np.random.Generator, guarantee: bool) -> list[str]:
    """Return `n` labels holding each share (at least one if `guarantee`), shuffled."""
    labels: list[str] = []
    for label, share in shares.items():
        quota = round(n * share)
        labels += [label] * (max(1, quota) if guarantee else quota)
    labels = labels[:n] + [default] * max(0, n - len(labels))
    return [labels[int(j)] for j in rng.permutation(n)]


def _name(cls: str, index: int, style: str) -> str:
    """Return the file stem of one image in the given naming style."""
    if style == "space":
        return f"{cls.title()} {index:04d}"
    if style == "nonascii":
        # Alternate scripts: Latin with umlauts and spaces, and CJK.
        return f"{_GERMAN[cls]} {index:04d}" if index % 2 == 0 else f"{_CHINESE[cls]}_{index:04d}"
    return f"{cls}_{index:04d}"


def _render(spec: _Spec, seed: int) -> npt.NDArray[np.uint8] | npt.NDArray[np.uint16]:
    """Draw one image as the array cv2 encodes (BGR, BGRA or gray)."""
    rng = np.random.default_rng([seed, spec.index])
    h, w = spec.height, spec.width
    scale = min(h, w)
    pcb = bool(rng.random() < 0.4)
    lum = _background(rng, h, w, brushed=not pcb)
    copper: _Float | None = None
    if pcb:
        copper = _traces(rng, h, w, scale)
        lum += 0.15 * copper
    if spec.cls != "good":
        lum += _defect(rng, spec.cls, h, w, scale)
    np.clip(lum, 0.0, 1.0, out=lum)

    if spec.kind == "gray16":
        return (lum * 65535.0 + 0.5).astype(np.uint16)
    # cv2's saturating conversions below do scale, round and cast in one pass per channel.
    if spec.kind == "gray":
        # A mono camera: the luminance itself, no colour tint.
        return np.asarray(cv2.convertScaleAbs(lum, alpha=255.0), np.uint8)
    # Tints are written in RGB for readability and reversed because cv2 wants BGR.
    if copper is not None:
        substrate = np.array([0.30, 0.62, 0.33])[::-1] * 255.0
        metal = np.array([0.95, 0.70, 0.40])[::-1] * 255.0
        shine = lum * copper
        channels = [
            cv2.addWeighted(lum, float(substrate[c]), shine, float(metal[c] - substrate[c]), 0.0, dtype=cv2.CV_8U)
            for c in range(3)
        ]
    else:
        grey = (np.array([0.92, 0.94, 0.97]) + rng.uniform(-0.02, 0.02, 3))[::-1] * 255.0
        channels = [cv2.convertScaleAbs(lum, alpha=float(grey[c])) for c in range(3)]
    if spec.kind == "rgba":
        # Opaque alpha, as screenshot tools and some camera software write it.
        channels.append(np.full((h, w), 255, np.uint8))
    return np.asarray(cv2.merge(channels), np.uint8)


def _background(rng: np.random.Generator, h: int, w: int, brushed: bool) -> _Float:
    """Return a luminance field in [0, 1]: gradient, vignette, low-frequency noise and grain."""
    # Build everything smooth at 32 px resolution and resize once: cheap at any image size.
    lh = 32
    lw = max(2, round(lh * w / h))
    yy, xx = np.mgrid[-0.5 : 0.5 : complex(0, lh), -0.5 : 0.5 : complex(0, lw)].astype(np.float32)
    theta = rng.uniform(0.0, 2.0 * math.pi)
    gradient = (xx * math.cos(theta) + yy * math.sin(theta)) * rng.uniform(0.1, 0.3)
    vignette = -(xx * xx + yy * yy) * rng.uniform(0.2, 0.5)
    coarse = cv2.resize(rng.standard_normal((4, 4), np.float32), (lw, lh), interpolation=cv2.INTER_CUBIC)
    medium = rng.standard_normal((lh, lw), np.float32)
    field = (rng.uniform(0.45, 0.6) + gradient + vignette + 0.05 * coarse + 0.015 * medium).astype(np.float32)
    lum = np.asarray(cv2.resize(field, (w, h), interpolation=cv2.INTER_CUBIC), np.float32)
    if brushed:
        # Brushed metal: streaks along one axis, smoothed so they are not single-pixel rows.
        horizontal = bool(rng.random() < 0.5)
        streak = rng.standard_normal(h if horizontal else w).astype(np.float32)
        streak = np.convolve(streak, np.array([0.25, 0.5, 0.25], np.float32), mode="same") * 0.025
        lum += streak[:, None] if horizontal else streak[None, :]
    # Sensor grain of up to 5 grey levels; uniform rather than Gaussian because it is
    # 6x cheaper to draw and looks the same at this amplitude.
    grain = rng.random((h, w), np.float32)
    grain -= 0.5
    grain *= 0.04
    lum += grain
    return lum


def _traces(rng: np.random.Generator, h: int, w: int, scale: int) -> _Float:
    """Return a PCB copper mask in [0, 1]: Manhattan traces ending in round pads."""
    mask = np.zeros((h, w), np.uint8)
    width = max(1, round(scale / 100))
    for _ in range(int(rng.integers(4, 10))):
        x0, y0 = int(rng.integers(w)), int(rng.integers(h))
        x1, y1 = int(rng.integers(w)), int(rng.integers(h))
        cv2.polylines(mask, [np.array([[x0, y0], [x1, y0], [x1, y1]], np.int32)], False, 255, width, cv2.LINE_AA)
        for x, y in ((x0, y0), (x1, y1)):
            cv2.circle(mask, (x, y), 2 * width + 1, 255, -1, cv2.LINE_AA)
    return mask.astype(np.float32) / 255.0


def _defect(rng: np.random.Generator, cls: str, h: int, w: int, scale: int) -> _Float:
    """Return the luminance change that draws one class's defect."""
    delta = np.zeros((h, w), np.float32)
    sign = 1.0 if rng.random() < 0.5 else -1.0
    thick = max(1, round(scale / 512))
    if cls == "scratch":
        for _ in range(int(rng.integers(1, 4))):
            cx, cy = rng.uniform(0.15, 0.85) * w, rng.uniform(0.15, 0.85) * h
            angle, half = rng.uniform(0.0, math.pi), rng.uniform(0.08, 0.25) * scale
            dx, dy = half * math.cos(angle), half * math.sin(angle)
            p1, p2 = (round(cx - dx), round(cy - dy)), (round(cx + dx), round(cy + dy))
            cv2.line(delta, p1, p2, sign * 0.3, thick, cv2.LINE_AA)
    elif cls == "spot":
        for _ in range(int(rng.integers(1, 4))):
            cx, cy = round(rng.uniform(0.1, 0.9) * w), round(rng.uniform(0.1, 0.9) * h)
            r = max(2.0, rng.uniform(0.01, 0.045) * scale)
            axes = (round(r), max(1, round(r * rng.uniform(0.6, 1.0))))
            cv2.ellipse(delta, (cx, cy), axes, rng.uniform(0.0, 180.0), 0.0, 360.0, sign * 0.3, -1, cv2.LINE_AA)
            # Blur only around the spot: a full-image blur this wide would dominate the run time.
            m = round(3 * r)
            y0, y1, x0, x1 = max(0, cy - m), min(h, cy + m + 1), max(0, cx - m), min(w, cx + m + 1)
            delta[y0:y1, x0:x1] = cv2.GaussianBlur(delta[y0:y1, x0:x1], (0, 0), r / 3)
    elif cls == "crack":
        # A crack is a random walk whose heading drifts: jagged, mostly one direction.
        heading = rng.uniform(0.0, 2.0 * math.pi)
        points = [(rng.uniform(0.25, 0.75) * w, rng.uniform(0.25, 0.75) * h)]
        for _ in range(int(rng.integers(10, 25))):
            heading += rng.normal(0.0, 0.5)
            step = rng.uniform(0.01, 0.03) * scale
            x, y = points[-1]
            points.append((x + step * math.cos(heading), y + step * math.sin(heading)))
        paths = [points]
        if rng.random() < 0.5:
            # Real cracks fork: a shorter branch leaves from a middle vertex.
            x, y = points[len(points) // 2]
            heading += rng.choice([-1.0, 1.0]) * rng.uniform(0.6, 1.2)
            branch = [(x, y)]
            for _ in range(int(rng.integers(4, 10))):
                heading += rng.normal(0.0, 0.5)
                step = rng.uniform(0.01, 0.02) * scale
                branch.append((branch[-1][0] + step * math.cos(heading), branch[-1][1] + step * math.sin(heading)))
            paths.append(branch)
        for path in paths:
            pts = np.round(np.array(path)).astype(np.int32)
            cv2.polylines(delta, [pts], False, -0.35, thick, cv2.LINE_AA)
    return delta


if __name__ == "__main__":
    raise SystemExit(main())
