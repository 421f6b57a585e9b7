"""What the shrink check costs a batch gather (run by hand).

    python benchmarks/map_check.py --count 4096 --size 48 --batch 256 --shard-mib 1,32

A store file cut under an open reader would crash it with SIGBUS, so before rows are copied out of
the memory maps the reader checks that the files they lie in have not shrunk (a ``stat`` per Zarr
shard the batch touches, one ``fstat`` for HDF5). This builds one uncompressed store per backend
and shard size, then, side by side in one run, times a whole ``gather`` of ``--batch`` random rows
and the check alone on the same indices (interleaved, median of ``--repeat`` rounds of
``--inner`` calls each). The ratio is the share of a gather the check costs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _images import make_pngs  # noqa: E402

import dlpack  # noqa: E402
from dlpack.backends import open_reader  # noqa: E402


def _per_call_us(fn: Callable[..., object], args: tuple[object, ...], inner: int) -> float:
    t = time.perf_counter()
    for _ in range(inner):
        fn(*args)
    return (time.perf_counter() - t) / inner * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=4096)
    p.add_argument("--size", type=int, default=48, help="square image side in pixels (3 channels)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--shard-mib", default="1,32", help="Zarr shard sizes to compare, MiB")
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--inner", type=int, default=200)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        make_pngs(src, a.count, a.size)
        stores = [("hdf5", None, Path(tmp) / "s.h5")]
        stores += [("zarr", int(m), Path(tmp) / f"s{m}.zarr") for m in a.shard_mib.split(",")]
        for _, mib, out in stores:
            extra = {} if mib is None else {"shard_bytes": mib * 2**20}
            dlpack.build(src, out, size=f"{a.size}x{a.size}", compression="none", quiet=True, **extra)
        rng = np.random.default_rng(0)
        for backend, mib, out in stores:
            reader = open_reader(out)
            idx = np.sort(rng.choice(a.count, size=a.batch, replace=False)).astype(np.int64)
            batch = np.empty((a.batch, a.size, a.size, 3), np.uint8)
            reader.gather("images", idx, batch)  # maps opened, plan found
            check = reader._map_check("images")
            whole, alone = [], []
            for _ in range(a.repeat):
                whole.append(_per_call_us(reader.gather, ("images", idx, batch), a.inner))
                alone.append(_per_call_us(check, (idx,), a.inner))
            shards = len({int(i) for i in idx // max(1, getattr(reader._stored("images"), "shard_rows", a.count))})
            row = {
                "backend": backend,
                "shard_mib": mib,
                "shards_touched": shards if backend == "zarr" else 1,
                "gather_us": statistics.median(whole),
                "check_us": statistics.median(alone),
            }
            row["check_share"] = row["check_us"] / row["gather_us"]
            rows.append(row)
            reader.close()
    print(f"{'store':<16} {'shards':>6} {'gather us':>10} {'check us':>9} {'share':>6}")
    for r in rows:
        name = r["backend"] + ("" if r["shard_mib"] is None else f" {r['shard_mib']} MiB")
        print(
            f"{name:<16} {r['shards_touched']:>6} {r['gather_us']:>10.1f} {r['check_us']:>9.1f} {r['check_share']:>6.1%}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
