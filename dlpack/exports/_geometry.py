"""Box coordinates between dlpack's corner form and HALCON's pixel-centred form, and COCO's.

dlpack stores boxes as ``[x_min, y_min, x_max, y_max]`` in corner coordinates (the image spans
``[0, W] x [0, H]``, as in COCO). HALCON puts the centre of pixel (r, c) at (r, c), so its image
spans ``[-0.5, H - 0.5] x [-0.5, W - 0.5]`` and lists rows first: every coordinate moves by half
a pixel. Pure functions, so the conversion is tested on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "HALF",
    "as_float",
    "corners_to_halcon",
    "halcon_to_corners",
    "corners_to_coco",
    "degenerate_boxes",
]

#: The shift between the two frames, in pixels.
HALF = 0.5


def as_float(value: float | np.floating) -> float:
    """A stored float32 as the Python float its shortest decimal names (``10.3``, not
    ``10.300000190734863``): the value the labelling tool wrote, before it was narrowed to float32."""
    if isinstance(value, np.float32):
        return float(str(value))  # NumPy prints a float32 by its shortest decimal
    return float(value)


def corners_to_halcon(boxes: np.ndarray) -> tuple[tuple[float, ...], ...]:
    """``K x 4`` corner boxes -> ``(row1, col1, row2, col2)``, each a tuple of K floats.

    ``row1 = y_min - 0.5``, ``col1 = x_min - 0.5``, ``row2 = y_max - 0.5``, ``col2 = x_max - 0.5``.
    """
    b = np.asarray(boxes).reshape(-1, 4)
    x0, y0, x1, y1 = ([as_float(v) - HALF for v in b[:, k]] for k in range(4))
    return tuple(y0), tuple(x0), tuple(y1), tuple(x1)


def halcon_to_corners(
    row1: Sequence[float], col1: Sequence[float], row2: Sequence[float], col2: Sequence[float]
) -> np.ndarray:
    """The inverse of :func:`corners_to_halcon`: ``K x 4`` float64 ``[x_min, y_min, x_max, y_max]``."""
    parts = [np.asarray(v, dtype=np.float64).reshape(-1) + HALF for v in (col1, row1, col2, row2)]
    return np.stack(parts, axis=1) if parts[0].size else np.zeros((0, 4), np.float64)


def corners_to_coco(boxes: np.ndarray) -> list[list[float]]:
    """``K x 4`` corner boxes -> COCO ``[x, y, w, h]`` lists of floats (same corner frame)."""
    out = []
    for x0, y0, x1, y1 in np.asarray(boxes).reshape(-1, 4):
        fx0, fy0 = as_float(x0), as_float(y0)
        out.append([fx0, fy0, as_float(x1) - fx0, as_float(y1) - fy0])
    return out


def degenerate_boxes(boxes: np.ndarray) -> list[int]:
    """Indices of boxes with ``x_min >= x_max`` or ``y_min >= y_max`` (or a NaN): HALCON refuses
    them (``row1 >= row2`` is an error there), and COCO gives them no area."""
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    bad = ~((b[:, 0] < b[:, 2]) & (b[:, 1] < b[:, 3]))
    return [int(i) for i in np.flatnonzero(bad)]
