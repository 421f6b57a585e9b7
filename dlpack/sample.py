"""A small built-in demo dataset: scattered defect-inspection images in class folders.

`make_sample` writes the kind of raw folder a real user starts from, so the README's
Quick start can run ``dlpack build`` without downloading anything::

    python -m dlpack.sample demo_raw          # 240 images, about 1024x1024
    dlpack build demo_raw demo.zarr --size 512x512

Everything is generated from ``(count, size, seed)`` alone: same arguments, same files,
byte for byte.

The sample knows the exact shape of every defect it draws, so it can also write labels
(``--labels``, ``labels=True``). The class folders then move one level down, to
``OUT/images/``, byte for byte as without labels, and the labels sit beside them; without
the option nothing changes. A label folder inside the image tree would read as one more class
folder, so the two are kept apart::

    OUT/images/<class>/...                   the images (good/, scratch/, spot/, crack/)
    OUT/annotations.json                     COCO: boxes and polygons, file names relative to images/
    OUT/masks/<path without ext>.png         label images: pixel = class id, 0 background
    OUT/masks/classes.txt                    line k names id k: background, scratch, spot, crack
    OUT/ground_truth/<defect>/<name>.png     anomaly ground truth (255 = defect), defect images only
    OUT/labels.csv                           path,label,split (paths relative to images/)

``images/`` with ``good/`` and one folder per defect is also the anomaly layout (HALCON's
``read_dl_dataset_anomaly``, MVTec AD), with ``ground_truth/`` as its ground-truth folder. COCO
category ids equal the mask values (scratch 1, spot 2, crack 3); ``good`` images are in COCO
with no annotations. Each drawn scratch, spot and crack (with its fork) is one annotation:
its pixels are those it changes by at least half its strength, drawn alone (a loop a crack
closes counts as inside); its box is their tight box, its polygons trace their pixel edges
(so they fill back to exactly those pixels), its area is their count, and the mask is their
union. See docs/sample.md.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import pathlib
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import cv2
import numpy as np
import numpy.typing as npt

from ._outline import fill_holes, outline, tight_box
from .errors import OptionError
from .options import check_int

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

# Label images are mostly one value: run-length coding without row filters writes them 5-10x
# faster than the images' settings, and smaller (older OpenCV versions lack the filter option).
_LABEL_PNG = [cv2.IMWRITE_PNG_COMPRESSION, _PNG_COMPRESSION, cv2.IMWRITE_PNG_STRATEGY, cv2.IMWRITE_PNG_STRATEGY_RLE]
if hasattr(cv2, "IMWRITE_PNG_FILTER"):
    _LABEL_PNG += [cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_NONE]

# The labelled layout (``labels=True``), relative to `out`. The images move under `_IMAGES_DIR`
# so that the image tree holds images only: label folders inside it would read as classes.
_IMAGES_DIR = "images"
_MASKS_DIR = "masks"
_GROUND_TRUTH_DIR = "ground_truth"
_COCO_FILE = "annotations.json"
_CSV_FILE = "labels.csv"
# Pixel value k of a label image is class _MASK_CLASSES[k]; COCO category ids are the same.
_MASK_CLASSES: tuple[str, ...] = ("background", *CLASSES[1:])
# The split of labels.csv: train, val, test shares within each class (train takes what val and
# test leave), drawn from a stream of its own so the images do not depend on it.
_SPLIT_SHARES = (0.8, 0.1, 0.1)
_SPLIT_STREAM = 0x53504C54


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


def make_sample(
    out: str | os.PathLike[str], count: int = 240, size: int = 1024, seed: int = 0, *, labels: bool = False
) -> pathlib.Path:
    """Write a deterministic demo dataset of defect-inspection images into `out`.

    Images go to ``out/<class>/...`` for the classes in `CLASSES` (about a quarter each).
    Each shows a textured metal or PCB background; ``scratch``, ``spot`` and ``crack``
    images carry that defect, ``good`` images none. With `labels`, the same images go to
    ``out/images/<class>/...`` and their labels beside them (see the module docstring).

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
        ``(count, size, seed)`` (and `labels`).
    labels : bool, default False
        Also write COCO boxes, label images, anomaly ground truth and a CSV of the defects.
        Adds up to about 10 % to the run time; the images are the same bytes.

    Returns
    -------
    pathlib.Path
        `out` as a path.

    Raises
    ------
    OptionError
        If `count`, `size` or `seed` is out of range (also a ``ValueError``).

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
    _write_all(root, count, size, seed, labels)
    return root


def main(argv: list[str] | None = None) -> int:
    """Run ``python -m dlpack.sample OUT [--count N] [--size S] [--seed S] [--labels]``."""
    parser = argparse.ArgumentParser(
        prog="python -m dlpack.sample",
        description="Write dlpack's built-in demo dataset of defect-inspection images.",
    )
    parser.add_argument("out", help="folder to write into (created if missing)")
    parser.add_argument("--count", type=int, default=240, help="number of images (default 240)")
    parser.add_argument("--size", type=int, default=1024, help="typical image side in pixels (default 1024)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--labels",
        action="store_true",
        help="put the images in OUT/images and write their labels beside: COCO annotations.json, "
        "label images in masks/, anomaly ground_truth/ and labels.csv",
    )
    args = parser.parse_args(argv)
    try:
        _check(args.count, args.size, args.seed)
    except OptionError as exc:
        print(f"dlpack.sample: error: {exc}", file=sys.stderr)
        return 2
    nbytes = _write_all(pathlib.Path(args.out), args.count, args.size, args.seed, args.labels)
    n_classes = min(args.count, len(CLASSES))
    what = " with labels" if args.labels else ""
    print(f"wrote {args.count} images in {n_classes} classes{what} ({nbytes / 1e6:.1f} MB) to {args.out}")
    return 0


def _check(count: int, size: int, seed: int) -> None:
    """Raise an :class:`~dlpack.errors.OptionError` (a ``ValueError``) naming the first out-of-range argument."""
    for name, value, minimum in (("count", count, 1), ("size", size, _MIN_SIZE), ("seed", seed, 0)):
        check_int(name, value, minimum, wanted=f">= {minimum}")


@dataclass(frozen=True)
class _Instance:
    """One labelled defect: COCO box ``(x, y, w, h)``, pixel count and outline polygons."""

    box: tuple[int, int, int, int]
    area: int
    polygons: tuple[tuple[int, ...], ...]


def _write_all(root: pathlib.Path, count: int, size: int, seed: int, labels: bool = False) -> int:
    """Render and write every planned image (and its labels); return the bytes written."""
    specs = _plan(count, size, seed)
    images = root / _IMAGES_DIR if labels else root
    label_root = root if labels else None
    # Threads suffice: numpy, cv2 drawing/encoding and file writes release the GIL, and each
    # image depends only on (seed, index), so the result does not depend on scheduling.
    workers = max(1, min(len(specs), os.cpu_count() or 1, 8))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(lambda spec: _write_one(images, spec, seed, label_root), specs))
    nbytes = sum(n for n, _ in done)
    if label_root is not None:
        instances = [inst for _, inst in done]
        nbytes += _write_text(root / _COCO_FILE, _coco_json(specs, instances, count, size, seed))
        nbytes += _write_text(root / _CSV_FILE, _labels_csv(specs, count, seed))
        nbytes += _write_text(root / _MASKS_DIR / "classes.txt", "".join(f"{name}\n" for name in _MASK_CLASSES))
    return nbytes


def _write_one(
    images: pathlib.Path, spec: _Spec, seed: int, label_root: pathlib.Path | None
) -> tuple[int, tuple[_Instance, ...]]:
    """Render, encode and write one image, and its masks when `label_root` is given.

    Returns the bytes written and the image's defect instances (none without labels).
    """
    image, shapes = _render(spec, seed)
    params: list[int] = []
    if spec.ext == ".jpg":
        params = [cv2.IMWRITE_JPEG_QUALITY, _JPEG_QUALITY]
    elif spec.ext == ".png":
        params = [cv2.IMWRITE_PNG_COMPRESSION, _PNG_COMPRESSION]
    nbytes = _write_image(images / spec.relpath, image, spec.ext, params)
    if label_root is None:
        return nbytes, ()
    mask = np.zeros((spec.height, spec.width), np.uint8)
    class_id = CLASSES.index(spec.cls)
    instances: list[_Instance] = []
    for shape in shapes:
        found = _shape_region(shape, spec.height, spec.width)
        if found is None:  # nothing of it in the image: nothing to label
            continue
        region, x0, y0 = found
        mask[y0 : y0 + region.shape[0], x0 : x0 + region.shape[1]][region] = class_id
        x, y, w, h = tight_box(region) or (0, 0, 0, 0)  # never empty: _shape_region returns None then
        crop = region[y : y + h, x : x + w]
        polygons = tuple(tuple(p) for p in outline(crop, x0 + x, y0 + y))
        instances.append(_Instance((x0 + x, y0 + y, w, h), int(np.count_nonzero(crop)), polygons))
    stem = spec.relpath.rsplit(".", 1)[0]
    nbytes += _write_image(label_root / _MASKS_DIR / f"{stem}.png", mask, ".png", _LABEL_PNG)
    if spec.cls != "good":
        # The defect folder is the class folder, so `stem` already starts with it.
        truth = np.where(mask > 0, np.uint8(255), np.uint8(0))
        nbytes += _write_image(label_root / _GROUND_TRUTH_DIR / f"{stem}.png", truth, ".png", _LABEL_PNG)
    return nbytes, tuple(instances)


def _write_image(
    path: pathlib.Path, image: npt.NDArray[np.uint8] | npt.NDArray[np.uint16], ext: str, params: list[int]
) -> int:
    """Encode `image` as `ext` and write it to `path` (parents created); return its size."""
    ok, buf = cv2.imencode(ext, image, params)
    if not ok:
        raise RuntimeError(f"cv2 could not encode {path} ({image.dtype}, {image.shape})")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = buf.tobytes()
    # cv2.imwrite cannot open non-ASCII paths on every platform; Python's open can.
    with open(path, "wb") as fh:
        fh.write(data)
    return len(data)


def _write_text(path: pathlib.Path, text: str) -> int:
    """Write `text` as UTF-8 with LF newlines to `path` (parents created); return its size."""
    data = text.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)
    return len(data)


def _coco_json(specs: list[_Spec], instances: list[tuple[_Instance, ...]], count: int, size: int, seed: int) -> str:
    """Return the COCO document of the sample: every image, one annotation per defect instance."""
    images = [{"id": s.index + 1, "file_name": s.relpath, "width": s.width, "height": s.height} for s in specs]
    annotations: list[dict[str, object]] = []
    for spec, found in zip(specs, instances, strict=True):
        for inst in found:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": spec.index + 1,
                    "category_id": CLASSES.index(spec.cls),
                    "bbox": list(inst.box),
                    "area": inst.area,
                    "iscrowd": 0,
                    "segmentation": [list(p) for p in inst.polygons],
                }
            )
    categories = [{"id": i, "name": name, "supercategory": "defect"} for i, name in enumerate(CLASSES) if i > 0]
    doc = {
        "info": {"description": f"dlpack built-in sample (count={count}, size={size}, seed={seed})"},
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"


def _labels_csv(specs: list[_Spec], count: int, seed: int) -> str:
    """Return ``labels.csv``: one row per image with its class and a stratified split."""
    rng = np.random.default_rng([seed, count, _SPLIT_STREAM])
    split: dict[int, str] = {}
    for cls in CLASSES:
        members = [s.index for s in specs if s.cls == cls]
        n_val, n_test = round(len(members) * _SPLIT_SHARES[1]), round(len(members) * _SPLIT_SHARES[2])
        for rank, j in enumerate(rng.permutation(len(members))):
            split[members[int(j)]] = "test" if rank < n_test else "val" if rank < n_test + n_val else "train"
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(("path", "label", "split"))
    writer.writerows((s.relpath, s.cls, split[s.index]) for s in specs)
    return buf.getvalue()


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


def _render(spec: _Spec, seed: int) -> tuple[npt.NDArray[np.uint8] | npt.NDArray[np.uint16], tuple[_Shape, ...]]:
    """Draw one image as the array cv2 encodes (BGR, BGRA or gray); return it and its defects."""
    rng = np.random.default_rng([seed, spec.index])
    h, w = spec.height, spec.width
    scale = min(h, w)
    pcb = bool(rng.random() < 0.4)
    lum = _background(rng, h, w, brushed=not pcb)
    copper: _Float | None = None
    if pcb:
        copper = _traces(rng, h, w, scale)
        lum += 0.15 * copper
    shapes: tuple[_Shape, ...] = ()
    if spec.cls != "good":
        shapes = _defect_shapes(rng, spec.cls, h, w, scale)
        lum += _draw_defects(shapes, h, w)
    np.clip(lum, 0.0, 1.0, out=lum)

    if spec.kind == "gray16":
        return (lum * 65535.0 + 0.5).astype(np.uint16), shapes
    # cv2's saturating conversions below do scale, round and cast in one pass per channel.
    if spec.kind == "gray":
        # A mono camera: the luminance itself, no colour tint.
        return np.asarray(cv2.convertScaleAbs(lum, alpha=255.0), np.uint8), shapes
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
    return np.asarray(cv2.merge(channels), np.uint8), shapes


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


@dataclass(frozen=True)
class _Scratch:
    """A straight scratch: a line of `thick` px from `p1` to `p2`."""

    p1: tuple[int, int]
    p2: tuple[int, int]
    value: float
    thick: int


@dataclass(frozen=True)
class _Spot:
    """A stain: a filled ellipse, blurred around itself by a sigma of radius / 3."""

    center: tuple[int, int]
    axes: tuple[int, int]
    angle: float
    value: float
    radius: float


@dataclass(frozen=True)
class _Crack:
    """A crack: one or two open polylines (a path and its fork) of `thick` px."""

    paths: tuple[tuple[tuple[int, int], ...], ...]
    value: float
    thick: int


_Shape = _Scratch | _Spot | _Crack


def _defect_shapes(rng: np.random.Generator, cls: str, h: int, w: int, scale: int) -> tuple[_Shape, ...]:
    """Draw the geometry of one class's defect instances from `rng` (none for ``good``)."""
    shapes: list[_Shape] = []
    sign = 1.0 if rng.random() < 0.5 else -1.0
    thick = max(1, round(scale / 512))
    if cls == "scratch":
        for _ in range(int(rng.integers(1, 4))):
            cx, cy = rng.uniform(0.15, 0.85) * w, rng.uniform(0.15, 0.85) * h
            angle, half = rng.uniform(0.0, math.pi), rng.uniform(0.08, 0.25) * scale
            dx, dy = half * math.cos(angle), half * math.sin(angle)
            p1, p2 = (round(cx - dx), round(cy - dy)), (round(cx + dx), round(cy + dy))
            shapes.append(_Scratch(p1, p2, sign * 0.3, thick))
    elif cls == "spot":
        for _ in range(int(rng.integers(1, 4))):
            cx, cy = round(rng.uniform(0.1, 0.9) * w), round(rng.uniform(0.1, 0.9) * h)
            r = max(2.0, rng.uniform(0.01, 0.045) * scale)
            axes = (round(r), max(1, round(r * rng.uniform(0.6, 1.0))))
            shapes.append(_Spot((cx, cy), axes, float(rng.uniform(0.0, 180.0)), sign * 0.3, float(r)))
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
        rounded = tuple(tuple((int(x), int(y)) for x, y in np.round(np.array(path)).astype(np.int32)) for path in paths)
        shapes.append(_Crack(rounded, -0.35, thick))
    return tuple(shapes)


def _draw_defects(shapes: tuple[_Shape, ...], h: int, w: int) -> _Float:
    """Return the luminance change that draws the defect instances, anti-aliased."""
    delta = np.zeros((h, w), np.float32)
    for shape in shapes:
        if isinstance(shape, _Scratch):
            cv2.line(delta, shape.p1, shape.p2, shape.value, shape.thick, cv2.LINE_AA)
        elif isinstance(shape, _Spot):
            cx, cy = shape.center
            cv2.ellipse(delta, shape.center, shape.axes, shape.angle, 0.0, 360.0, shape.value, -1, cv2.LINE_AA)
            # Blur only around the spot: a full-image blur this wide would dominate the run time.
            r = shape.radius
            m = round(3 * r)
            y0, y1, x0, x1 = max(0, cy - m), min(h, cy + m + 1), max(0, cx - m), min(w, cx + m + 1)
            delta[y0:y1, x0:x1] = cv2.GaussianBlur(delta[y0:y1, x0:x1], (0, 0), r / 3)
        else:
            for path in shape.paths:
                cv2.polylines(delta, [np.array(path, np.int32)], False, shape.value, shape.thick, cv2.LINE_AA)
    return delta


def _shape_region(shape: _Shape, h: int, w: int) -> tuple[npt.NDArray[np.bool_], int, int] | None:
    """Return the pixels one defect instance labels, as a crop and its ``(x, y)`` offset.

    The pixels are those the instance, drawn alone exactly as in the image, changes by at
    least half its strength (for a spot, after its blur). Pixels it encloses (a crack closing
    a loop) count as inside, since a COCO polygon has no holes. None if it changes no pixel
    that much. Drawn in a crop around the shape, which holds all of it (for a spot, the very
    window the image blurs), so it costs a fraction of a full-image canvas.
    """
    if isinstance(shape, _Scratch):
        points, margin = [shape.p1, shape.p2], shape.thick + 2
    elif isinstance(shape, _Spot):
        points, margin = [shape.center], round(3 * shape.radius)
    else:
        points, margin = [p for path in shape.paths for p in path], shape.thick + 2
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, y0 = max(0, min(xs) - margin), max(0, min(ys) - margin)
    x1, y1 = min(w, max(xs) + margin + 1), min(h, max(ys) + margin + 1)
    if x0 >= x1 or y0 >= y1:
        return None
    delta = _draw_defects((_moved(shape, -x0, -y0),), y1 - y0, x1 - x0)
    region = fill_holes(np.abs(delta) >= 0.5 * abs(shape.value))
    return (region, x0, y0) if region.any() else None


def _moved(shape: _Shape, dx: int, dy: int) -> _Shape:
    """Return `shape` shifted by ``(dx, dy)`` pixels."""
    if isinstance(shape, _Scratch):
        return replace(shape, p1=(shape.p1[0] + dx, shape.p1[1] + dy), p2=(shape.p2[0] + dx, shape.p2[1] + dy))
    if isinstance(shape, _Spot):
        return replace(shape, center=(shape.center[0] + dx, shape.center[1] + dy))
    return replace(shape, paths=tuple(tuple((x + dx, y + dy) for x, y in path) for path in shape.paths))


if __name__ == "__main__":
    raise SystemExit(main())
