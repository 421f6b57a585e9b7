"""dlpack against its peers on the same images and machine, in one run (run by hand, in a separate venv).

    python benchmarks/peers.py --work /tmp/dlpack-peers --json peers.json
    python benchmarks/peers.py --quick                      # tiny counts, 1 epoch: a smoke run

The peers are never project dependencies: install them in their own environment
(benchmarks/peers-requirements.txt says how). A peer that is not installed is reported as
"not installed", one that fails as "failed", and the run goes on.

Cases (``--cases``, ``SIDExCHANNELS:COUNT``): 32x32x1, 64x64x3, 224x224x3 and 512x512x3 sets small
enough to sit in the CPU's last-level cache or close to it, and two that do not (50,000 images at
32x32x1 and 20,000 at 64x64x3; the L3 size is read from sysfs and printed). Per case the script
makes the images once (smooth gradients plus noise, fixed seeds) as a raw file of their bytes and
writes every format from those same arrays: a scattered PNG folder (``class{i%4}/{i:06d}.png``),
dlpack Zarr and HDF5 stores built from it with ``dlpack.build(png, store, size=(S, S))``,
WebDataset tar shards of ``.npy``, LitData ``optimize()`` numpy chunks, Mosaic MDS shards and an
FFCV ``.beton`` (``RGBImageField(write_mode="raw")``, or an ``NDArrayField`` for one channel).
The torch-DataLoader peers and the PNG folder read 1-10k images/s, so cases over
``SLOW_PEERS_MAX`` images leave them out (their epochs would take most of the run).

Rows, each the way its docs show it, batch 32, random order by default, warm page cache:
- ceilings, from a plain ndarray view of a memory map of the raw bytes into one preallocated
  batch, in a random order: ``np.take(view, b, axis=0, out=, mode='clip')``, fancy indexing
  ``view[b]`` and a per-image copy loop; the fastest of the three is "the ceiling". A 2-thread
  gather (each thread takes every other batch with ``np.take``) shows what two cores can copy;
- dlpack Zarr and HDF5 with ``LoaderOptions`` defaults (workers not passed), and with
  ``workers`` 0, 1 and 2 (prefetch 4, or 0 with ``workers=0``);
- the PNG folder decoded by ``cv2.imdecode`` inline (0) or on 1 or 2 threads;
- WebDataset, LitData and Mosaic Streaming through a torch DataLoader with 0, 1 or 2 workers
  (persistent, so worker start-up is not timed);
- FFCV raw with 1 or 2 workers (it has no 0).
Every peer's "common setting" is 2 workers; its "best" is its fastest worker count here.

Every epoch of every row is checked: the first (warm-up) epoch compares every pixel of every
batch with the source bytes; each timed epoch checks that every sample comes exactly once, that
the batch shape is right and that 64 bytes from the middle of every image equal the source; the
time spent checking is taken off the epoch's time. A row with a
failing epoch FAILS (table and JSON) and the script exits 1, unless the failure is a known,
documented limitation of that peer (``KNOWN_LIMITS``).

Timing: the median epoch of at least ``--repeat`` timed epochs and ``--min-seconds``, after the
warm-up. Other processes distort the figures on a 2-core machine: each timed block records the
share of the CPUs other processes used meanwhile (/proc/stat minus this process and its workers),
and a block over ``--max-other`` is re-run, up to ``--max-tries`` blocks, the quietest kept.
``--rounds`` repeats the whole list of rows (interleaving the rows, each round starting further down
the list after the ceilings) and pools their epochs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

import dlpack

sys.path.insert(0, str(Path(__file__).parent))
from _cpu import busy_cpu_s as _busy_cpu_s  # noqa: E402
from _cpu import own_cpu_s as _own_cpu_s  # noqa: E402
from _memory import placed_empty  # noqa: E402

BATCH = 32
COMMON_WORKERS = 2
WDS_BUFFER = 256
DEFAULT_CASES = "32x1:2000,64x3:2000,224x3:500,512x3:400,32x1:50000,64x3:20000"
QUICK_CASES = "32x1:64,64x3:64"
#: Cases with more images leave out the torch-DataLoader peers and the PNG folder (1-10k images/s).
SLOW_PEERS_MAX = 5000
#: Bytes per image compared in every timed epoch (the warm-up epoch compares all of them).
SAMPLED_BYTES = 64
#: Peers and the module each imports; one that does not import is "not installed".
PEER_MODULES = {"WebDataset": "webdataset", "LitData": "litdata", "Mosaic": "streaming", "FFCV": "ffcv"}
#: Check failures that are a peer's documented behaviour (group -> why); they do not fail the run.
KNOWN_LIMITS: dict[str, str] = {}


@dataclass(frozen=True)
class Case:
    size: int
    channels: int
    count: int

    @property
    def name(self) -> str:
        return f"{self.size}x{self.size}x{self.channels}-{self.count}"

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.size, self.size, self.channels)

    @property
    def nbytes(self) -> int:
        return self.count * self.size * self.size * self.channels

    @property
    def slow_peers(self) -> bool:
        return self.count <= SLOW_PEERS_MAX


def parse_cases(text: str) -> list[Case]:
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            shape, count = part.split(":")
            side, ch = shape.lower().split("x")
            out.append(Case(int(side), int(ch), int(count)))
        except ValueError:
            raise SystemExit(f"--cases: {part!r} is not SIDExCHANNELS:COUNT (e.g. 64x3:2000)") from None
        if out[-1].channels not in (1, 3):
            raise SystemExit(f"--cases: {part!r}: channels must be 1 or 3")
    return out


def l3_bytes() -> int | None:
    """The last-level cache of CPU 0 (sysfs), for saying which cases fit in it."""
    sizes = []
    for d in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        with contextlib.suppress(OSError, ValueError):
            s = (d / "size").read_text().strip()
            mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1], 1)
            sizes.append(int(s.rstrip("KM")) * mult)
    return max(sizes) if sizes else None


# ------------------------------------------------------------------ data


def make_image(case: Case, i: int) -> np.ndarray:
    """Image ``i`` of a case: smooth gradients plus noise (PNG about 0.6x raw, like photos)."""
    s, c = case.size, case.channels
    rng = np.random.default_rng([7, s, c, i])
    base = cv2.resize(rng.integers(0, 256, (8, 8, c), dtype=np.uint8), (s, s), interpolation=cv2.INTER_CUBIC)
    base = base.reshape(s, s, c)
    return np.clip(base.astype(np.int16) + rng.integers(-6, 7, (s, s, c)), 0, 255).astype(np.uint8)


class RawImages:
    """The images of one case, read from the raw file; picklable (only the path travels)."""

    def __init__(self, path: Path, case: Case) -> None:
        self.path, self.case = str(path), case
        self._mm: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "case": self.case, "_mm": None}

    @property
    def mm(self) -> np.ndarray:
        """A plain ndarray view of the memory map (a np.memmap subclass makes every gather slower)."""
        if self._mm is None:
            mm = np.memmap(self.path, dtype=np.uint8, mode="r", shape=(self.case.count, *self.case.shape))
            self._mm = mm.view(np.ndarray)
        return self._mm

    def __len__(self) -> int:
        return self.case.count

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:  # FFCV's DatasetWriter wants tuples
        return np.array(self.mm[i]), int(i)


def litdata_item(images: RawImages, i: int) -> dict[str, Any]:
    img, label = images[i]
    return {"image": img, "label": label}


def installed(group: str) -> bool:
    module = PEER_MODULES.get(group)
    return module is None or importlib.util.find_spec(module) is not None


def step(name: str, fn: Callable[[], Any], times: dict[str, float], done: Path) -> None:
    """Run ``fn`` once (writes a format) unless ``done`` marks it finished; record its seconds."""
    if done.exists():
        times[name] = json.loads(done.read_text())["seconds"]
        return
    t = time.perf_counter()
    print(f"  writing {name} ...", flush=True)
    fn()
    times[name] = time.perf_counter() - t
    done.write_text(json.dumps({"seconds": times[name]}))


FORMAT_FILES = {"raw": "raw.u8", "zarr": "s.zarr", "hdf5": "s.h5", "ffcv": "s.beton"}
FORMAT_GROUP = {"wds": "WebDataset", "litdata": "LitData", "mds": "Mosaic", "ffcv": "FFCV"}
FORMATS = ("raw", "png", "zarr", "hdf5", "wds", "litdata", "mds", "ffcv")


def format_paths(work: Path) -> dict[str, Path]:
    return {k: work / FORMAT_FILES.get(k, k) for k in FORMATS}


def write_formats(work: Path, case: Case) -> None:
    """Every format of one case, from the same arrays; write times and errors go to files in ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    paths = format_paths(work)
    times: dict[str, float] = {}
    errors: dict[str, str] = {}
    images = RawImages(paths["raw"], case)
    count, size = case.count, case.size
    workers = min(2, os.cpu_count() or 1)

    def raw() -> None:
        with open(paths["raw"], "wb") as f:
            for i in range(count):
                f.write(make_image(case, i).tobytes())

    def png() -> None:
        def one(i: int) -> None:
            d = paths["png"] / f"class{i % 4}"
            d.mkdir(parents=True, exist_ok=True)
            img = images[i][0]
            ok, buf = cv2.imencode(".png", img[:, :, 0] if case.channels == 1 else cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            (d / f"{i:06d}.png").write_bytes(buf.tobytes())

        with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
            list(ex.map(one, range(count)))

    def store(key: str) -> Callable[[], None]:
        def go() -> None:
            if paths[key].exists():
                shutil.rmtree(paths[key]) if paths[key].is_dir() else paths[key].unlink()
            dlpack.build(paths["png"], paths[key], size=(size, size), channels=case.channels, quiet=True)

        return go

    def wds() -> None:
        import webdataset

        shutil.rmtree(paths["wds"], ignore_errors=True)
        paths["wds"].mkdir()
        per = math.ceil(count / 8)  # 8 shards, so 2 workers both get some
        with webdataset.ShardWriter(str(paths["wds"] / "shard-%06d.tar"), maxcount=per, verbose=0) as sink:
            for i in range(count):
                img, label = images[i]
                sink.write({"__key__": f"{i:06d}", "npy": img, "cls": label})

    def litdata() -> None:
        import functools

        from litdata import optimize

        shutil.rmtree(paths["litdata"], ignore_errors=True)
        with contextlib.redirect_stdout(io.StringIO()):
            optimize(
                fn=functools.partial(litdata_item, images),
                inputs=list(range(count)),
                output_dir=str(paths["litdata"]),
                chunk_bytes="64MB",
                num_workers=workers,
                verbose=False,
            )

    def mds() -> None:
        from streaming import MDSWriter

        shutil.rmtree(paths["mds"], ignore_errors=True)
        columns = {"image": f"ndarray:uint8:{size},{size},{case.channels}", "label": "int"}
        with MDSWriter(out=str(paths["mds"]), columns=columns, size_limit=1 << 26) as out:
            for i in range(count):
                img, label = images[i]
                out.write({"image": img, "label": label})

    def ffcv() -> None:
        from ffcv.fields import IntField, NDArrayField, RGBImageField
        from ffcv.writer import DatasetWriter

        paths["ffcv"].unlink(missing_ok=True)
        image: Any = (
            RGBImageField(write_mode="raw", max_resolution=size)
            if case.channels == 3
            else NDArrayField(dtype=np.dtype("uint8"), shape=case.shape)
        )
        DatasetWriter(
            str(paths["ffcv"]), {"image": image, "label": IntField()}, num_workers=workers
        ).from_indexed_dataset(images)

    plan: list[tuple[str, Callable[[], None]]] = [("raw", raw), ("png", png), ("zarr", store("zarr"))]
    plan.append(("hdf5", store("hdf5")))
    if case.slow_peers:
        plan += [("wds", wds), ("litdata", litdata), ("mds", mds)]
    plan.append(("ffcv", ffcv))
    for name, fn in plan:
        group = FORMAT_GROUP.get(name)
        if group is not None and not installed(group):
            errors[name] = "not installed"
            continue
        try:
            step(name, fn, times, work / f".done-{name}")
        except Exception as exc:  # a peer that cannot write is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}".strip()[:500]
            print(f"  {name}: write failed: {errors[name]}", flush=True)
            if name in ("raw", "png", "zarr", "hdf5"):
                raise
    (work / ".write-errors.json").write_text(json.dumps(errors))
    (work / ".write-times.json").write_text(json.dumps(times))


def write_in_child(work: Path, case: Case) -> dict[str, Any]:
    """Write the formats in a child process: LitData's optimize() leaves state behind that made its
    own loader 50x slower afterwards in the same process (seen here), so measuring starts clean."""
    spec = f"{case.size}x{case.channels}:{case.count}"
    subprocess.run([sys.executable, __file__, "--write-only", "--work", str(work.parent), "--cases", spec], check=True)
    return {
        "write_seconds": json.loads((work / ".write-times.json").read_text()),
        "write_errors": json.loads((work / ".write-errors.json").read_text()),
    }


# ------------------------------------------------------------------ loaders
# A factory takes (paths, images, order, workers) and returns an Epochs: ``run(add)`` reads one
# epoch and calls ``add(images, source indices)`` per batch; ``close()`` frees what it holds.


class Epochs:
    def __init__(
        self,
        epoch: Callable[[], Iterator[tuple[Any, Any]]] | None = None,
        close: Callable[[], None] | None = None,
        run: Callable[[Callable[[Any, Any], None]], None] | None = None,
    ) -> None:
        self._epoch = epoch
        self._run = run
        self.close = close or (lambda: None)

    def run(self, add: Callable[[Any, Any], None]) -> None:
        if self._run is not None:
            self._run(add)
            return
        assert self._epoch is not None
        for imgs, ids in self._epoch():
            add(imgs, ids)


Factory = Callable[[dict[str, Path], RawImages, str, int | None], Epochs]


def _order(n: int, order: str, rng: np.random.Generator) -> np.ndarray:
    return rng.permutation(n) if order == "random" else np.arange(n)


def take_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    view, n = images.mm, len(images)
    out = placed_empty((BATCH, *images.case.shape))
    rng = np.random.default_rng(0)

    def epoch() -> Iterator[tuple[Any, Any]]:
        idx = _order(n, order, rng)
        for s in range(0, n, BATCH):
            b = idx[s : s + BATCH]
            o = out[: len(b)]
            np.take(view, b, axis=0, out=o, mode="clip")
            yield o, b

    return Epochs(epoch)


def fancy_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    view, n = images.mm, len(images)
    rng = np.random.default_rng(0)

    def epoch() -> Iterator[tuple[Any, Any]]:
        idx = _order(n, order, rng)
        for s in range(0, n, BATCH):
            b = idx[s : s + BATCH]
            yield view[b], b

    return Epochs(epoch)


def loop_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    view, n = images.mm, len(images)
    out = placed_empty((BATCH, *images.case.shape))
    rng = np.random.default_rng(0)

    def epoch() -> Iterator[tuple[Any, Any]]:
        idx = _order(n, order, rng)
        for s in range(0, n, BATCH):
            b = idx[s : s + BATCH]
            for j, i in enumerate(b.tolist()):
                out[j] = view[i]
            yield out[: len(b)], b

    return Epochs(epoch)


def gather2_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    """Two threads, each gathering every other batch with np.take into its own buffer: no hand-off."""
    view, n = images.mm, len(images)
    bufs = [placed_empty((BATCH, *images.case.shape)) for _ in range(2)]
    rng = np.random.default_rng(0)
    pool = ThreadPoolExecutor(2)

    def run(add: Callable[[Any, Any], None]) -> None:
        idx = _order(n, order, rng)
        starts = list(range(0, n, BATCH))

        def work(t: int) -> None:
            for s in starts[t::2]:
                b = idx[s : s + BATCH]
                o = bufs[t][: len(b)]
                np.take(view, b, axis=0, out=o, mode="clip")
                add(o, b)

        list(pool.map(work, (0, 1)))

    return Epochs(run=run, close=lambda: pool.shutdown(wait=True))


def dlpack_loader(key: str) -> Factory:
    def make(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
        ds = dlpack.open(paths[key])
        shape = tuple(ds.manifest.image.shape or ())
        if shape != images.case.shape:
            ds.close()
            raise RuntimeError(f"the store holds {shape} images, not {images.case.shape}")
        # Store index -> index of the source image (the build orders samples by path).
        src = np.array([int(Path(s).stem) for s in ds.reader.sources(range(len(ds)))], np.int64)
        kw: dict[str, Any] = {} if workers is None else {"workers": workers, "prefetch": 0 if workers == 0 else 4}
        loader = ds.loader(batch_size=BATCH, order=order, seed=0, **kw)

        def epoch() -> Iterator[tuple[Any, Any]]:
            for batch in loader:  # each full pass advances the loader to its next epoch
                yield batch["image"], src[batch["index"]]

        return Epochs(epoch, ds.close)

    return make


def folder_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    n, gray = len(images), images.case.channels == 1
    files = [paths["png"] / f"class{i % 4}" / f"{i:06d}.png" for i in range(n)]
    pool = ThreadPoolExecutor(workers) if workers else None
    rng = np.random.default_rng(0)

    def load(i: int) -> np.ndarray:
        buf = np.frombuffer(files[i].read_bytes(), np.uint8)
        if gray:
            return cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)[:, :, None]
        return cv2.cvtColor(cv2.imdecode(buf, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)

    def epoch() -> Iterator[tuple[Any, Any]]:
        idx = _order(n, order, rng)
        it = pool.map(load, idx.tolist()) if pool else map(load, idx.tolist())  # cv2 releases the GIL
        for s in range(0, n, BATCH):
            b = idx[s : s + BATCH]
            yield np.stack([next(it) for _ in b]), b

    return Epochs(epoch, lambda: pool.shutdown(wait=True) if pool else None)


def _dl_kw(workers: int | None) -> dict[str, Any]:
    w = COMMON_WORKERS if workers is None else workers
    return {"num_workers": w, "persistent_workers": w > 0}


def wds_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    import webdataset as wds

    urls = sorted(str(p) for p in paths["wds"].glob("shard-*.tar"))
    if not urls:
        raise RuntimeError("no WebDataset shards were written")
    random = order == "random"
    ds = wds.WebDataset(urls, shardshuffle=len(urls) if random else False, empty_check=False, seed=0)
    if random:
        ds = ds.shuffle(WDS_BUFFER)  # a shard shuffle plus a 256-sample buffer: not a permutation
    ds = ds.decode().to_tuple("npy", "cls").batched(BATCH, partial=True)
    loader = wds.WebLoader(ds, batch_size=None, **_dl_kw(workers))

    def epoch() -> Iterator[tuple[Any, Any]]:
        yield from loader

    return Epochs(epoch, lambda: _end_workers(loader))


def litdata_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    from litdata import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(input_dir=str(paths["litdata"]), shuffle=order == "random", seed=0)
    # With persistent workers LitData still reshuffles every epoch ("epochs differ" checks it).
    loader = StreamingDataLoader(ds, batch_size=BATCH, **_dl_kw(workers))

    def epoch() -> Iterator[tuple[Any, Any]]:
        for batch in loader:
            yield batch["image"], batch["label"]

    return Epochs(epoch, lambda: _end_workers(loader))


def mosaic_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    ds = StreamingDataset(local=str(paths["mds"]), shuffle=order == "random", batch_size=BATCH, shuffle_seed=0)
    loader = DataLoader(ds, batch_size=BATCH, **_dl_kw(workers))

    def epoch() -> Iterator[tuple[Any, Any]]:
        for batch in loader:
            yield batch["image"], batch["label"]

    def close() -> None:  # Mosaic holds the local folder in shared memory until the dataset is gone
        nonlocal ds, loader
        _end_workers(loader)
        del loader, ds
        gc.collect()

    return Epochs(epoch, close)


def ffcv_loader(paths: dict[str, Path], images: RawImages, order: str, workers: int | None) -> Epochs:
    from ffcv.fields.decoders import IntDecoder, NDArrayDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption

    decoder = SimpleRGBImageDecoder() if images.case.channels == 3 else NDArrayDecoder()
    loader = Loader(
        str(paths["ffcv"]),
        batch_size=BATCH,
        num_workers=COMMON_WORKERS if workers is None else workers,
        order=OrderOption.RANDOM if order == "random" else OrderOption.SEQUENTIAL,
        os_cache=True,
        drop_last=False,
        seed=0,
        pipelines={"image": [decoder], "label": [IntDecoder()]},
    )

    def epoch() -> Iterator[tuple[Any, Any]]:
        yield from loader

    return Epochs(epoch, loader.close if hasattr(loader, "close") else None)


def _end_workers(loader: Any) -> None:
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


@dataclass(frozen=True)
class Row:
    group: str  # "ceiling", "dlpack Zarr", ..., a peer's name
    label: str  # what differs inside the group ("defaults", "workers=2", ...)
    key: str  # the format it reads
    factory: Factory
    workers: int | None  # None: the loader's own default

    @property
    def name(self) -> str:
        return f"{self.group}, {self.label}"


def rows_for(case: Case) -> list[Row]:
    rows = [
        Row("ceiling", "np.take mode='clip'", "raw", take_loader, 1),
        Row("ceiling", "fancy indexing", "raw", fancy_loader, 1),
        Row("ceiling", "per-image copy loop", "raw", loop_loader, 1),
        Row("2-thread gather", "np.take mode='clip'", "raw", gather2_loader, 2),
    ]
    for key, group in (("zarr", "dlpack Zarr"), ("hdf5", "dlpack HDF5")):
        rows.append(Row(group, "defaults", key, dlpack_loader(key), None))
        rows += [Row(group, f"workers={w}", key, dlpack_loader(key), w) for w in (0, 1, 2)]
    if case.slow_peers:
        rows += [Row("PNG folder + cv2", f"threads={w}", "png", folder_loader, w) for w in (0, 1, 2)]
        for group, key, factory in (
            ("WebDataset", "wds", wds_loader),
            ("LitData", "litdata", litdata_loader),
            ("Mosaic", "mds", mosaic_loader),
        ):
            rows += [Row(group, f"workers={w}", key, factory, w) for w in (0, 1, 2)]
    rows += [Row("FFCV", f"workers={w}", "ffcv", ffcv_loader, w) for w in (1, 2)]
    return rows


# ------------------------------------------------------------------ checks and timing


def _np(x: Any) -> np.ndarray:
    if hasattr(x, "numpy"):
        x = x.numpy()
    return np.asarray(x)


class Check:
    """What one epoch delivered: sample indices, image count, and pixels compared with the source."""

    def __init__(self, images: RawImages, positions: slice, full: bool) -> None:
        self.source = images.mm.reshape(len(images), -1)
        self.shape = images.case.shape
        self.positions, self.full = positions, full
        self.ids: list[np.ndarray] = []
        self.sampled: list[np.ndarray] = []
        self.problems: list[str] = []
        self.seconds = 0.0  # spent in add(): taken off the epoch's time
        self.lock = threading.Lock()

    def add(self, imgs: Any, ids: Any) -> None:
        t0 = time.perf_counter()
        a = _np(imgs)
        i = np.array(ids if not hasattr(ids, "numpy") else ids.numpy(), dtype=np.int64).reshape(-1)
        with self.lock:
            self.ids.append(i)
            if a.shape[1:] != self.shape or len(a) != len(i):
                self.problems.append(f"batch of {a.shape} for {len(i)} samples, not (B, {self.shape})")
            elif self.full:
                flat = a.reshape(len(a), -1)
                if (i < 0).any() or (i >= len(self.source)).any() or not np.array_equal(flat, self.source[i]):
                    self.problems.append("pixels differ from the source")
            else:
                self.sampled.append(a.reshape(len(a), -1)[:, self.positions].copy())
            self.seconds += time.perf_counter() - t0

    @property
    def count(self) -> int:
        return sum(len(i) for i in self.ids)

    def verdict(self) -> tuple[np.ndarray, str | None]:
        """The epoch's indices in order, and None or what is wrong with the epoch."""
        n = len(self.source)
        ids = np.concatenate(self.ids) if self.ids else np.empty(0, np.int64)
        if self.problems:
            return ids, self.problems[0]
        if len(ids) != n or (ids < 0).any() or (ids >= n).any() or (np.bincount(ids, minlength=n) != 1).any():
            dup = len(ids) - len(np.unique(ids))
            return ids, f"{len(ids)} samples of {n}, {len(np.unique(ids))} distinct ({dup} repeated)"
        if self.sampled and not np.array_equal(np.concatenate(self.sampled), self.source[ids][:, self.positions]):
            return ids, "sampled pixels differ from the source"
        return ids, None


def measure(
    epochs: Epochs, images: RawImages, repeat: int, min_seconds: float, max_other: float, tries: int
) -> dict[str, Any]:
    """A fully checked warm-up epoch, then timed, checked epochs; images/s is the median epoch."""
    n = len(images)
    per_image = int(np.prod(images.case.shape))
    start = max(0, per_image // 2 - SAMPLED_BYTES // 2)
    positions = slice(start, min(per_image, start + SAMPLED_BYTES))  # a slice: cheaper than scattered bytes
    warm = Check(images, positions, full=True)
    epochs.run(warm.add)
    first, problem = warm.verdict()
    failures = [f"warm-up epoch: {problem}"] if problem else []
    displacement = float(np.mean(np.abs(first - np.arange(n)))) / n if len(first) == n else float("nan")
    differ = None
    blocks = []
    for _ in range(max(1, tries)):
        rates: list[float] = []
        b0, o0 = _busy_cpu_s(), _own_cpu_s()
        t_block = time.perf_counter()
        while len(rates) < repeat or time.perf_counter() - t_block < min_seconds:
            chk = Check(images, positions, full=False)
            t = time.perf_counter()
            epochs.run(chk.add)
            # The check's own time is taken off (it runs on the consuming thread, like a short step).
            rates.append(chk.count / max(1e-9, time.perf_counter() - t - chk.seconds))
            ids, problem = chk.verdict()
            if problem:
                failures.append(f"timed epoch {len(rates)}: {problem}")
            if differ is None:
                differ = bool(len(ids) != len(first) or (ids != first).any())
        wall = time.perf_counter() - t_block
        b1, o1 = _busy_cpu_s(), _own_cpu_s()
        cpus = os.cpu_count() or 1
        other = min(1.0, max(0.0, (b1 - b0) - (o1 - o0)) / (wall * cpus)) if b0 is not None and b1 is not None else 0.0
        blocks.append({"runs": rates, "other_cpu_share": other, "own_cpu_share": (o1 - o0) / (wall * cpus)})
        if other <= max_other:
            break
    best = min(blocks, key=lambda b: b["other_cpu_share"])
    return {
        "images_per_s": statistics.median(best["runs"]),
        "runs": best["runs"],
        "other_cpu_share": best["other_cpu_share"],
        "own_cpu_share": best["own_cpu_share"],
        "blocks_tried": len(blocks),
        "epochs_checked": 1 + sum(len(b["runs"]) for b in blocks),
        "failures": failures,
        "displacement": displacement,
        "epochs_differ": differ,
    }


# ------------------------------------------------------------------ report


def versions() -> dict[str, str]:
    out = {}
    for pkg in (
        "dlpack-datasets",
        "numpy",
        "zarr",
        "h5py",
        "opencv-python-headless",
        "torch",
        "torchvision",
        "webdataset",
        "litdata",
        "mosaicml-streaming",
        "ffcv",
        "numba",
    ):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def machine() -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    mem = next(
        (ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")), "0"
    )
    return {
        "cpu": next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?"),
        "cores": os.cpu_count(),
        "memory_gb": round(int(mem) / 1e6, 1),
        "l3_bytes": l3_bytes(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": versions(),
    }


def status(r: dict[str, Any]) -> str:
    """``ok``, ``FAIL: ...``, ``known limit: ...``, ``not installed`` or ``failed: ...``."""
    if "skipped" in r:
        return str(r["skipped"])
    if "error" in r:
        return f"failed: {r['error'][:120]}"
    if r["failures"]:
        return ("known limit: " if r.get("known_limit") else "FAIL: ") + r["failures"][0]
    return "ok"


def rate(res: dict[str, Any], name: str) -> float | None:
    v = res["rows"].get(name, {}).get("images_per_s")
    return float(v) if v else None


def ceiling(res: dict[str, Any]) -> tuple[str, float] | None:
    got = [(n, r["images_per_s"]) for n, r in res["rows"].items() if n.startswith("ceiling,") and "images_per_s" in r]
    return max(got, key=lambda x: x[1]) if got else None


def best_of(res: dict[str, Any], group: str) -> tuple[str, float] | None:
    """A group's fastest row that passed its checks."""
    got = [
        (n, r["images_per_s"])
        for n, r in res["rows"].items()
        if n.startswith(group + ",") and "images_per_s" in r and not r["failures"]
    ]
    return max(got, key=lambda x: x[1]) if got else None


PEER_GROUPS = ("PNG folder + cv2", "WebDataset", "LitData", "Mosaic", "FFCV")
TARGET_PEERS = ("WebDataset", "LitData", "Mosaic", "FFCV")


def print_table(case: Case, res: dict[str, Any], order: str) -> None:
    ceil = ceiling(res)
    l3 = l3_bytes()
    fits = "" if l3 is None else (" (fits in the L3)" if case.nbytes <= l3 else " (larger than the L3)")
    print(
        f"\n{case.size}x{case.size}x{case.channels}, {case.count:,} images = {case.nbytes / 2**20:.1f} MiB{fits}, "
        f"batch {BATCH}, {order} order, warm, median epoch"
    )
    print("| loader | img/s | / ceiling | other CPU | check |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name, r in res["rows"].items():
        v = r.get("images_per_s")
        cells = f"{v:,.0f} | {v / ceil[1]:.2f}" if v and ceil else "- | -"
        other = f"{100 * r['other_cpu_share']:.0f} %" if "other_cpu_share" in r else "-"
        print(f"| {name} | {cells} | {other} | {status(r)} |")
    if ceil:
        print(f"ceiling: {ceil[0]} ({ceil[1]:,.0f} img/s)")
    print("\n| peer | best (workers) img/s | common (2 workers) img/s | dlpack Zarr defaults / best |")
    print("| --- | ---: | ---: | ---: |")
    mine = rate(res, "dlpack Zarr, defaults")
    for group in ("dlpack Zarr", "dlpack HDF5", *PEER_GROUPS):
        best = best_of(res, group)
        if best is None:
            first = next((r for n, r in res["rows"].items() if n.startswith(group + ",")), None)
            if first is not None:
                print(f"| {group} | {status(first)} | | |")
            continue
        common_name = f"{group}, {'threads' if group.startswith('PNG') else 'workers'}={COMMON_WORKERS}"
        common = rate(res, common_name)
        ratio = f"{mine / best[1]:.2f}" if mine else "-"
        print(
            f"| {group} | {best[1]:,.0f} ({best[0].split(', ', 1)[1]}) | "
            f"{f'{common:,.0f}' if common else '-'} | {ratio} |"
        )


def targets(case: Case, res: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets this case checks, each with its ratio, need and pass/fail."""
    out: list[dict[str, Any]] = []
    ceil = ceiling(res)
    side = case.size
    for store in ("dlpack Zarr", "dlpack HDF5"):
        mine = rate(res, f"{store}, defaults")
        if mine is None:
            continue
        if side in (32, 64, 512) and case.slow_peers:
            for peer in TARGET_PEERS:
                best = best_of(res, peer)
                if best is not None:
                    out.append(
                        {"target": f"{store} defaults / {peer} best ({best[0].split(', ', 1)[1]})", "need": 1.0}
                        | {"ratio": mine / best[1]}
                    )
        best = best_of(res, "FFCV")
        if best is not None:
            out.append(
                {"target": f"{store} defaults / FFCV raw best ({best[0].split(', ', 1)[1]})", "need": 1.5}
                | {"ratio": mine / best[1]}
            )
        if ceil:
            need = 0.5 if (side, case.channels) == (32, 1) else 0.8
            for w in (0, 2):
                v = rate(res, f"{store}, workers={w}")
                if v is not None:
                    out.append({"target": f"{store} workers={w} / ceiling", "need": need, "ratio": v / ceil[1]})
    for t in out:
        t["met"] = t["ratio"] >= t["need"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/tmp/dlpack-peers", help="folder for the images and every format")
    p.add_argument("--cases", default=None, help=f"SIDExCHANNELS:COUNT,... (default {DEFAULT_CASES})")
    p.add_argument("--quick", action="store_true", help=f"a smoke run: cases {QUICK_CASES}, one timed epoch")
    p.add_argument("--orders", default="random", help="comma-separated: random, sequential (default random)")
    p.add_argument("--repeat", type=int, default=3, help="timed epochs per row at least (median; default 3)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="time each row at least this long (default 1)")
    p.add_argument("--rounds", type=int, default=1, help="run the list of rows this many times, interleaved")
    p.add_argument(
        "--max-other",
        type=float,
        default=0.15,
        help="re-time a row when other processes used more than this share of the CPUs meanwhile (default 0.15)",
    )
    p.add_argument("--max-tries", type=int, default=2, help="timed blocks per row at most (default 2)")
    p.add_argument("--only", default="", help="comma-separated substrings: measure only rows whose name matches")
    p.add_argument("--json", default=None, help="write every result and the machine facts here")
    p.add_argument("--write-only", action="store_true", help=argparse.SUPPRESS)  # the child that writes formats
    a = p.parse_args(argv)
    if a.quick:
        a.repeat, a.min_seconds, a.max_tries, a.max_other = 1, 0.0, 1, 1.0
    cases = parse_cases(a.cases or (QUICK_CASES if a.quick else DEFAULT_CASES))
    if a.write_only:
        for case in cases:
            write_formats(Path(a.work) / case.name, case)
        return 0
    # Mosaic and WebDataset hand read-only numpy arrays to torch's collate, which warns once per worker.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    orders = [o.strip() for o in a.orders.split(",") if o.strip()]
    if not set(orders) <= {"random", "sequential"}:
        raise SystemExit(f"--orders: {a.orders!r}: use random and/or sequential")
    only = [s.strip().lower() for s in a.only.split(",") if s.strip()]
    report: dict[str, Any] = {
        "machine": machine(),
        "load_average_before": os.getloadavg(),
        "batch_size": BATCH,
        "repeat": a.repeat,
        "min_seconds": a.min_seconds,
        "rounds": a.rounds,
        "max_other": a.max_other,
        "wds_shuffle_buffer": WDS_BUFFER,
        "argv": sys.argv,
        "cases": {},
    }
    print(f"load average before: {report['load_average_before']}; L3 {l3_bytes()} bytes")
    t_all = time.perf_counter()
    with contextlib.suppress(Exception):
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()  # Mosaic: leftovers of a crashed run block the next one
    failed_rows: list[str] = []
    missing = [g for g in PEER_MODULES if not installed(g)]
    for g in missing:
        print(f"{g}: not installed (No module named '{PEER_MODULES[g]}')")
    for case in cases:
        print(f"\n== {case.name}: writing formats (once) ...", flush=True)
        work = Path(a.work) / case.name
        written = write_in_child(work, case)
        paths, images = format_paths(work), RawImages(format_paths(work)["raw"], case)
        for order in orders:
            res: dict[str, Any] = {"case": case.__dict__, "order": order, "rows": {}, **written}
            rows = [r for r in rows_for(case) if r.key == "raw" or not only or any(s in r.name.lower() for s in only)]
            runs: dict[str, list[dict[str, Any]]] = {r.name: [] for r in rows}
            for rnd in range(max(1, a.rounds)):
                # Each round starts further down the list (the raw ceilings always first): no dlpack or
                # peer row always runs right after the same one (a 2-thread gather slowed the next row).
                rest = [r for r in rows if r.key != "raw"]
                k = rnd * max(1, len(rest) // max(1, a.rounds)) % max(1, len(rest))
                for row in [r for r in rows if r.key == "raw"] + rest[k:] + rest[:k]:
                    if row.group in PEER_MODULES and not installed(row.group):
                        runs[row.name].append({"skipped": "not installed"})
                        continue
                    if row.key in written["write_errors"]:
                        runs[row.name].append({"skipped": f"format not written: {written['write_errors'][row.key]}"})
                        continue
                    t = time.perf_counter()
                    epochs = None
                    try:
                        epochs = row.factory(paths, images, order, row.workers)
                        v = measure(epochs, images, a.repeat, a.min_seconds, a.max_other, a.max_tries)
                        runs[row.name].append(v)
                        print(
                            f"{row.name:<44} {v['images_per_s']:>11,.0f} img/s  other CPU "
                            f"{100 * v['other_cpu_share']:.0f} %  {v['epochs_checked']} epochs checked: "
                            f"{'; '.join(v['failures'][:1]) or 'ok'} ({time.perf_counter() - t:.1f} s)",
                            flush=True,
                        )
                    except Exception as exc:  # a peer that fails is reported, not fatal
                        msg = f"{type(exc).__name__}: {exc}".strip()
                        runs[row.name].append({"error": msg[:500], "traceback": traceback.format_exc()[-2000:]})
                        print(f"{row.name:<44} failed: {msg[:300]}", flush=True)
                    finally:
                        if epochs is not None:
                            with contextlib.suppress(Exception):
                                epochs.close()
                        del epochs
                        gc.collect()
            for row in rows:
                got = runs[row.name]
                timed = [g for g in got if "images_per_s" in g]
                if not timed:
                    res["rows"][row.name] = got[0]
                    if "error" in got[0] and row.group not in PEER_MODULES:
                        failed_rows.append(f"{case.name} {order} {row.name}: {got[0]['error']}")
                    continue
                all_runs = [x for g in timed for x in g["runs"]]
                failures = [f for g in timed for f in g["failures"]]
                r = {**timed[-1], "images_per_s": statistics.median(all_runs), "runs": all_runs, "failures": failures}
                r["other_cpu_share"] = max(g["other_cpu_share"] for g in timed)
                r["known_limit"] = KNOWN_LIMITS.get(row.group) if failures else None
                res["rows"][row.name] = r
                if failures and not r["known_limit"]:
                    failed_rows.append(f"{case.name} {order} {row.name}: {failures[0]}")
            res["targets"] = targets(case, res) if order == "random" else []
            report["cases"][f"{case.name} {order}"] = res
            print_table(case, res, order)
            if res["targets"]:
                print("targets:")
                for t in res["targets"]:
                    print(
                        f"  {t['target']:<58} {t['ratio']:6.2f}x (need {t['need']}x)  {'pass' if t['met'] else 'FAIL'}"
                    )
    report["failed_rows"] = failed_rows
    report["load_average_after"] = os.getloadavg()
    report["seconds"] = time.perf_counter() - t_all
    print(f"\nload average after: {report['load_average_after']}; {report['seconds']:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2, default=str))
    if failed_rows:
        print(f"\n{len(failed_rows)} row(s) FAILED their checks:", *failed_rows, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
