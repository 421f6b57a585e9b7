"""A contact sheet of originals and their variants, so a person can check augmentations by eye.

A band at the top names the classes in their colours (``HEADER`` pixels a line; more lines
when the sheet is too narrow for one). Below it, one row per
sample (drawn by ``seed``, in index order), one column per view (0 = the original, then 1..K).
Each view is a ``tile`` x ``tile`` cell with ``MARGIN`` white pixels around it: the view scaled
by ``tile / max(H, W)`` (``cv2.resize``: nearest neighbour when enlarging, ``INTER_AREA`` when
shrinking) at the cell's top-left corner, white elsewhere, its mask blended in (each pixel in the
colour of the class whose id it holds; 0 and the store's ignore value left out) and its boxes
outlined in their class's colour. Under it, a ``CAPTION`` band: the sample and view, and the
operations that made the view with their drawn parameters, from its record. 16-bit images are
shown scaled to 8 bits (/ 257). Drawing is pure (:func:`render_tile`); :func:`preview` reads
the store and writes the PNG.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from .._files import refuse_url
from .._output import check_outputs, write_atomic
from ..errors import OptionError, StoreError
from ..options import PreviewOptions

__all__ = ["preview", "PreviewResult", "describe_record", "render_tile", "MARGIN", "HEADER", "CAPTION"]

#: White space around each cell, in pixels (so cells are ``tile + 2 * MARGIN`` apart).
MARGIN = 4
#: Caption lines under each tile: the head (``#i v2``) and up to four lines of operations.
CAPTION_LINES = 5
#: Height of one caption line, and of one line of the class band at the top of the sheet.
LINE = 14
HEADER = LINE + 8
#: Height of the caption band under each tile.
CAPTION = LINE * CAPTION_LINES + 4
_FONT = cv2.FONT_HERSHEY_SIMPLEX
_SCALE = 0.38
_INK = (20, 20, 20)
_MASK_ALPHA = 0.45


@dataclass(frozen=True)
class PreviewResult:
    """What :func:`preview` wrote: the PNG, the samples (one row each), the variants per row and
    the classes its band names (those whose boxes or masks it drew)."""

    out: str
    store: str
    samples: tuple[int, ...]
    variants: int
    classes: tuple[str, ...] = ()

    def summary(self) -> str:
        """The one line the CLI prints: where the preview went and what it shows."""
        views = f"the original and {self.variants} variant(s)" if self.variants else "the original (no variants)"
        return f"wrote {self.out}: {len(self.samples)} sample(s) of {self.store}, {views} each"


def _palette(n: int) -> np.ndarray:
    """``n`` distinct BGR colours (golden-angle hues, saturated and bright)."""
    hues = (np.arange(max(n, 1)) * 137.508) % 180
    hsv = np.stack([hues, np.full_like(hues, 220), np.full_like(hues, 255)], axis=1).astype(np.uint8)[None]
    bgr: np.ndarray = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0].astype(np.int32)
    return bgr


def _short(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_short(v) for v in value[:4]) + (",..." if len(value) > 4 else "") + "]"
    return str(value)


def describe_record(record: Sequence[Mapping[str, Any]], variant: int = 1) -> list[str]:
    """One line per applied operation: ``name k=v k=v`` (numbers to 3 digits, lists cut at 4).

    ``variant`` 0 is the original; a variant whose record is empty had no operation drawn (the
    config's ``augmentation_percentage`` or ``p``), so it equals its original, and says so.
    """
    if variant == 0:
        return ["original"]
    if not record:
        return ["no operation drawn (= original)"]
    lines = []
    for entry in record:
        params = " ".join(f"{k}={_short(v)}" for k, v in entry.items() if k != "op")
        lines.append(f"{entry.get('op', '?')} {params}".strip())
    return lines


def _width(text: str) -> int:
    return int(cv2.getTextSize(text, _FONT, _SCALE, 1)[0][0])


def _cut(text: str, width: int) -> str:
    """``text`` cut to ``width`` pixels, ending in ``...`` when something was cut."""
    if _width(text) <= width:
        return text
    while text and _width(text + "...") > width:
        text = text[:-1]
    return text + "..."


def _wrap(line: str, width: int) -> list[str]:
    """``line`` wrapped at spaces to ``width`` pixels; a word wider than that is cut into pieces."""
    out: list[str] = []
    current = ""
    for word in line.split(" "):
        candidate = f"{current} {word}" if current else word
        if _width(candidate) <= width:
            current = candidate
            continue
        if current:
            out.append(current)
        while len(word) > 1 and _width(word) > width:
            k = len(word) - 1
            while k > 1 and _width(word[:k]) > width:
                k -= 1
            out.append(word[:k])
            word = word[k:]
        current = word
    out.append(current)
    return out


def _fit_lines(lines: Sequence[str], width: int, most: int = CAPTION_LINES) -> list[str]:
    """At most ``most`` lines of ``lines`` within ``width`` pixels: wrapped when they fit so, else
    one line each, cut (so every operation is named), and ``+N more`` for those that do not fit."""
    wrapped = [part for line in lines for part in _wrap(line, width)]
    if len(wrapped) <= most:
        return wrapped
    cut = [_cut(line, width) for line in lines]
    if len(cut) <= most:
        return cut
    return [*cut[: most - 1], _cut(f"+{len(cut) - most + 1} more", width)]


def _bgr8(image: np.ndarray) -> np.ndarray:
    """A stored image (H x W x 1 or 3, RGB, 8 or 16 bit) as 8-bit BGR."""
    img = np.asarray(image)
    if img.ndim == 2:
        img = img[:, :, None]
    if img.dtype == np.uint16:
        img = ((img.astype(np.uint32) + 128) // 257).astype(np.uint8)
    if img.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(img, 3, axis=2))
    return np.ascontiguousarray(img[:, :, 2::-1])


def _mask_colours(mask: np.ndarray, ignore: int | None, class_ids: Sequence[int], colours: np.ndarray) -> np.ndarray:
    """An H x W index into ``colours`` for each pixel of ``mask``, -1 where nothing is drawn: a class
    id gets its class's colour (as its boxes), any other value a colour of its own."""
    m = np.asarray(mask).astype(np.int64)
    lookup = {int(cid): k for k, cid in enumerate(class_ids)}
    index = np.full(m.shape, -1, np.int64)
    for value in np.unique(m).tolist():
        if value == 0 or value == ignore:
            continue
        index[m == value] = lookup.get(value, len(class_ids) + value) % len(colours)
    return index


def render_tile(
    sample: Mapping[str, Any],
    tile: int,
    *,
    ignore: int | None = None,
    class_ids: Sequence[int] = (),
    colours: np.ndarray | None = None,
) -> np.ndarray:
    """A ``tile`` x ``tile`` BGR uint8 cell: the view's image scaled to fit (top-left), mask blended,
    boxes outlined. Pure: reads ``sample`` (``image``, optional ``mask``, ``boxes``, ``box_labels``)."""
    colours = _palette(12) if colours is None else colours
    bgr = _bgr8(sample["image"])
    h, w = bgr.shape[:2]
    scale = tile / max(h, w)
    tw, th = max(1, round(w * scale)), max(1, round(h * scale))
    interp = cv2.INTER_NEAREST if scale >= 1 else cv2.INTER_AREA
    view = cv2.resize(bgr, (tw, th), interpolation=interp)
    mask = sample.get("mask")
    if mask is not None:
        m = cv2.resize(np.ascontiguousarray(mask), (tw, th), interpolation=cv2.INTER_NEAREST)
        index = _mask_colours(m, ignore, class_ids, colours)
        shown = index >= 0
        if shown.any():
            blended = view[shown] * (1 - _MASK_ALPHA) + colours[index[shown]] * _MASK_ALPHA
            view[shown] = np.rint(blended).astype(np.uint8)
    cell = np.full((tile, tile, 3), 255, np.uint8)
    cell[:th, :tw] = view
    boxes = sample.get("boxes")
    if boxes is not None:
        labels = sample.get("box_labels")
        thickness = max(1, tile // 200)
        for k, b in enumerate(np.asarray(boxes, np.float64).reshape(-1, 4)):
            c = int(labels[k]) if labels is not None and k < len(labels) else 0
            colour = tuple(int(x) for x in colours[c % len(colours)])
            # Corner coordinates: the box's last pixel column is x_max - 1.
            p0 = (round(b[0] * scale), round(b[1] * scale))
            p1 = (max(p0[0], round(b[2] * scale) - 1), max(p0[1], round(b[3] * scale) - 1))
            cv2.rectangle(cell, p0, p1, colour, thickness)
    return cell


def _caption(lines: Sequence[str], width: int) -> np.ndarray:
    band = np.full((CAPTION, width, 3), 255, np.uint8)
    for n, line in enumerate(_fit_lines(lines, width - 4)):
        cv2.putText(band, line, (2, LINE * (n + 1)), _FONT, _SCALE, _INK, 1, cv2.LINE_AA)
    return band


def _legend(classes: Sequence[str], width: int, shown: Sequence[int] | None = None) -> list[list[tuple[int, str, int]]]:
    """The class names placed in lines of ``width`` pixels: ``[(class index, name, x), ...]`` per
    line (a name wider than a line is cut to fit); ``shown``: the class indices to list (all)."""
    lines: list[list[tuple[int, str, int]]] = [[]]
    x = MARGIN
    for k in range(len(classes)) if shown is None else shown:
        name = classes[k]
        text = _cut(str(name), max(8, width - 2 * MARGIN - LINE))
        step = LINE + _width(text) + 12
        if lines[-1] and x + step - 12 > width - MARGIN:
            lines.append([])
            x = MARGIN
        lines[-1].append((k, text, x))
        x += step
    return lines


def _header(classes: Sequence[str], colours: np.ndarray, width: int, shown: Sequence[int] | None = None) -> np.ndarray:
    """The band at the top: each class name in its colour (boxes and masks use the same), in as
    many lines of ``HEADER`` pixels as the sheet's width needs; ``shown``: the classes the sheet
    drew (all when None), so the band names no colour that appears nowhere."""
    lines = _legend(classes, width, shown)
    band = np.full((HEADER * len(lines), width, 3), 255, np.uint8)
    if not classes or (shown is not None and not shown):
        text = "no classes" if not classes else "no boxes or masks drawn"
        cv2.putText(band, text, (MARGIN, LINE + 1), _FONT, _SCALE, _INK, 1, cv2.LINE_AA)
    for n, line in enumerate(lines):
        y = n * HEADER
        for k, text, x in line:
            colour = tuple(int(c) for c in colours[k % len(colours)])
            cv2.rectangle(band, (x, y + 5), (x + LINE - 4, y + LINE + 1), colour, -1)
            cv2.putText(band, text, (x + LINE, y + LINE + 1), _FONT, _SCALE, _INK, 1, cv2.LINE_AA)
    return band


#: Masks read at most per requested sample while looking for labelled ones (a store of many
#: unlabelled images is not read whole to find a few).
_MASK_LOOKS = 20


def _labelled(ds: Any, order: np.ndarray, count: int) -> list[int]:
    """The first ``count`` samples of ``order`` that have a box or a mask pixel of a class, then
    the others in that order: a sheet shows what the labels do wherever the store has labels."""
    from .. import schema

    r = ds.reader
    if "boxes" in ds.manifest.arrays:
        off = np.asarray(r.meta("boxes_offsets"), np.int64)
        has = np.diff(off)[order] > 0
        first = [int(i) for i in order[has][:count]]
    elif schema.MASK in ds.manifest.arrays:
        ignore = ds.manifest.mask_ignore
        first = []
        for i in order[: _MASK_LOOKS * count].tolist():
            m = np.asarray(r.read(schema.MASK, i))
            if np.any((m != 0) & (m != (ignore if ignore is not None else 0))):
                first.append(i)
                if len(first) == count:
                    break
    else:
        first = []
    taken = set(first)
    rest = [int(i) for i in order if int(i) not in taken][: count - len(first)]
    return first + rest


def _drawn(sample: Mapping[str, Any], ignore: int | None, class_ids: Sequence[int], n: int) -> set[int]:
    """The class indices whose colour a view shows (its boxes' labels, its mask's class ids)."""
    labels = sample.get("box_labels")
    found = set() if labels is None else {int(c) for c in np.asarray(labels).reshape(-1).tolist()}
    mask = sample.get("mask")
    if mask is not None:
        lookup = {int(cid): k for k, cid in enumerate(class_ids)}
        found |= {lookup[v] for v in np.unique(np.asarray(mask)).tolist() if v in lookup and v not in (0, ignore)}
    return {c for c in found if 0 <= c < n}


def preview(
    store: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    count: int = 8,
    seed: int = 0,
    tile: int = 160,
    max_variants: int = 8,
    index: Sequence[int] | None = None,
) -> PreviewResult:
    """Write a contact sheet of ``count`` samples of ``store`` and their variants to ``out`` (PNG).

    Samples are drawn without replacement by ``seed`` (all of them when the store has fewer),
    those with boxes or mask pixels first (a sheet of a labelled store shows its labels), and
    shown in index order; ``index`` names the samples instead (in that order; ``count`` and
    ``seed`` are then unused). Each row shows the original and its first ``max_variants`` variants
    (a store without variants: the originals only); the band at the top names the classes whose
    boxes or masks the sheet drew. The same arguments write the same bytes.

    Raises
    ------
    OptionError
        A bad argument, ``out`` not named ``.png``, or ``out`` inside the store.
    StoreNotFoundError, StoreError
        No store at ``store``, or one that cannot be read.
    """
    refuse_url(store, "the store")
    refuse_url(out, "the output")
    from ..read.dataset import Dataset

    index = PreviewOptions(count=count, seed=seed, tile=tile, max_variants=max_variants, index=index).index
    path = Path(out)
    if path.suffix.lower() != ".png":
        raise OptionError(f"the preview is a PNG: give OUT a .png name, got {path}")
    check_outputs([("the preview", path)], [("the store", store)], made_folders={"the preview"})
    with Dataset(store) as ds:
        k = min(ds.variants, max_variants)
        if index is not None:
            outside = [i for i in index if i >= len(ds)]
            if outside:
                raise OptionError(
                    f"preview index (--index) {outside[0]} is not a sample of {store}: it has {len(ds)} (0..{len(ds) - 1})"
                )
            picks = np.asarray(index, np.int64)
        else:
            order = np.random.default_rng(seed).permutation(len(ds))
            picks = np.sort(np.asarray(_labelled(ds, order, min(count, len(ds))), np.int64))
        ignore = ds.manifest.mask_ignore
        classes, class_ids = ds.classes, ds.class_ids
        colours = _palette(max(len(classes), 12))
        rows = []
        drawn: set[int] = set()
        for i in picks.tolist():
            cells = []
            for v in range(k + 1):
                sample = ds.variant(i, v)
                drawn |= _drawn(sample, ignore, class_ids, len(classes))
                head = f"#{i} v{v}"
                label = int(sample.get("label", -1))
                if v == 0 and 0 <= label < len(classes):
                    head += f" {classes[label]}"
                lines = [head, *describe_record(ds.augmentation(i, v), v)]
                img = render_tile(sample, tile, ignore=ignore, class_ids=class_ids, colours=colours)
                cell = np.concatenate([img, _caption(lines, tile)], axis=0)
                cells.append(np.pad(cell, ((MARGIN, MARGIN), (MARGIN, MARGIN), (0, 0)), constant_values=255))
            rows.append(np.concatenate(cells, axis=1))
    sheet = np.concatenate([_header(classes, colours, rows[0].shape[1], sorted(drawn)), *rows], axis=0)
    ok, buf = cv2.imencode(".png", sheet)
    if not ok:
        raise StoreError(f"cannot encode the preview {path} as PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, buf.tobytes())  # a reader never sees half a PNG
    return PreviewResult(
        out=str(path),
        store=str(store),
        samples=tuple(picks.tolist()),
        variants=k,
        classes=tuple(str(classes[c]) for c in sorted(drawn)),
    )
