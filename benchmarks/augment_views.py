"""How many cached variants are real views (run by hand).

    python benchmarks/augment_views.py --count 200 --size 64 --k 4 --config examples/augment_halcon.json

Makes ``--count`` gray (1-channel) PNGs of ``--size`` px in 4 class folders, builds an uncompressed
Zarr store of them, computes K = ``--k`` variants per image with ``--config`` and ``--jobs``, and
counts the variants whose pixels equal their original's, and the pairs of variants of one image that
equal each other. Both are views the cache stores but training gains nothing from. It reports the
augment's wall time too. The script uses only the public API that every version has, so the same
command run with ``PYTHONPATH`` set to an older checkout measures that one on the same data.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

import dlpack


def _gray_pngs(root: Path, count: int, size: int) -> None:
    for i in range(count):
        rng = np.random.default_rng([11, i])
        base = cv2.resize(rng.integers(0, 256, (8, 8), dtype=np.uint8), (size, size), interpolation=cv2.INTER_CUBIC)
        img = np.clip(base.astype(np.int16) + rng.integers(-6, 7, (size, size)), 0, 255).astype(np.uint8)
        d = root / f"class{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(d / f"{i:05d}.png"), img)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--config", default="examples/augment_halcon.json")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "s.zarr"
        _gray_pngs(src, a.count, a.size)
        dlpack.build(src, out, size=f"{a.size}x{a.size}", compression="none", quiet=True)
        t = time.perf_counter()
        dlpack.augment(out, a.k, os.path.abspath(a.config), jobs=a.jobs, quiet=True)
        seconds = time.perf_counter() - t
        same_as_original = duplicate_pairs = 0
        with dlpack.open(out) as ds:
            for i in range(len(ds)):
                original = ds[i]["image"]
                views = [ds.variant(i, v)["image"] for v in range(1, a.k + 1)]
                same_as_original += sum(np.array_equal(v, original) for v in views)
                duplicate_pairs += sum(
                    np.array_equal(views[x], views[y]) for x in range(len(views)) for y in range(x + 1, len(views))
                )
    row = {
        "dlpack": dlpack.__version__,
        "images": a.count,
        "variants": a.count * a.k,
        "same_as_original": same_as_original,
        "duplicate_pairs": duplicate_pairs,
        "augment_s": seconds,
    }
    print(
        f"{row['variants']} variants of {a.count} gray {a.size}x{a.size} images: {same_as_original} equal to their "
        f"original, {duplicate_pairs} pairs of one image's variants equal; augment {seconds:.2f} s (--jobs {a.jobs})"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(row, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
