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

Two sections run on their own (and only them) with a flag:

    python benchmarks/loader.py --small --work /tmp/dlpack-small --repeat 5 --json small.json
    python benchmarks/loader.py --steps --work /tmp/dlpack-small --repeat 3 --json steps.json

- ``--small``: small images (32x32x1, 64x64x3; 224x224x3 and 512x512x3 for reference), sets that fit
  in the CPU cache and sets that do not; per case the ceiling, the fastest NumPy gather of the same
  images in the same order from a memory map of the same bytes into one preallocated batch (a
  per-image copy loop, fancy indexing, ``np.take(axis=0, out=)`` with ``mode='raise'`` and
  ``mode='clip'``), a 2-thread gather, and the loader (Zarr, HDF5; workers 0, 1, 2 and the default),
  interleaved, as ratios to the ceiling; and, in the same rounds, the Zarr loader over the same
  store with its shards mapped one ``mmap`` each ("maps each", :func:`one_map_each`), as before
  they were mapped end to end in one range, for a before/after in one run.
- ``--steps``: simulated 5 ms training steps fed by the loader: one holding the GIL for 1.5 ms
  (pure Python, like a PyTorch step's own code) then releasing it for 3.5 ms, one releasing it
  throughout (``time.sleep``); busy % by the loader's ``stats()`` and by the step's own clock, for
  the default and workers 0, 1, 2, and the default without read-ahead across epochs
  (``read_ahead_epochs=False``), at 512x512x3 batches of 32, 64x64x3 batches of 256 and of 32.
  ``--quick`` shrinks both to a smoke run.

``--torch-only`` runs just the PyTorch-path section (:func:`torch_main`) on a 256x256x3 store,
random order, warm cache, 2 workers, interleaved epochs:

    python benchmarks/loader.py --torch-only --work /tmp/dlpack-torch-bench --count 1500 --repeat 5

``ds.loader`` uint8 against ``torch_loader`` uint8 (the default channels_last view, and
contiguous NCHW), float32 normalised against the conversion the adapter made before (kept here as
:func:`before_to_tensor`), ``TorchDataset`` in a ``DataLoader(num_workers=2)``, and one batch's
conversion three ways (the earlier passes, the fused scale-and-shift, a per-channel lookup table).
Then the uint8 target on its own (:func:`paired_torch`): ``ds.loader`` and ``torch_loader`` in a
new random order each round, images/s and CPU time per batch, and where a batch's time goes with
``workers=0`` (:func:`torch_profile`); ``--torch-baseline FILE`` adds
another checkout's adapter as a third arm (``git show REV:dlpack/torch.py > FILE``), and
``--torch-workers`` sets the loaders' workers (2 by default, or ``auto``, or 0).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import shutil
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
from _memory import placed_empty  # noqa: E402

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


# ---------------------------------------------------------------- small images and short steps

#: (side, channels, images, batch, fits the CPU cache); the caches here are 1 MiB L2 per core and 32 MiB L3.
SMALL_CASES = (
    (32, 1, 10000, 256, True),
    (32, 1, 50000, 256, False),
    (64, 3, 1500, 256, True),
    (64, 3, 20000, 256, False),
    (224, 3, 600, 32, False),
    (512, 3, 300, 32, False),
)
QUICK_CASES = ((32, 1, 600, 64, True), (64, 3, 300, 64, True))


def small_store(work: Path, side: int, channels: int, count: int) -> dict[str, Any]:
    """PNGs of ``side`` x ``side`` x ``channels`` built into a Zarr and an HDF5 store (kept when
    there), and a raw file of the same image bytes, memory-mapped: a plain view of the map."""
    import cv2

    root = work / f"small-{side}x{side}x{channels}-{count}"
    src = root / "png"
    if not (root / "raw.u8").exists():
        shutil.rmtree(root, ignore_errors=True)

        def one(i: int) -> None:
            rng = np.random.default_rng([11, i])
            img = rng.integers(0, 256, (side, side, channels), dtype=np.uint8)
            d = src / f"class{i % 4}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{i:06d}.png").write_bytes(cv2.imencode(".png", img)[1].tobytes())

        with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
            list(ex.map(one, range(count)))
        for name in ("s.zarr", "s.h5"):
            dlpack.build(src, root / name, size=(side, side), channels=channels, quiet=True)
        h5 = dlpack.open(root / "s.h5")
        with open(root / "raw.tmp", "wb") as f:
            for st in range(0, count, 1024):
                f.write(h5.get_batch(range(st, min(count, st + 1024)))["image"].tobytes())
        os.replace(root / "raw.tmp", root / "raw.u8")
        shutil.rmtree(src)
    mm = np.memmap(root / "raw.u8", dtype=np.uint8, mode="r", shape=(count, side, side, channels))
    return {"zarr": dlpack.open(root / "s.zarr"), "hdf5": dlpack.open(root / "s.h5"), "view": np.asarray(mm)}


def one_map_each(path: Path) -> dlpack.Dataset:
    """The Zarr store at ``path`` with its shards mapped one ``mmap`` each, as before they were
    mapped end to end in one range (and as where the platform cannot): a comparison in the same
    run, in the same state of the process's address space."""
    from dlpack.backends import _shard

    real = _shard.map_consecutive
    _shard.map_consecutive = lambda sizes, open_file, align=1, arena=None: None
    try:
        ds = dlpack.open(path)
        ds.get_batch([0, len(ds) - 1])  # maps every array a batch reads, while the patch holds
    finally:
        _shard.map_consecutive = real
    return ds


def _timed_epochs(epoch: Any, min_s: float) -> float:
    """Images/s of ``epoch(e) -> images`` run with e = 0, 1, ... until ``min_s`` seconds have passed."""
    t = time.perf_counter()
    n, e = 0, 0
    while True:
        n += epoch(e)
        e += 1
        dt = time.perf_counter() - t
        if dt >= min_s:
            return n / dt


def small_section(work: Path, repeat: int, quick: bool) -> dict[str, Any]:
    """The small-image figures: per case, every gather and loader interleaved (each round starts at
    another method), ``repeat`` rounds."""
    out: dict[str, Any] = {}
    min_s = 0.05 if quick else 0.4
    for side, ch, count, b, in_cache in QUICK_CASES if quick else SMALL_CASES:
        key, row = small_case(work, side, ch, count, b, in_cache, repeat, min_s)
        out[key] = row
    return out


def small_case(
    work: Path, side: int, ch: int, count: int, b: int, in_cache: bool, repeat: int, min_s: float
) -> tuple[str, dict[str, Any]]:
    """One small-image case: the gathers and the loaders, interleaved, ``repeat`` rounds."""
    got = small_store(work, side, ch, count)
    view = got["view"]
    n = len(view)
    bufs = [placed_empty((b, side, side, ch)) for _ in range(2)]
    orders: dict[int, list[np.ndarray]] = {}

    def batches(e: int, n: int = n, b: int = b) -> list[np.ndarray]:
        if e not in orders:  # the same order for every method of a round (drawn outside the timing)
            orders[e] = batches_of(np.random.default_rng([5, e]).permutation(n).astype(np.int64), b)
        return orders[e]

    def loop(e: int, view: np.ndarray = view, buf: np.ndarray = bufs[0]) -> int:
        for idx in batches(e):
            for j, i in enumerate(idx.tolist()):
                buf[j] = view[i]
        return n

    def fancy(e: int, view: np.ndarray = view, buf: np.ndarray = bufs[0]) -> int:
        for idx in batches(e):
            buf[: len(idx)] = view[idx]
        return n

    def take(mode: Any, view: np.ndarray = view, buf: np.ndarray = bufs[0]) -> Any:
        def run(e: int) -> int:
            for idx in batches(e):
                np.take(view, idx, axis=0, out=buf[: len(idx)], mode=mode)
            return n

        return run

    pool2 = ThreadPoolExecutor(2)

    def two_threads(e: int, view: np.ndarray = view) -> int:
        bs = batches(e)

        def half(h: int) -> None:
            for idx in bs[h::2]:
                np.take(view, idx, axis=0, out=bufs[h][: len(idx)], mode="clip")

        list(pool2.map(half, (0, 1)))
        return n

    loaders = {
        f"dlpack {backend} workers={w}": got[backend].loader(batch_size=b, workers=w)
        for backend in ("zarr", "hdf5")
        for w in ("auto", 0, 1, 2)
    }
    each = one_map_each(Path(got["zarr"].path))
    for w in ("auto", 0):  # shards mapped one by one, side by side (they land between earlier maps' holes)
        loaders[f"dlpack zarr workers={w}, maps each"] = each.loader(batch_size=b, workers=w)

    def through(loader: Any) -> Any:
        def run(e: int) -> int:
            loader.set_epoch(e)
            k = 0
            for batch in loader:
                k += len(batch["index"])
            return k

        return run

    methods: dict[str, Any] = {
        "gather: per-image loop": loop,
        "gather: fancy indexing": fancy,
        "gather: np.take raise": take("raise"),
        "gather: np.take clip": take("clip"),
        "gather: np.take clip, 2 threads": two_threads,
    } | {name: through(ld) for name, ld in loaders.items()}
    runs: dict[str, list[float]] = {name: [] for name in methods}
    for fn in methods.values():
        fn(0)  # warm: page cache, maps, threads
    names = list(methods)
    for r in range(repeat):  # each round starts at another method: none always follows the same one
        k = r * max(1, len(names) // repeat) % len(names)
        for name in names[k:] + names[:k]:
            runs[name].append(_timed_epochs(methods[name], min_s))
    pool2.shutdown()
    med = {name: statistics.median(r) for name, r in runs.items()}
    one_thread = [k for k in med if k.startswith("gather:") and "2 threads" not in k]
    ceiling_name = max(one_thread, key=med.__getitem__)
    ceiling = med[ceiling_name]
    key = f"{side}x{side}x{ch} x{count} batch {b}"
    print(f"\n{key} ({'fits the CPU cache' if in_cache else 'larger than the CPU cache'}), median of {repeat}")
    for name in methods:
        print(f"  {name:<36} {med[name]:>13,.0f} images/s  {med[name] / ceiling:5.2f}x ceiling")
    print(f"  ceiling: {ceiling_name}; {repr(loaders['dlpack zarr workers=auto']).split(' {')[0]}>")
    row = {
        "side": side, "channels": ch, "count": count, "batch": b, "fits_cache": in_cache,
        "ceiling": ceiling_name, "ceiling_images_per_s": ceiling,
        "median_images_per_s": med, "runs": runs,
        "ratios": {name: med[name] / ceiling for name in methods},
        "auto": loaders["dlpack zarr workers=auto"].workers,
    }  # fmt: skip
    for ld in loaders.values():
        ld.close()
    return key, row


def _gil_step(ms: float) -> None:
    """A step like a PyTorch one: 30 % pure Python (holds the GIL), then 70 % GIL-free waiting."""
    end = time.perf_counter() + 0.3 * ms / 1000
    while time.perf_counter() < end:
        pass
    time.sleep(0.7 * ms / 1000)


def _sleep_step(ms: float) -> None:
    time.sleep(ms / 1000)


def steps_section(work: Path, repeat: int, quick: bool, step_ms: float = 5.0) -> dict[str, Any]:
    """Busy % of short steps fed by the loader: per shape, step kind and workers, ``repeat`` epochs."""
    # 64x64x3 batches of 32 (384 KiB): what "auto" reads on the calling thread (it fits the L2 cache).
    cases = (
        ((64, 3, 600, 64), (128, 3, 200, 16)) if quick else ((512, 3, 1280, 32), (64, 3, 20000, 256), (64, 3, 2000, 32))
    )
    out: dict[str, Any] = {}
    print(f"\nsimulated {step_ms:g} ms steps (busy = share of the epoch outside next(); target >= 95 %)")
    for side, ch, count, b in cases:
        ds = small_store(work, side, ch, count)["zarr"]
        for kind, step in (("GIL 1.5 ms + sleep 3.5 ms", _gil_step), ("sleep 5 ms", _sleep_step)):
            loaders: dict[Any, Any] = {w: ds.loader(batch_size=b, workers=w) for w in ("auto", 0, 1, 2)}
            loaders["auto, no read-ahead across epochs"] = ds.loader(batch_size=b, read_ahead_epochs=False)
            own: dict[str, list[float]] = {str(w): [] for w in loaders}
            for e in range(repeat + 1):  # the first epoch warms the page cache and the threads
                for w, ld in loaders.items():
                    ld.set_epoch(e)
                    t0 = time.perf_counter()
                    stepping = 0.0
                    for _batch in ld:
                        s0 = time.perf_counter()
                        step(step_ms)
                        stepping += time.perf_counter() - s0
                    if e:
                        own[str(w)].append(stepping / (time.perf_counter() - t0))
            key = f"{side}x{side}x{ch} batch {b}, {kind}"
            row: dict[str, Any] = {}
            for w, ld in loaders.items():
                stats = [st.busy_share for st in ld.stats()[1:]]
                row[str(w)] = {
                    "busy_stats": statistics.median(stats), "busy_own_clock": statistics.median(own[str(w)]),
                    "runs_stats": stats, "runs_own_clock": own[str(w)], "workers": ld.workers,
                }  # fmt: skip
                ld.close()
            out[key] = row | {"default": repr(loaders["auto"]).split(" {")[0] + ">"}
            shown = "  ".join(
                f"{w if w != 'auto' else 'default'}: {100 * r['busy_stats']:.1f}/{100 * r['busy_own_clock']:.1f} %"
                for w, r in row.items()
            )
            print(f"  {key:<44} {shown}   (stats/own clock)")
    return out


# ---------------------------------------------------------------- the PyTorch path

TORCH_SIZE = 256
TORCH_MEAN = (0.485, 0.456, 0.406)
TORCH_STD = (0.229, 0.224, 0.225)


def before_to_tensor(images: np.ndarray, dtype: Any, mean: Any = None, std: Any = None) -> Any:
    """The adapter's conversion before it moved to the reader threads (the "before" arm): a
    contiguous NHWC -> NCHW copy on the training thread, then scale, subtract and divide passes."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)
    if dtype == torch.uint8 and images.dtype == np.uint8 and mean is None:
        return t.contiguous()
    scale = float(np.iinfo(images.dtype).max)
    t = t.to(dtype if dtype.is_floating_point else torch.float32).div_(scale)
    if mean is not None or std is not None:
        m = torch.tensor(mean if mean is not None else [0.0], dtype=t.dtype).view(1, -1, 1, 1)
        s = torch.tensor(std if std is not None else [1.0], dtype=t.dtype).view(1, -1, 1, 1)
        t = t.sub_(m).div_(s)
    return t.contiguous()


def conversion_ms(images: np.ndarray, repeat: int) -> dict[str, float]:
    """Median ms to turn one uint8 batch into normalised float32 NCHW: the earlier passes, the
    fused scale-and-shift (``torch.addcmul``, one pass; into channels_last as rows of W x C values,
    as the adapter does, and into NCHW), and a per-channel 256-entry table (``np.take``)."""
    import torch

    from dlpack.torch import scale_shift

    n, h, w, c = images.shape
    a, b = scale_shift(images.dtype, c, TORCH_MEAN, TORCH_STD)
    at = torch.tensor(a, dtype=torch.float32).view(1, c, 1, 1)
    bt = torch.tensor(b, dtype=torch.float32).view(1, c, 1, 1)
    lut = (np.arange(256, dtype=np.float64)[None, :] * a[:, None] + b[:, None]).astype(np.float32)
    out = torch.empty((n, c, h, w), dtype=torch.float32)
    arr = out.numpy()
    x = torch.from_numpy(images)

    rows = torch.empty((n, h, w, c), dtype=torch.float32)  # channels_last, as rows of W x C values
    arow, brow = at.view(c).repeat(w), bt.view(c).repeat(w)

    def fused() -> None:
        torch.addcmul(brow, x.view(n * h, w * c), arow, out=rows.view(n * h, w * c))

    def fused_nchw() -> None:
        torch.addcmul(bt, x.permute(0, 3, 1, 2), at, out=out)

    def table() -> None:
        for k in range(c):
            np.take(lut[k], images[..., k], out=arr[:, k])

    arms = {
        "before": lambda: before_to_tensor(images, torch.float32, TORCH_MEAN, TORCH_STD),
        "fused": fused,
        "fused NCHW": fused_nchw,
        "table": table,
    }
    times: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(2 * max(4, repeat) + 1):
        for k, fn in arms.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: 1000 * statistics.median(v[1:]) for k, v in times.items()}


def baseline_adapter(path: str) -> Any:
    """``dlpack/torch.py`` of another checkout (``git show REV:dlpack/torch.py > FILE``), loaded as
    a module of this dlpack: its ``torch_loader`` over the same store, loader and threads, so the
    paired arms compare the adapters alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dlpack._torch_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--torch-baseline {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def paired_torch(arms: dict[str, Any], n: int, b: int, rounds: int) -> dict[str, Any]:
    """``ds.loader`` against the uint8 adapter arms, one epoch each per round in a new random
    order every round (no arm always follows the same one), ``rounds`` rounds after a warm-up.

    Per arm: images/s, and process CPU time per batch, the work the arm costs whatever else the
    machine runs (wall rates move with the load of other processes; the CPU time much less). The
    ratios are medians over rounds of each round's ratio to the first arm."""
    order = np.random.default_rng(7)
    names = list(arms)
    rates: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    batches = -(-n // b)

    def epoch(name: str) -> tuple[float, float]:
        t, c, k = time.perf_counter(), time.process_time(), 0
        for batch in arms[name]:
            k += len(batch["index"])
        assert k == n, f"{name}: an epoch held {k} of {n} images"
        return k / (time.perf_counter() - t), 1e6 * (time.process_time() - c) / batches

    for name in names:
        epoch(name)
    for _ in range(rounds):
        for j in order.permutation(len(names)):
            r, c = epoch(names[j])
            rates[names[j]].append(r)
            cpu[names[j]].append(c)
    base = names[0]
    return {
        "rounds": rounds,
        "median_images_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "cpu_us_per_batch": {k: statistics.median(v) for k, v in cpu.items()},
        "ratio_to_ds_loader": {
            k: statistics.median(x / y for x, y in zip(rates[k], rates[base], strict=True)) for k in names[1:]
        },
        "cpu_ratio_to_ds_loader": {
            k: statistics.median(x / y for x, y in zip(cpu[k], cpu[base], strict=True)) for k in names[1:]
        },
        "runs": rates,
        "cpu_runs": cpu,
    }


def torch_profile(arms: dict[str, Any], rounds: int) -> dict[str, dict[str, float]]:
    """Where a batch's time goes with ``workers=0`` (everything on the calling thread): per arm,
    the median microseconds of the source's ``get_batch``, of the adapter's finisher, and of the
    rest of ``next()`` (the loader's own work, the adapter's hand-over, freeing the batch before).
    ``arms`` are loaders or torch loaders with ``workers=0``, each timed one epoch per round."""
    times: dict[str, dict[str, list[int]]] = {k: {"get_batch": [], "finisher": [], "next": []} for k in arms}
    for name, arm in arms.items():
        ld, got = getattr(arm, "loader", arm), times[name]
        src, fin = ld.source, ld.finisher

        class Timed:  # the source, its get_batch timed (a BatchSource is duck-typed)
            def __getattr__(self, key: str, src: Any = src) -> Any:
                return getattr(src, key)

            def __len__(self, src: Any = src) -> int:
                return len(src)

            def get_batch(self, idx: Any, epoch: int = 0, out: Any = None, src: Any = src, got: Any = got) -> Any:
                t = time.perf_counter_ns()
                batch = src.get_batch(idx, epoch, out)
                got["get_batch"].append(time.perf_counter_ns() - t)
                return batch

            def get_valid_batch(self, idx: Any, epoch: int = 0, out: Any = None, src: Any = src, got: Any = got) -> Any:
                read = getattr(src, "get_valid_batch", None) or src.get_batch  # what the loader calls
                t = time.perf_counter_ns()
                batch = read(idx, epoch, out)
                got["get_batch"].append(time.perf_counter_ns() - t)
                return batch

        ld.source = Timed()
        if fin is not None:

            def timed(batch: dict[str, Any], fin: Any = fin, got: Any = got) -> Any:
                t = time.perf_counter_ns()
                out = fin(batch)
                got["finisher"].append(time.perf_counter_ns() - t)
                return out

            ld.finisher = timed
    names = list(arms)
    for r in range(rounds + 1):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            it, got = iter(arms[name]), times[name]["next"]
            while True:
                t = time.perf_counter_ns()
                batch = next(it, None)
                if batch is None:
                    break
                got.append(time.perf_counter_ns() - t)
        if r == 0:  # a warm-up round
            for got_arm in times.values():
                for v in got_arm.values():
                    v.clear()
    out: dict[str, dict[str, float]] = {}
    for name, got in times.items():
        med = {k: statistics.median(v) / 1e3 if v else 0.0 for k, v in got.items()}
        out[name] = {"get_batch_us": med["get_batch"], "finisher_us": med["finisher"],
                     "rest_of_next_us": med["next"] - med["get_batch"] - med["finisher"], "next_us": med["next"]}  # fmt: skip
    return out


def torch_main(a: argparse.Namespace) -> int:
    """The PyTorch-path section: every arm one epoch in turn, ``--repeat`` rounds, medians; then
    the uint8 adapter paired with ``ds.loader`` alone (:func:`paired_torch`)."""
    import torch

    from dlpack.torch import TorchDataset, torch_loader

    work = Path(a.work)
    src = work / f"png{TORCH_SIZE}"
    make_pngs(src, a.count, TORCH_SIZE)
    path = work / f"s{TORCH_SIZE}.zarr"
    if not path.exists():
        dlpack.build(src, path, size=(TORCH_SIZE, TORCH_SIZE), quiet=True)
    ds = dlpack.open(path)
    n, b = len(ds), a.batch_size
    workers: Any = a.torch_workers if a.torch_workers == "auto" else int(a.torch_workers)
    kw: dict[str, Any] = {"batch_size": b, "workers": workers, "prefetch": 4}
    float_kw: dict[str, Any] = {"dtype": torch.float32, "mean": TORCH_MEAN, "std": TORCH_STD, "pin_memory": False}
    # One loader per arm for the whole run, as a training script keeps one: each pass is the next epoch.
    plain, before_u8, before_f = (ds.loader(seed=k, **kw) for k in range(3))
    t_cl = torch_loader(ds, seed=3, pin_memory=False, **kw)
    t_c = torch_loader(ds, seed=4, pin_memory=False, memory_format=torch.contiguous_format, **kw)
    t_f = torch_loader(ds, seed=5, **float_kw, **kw)
    t_fc = torch_loader(ds, seed=6, memory_format=torch.contiguous_format, **float_kw, **kw)
    loaders: dict[str, Any] = {
        "ds.loader uint8": lambda: plain,
        "torch_loader uint8 channels_last": lambda: t_cl,
        "torch_loader uint8 contiguous": lambda: t_c,
        "before uint8 (to_tensor on the caller)": lambda: (
            before_to_tensor(x["image"], torch.uint8) for x in before_u8
        ),
        "torch_loader float32 normalised": lambda: t_f,
        "torch_loader float32 normalised contiguous": lambda: t_fc,
        "before float32 normalised": lambda: (
            before_to_tensor(x["image"], torch.float32, TORCH_MEAN, TORCH_STD) for x in before_f
        ),
    }
    tds = TorchDataset(path)
    dl = torch.utils.data.DataLoader(
        tds, batch_size=b, shuffle=True, num_workers=2, persistent_workers=True, collate_fn=tds.collate_fn
    )
    loaders["TorchDataset + DataLoader(num_workers=2)"] = lambda: dl

    def epoch(make: Any) -> float:
        t = time.perf_counter()
        k = 0
        for batch in make():
            k += len(batch["index"]) if isinstance(batch, dict) else len(batch)
        assert k == n, f"an epoch held {k} of {n} images"
        return k / (time.perf_counter() - t)

    runs: dict[str, list[float]] = {name: [] for name in loaders}
    for make in loaders.values():
        epoch(make)  # warm-up: page cache, threads, worker processes
    names = list(loaders)
    for r in range(max(4, a.repeat)):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # each arm after each other in turn
            runs[name].append(epoch(loaders[name]))
    res: dict[str, Any] = {
        "images": n,
        "size": TORCH_SIZE,
        "batch_size": b,
        "torch": torch.__version__,
        "runs": runs,
        "median_images_per_s": {k: statistics.median(v) for k, v in runs.items()},
    }
    print(f"{n} images of {TORCH_SIZE}x{TORCH_SIZE}x3, batch {b}, random, warm cache, workers {workers}, "
          f"median of {max(4, a.repeat)} interleaved epochs")  # fmt: skip
    for k, v in res["median_images_per_s"].items():
        print(f"{k:<46} {v:>10,.0f} images/s   runs: {', '.join(f'{r:,.0f}' for r in runs[k])}", flush=True)

    def ratio(num: str, den: str) -> float:
        """Median over rounds of the two arms' rate ratio within one round: on a shared machine
        the load moves both arms of a round alike, and the rounds' medians each other less."""
        return statistics.median(x / y for x, y in zip(runs[num], runs[den], strict=True))

    base, before_f = "ds.loader uint8", "before float32 normalised"
    ratios = {
        "torch uint8 channels_last / ds.loader (target >= 0.95)": ratio("torch_loader uint8 channels_last", base),
        "torch uint8 contiguous / ds.loader": ratio("torch_loader uint8 contiguous", base),
        "before uint8 / ds.loader": ratio("before uint8 (to_tensor on the caller)", base),
        "float32 new / before (target >= 3)": ratio("torch_loader float32 normalised", before_f),
        "float32 new contiguous / before": ratio("torch_loader float32 normalised contiguous", before_f),
        "TorchDataset+DataLoader / ds.loader": ratio("TorchDataset + DataLoader(num_workers=2)", base),
    }
    res["ratios"] = ratios
    print("\nratios (median of the per-round ratios)")
    for k, v in ratios.items():
        print(f"  {k:<56} {v:8.2f}")
    # The uint8 target in a phase of its own: the arms above share the rounds with 7 others.
    paired = {
        "ds.loader uint8": ds.loader(seed=10, **kw),
        "torch_loader uint8": torch_loader(ds, seed=11, pin_memory=False, **kw),
    }
    if a.torch_baseline:
        old = baseline_adapter(a.torch_baseline)
        paired[f"baseline torch_loader uint8 ({Path(a.torch_baseline).name})"] = old.torch_loader(
            ds, seed=12, pin_memory=False, **kw
        )
    # The same reader threads in every arm (workers="auto" picks per loader), said rather than assumed.
    threads = {getattr(ld, "loader", ld).workers for ld in paired.values()}
    assert len(threads) == 1, f"the paired arms read on different thread counts: {threads}"
    # An epoch of 1000 images takes ~40 ms: many short rounds, so a burst of other load moves a
    # few per-round ratios rather than the median.
    rounds = max(60, 20 * a.repeat)
    res["paired"] = pr = paired_torch(paired, n, b, rounds)
    print(f"\nuint8 paired with ds.loader, {rounds} rounds in random order, workers {kw['workers']} -> {threads}:")
    for k in paired:
        ratio_s = (f"  ratio {pr['ratio_to_ds_loader'][k]:.3f}, cpu ratio {pr['cpu_ratio_to_ds_loader'][k]:.3f}"
                   if k in pr["ratio_to_ds_loader"] else "")  # fmt: skip
        print(f"  {k:<52} {pr['median_images_per_s'][k]:>9,.0f} images/s  "
              f"{pr['cpu_us_per_batch'][k]:6.0f} us cpu/batch{ratio_s}", flush=True)  # fmt: skip
    one = {"batch_size": b, "workers": 0, "prefetch": 0}
    arms0: dict[str, Any] = {
        "ds.loader uint8": ds.loader(seed=20, **one),
        "torch_loader uint8": torch_loader(ds, seed=21, pin_memory=False, **one),
    }
    if a.torch_baseline:
        arms0["baseline torch_loader uint8"] = old.torch_loader(ds, seed=22, pin_memory=False, **one)
    res["profile_workers0"] = prof = torch_profile(arms0, max(8, a.repeat))
    print(f"\nwhere a batch's time goes, workers=0, median us of {max(8, a.repeat)} epochs each:")
    for k, v in prof.items():
        print(f"  {k:<30} get_batch {v['get_batch_us']:7.1f}  finisher {v['finisher_us']:6.1f}  "
              f"rest of next() {v['rest_of_next_us']:6.1f}  next() {v['next_us']:7.1f}")  # fmt: skip
    first = ds.get_batch(np.arange(min(b, n)))["image"]
    res["conversion_ms"] = conversion_ms(first, a.repeat)
    print(
        "one batch to normalised float32 NCHW: " + ", ".join(f"{k} {v:.1f} ms" for k, v in res["conversion_ms"].items())
    )
    res["load_average"] = os.getloadavg()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2))
    ds.close()
    return 0


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
    p.add_argument("--small", action="store_true", help="run only the small-image section")
    p.add_argument("--steps", action="store_true", help="run only the short-step section")
    p.add_argument("--quick", action="store_true", help="with --small/--steps: tiny sets (a smoke run)")
    p.add_argument("--torch-only", action="store_true", help="run only the PyTorch-path section (256x256x3)")
    p.add_argument(
        "--torch-baseline", default=None, help="with --torch-only: another checkout's dlpack/torch.py as a paired arm"
    )
    p.add_argument("--torch-workers", default="2", help="with --torch-only: the loaders' workers (an integer, or auto)")
    a = p.parse_args(argv)
    if a.torch_only:
        return torch_main(a)
    work = Path(a.work)
    if a.small or a.steps:
        work.mkdir(parents=True, exist_ok=True)
        print(f"{platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}; load {os.getloadavg()}")
        doc: dict[str, Any] = {"command": " ".join(["python", "benchmarks/loader.py", *(argv or sys.argv[1:])])}
        if a.small:
            doc["small"] = small_section(work, a.repeat, a.quick)
        if a.steps:
            doc["steps"] = steps_section(work, a.repeat, a.quick)
        doc["load_average_after"] = os.getloadavg()
        if a.json:
            Path(a.json).write_text(json.dumps(doc, indent=2))
        return 0
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
