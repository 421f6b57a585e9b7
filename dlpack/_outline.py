"""Exact polygon outlines of pixel regions, for writing COCO labels of known masks.

A region is a boolean image. Its outline runs along pixel *edges*, in COCO's pixel-corner
coordinates (pixel ``(row r, column c)`` is the square ``[c, c+1] x [r, r+1]``), so every vertex
is an integer and no pixel centre lies on an edge: a rasteriser that fills the pixels whose
centres are inside the polygons gives back exactly the region, and the polygons' area is its
pixel count. Pixels that touch only at a corner belong to one polygon (8-connectivity), which
then touches itself at that corner; a region with holes is outlined with its holes filled
(COCO polygons cannot have holes), so `fill_holes` first.
"""

from __future__ import annotations

import cv2
import numpy as np
import numpy.typing as npt

__all__ = ["fill_holes", "outline", "tight_box"]

_Bool = npt.NDArray[np.bool_]

# Edge directions, clockwise on screen (y grows downwards): east, south, west, north.
_DX = np.array([1, 0, -1, 0], np.int64)
_DY = np.array([0, 1, 0, -1], np.int64)


def fill_holes(region: _Bool) -> _Bool:
    """Return `region` with every background area it encloses set.

    Background counts as connected only through edges (4-connectivity), the complement of the
    8-connectivity `outline` uses for the region: a pocket that reaches the outside only through
    a corner is a hole.
    """
    h, w = region.shape
    flood = np.pad(region.astype(np.uint8), 1)
    # floodFill needs a mask 2 px larger than the image; value 2 marks the outside.
    cv2.floodFill(flood, np.zeros((h + 4, w + 4), np.uint8), (0, 0), 2, flags=4)
    return np.asarray(flood[1:-1, 1:-1] != 2)


def tight_box(region: _Bool) -> tuple[int, int, int, int] | None:
    """Return the COCO box ``(x, y, width, height)`` of the region's pixels, None if it has none."""
    rows = np.flatnonzero(region.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(region.any(axis=0))
    x, y = int(cols[0]), int(rows[0])
    return x, y, int(cols[-1]) - x + 1, int(rows[-1]) - y + 1


def outline(region: _Bool, x0: int = 0, y0: int = 0) -> list[list[int]]:
    """Return the outer boundary of each 8-connected part of `region` as COCO polygons.

    Each polygon is ``[x0, y0, x1, y1, ...]`` with one vertex per corner of the boundary (runs
    of collinear edges are merged), clockwise on screen, offset by ``(x0, y0)`` (the position
    of `region` when it is a crop of a larger image). Holes are not traced: pass a region
    without holes (`fill_holes`) for polygons that fill exactly to it. Deterministic: the
    polygons come in the order of their first pixel in raster order.
    """
    h, w = region.shape
    pad = np.pad(region, 1)
    inner = pad[1:-1, 1:-1]
    starts_x: list[npt.NDArray[np.int64]] = []
    starts_y: list[npt.NDArray[np.int64]] = []
    dirs: list[npt.NDArray[np.int64]] = []
    # One directed edge per pixel side facing the background, with the region on its right.
    neighbours = (pad[:-2, 1:-1], pad[1:-1, 2:], pad[2:, 1:-1], pad[1:-1, :-2])  # above, right, below, left
    corner = ((0, 0), (1, 0), (1, 1), (0, 1))  # start corner (dx, dy) of the top, right, bottom, left side
    for side, (neighbour, (cx, cy)) in enumerate(zip(neighbours, corner, strict=True)):
        r, c = np.nonzero(inner & ~neighbour)
        starts_x.append(c.astype(np.int64) + cx)
        starts_y.append(r.astype(np.int64) + cy)
        dirs.append(np.full(r.size, side, np.int64))
    sx, sy, d = np.concatenate(starts_x), np.concatenate(starts_y), np.concatenate(dirs)
    if d.size == 0:
        return []
    # Sort edges by raster order of their start vertex so polygons start at the top-left.
    order = np.lexsort((d, sx, sy))
    sx, sy, d = sx[order], sy[order], d[order]
    stride = w + 2
    code = (sy * stride + sx) * 4 + d
    ex, ey = sx + _DX[d], sy + _DY[d]
    # The next edge starts where this one ends. Where two leave one vertex (two pixels touching
    # at a corner) turn left, towards the other pixel: that joins them (8-connectivity).
    succ = np.full(d.size, -1, np.int64)
    for turn in (3, 0, 1):  # left, straight, right
        want = (ey * stride + ex) * 4 + (d + turn) % 4
        pos = np.minimum(np.searchsorted(code, want), code.size - 1)
        hit = (code[pos] == want) & (succ < 0)
        succ[hit] = pos[hit]
    bends = d[succ] != d  # the edge's end vertex is a corner of the polygon
    seen = np.zeros(d.size, np.bool_)
    polygons: list[list[int]] = []
    for first in range(d.size):
        if seen[first]:
            continue
        coords: list[int] = []
        i = first
        while not seen[i]:
            seen[i] = True
            if bends[i]:
                coords += (int(ex[i]) + x0, int(ey[i]) + y0)
            i = int(succ[i])
        polygons.append(coords)
    return polygons
