"""Which ``--compression`` default? Size on disk and loader speed per codec (run by hand).

    python benchmarks/compression.py SRC_FOLDER --size 512x512 --work /tmp/dlpack-compression

Builds the same folder into Zarr and HDF5 stores with ``none``, ``lz4`` and ``zstd``, then, side by
side in one run, warm page cache, reads every store in random order with the loader (single
thread, so codec cost is not hidden by parallelism) and reports the median images/s and the
store's size relative to the uncompressed one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import dlpack


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("--size", default="512x512")
    p.add_argument("--resize", default=None, help="stretch (default with --size) or fit")
    p.add_argument("--work", default="/tmp/dlpack-compression")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for fmt, suffix in (("zarr", ".zarr"), ("hdf5", ".h5")):
        for codec in ("none", "lz4", "zstd"):
            out = work / f"{codec}{suffix}"
            t = time.perf_counter()
            res = dlpack.build(a.src, out, size=a.size, resize=a.resize, compression=codec, overwrite=True, quiet=True)
            build_s = time.perf_counter() - t
            rows.append(
                {
                    "format": fmt,
                    "codec": codec,
                    "path": str(out),
                    "bytes": res.output_bytes,
                    "build_images_per_s": res.count / build_s,
                    "count": res.count,
                }
            )
    for row in rows:
        ds = dlpack.open(row["path"])
        loader = ds.loader(batch_size=32, workers=0, prefetch=0, seed=0)
        for _ in loader:  # warm the page cache and the reader
            pass
        rates = []
        for _ in range(a.repeat):
            t = time.perf_counter()
            n = sum(len(b["index"]) for b in loader)
            rates.append(n / (time.perf_counter() - t))
        row["read_images_per_s"] = statistics.median(rates)
        ds.close()
    print(f"{'format':<6} {'codec':<5} {'MB':>8} {'vs none':>8} {'read img/s':>11} {'vs none':>8} {'build img/s':>12}")
    for row in rows:
        base = next(r for r in rows if r["format"] == row["format"] and r["codec"] == "none")
        row["size_ratio"] = row["bytes"] / base["bytes"]
        row["read_ratio"] = row["read_images_per_s"] / base["read_images_per_s"]
        print(
            f"{row['format']:<6} {row['codec']:<5} {row['bytes'] / 1e6:>8.1f} {row['size_ratio']:>8.2f} "
            f"{row['read_images_per_s']:>11,.0f} {row['read_ratio']:>8.2f} {row['build_images_per_s']:>12,.0f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "load_average": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
