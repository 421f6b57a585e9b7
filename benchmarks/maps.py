"""What 2 MiB page-table entries are worth to a gather out of a store's shard maps (run by hand).

    python benchmarks/maps.py STORE [--array images] [--batch 16] [--batches 2000] [--repeat 5]

dlpack maps a Zarr store's shard files so that each starts on a 2 MiB boundary: where the page
cache holds a file in 2 MiB pieces (Linux 6 on ext4, xfs, tmpfs), the kernel then maps it 2 MiB
at a time instead of 4 KiB at a time. This maps the same array twice in one process, once so (as
the reader does) and once one page off a 2 MiB boundary (as the reader did before), and times the
same random batches of rows gathered from each (one ``np.take`` through the maps' ``RowSpan``, as
the loader's), interleaved, median of ``--repeat`` rounds. It also reports how much of each map
the kernel mapped by 2 MiB entries (``FilePmdMapped`` of ``/proc/self/smaps``), which depends on
how the page cache came to hold the files. The store should be warm (read once) and larger than
the CPU's last-level cache.
"""

from __future__ import annotations

import argparse
import functools
import json
import mmap
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from dlpack import _maps
from dlpack.backends._shard import ShardedArray
from dlpack.backends.gather import RowSpan


@contextmanager
def one_page_off() -> Iterator[None]:
    """Maps made meanwhile start one page past a 2 MiB boundary, each file whole pages and rows apart."""
    reserve, step = _maps._reserve_huge, _maps._step

    def shifted(lib: Any, anon: int, size: int) -> tuple[int, int] | None:
        got = reserve(lib, anon, size + mmap.PAGESIZE)
        return None if got is None else (got[0] + mmap.PAGESIZE, got[1])

    _maps._reserve_huge, _maps._step = shifted, lambda page, largest: page  # type: ignore[assignment]
    try:
        yield
    finally:
        _maps._reserve_huge, _maps._step = reserve, step  # type: ignore[assignment]


def pmd_mapped_kib(lo: int, hi: int) -> tuple[int, int]:
    """(resident KiB, KiB mapped by 2 MiB entries) of this process's file maps inside ``[lo, hi)``."""
    rss = pmd = 0
    inside = False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                inside = lo <= int(m.group(1), 16) < hi
            elif inside and line.startswith("Rss:"):
                rss += int(line.split()[1])
            elif inside and line.startswith("FilePmdMapped:"):
                pmd += int(line.split()[1])
    return rss, pmd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", type=Path)
    p.add_argument("--array", default="images")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--batches", type=int, default=2000, help="random batches per round and way of mapping")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    arrays = {"2 MiB boundary": ShardedArray(a.store / a.array, strict=True)}
    sources = {"2 MiB boundary": arrays["2 MiB boundary"].row_source()}
    with one_page_off():  # the same files mapped again (the maps are made at first use)
        arrays["one page off"] = ShardedArray(a.store / a.array, strict=True)
        sources["one page off"] = arrays["one page off"].row_source()
    if any(src is None for src in sources.values()):
        print(f"{a.store / a.array}: its rows are not read from maps (compressed?)", file=sys.stderr)
        return 2
    first = arrays["2 MiB boundary"]
    n, shape = first.shape[0], first.shape[1:]
    out = np.empty((a.batch, *shape), dtype=first.dtype)
    gathers, ranges = {}, {}
    for name, src in sources.items():
        assert src is not None
        views, per = src
        span = RowSpan.of(views, per)
        if span is not None:  # several shards: one take over all their maps, as the loader's
            gathers[name] = functools.partial(span.gather, out=out)
        else:  # one shard
            gathers[name] = functools.partial(np.take, views[0], axis=0, out=out, mode="clip")
        starts = [int(v.__array_interface__["data"][0]) for v in views]
        ranges[name] = (min(starts), max(s + v.nbytes for s, v in zip(starts, views, strict=True)), starts)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, n, a.batch, dtype=np.int64) for _ in range(a.batches)]
    times: dict[str, list[float]] = {name: [] for name in gathers}
    for rnd in range(a.repeat + 1):  # the first round maps every page: not counted
        for name in list(gathers) if rnd % 2 == 0 else list(gathers)[::-1]:
            gather = gathers[name]
            t = time.perf_counter()
            for idx in batches:
                gather(idx)
            if rnd:
                times[name].append((time.perf_counter() - t) / (a.batches * a.batch) * 1e6)
    rows: dict[str, Any] = {}
    for name, (lo, hi, starts) in ranges.items():
        rss, pmd = pmd_mapped_kib(lo, hi)
        rows[name] = {
            "us_per_row": statistics.median(times[name]),
            "rounds": times[name],
            "rss_kib": rss,
            "pmd_kib": pmd,
            "starts_mod_2mib": sorted({s % _maps.HUGE for s in starts}),
        }
    base = rows["one page off"]["us_per_row"]
    print(f"{a.store / a.array}: {n} rows of {'x'.join(map(str, shape))}, batches of {a.batch}, random rows, warm")
    for name, r in rows.items():
        share = 100 * r["pmd_kib"] / max(1, r["rss_kib"])
        print(
            f"  maps start {name:<15}: {r['us_per_row']:7.2f} us a row ({base / r['us_per_row']:.2f}x)  "
            f"{share:3.0f} % of {r['rss_kib'] // 1024} MiB mapped by 2 MiB entries"
        )
    if a.json:
        doc = {
            "store": str(a.store),
            "array": a.array,
            "batch": a.batch,
            "rows": rows,
            "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]},
        }
        Path(a.json).write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
