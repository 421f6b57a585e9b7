"""A contact sheet of originals and their variants, so a person can check augmentations by eye.

One row per sample (drawn by ``seed``), one column per view (0 = the original, then 1..K). Each tile
shows the stored pixels with the view's boxes drawn (one colour per class) and its mask blended in
(one colour per mask value; the store's ignore value left out), and under it the operations that
made the view with their main parameters, from the view's record.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from ..errors import OptionError, StoreError

__all__ = ["preview", "describe_record"]

_CAPTION_LINES = 3
_LINE = 14
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_SCALE = 0.38


def _palette(n: int) -> np.ndarray:
    """``n`` distinct BGR colours (golden-angle hues at full saturation)."""
    hues = (np.arange(max(n, 1)) * 137.508) % 180
    hsv = np.stack([hues, np.full_like(hues, 220), np.full_like(hues, 255)], axis=1).astype(np.uint8)[None]
    bgr: np.ndarray = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0].astype(np.int32)
    return bgr


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value[:4]) + ("..." if len(value) > 4 else "") + "]"
    return str(value)


def describe_record(record: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per applied operation: ``name k=v k=v`` (nested values shortened); ``original`` for none."""
    if not record:
        return ["original"]
    lines = []
    for entry in record:
        params = " ".join(f"{k}={_short(v)}" for k, v in entry.items() if k != "op")
        lines.append(f"{entry.get('op', '?')} {params}".strip())
    return lines


def _fit_lines(lines: list[str], width: int) -> list[str]:
    """Wrap and cut ``lines`` to the tile's width and the caption's height."""
    out: list[str] = []
    for line in lines:
        while line:
            k = len(line)
            while k > 1 and cv2.getTextSize(line[:k], _FONT, _SCALE, 1)[0][0] > width - 4:
                k -= 1
            out.append(line[:k])
            line = line[k:]
    if len(out) > _CAPTION_LINES:
        out = [*out[: _CAPTION_LINES - 1], out[_CAPTION_LINES - 1][:-3] + "..."]
    return out


def _tile(sample: Mapping[str, Any], size: int, ignore: int | None, colours: np.ndarray) -> np.ndarray:
    """The view's pixels as a ``size``-tall BGR uint8 tile, boxes and mask drawn."""
    img = np.asarray(sample["image"])
    if img.dtype == np.uint16:
        img = ((img.astype(np.uint32) + 128) // 257).astype(np.uint8)
    bgr = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR) if img.shape[2] == 1 else cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
    h, w = bgr.shape[:2]
    scale = size / h
    tw = max(1, round(w * scale))
    interp = cv2.INTER_NEAREST if scale >= 1 else cv2.INTER_AREA
    tile = cv2.resize(bgr, (tw, size), interpolation=interp).astype(np.int32)
    mask = sample.get("mask")
    if mask is not None:
        m = cv2.resize(np.asarray(mask), (tw, size), interpolation=cv2.INTER_NEAREST)
        shown = (m != 0) & (m != ignore) if ignore is not None else m != 0
        if shown.any():
            colour = colours[m[shown].astype(np.int64) % len(colours)]
            tile[shown] = (tile[shown] * 0.55 + colour * 0.45).astype(np.int32)
    out = np.ascontiguousarray(tile.astype(np.uint8))
    boxes = sample.get("boxes")
    if boxes is not None:
        labels = sample.get("box_labels")
        for k, b in enumerate(np.asarray(boxes, np.float64).reshape(-1, 4)):
            c = int(labels[k]) if labels is not None and k < len(labels) else 0
            colour = tuple(int(x) for x in colours[c % len(colours)])
            p0 = (round(b[0] * scale), round(b[1] * scale))
            p1 = (max(p0[0], round(b[2] * scale) - 1), max(p0[1], round(b[3] * scale) - 1))
            cv2.rectangle(out, p0, p1, colour, 1)
    return out


def preview(
    store: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    count: int = 8,
    seed: int = 0,
    tile: int = 160,
    max_variants: int = 8,
) -> Path:
    """Write a contact sheet of ``count`` samples of ``store`` and their variants to ``out`` (PNG).

    Samples are drawn without replacement by ``seed``; at most ``max_variants`` variants per row are
    shown (the first ones). A store without variants shows its originals only. Returns ``out``.
    """
    from ..dataset import Dataset

    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise OptionError(f"count must be an integer >= 1, got {count!r}")
    if not isinstance(tile, int) or tile < 32:
        raise OptionError(f"tile must be an integer >= 32 (pixels), got {tile!r}")
    path = Path(out)
    if path.suffix.lower() != ".png":
        raise OptionError(f"the preview is a PNG: give OUT a .png name, got {path}")
    with Dataset(store) as ds:
        k = min(ds.variants, max_variants)
        picks = np.sort(np.random.default_rng(seed).choice(len(ds), size=min(count, len(ds)), replace=False))
        ignore = ds.manifest.mask_ignore
        colours = _palette(max(len(ds.classes), 12))
        rows = []
        for i in picks.tolist():
            tiles = []
            for v in range(k + 1):
                sample = ds.variant(i, v) if v else ds[i]
                lines = describe_record(ds.augmentation(i, v)) if v else ["original"]
                img = _tile(sample, tile, ignore, colours)
                head = f"#{i} v{v}"
                label = int(sample.get("label", -1))
                if v == 0 and 0 <= label < len(ds.classes):
                    head += f" {ds.classes[label]}"
                caption = np.full((_LINE * (_CAPTION_LINES + 1) + 4, img.shape[1], 3), 255, np.uint8)
                for n, line in enumerate(_fit_lines([head, *lines], img.shape[1])[: _CAPTION_LINES + 1]):
                    cv2.putText(caption, line, (2, _LINE * (n + 1)), _FONT, _SCALE, (20, 20, 20), 1, cv2.LINE_AA)
                cell = np.concatenate([img, caption], axis=0)
                tiles.append(np.pad(cell, ((4, 4), (4, 4), (0, 0)), constant_values=255))
            rows.append(np.concatenate(tiles, axis=1))
    width = max(r.shape[1] for r in rows)
    sheet = np.concatenate([np.pad(r, ((0, 0), (0, width - r.shape[1]), (0, 0)), constant_values=255) for r in rows])
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(os.fspath(path), sheet):
        raise StoreError(f"cannot write the preview {path}")
    return path
