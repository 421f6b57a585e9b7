r"""Which ``--compression`` default? Size on disk, build time and loader speed per codec (run by hand).

    python benchmarks/compression.py SRC[:SIZES[:upscale]] ... --work /tmp/dlpack-compression --json out.json

    python benchmarks/compression.py \
        /tmp/dlpack-datasets/stellarium_nebulae:64x64,256x256,512x512 \
        /tmp/dlpack-datasets/fashion_mnist:64x64:upscale \
        /tmp/dlpack-datasets/stardist_mask/images/img2d.tif:64x64 \
        --repeat 3 --json compression.json

Each case is a source and the sizes to pack it at (``--size`` when none is given). A folder is
packed as it is; images smaller than the size are skipped (``on_error="skip"``), unless the case
ends in ``:upscale`` (``--allow-upscale``). A single image file is cut into overlapping crops of
the size (stride half the size), written as PNG, and those are the source: one real image becomes
a set of samples of its own kind (the stardist microscopy image is 16-bit).

Per case, side by side in one run: the same source packed into Zarr and HDF5 stores with ``none``,
``lz4`` (Blosc LZ4 + bitshuffle) and ``zstd`` (Zarr's codecs; hdf5plugin's filters for HDF5), each
build timed as a user runs it (``dlpack.build``, every core); then every store read through
:func:`dlpack.bench.run_bench`, the machinery of ``dlpack bench``: the default loader
(``workers="auto"``, batch 32, read-ahead 4) in random and block order, warm (files primed) and
cold (evicted with ``posix_fadvise(DONTNEED)``, checked with ``mincore``), median of ``--repeat``
runs of one epoch (warm: at least 1 s; ``--seconds`` sets a time instead; a cold run stops at the
end of its epoch). Reported: MB on disk, that
over the source files' bytes and over the ``none`` store's, build images/s, and images/s per
(order, cache) with its ratio to ``none``. The share of the machine other processes used during
each case is printed, so a disturbed case shows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import dlpack
from dlpack.bench import run_bench
from dlpack.bench.machine import load_average, machine_info
from dlpack.options import parse_size

sys.path.insert(0, str(Path(__file__).parent))
from _cpu import busy_cpu_s as _busy_cpu_s  # noqa: E402
from _cpu import own_cpu_s as _own_cpu_s  # noqa: E402

CODECS = ("none", "lz4", "zstd")
FORMATS = (("zarr", ".zarr"), ("hdf5", ".h5"))
ORDERS = ("random", "block")
CACHES = ("warm", "cold")


def _case(spec: str, default_sizes: str) -> tuple[Path, list[tuple[int, int]], bool]:
    """``SRC[:SIZES[:upscale]]`` -> (source, sizes, allow_upscale)."""
    parts = spec.split(":")
    upscale = parts[-1] == "upscale"
    if upscale:
        parts = parts[:-1]
    src = Path(parts[0])
    sizes = parts[1] if len(parts) > 1 and parts[1] else default_sizes
    return src, [parse_size(s) for s in sizes.split(",")], upscale


def _label(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def _crops(image: Path, size: tuple[int, int], work: Path) -> Path:
    """Overlapping crops of ``size`` (stride half of it) of one image, as PNG files in a folder."""
    pixels = cv2.imread(str(image), cv2.IMREAD_UNCHANGED)
    if pixels is None:
        raise SystemExit(f"{image}: not an image OpenCV reads")
    w, h = size
    out = work / f"crops-{image.stem}-{w}x{h}"
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for y in range(0, pixels.shape[0] - h + 1, max(1, h // 2)):
        for x in range(0, pixels.shape[1] - w + 1, max(1, w // 2)):
            cv2.imwrite(str(out / f"{n:05d}.png"), np.ascontiguousarray(pixels[y : y + h, x : x + w]))
            n += 1
    if n == 0:
        raise SystemExit(f"{image}: smaller than {w}x{h}")
    return out


def _measure_case(
    name: str, src: Path, size: tuple[int, int], upscale: bool, work: Path, a: argparse.Namespace
) -> list[dict[str, Any]]:
    """Build the six stores of one (source, size) and read each, side by side."""
    label = _label(size)
    rows: list[dict[str, Any]] = []
    b0, o0, t0 = _busy_cpu_s(), _own_cpu_s(), time.perf_counter()
    for fmt, suffix in FORMATS:
        for codec in CODECS:
            out = work / f"{name}-{label}-{codec}{suffix}"
            t = time.perf_counter()
            res = dlpack.build(
                src,
                out,
                size=label,
                compression=codec,
                allow_upscale=upscale,
                on_error="skip",
                overwrite=True,
                quiet=True,
                jobs=a.jobs,
            )
            build_s = time.perf_counter() - t
            rows.append(
                {
                    "set": name,
                    "size": label,
                    "format": fmt,
                    "codec": codec,
                    "path": str(out),
                    "count": res.count,
                    "skipped": len(res.skipped),
                    "bytes": res.output_bytes,
                    "source_bytes": res.input_bytes,
                    "build_s": build_s,
                    "build_images_per_s": res.count / build_s,
                }
            )
    report = run_bench(
        [r["path"] for r in rows],
        orders=ORDERS,
        caches=CACHES,
        repeat=a.repeat,
        seconds=a.seconds,
        workers=a.workers,
        batch_size=a.batch_size,
        quiet=True,
    )
    wall = time.perf_counter() - t0
    b1, o1 = _busy_cpu_s(), _own_cpu_s()
    other = None if b0 is None or b1 is None else max(0.0, (b1 - b0) - (o1 - o0)) / (wall * (os.cpu_count() or 1))
    for row in rows:
        for cell in report.cells:
            if Path(cell.path).resolve() == Path(row["path"]).resolve():
                key = f"{cell.order}_{cell.cache}"
                row[key] = cell.images_per_s
                row[f"{key}_spread"] = cell.spread
                if cell.cache == "cold":
                    row[f"{key}_evicted"] = cell.eviction_verified
        row["case_seconds"] = wall
        row["other_cpu_share"] = other
    for row in rows:
        base = next(r for r in rows if r["format"] == row["format"] and r["codec"] == "none")
        row["vs_source"] = row["bytes"] / row["source_bytes"] if row["source_bytes"] else None
        row["size_vs_none"] = row["bytes"] / base["bytes"]
        row["build_vs_none"] = row["build_images_per_s"] / base["build_images_per_s"]
        for order in ORDERS:
            for cache in CACHES:
                key = f"{order}_{cache}"
                if key in row and key in base:
                    row[f"{key}_vs_none"] = row[key] / base[key]
    return rows


def _print_case(rows: list[dict[str, Any]]) -> None:
    first = rows[0]
    share = first["other_cpu_share"]
    print(
        f"\n## {first['set']} at {first['size']}: {first['count']} images ({first['skipped']} skipped), "
        f"source {first['source_bytes'] / 1e6:.1f} MB; {first['case_seconds']:.0f} s, "
        f"others used {'?' if share is None else f'{share:.0%}'} of the machine"
    )
    head = f"{'format':<6} {'codec':<5} {'MB':>8} {'x src':>6} {'x none':>6} {'build/s':>8}"
    for order in ORDERS:
        for cache in CACHES:
            head += f" {order + ' ' + cache:>13} {'x':>5}"
    print(head)
    for row in rows:
        line = (
            f"{row['format']:<6} {row['codec']:<5} {row['bytes'] / 1e6:>8.1f} "
            f"{row['vs_source'] or 0:>6.2f} {row['size_vs_none']:>6.2f} {row['build_images_per_s']:>8,.0f}"
        )
        for order in ORDERS:
            for cache in CACHES:
                key = f"{order}_{cache}"
                line += f" {row.get(key, 0):>13,.0f} {row.get(key + '_vs_none', 0):>5.2f}"
        print(line)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cases", nargs="+", metavar="SRC[:SIZES[:upscale]]")
    p.add_argument("--size", default="512x512", help="sizes of a case that names none (comma list)")
    p.add_argument("--work", default="/tmp/dlpack-compression")
    p.add_argument("--repeat", type=int, default=3, help="runs per (store, order, cache); the median is reported")
    p.add_argument("--seconds", type=float, default=None, help="seconds per read run (default: one epoch, 1-10 s warm)")
    p.add_argument("--workers", default="auto", help="loader threads (default: the loader's auto)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--jobs", type=int, default=-1, help="build worker processes (default: every core)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_before = load_average()
    rows: list[dict[str, Any]] = []
    first = _case(a.cases[0], a.size)
    if first[0].is_dir():  # imports and the worker pool started outside every timed build
        dlpack.build(
            first[0],
            work / "warm-up.zarr",
            size=_label(first[1][0]),
            allow_upscale=first[2],
            on_error="skip",
            overwrite=True,
            quiet=True,
            jobs=a.jobs,
        )
    for spec in a.cases:
        src, sizes, upscale = _case(spec, a.size)
        for size in sizes:
            name = src.stem if src.is_file() else src.name
            folder = _crops(src, size, work) if src.is_file() else src
            case = _measure_case(name, folder, size, upscale, work, a)
            _print_case(case)
            rows += case
    print(
        f"\n{time.perf_counter() - started:.0f} s in all; load average {load_before} before, {load_average()} after; "
        f"reads: median of {a.repeat} runs of {a.seconds or 'one epoch, 1-10'} s, batch {a.batch_size}, workers {a.workers}"
    )
    summary = _summary(rows)
    for line in summary:
        print(line)
    if a.json:
        doc = {
            "command": "python benchmarks/compression.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "rows": rows,
            "summary": summary,
            "machine": machine_info([work]),
            "load_average": [load_before, load_average()],
        }
        Path(a.json).write_text(json.dumps(doc, indent=2))
    return 0


def _summary(rows: list[dict[str, Any]]) -> list[str]:
    """Per format and codec: the median over cases of the size and speed ratios to ``none``."""
    out = ["", "median over cases, ratio to none: size, build, random warm/cold, block warm/cold"]
    for fmt, _ in FORMATS:
        for codec in CODECS[1:]:
            mine = [r for r in rows if r["format"] == fmt and r["codec"] == codec]
            if not mine:
                continue

            def med(key: str, mine: list[dict[str, Any]] = mine) -> float:
                vals = [r[key] for r in mine if r.get(key) is not None]
                return statistics.median(vals) if vals else float("nan")

            out.append(
                f"{fmt:<5} {codec:<5} size {med('size_vs_none'):.2f}  build {med('build_vs_none'):.2f}  "
                f"random {med('random_warm_vs_none'):.2f}/{med('random_cold_vs_none'):.2f}  "
                f"block {med('block_warm_vs_none'):.2f}/{med('block_cold_vs_none'):.2f}"
            )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
