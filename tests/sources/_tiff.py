"""Test helper: multi-page TIFF bytes with any supported OpenCV."""

from __future__ import annotations

import tempfile
from pathlib import Path

import cv2
import numpy as np


def multipage_tiff(pages: list[np.ndarray]) -> bytes:
    """A multi-page TIFF in memory (OpenCV before 4.9 has no imencodemulti: it goes through a file)."""
    if hasattr(cv2, "imencodemulti"):
        ok, buf = cv2.imencodemulti(".tiff", pages)
        assert ok
        return np.asarray(buf, dtype=np.uint8).tobytes()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pages.tiff"
        assert cv2.imwritemulti(str(path), pages)
        return path.read_bytes()
