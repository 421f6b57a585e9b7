"""Generated benchmark images shared by the scripts: PNGs that compress like photos, not like noise."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np


def make_pngs(root: Path, count: int, size: int, seed: Sequence[int] = (7,), classes: int = 4) -> None:
    """``count`` RGB PNGs of ``size`` x ``size`` in ``classes`` class folders under ``root`` (kept
    when there); smooth gradients plus noise (PNG about 0.6x raw). Image i is drawn from
    ``default_rng([*seed, i])``, so a script's data stays the same between runs."""
    if root.exists() and len(list(root.rglob("*.png"))) >= count:
        return

    def one(i: int) -> None:
        rng = np.random.default_rng([*seed, i])
        base = cv2.resize(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), (size, size), interpolation=cv2.INTER_CUBIC)
        img = np.clip(base.astype(np.int16) + rng.integers(-6, 7, (size, size, 3)), 0, 255).astype(np.uint8)
        d = root / f"class{i % classes}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:06d}.png").write_bytes(cv2.imencode(".png", img)[1].tobytes())

    with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        list(ex.map(one, range(count)))
