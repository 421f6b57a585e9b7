"""Loader throughput against the memory-bandwidth ceiling and the scattered folder (run by hand).

    python benchmarks/loader.py --work /tmp/dlpack-loader-bench --count 1500 --repeat 5 --json loader.json

Builds (once) a folder of 512x512x3 PNGs (gradients + noise, like docs/benchmarks.md), a Zarr and
an HDF5 store from it, and a raw file of the same image bytes. Then, side by side in one run,
warm page cache, median of ``--repeat`` epochs:
- ``memmap``: a raw ``np.memmap`` gather (``mm[sorted batch indices]``), one thread: the ceiling;
- the dlpack loader, random and sequential order, per backend and worker count;
- the PNG folder decoded and resized by 2 threads (what a training script does without dlpack);
- zarr-python ``z[i]`` and h5py ``ds[i]`` per sample, the options the loader's design rejected;
- a process-pool loader (2 processes, batches pickled back), the rejected worker design;
- a simulated training step (sleep) fed by the loader with prefetch 0, 1 and 4: the busy fraction.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

import dlpack
from dlpack.sources import FolderSource, TargetSpec, prepare_image

sys.path.insert(0, str(Path(__file__).parent))
from _images import make_pngs  # noqa: E402

SIZE = 512
#: The folder baseline decodes with the build's own rules (RGB, 8-bit, area shrink).
FOLDER_TARGET = TargetSpec(mode="stretch", size=(SIZE, SIZE), allow_upscale=True, channels=3, dtype="|u1")


def load_folder_image(path: Path) -> np.ndarray:
    """One folder image as a training script without dlpack gets it: decoded, resized, RGB 8-bit."""
    return prepare_image(path.read_bytes(), FOLDER_TARGET).pixels


def rate(fn: Any, repeat: int) -> tuple[float, list[float]]:
    """Median images/s of ``fn() -> images`` over ``repeat`` runs (after one warm-up run)."""
    fn()
    rates = []
    for _ in range(repeat):
        t = time.perf_counter()
        n = fn()
        rates.append(n / (time.perf_counter() - t))
    return statistics.median(rates), rates


def batches_of(order: np.ndarray, b: int) -> list[np.ndarray]:
    return [order[s : s + b] for s in range(0, len(order), b)]


def _proc_init(path: str) -> None:
    global _PROC_DS
    _PROC_DS = dlpack.open(path)


def _proc_batch(idx: np.ndarray) -> np.ndarray:
    return _PROC_DS.get_batch(idx)["image"]  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/dlpack-loader-bench")
    p.add_argument("--count", type=int, default=1500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--folder-samples", type=int, default=256, help="images read from the PNG folder per run")
    p.add_argument(
        "--step-ms", type=float, default=0.0, help="simulated step (default: 2x the read time, 10 and 30 ms)"
    )
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    work = Path(a.work)
    src = work / "png"
    make_pngs(src, a.count, SIZE)
    stores = {"zarr": work / "s.zarr", "hdf5": work / "s.h5"}
    for path in stores.values():
        if not path.exists():
            dlpack.build(src, path, size=(SIZE, SIZE), quiet=True)
    ds = {k: dlpack.open(v) for k, v in stores.items()}
    n = len(ds["zarr"])
    raw = work / "raw.u8"
    if not raw.exists():
        with open(raw, "wb") as f:
            for s in range(0, n, 64):
                f.write(ds["hdf5"].get_batch(range(s, min(n, s + 64)))["image"].tobytes())
    mm = np.memmap(raw, dtype=np.uint8, mode="r", shape=(n, SIZE, SIZE, 3))
    b = a.batch_size
    rng = np.random.default_rng(0)
    res: dict[str, Any] = {}

    def put(name: str, value: tuple[float, list[float]]) -> float:
        res[name] = {"median_images_per_s": value[0], "runs": value[1]}
        print(f"{name:<44} {value[0]:>10,.0f} images/s   runs: {', '.join(f'{r:,.0f}' for r in value[1])}", flush=True)
        return value[0]

    print(f"{n} images of {SIZE}x{SIZE}x3, batch {b}, warm page cache, median of {a.repeat}")

    # The ceiling: fancy-index gather from one persistent memory map, one thread.
    def memmap_epoch(order: np.ndarray) -> int:
        for idx in batches_of(order, b):
            _ = mm[np.sort(idx)]
        return n

    put("memmap gather random", rate(lambda: memmap_epoch(rng.permutation(n)), a.repeat))
    put("memmap gather sequential", rate(lambda: memmap_epoch(np.arange(n)), a.repeat))

    def loader_epoch(d: dlpack.Dataset, **kw: Any) -> int:
        k = 0
        for batch in d.loader(batch_size=b, **kw):
            k += len(batch["index"])
        return k

    for name, d in ds.items():
        for order in ("random", "sequential", "block"):
            for workers, prefetch in ((0, 0), (1, 4), (2, 4)):
                seed = iter(range(10**6))
                put(
                    f"dlpack {name} {order} w{workers} p{prefetch}",
                    rate(
                        lambda d=d, o=order, w=workers, pf=prefetch, s=seed: loader_epoch(
                            d, order=o, workers=w, prefetch=pf, seed=next(s)
                        ),
                        a.repeat,
                    ),
                )

    # Rejected designs, measured on the same bytes.
    import h5py
    import zarr

    z = zarr.open_array(str(stores["zarr"] / "images"), mode="r")
    sample = rng.permutation(n)[:200]
    put("zarr-python z[i] (200 random)", rate(lambda: sum(1 for i in sample if z[int(i)] is not None), 1))
    with h5py.File(stores["hdf5"], "r") as f:
        h = f["images"]
        put("h5py ds[i] (200 random)", rate(lambda: sum(1 for i in sample if h[int(i)] is not None), 3))
    ctx = mp.get_context("spawn")
    with ctx.Pool(2, initializer=_proc_init, initargs=(str(stores["hdf5"]),)) as pool:
        put(
            "process pool (2 procs, pickled) hdf5 random",
            rate(lambda: sum(len(x) for x in pool.imap(_proc_batch, batches_of(rng.permutation(n), b))), a.repeat),
        )

    # The scattered folder, decoded by 2 threads (cv2 releases the GIL), random order.
    files = [src / it.rel for it in FolderSource(src).scan().items]

    def folder_epoch() -> int:
        pick = rng.permutation(len(files))[: a.folder_samples]

        def load(i: int) -> np.ndarray:
            return load_folder_image(files[i])

        with ThreadPoolExecutor(2) as ex:
            for idx in batches_of(pick, b):
                np.stack(list(ex.map(load, idx)))
        return len(pick)

    put("PNG folder, decode+resize, 2 threads, random", rate(folder_epoch, max(1, a.repeat // 2)))

    # Simulated training step: is the step ever waiting for data? A step twice as long as the
    # read (the hardest case that can still be 100 % busy), and 10 and 30 ms steps.
    read_ms = 1000 * b / res["dlpack hdf5 random w2 p4"]["median_images_per_s"]
    steps_ms = [a.step_ms] if a.step_ms else [round(max(2.0, 2 * read_ms), 1), 10.0, 30.0]
    res["step_ms"] = steps_ms
    for step_ms in steps_ms:
        for name, d in ds.items():
            for prefetch in (0, 1, 4):
                busy = []
                for rep in range(3):
                    loader = d.loader(batch_size=b, workers=2, prefetch=prefetch, seed=rep)
                    t0 = time.perf_counter()
                    steps = 0
                    for _batch in loader:
                        time.sleep(step_ms / 1000)
                        steps += 1
                    wall = time.perf_counter() - t0
                    busy.append(steps * step_ms / 1000 / wall)
                med = statistics.median(busy)
                key = f"busy {name} step {step_ms} ms prefetch {prefetch}"
                res[key] = {"median_busy": med, "runs": busy}
                print(f"{key:<44} {100 * med:>9.1f} %")

    ceiling = res["memmap gather random"]["median_images_per_s"]
    folder = res["PNG folder, decode+resize, 2 threads, random"]["median_images_per_s"]
    print("\nratios (targets: >= 0.8 of memmap, random >= 0.9 of sequential, >= 40x folder, busy >= 95 %)")
    ratios: dict[str, float] = {}
    for name in ds:
        best = max(("w0 p0", "w1 p4", "w2 p4"), key=lambda w: res[f"dlpack {name} random {w}"]["median_images_per_s"])
        r = res[f"dlpack {name} random {best}"]["median_images_per_s"]
        sq = res[f"dlpack {name} sequential {best}"]["median_images_per_s"]
        ratios[f"{name} random / memmap ({best})"] = r / ceiling
        ratios[f"{name} random / sequential ({best})"] = r / sq
        ratios[f"{name} random / PNG folder ({best})"] = r / folder
    for k, v in ratios.items():
        print(f"  {k:<44} {v:8.2f}")
    res["ratios"] = ratios
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    res["machine"] = {
        "cpu": next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?"),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": np.__version__,
        "zarr": zarr.__version__,
        "h5py": h5py.__version__,
        "load_average": os.getloadavg(),
    }
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
