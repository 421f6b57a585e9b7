"""What the strict label-file reader costs against plain ``json.loads`` (run by hand).

    python benchmarks/strict_json.py --images 100000 --boxes 5 --repeat 5

Label files and augmentation configs are parsed by one strict reader (a key given twice, ``NaN``,
numbers beyond a float or 64 bits and deep nesting refused). This writes a COCO document of
``--images`` images with ``--boxes`` boxes each (float coordinates, as exporters write them) and
times, side by side in one process, alternating, ``json.loads`` and the strict reader on the same
text; medians of ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from dlpack._json import parse_json


def coco_text(images: int, boxes: int) -> str:
    rng = np.random.default_rng(0)
    doc = {
        "images": [
            {"id": i, "file_name": f"c{i % 4}/{i:07d}.png", "width": 1024, "height": 1024} for i in range(images)
        ],
        "annotations": [
            {
                "id": i * boxes + k,
                "image_id": i,
                "category_id": int(1 + k % 3),
                "bbox": [round(float(v), 2) for v in rng.uniform(0, 900, 4)],
                "area": 1234.5,
                "iscrowd": 0,
            }
            for i in range(images)
            for k in range(boxes)
        ],
        "categories": [{"id": c, "name": f"class{c}"} for c in (1, 2, 3)],
    }
    return json.dumps(doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", type=int, default=100_000)
    p.add_argument("--boxes", type=int, default=5)
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args(argv)
    text = coco_text(a.images, a.boxes)
    plain, strict = [], []
    for r in range(a.repeat):
        for which in ("plain", "strict") if r % 2 == 0 else ("strict", "plain"):
            t = time.perf_counter()
            if which == "plain":
                json.loads(text)
                plain.append(time.perf_counter() - t)
            else:
                parse_json(text, "bench.json", ValueError)
                strict.append(time.perf_counter() - t)
    mb = len(text.encode()) / 1e6
    p_s, s_s = statistics.median(plain), statistics.median(strict)
    print(f"{mb:.1f} MB COCO: json.loads {p_s:.2f} s, strict reader {s_s:.2f} s ({s_s / p_s:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
