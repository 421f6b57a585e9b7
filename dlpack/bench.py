"""``dlpack bench``: where does the time go? Random vs sequential, warm vs cold, packed vs scattered.

Each *cell* is one (target, cache, order) combination, measured ``repeat`` times through the
same loader a training script uses (``dlpack.Loader``: threads, read-ahead). A target is a dlpack
store or a plain folder of images, which is decoded and resized on the loader's threads to the
store's resolution, as a training script without dlpack would do, so the comparison is fair.

Cold runs evict every file of the target from the page cache first (``posix_fadvise``, no root
needed) and check with ``mincore`` that the pages are gone; see docs/bench.md for the limits.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from . import __version__
from ._machine import load_average, machine_info, mount_of
from ._pagecache import evict, files_under, prime, resident_fraction
from .errors import DlpackError, MissingExtraError, OptionError, StoreError, StoreNotFoundError
from .loader import Loader, LoaderOptions
from .options import parse_size

if TYPE_CHECKING:
    from .dataset import Dataset

__all__ = [
    "BenchOptions",
    "BenchReport",
    "BenchCell",
    "BenchRun",
    "run_bench",
    "check_outputs",
    "ORDERS",
    "CACHES",
]

ORDERS: tuple[str, ...] = ("sequential", "random", "block")
CACHES: tuple[str, ...] = ("warm", "cold")
SCHEMA = "dlpack-bench/1"

#: A cold run counts as verified when at most this fraction of the target's pages is still cached.
EVICTED_MAX = 0.02
#: Below this cached fraction after priming, a "warm" run is partly cold and the report says so.
WARM_MIN = 0.95
# Without --samples/--seconds a run reads one epoch, capped at _MAX_S; warm runs keep reading for
# at least _MIN_S so that tiny, fast stores still give a stable rate.
_MIN_S = 1.0
_MAX_S = 10.0


# ---------------------------------------------------------------- options


def _choices(name: str, flag: str, value: str | Sequence[str], allowed: tuple[str, ...]) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [str(v).strip() for v in items if str(v).strip()]
    bad = [v for v in items if v not in allowed]
    if bad or not items:
        raise OptionError(f"{name} ({flag}) must be a comma-separated list of {', '.join(allowed)}; got {value!r}")
    if len(set(items)) != len(items):
        raise OptionError(f"{name} ({flag}) lists a value twice: {value!r}")
    return tuple(items)


def _int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise OptionError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True)
class BenchOptions:
    """What ``dlpack bench`` measures; its flags are generated from these fields.

    ``orders`` and ``caches`` accept tuples or comma-separated strings (``"sequential,random"``).
    ``samples`` (images per run) and ``seconds`` (per run) are exclusive; with neither, a run
    reads one epoch, at most 10 s, and a warm run keeps reading for at least 1 s. Cold runs read at
    most one epoch (after that the data is cached). ``repeat`` runs per cell give the median and
    the spread. ``step_ms`` adds, per run, a second run that sleeps that long per batch, as a
    training step would, and reports how much of the time the step was busy. ``size`` (W, H) is
    the resolution folder targets are resized to (default: the first store target's).
    ``batch_size``, ``workers`` and ``prefetch`` are the loader's (defaults as in LoaderOptions).
    """

    # Field metadata: the `dlpack bench` flag (see dlpack.cli.add_option_arguments).
    orders: tuple[str, ...] = field(
        default=("sequential", "random"),
        metadata={"help": "comma list of sequential, random, block", "flag": "--order", "metavar": "ORDERS"},
    )
    caches: tuple[str, ...] = field(
        default=("warm", "cold"),
        metadata={
            "help": "comma list of warm, cold (cold evicts the target first)",
            "flag": "--cache",
            "metavar": "CACHES",
        },
    )
    batch_size: int = field(default=32, metadata={"help": "images per batch", "metavar": "B"})
    workers: int = field(default=2, metadata={"help": "loader threads", "metavar": "W"})
    prefetch: int = field(default=4, metadata={"help": "batches read ahead", "metavar": "P"})
    samples: int | None = field(
        default=None,
        metadata={
            "help": "images per run (without it or --seconds: one epoch, 1-10 s; not with --seconds)",
            "metavar": "N",
        },
    )
    seconds: float | None = field(
        default=None, metadata={"help": "seconds per run (not with --samples)", "metavar": "T"}
    )
    repeat: int = field(default=3, metadata={"help": "runs per cell; the median is reported", "metavar": "R"})
    step_ms: float | None = field(
        default=None, metadata={"help": "simulate a training step of MS per batch", "metavar": "MS"}
    )
    size: tuple[int, int] | None = field(
        default=None,
        metadata={"help": "resolution for folder targets (without it: the first store's)", "metavar": "WxH"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the random order"})
    quiet: bool = field(default=False, metadata={"help": "no progress bar"})

    def __post_init__(self) -> None:
        object.__setattr__(self, "orders", _choices("order", "--order", self.orders, ORDERS))
        object.__setattr__(self, "caches", _choices("cache", "--cache", self.caches, CACHES))
        _int("batch_size", self.batch_size, 1)
        _int("workers", self.workers, 0)
        _int("prefetch", self.prefetch, 0)
        _int("repeat", self.repeat, 1)
        _int("seed", self.seed, 0)
        if self.samples is not None and self.seconds is not None:
            raise OptionError("give either samples (--samples N) or seconds (--seconds T) per run, not both")
        if self.samples is not None:
            _int("samples", self.samples, 1)
        if self.seconds is not None and (not isinstance(self.seconds, (int, float)) or not self.seconds > 0):
            raise OptionError(f"seconds must be a number > 0, got {self.seconds!r}")
        if self.step_ms is not None and (
            not isinstance(self.step_ms, (int, float)) or not math.isfinite(self.step_ms) or self.step_ms < 0
        ):
            raise OptionError(f"step_ms must be a number of milliseconds >= 0, got {self.step_ms!r}")
        if self.size is not None:
            object.__setattr__(self, "size", parse_size(self.size))

    def loader_options(self, order: str) -> LoaderOptions:
        return LoaderOptions(
            batch_size=self.batch_size,
            shuffle=order != "sequential",
            seed=self.seed,
            prefetch=self.prefetch,
            workers=self.workers,
            order=cast(Any, order),
        )


def check_outputs(
    json_path: str | os.PathLike[str] | None = None, plot_path: str | os.PathLike[str] | None = None
) -> None:
    """Fail before a long run, not after: the output folders exist and matplotlib is there for a plot."""
    for p in (json_path, plot_path):
        if p is not None:
            parent = Path(p).resolve().parent
            if not parent.is_dir():
                raise OptionError(f"cannot write {os.fspath(p)!r}: the folder {str(parent)!r} does not exist")
    if plot_path is not None:
        _matplotlib()


# ---------------------------------------------------------------- targets


@dataclass(frozen=True)
class _Spec:
    """The batch every target must produce: (W, H), channels, dtype, and how folder images are fitted."""

    size: tuple[int, int]
    channels: int
    dtype: str
    mode: str


class _FolderData:
    """A folder of images behind the two methods the Loader uses: ``len`` and ``get_batch``.

    Decoding and resizing run on the loader's worker threads (OpenCV releases the GIL), exactly
    as a training script's Dataset would do them.
    """

    def __init__(self, root: Path, rels: Sequence[str], spec: _Spec) -> None:
        self.root = root
        self.rels = list(rels)
        self.spec = spec

    def __len__(self) -> int:
        return len(self.rels)

    @property
    def reader(self) -> _FolderData:
        return self

    def warm(self) -> None:
        """Nothing to open ahead: every image is its own file."""

    def close(self) -> None:
        """Nothing held open."""

    def _load(self, i: int) -> np.ndarray:
        from .sources.folder import DecodeError, decode_image, read_source_file
        from .transforms.functional import convert_channels, convert_depth, plan_geometry, resize_image

        path = self.root / self.rels[i]
        try:
            img = decode_image(read_source_file(path))
        except DecodeError as exc:
            raise DlpackError(f"folder target: cannot decode {path}: {exc}; remove or fix the file") from exc
        s = self.spec
        g = plan_geometry(img.shape[0], img.shape[1], s.mode, s.size, allow_upscale=True)
        img = resize_image(img, g)
        return convert_depth(convert_channels(img, s.channels), s.dtype)

    def get_batch(self, indices: Sequence[int], out: np.ndarray | None = None) -> dict[str, Any]:
        w, h = self.spec.size
        if out is None:
            out = np.empty((len(indices), h, w, self.spec.channels), dtype=self.spec.dtype)
        for k, i in enumerate(indices):
            out[k] = self._load(int(i))
        return {"image": out, "index": np.asarray(indices, dtype=np.int64)}


@dataclass
class _Target:
    name: str
    path: Path
    kind: str  # a backend name, or "folder"
    count: int
    files: list[Path]
    bytes_on_disk: int
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    resize_mode: str | None = None
    rels: list[str] = field(default_factory=list)
    sizes: np.ndarray | None = None  # folders: bytes of each file

    @property
    def is_folder(self) -> bool:
        return self.kind == "folder"

    def disk_bytes(self, indices: np.ndarray) -> float:
        if self.sizes is not None:
            return float(self.sizes[indices].sum())
        return len(indices) * self.bytes_on_disk / max(1, self.count)

    def info(self, spec: _Spec | None) -> dict[str, Any]:
        shape = list(self.shape) if self.shape else None
        if self.is_folder and spec is not None:
            shape = [spec.size[1], spec.size[0], spec.channels]
        return {
            "name": self.name,
            "path": str(self.path),
            "kind": self.kind,
            "count": self.count,
            "files": len(self.files),
            "bytes_on_disk": self.bytes_on_disk,
            "disk_bytes_per_image": self.bytes_on_disk / max(1, self.count),
            "image_shape": shape,
            "dtype": (spec.dtype if spec else None) if self.is_folder else self.dtype,
            "decoded_on_the_fly": self.is_folder,
        }


def _resolve(path: str | os.PathLike[str]) -> _Target:
    from .backends import detect_backend
    from .dataset import open as open_store

    p = Path(path)
    if not p.exists():
        raise StoreNotFoundError(
            f"bench target {os.fspath(path)!r} does not exist; give a dlpack store (DIR.zarr, FILE.h5) or a folder of images"
        )
    try:
        backend = detect_backend(p)
    except StoreError:
        if not p.is_dir():
            raise StoreError(
                f"bench target {os.fspath(path)!r} is neither a dlpack store (Zarr folder, HDF5 file) nor a folder of images"
            ) from None
        backend = None
    if backend is None:
        from .sources.folder import scan_folder

        items, _classes, _errors = scan_folder(p, labels="none")
        rels = [it.rel for it in items]
        sizes = np.array([os.path.getsize(p / r) for r in rels], dtype=np.int64)
        return _Target(
            name=p.resolve().name or str(p),
            path=p.resolve(),
            kind="folder",
            count=len(rels),
            files=[p / r for r in rels],
            bytes_on_disk=int(sizes.sum()),
            rels=rels,
            sizes=sizes,
        )
    with open_store(p) as ds:
        m = ds.manifest
        files = files_under(p)
        on_disk = ds.reader.nbytes_on_disk()
        return _Target(
            name=p.resolve().name or str(p),
            path=p.resolve(),
            kind=ds.backend,
            count=m.count,
            files=files,
            bytes_on_disk=on_disk,
            shape=m.image.shape,
            dtype=m.image.dtype,
            resize_mode=str(m.resize.get("mode")) if m.resize else None,
        )


def _reference_spec(targets: Sequence[_Target], options: BenchOptions) -> _Spec | None:
    """The batch shape folder targets are decoded to: the first fixed-size store's, or --size."""
    store = next((t for t in targets if not t.is_folder and t.shape is not None), None)
    channels, dtype, mode = 3, "|u1", "stretch"
    size = options.size
    if store is not None:
        assert store.shape is not None and store.dtype is not None
        h, w, channels = store.shape
        dtype = store.dtype
        mode = store.resize_mode if store.resize_mode in ("stretch", "fit") else "stretch"
        size = size or (w, h)
    if size is None:
        if any(t.is_folder for t in targets):
            raise OptionError(
                "a folder target needs a resolution to resize to, as training would: pass --size WxH "
                "(size=(W, H)) or also bench a fixed-size store, whose resolution is then used"
            )
        return None
    return _Spec(size=size, channels=channels, dtype=dtype, mode=mode)


def _unique_names(targets: list[_Target]) -> None:
    names = [t.name for t in targets]
    for t in targets:
        if names.count(t.name) > 1:
            t.name = str(t.path)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class BenchRun:
    """One timed pass: what was read, how long it took, how long each batch kept the consumer waiting."""

    images: int
    batches: int
    seconds: float
    decoded_bytes: int
    disk_bytes: float
    latency_ms_p50: float
    latency_ms_p99: float
    resident_at_start: float | None
    evicted: bool | None = None
    step_ms: float | None = None
    busy_seconds: float | None = None
    wait_seconds: float = 0.0

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def busy_fraction(self) -> float | None:
        if self.busy_seconds is None or self.seconds <= 0:
            return None
        return min(1.0, self.busy_seconds / self.seconds)

    @property
    def wait_fraction(self) -> float:
        """The share of wall time the consuming loop was blocked waiting for a batch."""
        return min(1.0, self.wait_seconds / self.seconds) if self.seconds > 0 else 0.0

    @property
    def eviction_verified(self) -> bool:
        return self.resident_at_start is not None and self.resident_at_start <= EVICTED_MAX

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["images_per_s"] = self.images_per_s
        d["busy_fraction"] = self.busy_fraction
        d["wait_fraction"] = self.wait_fraction
        return d


@dataclass(frozen=True)
class BenchCell:
    """One (target, cache, order) combination: medians over the runs, and the runs themselves.

    ``latency_ms_*`` is how long the consuming loop was blocked waiting for each batch (with
    read-ahead, the gap between batches). ``vs_sequential`` is this cell's images/s over the
    sequential cell of the same target and cache; ``vs_folder`` over the first folder target's
    cell with the same order and cache. ``busy_fraction`` (with ``step_ms``): the share of wall time a
    simulated training step of that length was running rather than waiting for data, i.e. the
    GPU-Util such a step would see; ``wait_fraction``, measured separately, the share the loop was
    blocked waiting for a batch (the two add up to about 1; the rest is the loop's own overhead).
    """

    target: str
    path: str
    kind: str
    order: str
    cache: str
    repeats: int
    images: int
    seconds: float
    images_per_s: float
    images_per_s_min: float
    images_per_s_max: float
    spread: float
    decoded_mb_per_s: float
    disk_mb_per_s: float
    latency_ms_p50: float
    latency_ms_p99: float
    peak_rss_mb: float | None
    resident_at_start: float | None
    evicted: bool | None
    eviction_verified: bool | None
    step_ms: float | None = None
    busy_fraction: float | None = None
    wait_fraction: float | None = None
    step_images_per_s: float | None = None
    wait_ms_p50: float | None = None
    wait_ms_p99: float | None = None
    vs_sequential: float | None = None
    vs_folder: float | None = None
    runs: tuple[BenchRun, ...] = ()
    step_runs: tuple[BenchRun, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("runs", "step_runs")}
        d["runs"] = [r.to_dict() for r in self.runs]
        d["step_runs"] = [r.to_dict() for r in self.step_runs]
        return d


def _median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64))) if len(values) else 0.0


def _cell(
    target: _Target, order: str, cache: str, runs: list[BenchRun], step_runs: list[BenchRun], rss: float | None
) -> BenchCell:
    ips = [r.images_per_s for r in runs]
    med = _median(ips)
    cold = cache == "cold"
    residents = [r.resident_at_start for r in runs + step_runs]
    known = [x for x in residents if x is not None]
    if len(known) < len(residents) or not known:
        resident = None
    else:
        resident = max(known) if cold else min(known)
    cell = BenchCell(
        target=target.name,
        path=str(target.path),
        kind=target.kind,
        order=order,
        cache=cache,
        repeats=len(runs),
        images=int(_median([r.images for r in runs])),
        seconds=_median([r.seconds for r in runs]),
        images_per_s=med,
        images_per_s_min=min(ips),
        images_per_s_max=max(ips),
        spread=(max(ips) - min(ips)) / med if med > 0 else 0.0,
        decoded_mb_per_s=_median([r.decoded_bytes / r.seconds / 1e6 for r in runs if r.seconds > 0]),
        disk_mb_per_s=_median([r.disk_bytes / r.seconds / 1e6 for r in runs if r.seconds > 0]),
        latency_ms_p50=_median([r.latency_ms_p50 for r in runs]),
        latency_ms_p99=_median([r.latency_ms_p99 for r in runs]),
        peak_rss_mb=rss,
        resident_at_start=resident,
        evicted=all(bool(r.evicted) for r in runs + step_runs) if cold else None,
        eviction_verified=all(r.eviction_verified for r in runs + step_runs) if cold else None,
        runs=tuple(runs),
        step_runs=tuple(step_runs),
    )
    if step_runs:
        busy = _median([r.busy_fraction or 0.0 for r in step_runs])
        cell = replace(
            cell,
            step_ms=step_runs[0].step_ms,
            busy_fraction=busy,
            wait_fraction=_median([r.wait_fraction for r in step_runs]),
            step_images_per_s=_median([r.images_per_s for r in step_runs]),
            wait_ms_p50=_median([r.latency_ms_p50 for r in step_runs]),
            wait_ms_p99=_median([r.latency_ms_p99 for r in step_runs]),
        )
    return cell


# ---------------------------------------------------------------- measuring


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``, no root needed), so each cell gets its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb(scoped: bool) -> float | None:
    if scoped:
        try:
            with open("/proc/self/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024 / 1e6
        except (OSError, ValueError, IndexError):
            pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6  # bytes on macOS, KiB elsewhere


@dataclass(frozen=True)
class _Budget:
    max_images: int | None
    min_seconds: float
    max_seconds: float | None
    one_epoch: bool  # cold runs: stop at the end of the first epoch, whatever else says

    def done(self, images: int, elapsed: float) -> bool:
        if self.max_seconds is not None and elapsed >= self.max_seconds:
            return True
        return (self.max_images is None or images >= self.max_images) and elapsed >= self.min_seconds


def _budget(options: BenchOptions, count: int, cold: bool, stepped: bool) -> _Budget:
    if options.samples is not None:
        return _Budget(options.samples, 0.0, None, cold)
    if options.seconds is not None:
        return _Budget(None, options.seconds, options.seconds, cold)
    return _Budget(count, 0.0 if cold or stepped else _MIN_S, _MAX_S, cold)


def _nbytes(images: Any) -> int:
    if isinstance(images, np.ndarray):
        return int(images.nbytes)
    return int(sum(np.asarray(i).nbytes for i in images))


def _open(target: _Target, spec: _Spec | None) -> Any:
    if target.is_folder:
        assert spec is not None
        return _FolderData(target.path, target.rels, spec)
    from .dataset import open as open_store

    return open_store(target.path)


def _timed_run(
    target: _Target,
    data: Any,
    lopts: LoaderOptions,
    first_epoch: int,
    budget: _Budget,
    step_s: float | None,
) -> tuple[BenchRun, int]:
    """Read batches as a training loop would until the budget is spent; returns the run and the next epoch."""
    loader = Loader(cast("Dataset", data), lopts)
    waits: list[float] = []
    images = batches = decoded = 0
    disk = 0.0
    busy = 0.0
    epoch = first_epoch
    t0 = last = time.perf_counter()
    done = False
    while not done:
        loader.set_epoch(epoch)
        epoch += 1
        it: Iterator[dict[str, Any]] = iter(loader)
        got = 0
        try:
            while True:
                t = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                waits.append(time.perf_counter() - t)
                got += 1
                imgs = batch["image"]
                images += len(imgs)
                batches += 1
                decoded += _nbytes(imgs)
                disk += target.disk_bytes(np.asarray(batch["index"]))
                if step_s:  # a 0 ms step does nothing; sleep(0) would be a GIL hand-off, not a step
                    s0 = time.perf_counter()
                    time.sleep(step_s)
                    busy += time.perf_counter() - s0
                last = time.perf_counter()
                if budget.done(images, last - t0):
                    done = True
                    break
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # stops the read-ahead now instead of at garbage collection
        if budget.one_epoch or got == 0:
            done = True
    # Up to the last batch consumed: stopping mid-epoch waits for in-flight reads nobody will use.
    seconds = last - t0
    w = np.asarray(waits, dtype=np.float64) * 1e3
    run = BenchRun(
        images=images,
        batches=batches,
        seconds=seconds,
        decoded_bytes=decoded,
        disk_bytes=disk,
        latency_ms_p50=float(np.percentile(w, 50)) if len(w) else 0.0,
        latency_ms_p99=float(np.percentile(w, 99)) if len(w) else 0.0,
        resident_at_start=None,
        step_ms=None if step_s is None else step_s * 1e3,
        busy_seconds=None if step_s is None else busy,
        wait_seconds=float(w.sum()) / 1e3,
    )
    return run, epoch


def _close(data: Any) -> None:
    data.close()
    gc.collect()  # drop memory maps now: the kernel keeps mapped pages cached whatever we advise


def _measure_cell(
    target: _Target, spec: _Spec | None, order: str, cache: str, options: BenchOptions, tick: Any
) -> BenchCell:
    lopts = options.loader_options(order)
    step_s = None if options.step_ms is None else options.step_ms / 1e3
    kinds = [None, step_s] if step_s is not None else [None]
    runs: list[BenchRun] = []
    step_runs: list[BenchRun] = []
    scoped = _reset_peak_rss()
    epoch = 0
    if cache == "warm":
        prime(target.files)
        data = _open(target, spec)
        try:
            data.reader.warm()  # open maps and indexes outside the timing, as after a first epoch
            resident = resident_fraction(target.files)
            for _ in range(options.repeat):
                for s in kinds:
                    run, epoch = _timed_run(
                        target, data, lopts, epoch, _budget(options, target.count, False, s is not None), s
                    )
                    run = replace(run, resident_at_start=resident)
                    (runs if s is None else step_runs).append(run)
                    tick()
        finally:
            _close(data)
    else:
        for _ in range(options.repeat):
            for s in kinds:
                advised = evict(target.files)
                resident = resident_fraction(target.files)
                data = _open(target, spec)
                try:
                    run, epoch = _timed_run(
                        target, data, lopts, epoch, _budget(options, target.count, True, s is not None), s
                    )
                finally:
                    _close(data)
                run = replace(run, resident_at_start=resident, evicted=advised)
                (runs if s is None else step_runs).append(run)
                tick()
    return _cell(target, order, cache, runs, step_runs, _peak_rss_mb(scoped))


def _with_ratios(cells: list[BenchCell], targets: list[_Target]) -> list[BenchCell]:
    by_key = {(c.target, c.order, c.cache): c for c in cells}
    folder = next((t.name for t in targets if t.is_folder), None)
    out = []
    for c in cells:
        seq = by_key.get((c.target, "sequential", c.cache))
        vs_seq = c.images_per_s / seq.images_per_s if seq and c.order != "sequential" and seq.images_per_s > 0 else None
        base = by_key.get((folder, c.order, c.cache)) if folder is not None and c.kind != "folder" else None
        vs_folder = c.images_per_s / base.images_per_s if base and base.images_per_s > 0 else None
        out.append(replace(c, vs_sequential=vs_seq, vs_folder=vs_folder))
    return out


# ---------------------------------------------------------------- report


@dataclass(frozen=True)
class BenchReport:
    """Everything one ``run_bench`` measured, with the machine and the exact options.

    :meth:`to_dict`/:meth:`to_json` give every figure; :meth:`table` the terminal table;
    :meth:`plot` a PNG bar chart (extra ``[plot]``).
    """

    options: BenchOptions
    targets: tuple[dict[str, Any], ...]
    cells: tuple[BenchCell, ...]
    machine: dict[str, Any]
    load_average_before: list[float] | None
    load_average_after: list[float] | None
    started: str
    seconds: float
    notes: tuple[str, ...] = ()
    peak_rss_scope: str = "cell"
    dlpack_version: str = __version__

    def cell(self, target: str, order: str, cache: str) -> BenchCell | None:
        """The cell of ``target`` (its name, as in the table), ``order`` and ``cache``, if measured."""
        for c in self.cells:
            if (c.target, c.order, c.cache) == (target, order, cache):
                return c
        return None

    def ratios(self) -> list[dict[str, Any]]:
        """The comparisons the table's ratio columns show, one entry each."""
        out: list[dict[str, Any]] = []
        for c in self.cells:
            if c.vs_sequential is not None:
                out.append(
                    {"name": f"{c.order}/sequential", "target": c.target, "cache": c.cache, "value": c.vs_sequential}
                )
        for c in self.cells:
            if c.vs_folder is not None:
                out.append(
                    {
                        "name": "store/folder",
                        "target": c.target,
                        "order": c.order,
                        "cache": c.cache,
                        "value": c.vs_folder,
                    }
                )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "dlpack_version": self.dlpack_version,
            "started": self.started,
            "seconds": self.seconds,
            "options": asdict(self.options),
            "machine": self.machine,
            "load_average": {"before": self.load_average_before, "after": self.load_average_after},
            "peak_rss_scope": self.peak_rss_scope,
            "targets": list(self.targets),
            "cells": [c.to_dict() for c in self.cells],
            "ratios": self.ratios(),
            "notes": list(self.notes),
        }

    def to_json(self) -> str:
        return json.dumps(_finite(self.to_dict()), indent=2, ensure_ascii=False, allow_nan=False) + "\n"

    def write_json(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    def machine_line(self) -> str:
        m = self.machine
        mem = f", {m['memory_gb']:.0f} GB RAM" if m.get("memory_gb") else ""
        disk = (m.get("disks") or [{}])[0]
        fs = f", {disk['fstype']} on {disk['device']}" if disk.get("fstype") else ""
        vm = " (VM)" if m.get("virtualized") else ""
        return f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores{mem}{fs}{vm}; Python {m.get('python', '?')}"

    def table(self) -> str:
        """An aligned text table: one row per cell, then ratios and notes."""
        o = self.options
        step = any(c.busy_fraction is not None for c in self.cells)
        head = [
            "target",
            "kind",
            "order",
            "cache",
            "images/s",
            "spread",
            "MB/s decoded",
            "MB/s disk",
            "batch p50 ms",
            "p99 ms",
            "vs seq",
            "vs folder",
            "peak RSS MB",
            "evicted",
        ]
        if step:
            head += [f"busy @ {o.step_ms:g} ms"]
        rows = [head]
        for c in self.cells:
            row = [
                c.target,
                c.kind,
                c.order,
                c.cache,
                _num(c.images_per_s),
                f"{c.spread:.0%}",
                _num(c.decoded_mb_per_s),
                _num(c.disk_mb_per_s),
                _ms(c.latency_ms_p50),
                _ms(c.latency_ms_p99),
                _ratio(c.vs_sequential),
                _ratio(c.vs_folder),
                "-" if c.peak_rss_mb is None else f"{c.peak_rss_mb:,.0f}",
                _eviction(c),
            ]
            if step:
                row.append("-" if c.busy_fraction is None else f"{c.busy_fraction:.0%}")
            rows.append(row)
        left = {0, 1, 2, 3, head.index("evicted")}
        widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
        lines = []
        for n, r in enumerate(rows):
            cells = [r[k].ljust(widths[k]) if k in left else r[k].rjust(widths[k]) for k in range(len(head))]
            lines.append("  ".join(cells))
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        title = (
            f"dlpack bench: batch {o.batch_size}, {o.workers} workers, prefetch {o.prefetch}, "
            f"median of {o.repeat} run(s); spread = (max-min)/median"
        )
        out = [title, f"machine: {self.machine_line()}", ""] + lines
        if self.notes:
            out.append("")
            out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Write a PNG bar chart of images/s per target, grouped by target, one bar per cache and order."""
        _plot(self, Path(path))


def _finite(x: Any) -> Any:
    """JSON has no NaN or infinity: map them to null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _num(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _ms(v: float) -> str:
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _ratio(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}x" if v >= 10 else f"{v:.2f}x"


def _eviction(c: BenchCell) -> str:
    if c.cache != "cold":
        return (
            "-"
            if c.resident_at_start is None or c.resident_at_start >= WARM_MIN
            else f"only {c.resident_at_start:.0%} cached"
        )
    if not c.evicted:
        return "NO (no fadvise)"
    if c.resident_at_start is None:
        return "unverified"
    if c.eviction_verified:
        return "verified"
    return f"NO: {c.resident_at_start:.0%} left"


# ---------------------------------------------------------------- plot


def _matplotlib() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingExtraError("matplotlib", "plot", "dlpack bench --plot") from exc
    return Figure, FigureCanvasAgg


_COLOURS = {
    ("warm", "sequential"): "#1f4e79",
    ("warm", "random"): "#5b9bd5",
    ("warm", "block"): "#a9cbe8",
    ("cold", "sequential"): "#a14600",
    ("cold", "random"): "#ed7d31",
    ("cold", "block"): "#f6bf93",
}


def _short(v: float) -> str:
    """Compact images/s for bar labels and axis ticks: 950, 1.2k, 23k, 1.5M."""
    if v >= 1e6:
        return f"{v / 1e6:.1f}".removesuffix(".0") + "M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    if v >= 1e3:
        return f"{v / 1e3:.1f}".removesuffix(".0") + "k"
    return f"{v:.0f}"


def _plot(report: BenchReport, path: Path) -> None:
    Figure, FigureCanvasAgg = _matplotlib()
    o = report.options
    targets = list(dict.fromkeys(c.target for c in report.cells))
    series = [(cache, order) for cache in o.caches for order in o.orders]
    step = any(c.busy_fraction is not None for c in report.cells)
    n_t, n_s = len(targets), len(series)
    width = max(7.0, 1.3 + n_t * (0.55 * n_s + 0.6)) + (4.0 if step else 0.0)
    fig = Figure(figsize=(width, 5.6), layout="constrained")
    FigureCanvasAgg(fig)
    if step:
        ax, ax2 = fig.subplots(1, 2, width_ratios=[2.2, 1])
    else:
        ax, ax2 = fig.subplots(1, 1), None
    bar_w = 0.8 / n_s
    values = [c.images_per_s for c in report.cells if c.images_per_s > 0]
    log = bool(values) and max(values) / min(values) > 20
    ymax = max((c.images_per_s_max for c in report.cells), default=1.0) or 1.0
    kind = {c.target: c.kind for c in report.cells}
    for k, (cache, order) in enumerate(series):
        xs, ys, lo, hi = [], [], [], []
        for t, name in enumerate(targets):
            c = report.cell(name, order, cache)
            if c is None:
                continue
            xs.append(t - 0.4 + bar_w * (k + 0.5))
            ys.append(c.images_per_s)
            lo.append(c.images_per_s - c.images_per_s_min)
            hi.append(c.images_per_s_max - c.images_per_s)
        label = f"{cache} cache, {order}"
        if cache == "cold" and any(
            (c := report.cell(n, order, cache)) is not None and not c.eviction_verified for n in targets
        ):
            label += " (eviction not verified)"
        ax.bar(
            xs,
            ys,
            bar_w * 0.92,
            label=label,
            color=_COLOURS.get((cache, order)),
            yerr=[lo, hi] if o.repeat > 1 else None,
            capsize=2,
            ecolor="#333333",
            error_kw={"lw": 0.8},
        )
        for x, y, h in zip(xs, ys, hi, strict=True):
            # Above the whisker, so the value never sits on the error bar.
            top = (y + h) * 1.12 if log else y + h + 0.012 * ymax
            ax.text(x, top, _short(y), ha="center", va="bottom", fontsize=8, rotation=90 if n_s > 4 else 0)
    ax.set_xticks(range(n_t))
    ax.set_xticklabels([f"{t}\n({'folder, decoded' if kind[t] == 'folder' else kind[t]})" for t in targets])
    ax.set_xlim(-0.6, n_t - 0.4)
    ax.set_ylabel(f"images/s (median of {o.repeat}; whiskers: min-max)" if o.repeat > 1 else "images/s")
    if log:
        ax.set_yscale("log")
        ax.set_ylim(min(values) / 2.5, ymax * 4)
        ax.set_ylabel(ax.get_ylabel() + ", log scale")
    else:
        ax.set_ylim(0, ymax * 1.15)
    from matplotlib.ticker import FuncFormatter

    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _short(v) if v >= 1 else f"{v:g}"))
    ax.grid(axis="y", alpha=0.3, which="major")
    ax.set_axisbelow(True)
    fig.legend(
        *ax.get_legend_handles_labels(), loc="outside lower center", ncols=min(n_s, 4), fontsize=8, frameon=False
    )
    ratios = [c for c in report.cells if c.vs_folder is not None and c.order == "random"]
    if ratios:
        best = max(ratios, key=lambda c: c.vs_folder or 0.0)
        ax.set_title(
            f"read throughput; best store vs folder, random order: {best.target} {best.cache} {_ratio(best.vs_folder)}",
            fontsize=10,
        )
    else:
        ax.set_title("read throughput", fontsize=10)
    if ax2 is not None:
        for k, (cache, order) in enumerate(series):
            xs, ys = [], []
            for t, name in enumerate(targets):
                c = report.cell(name, order, cache)
                if c is None or c.busy_fraction is None:
                    continue
                xs.append(t - 0.4 + bar_w * (k + 0.5))
                ys.append(100 * c.busy_fraction)
            bars = ax2.bar(xs, ys, bar_w * 0.92, color=_COLOURS.get((cache, order)))
            ax2.bar_label(bars, labels=[f"{y:.0f}" for y in ys], padding=2, fontsize=8)
        ax2.set_xticks(range(n_t))
        ax2.set_xticklabels(targets)
        ax2.set_xlim(-0.6, n_t - 0.4)
        ax2.set_ylim(0, 112)
        ax2.set_ylabel("% of time the step is busy (not waiting for data)")
        ax2.set_title(f"simulated {o.step_ms:g} ms training step per batch", fontsize=10)
        ax2.grid(axis="y", alpha=0.3)
        ax2.set_axisbelow(True)
    loaded = ""
    la = report.load_average_before
    cores = report.machine.get("cores") or 1
    if la and la[0] > 0.5 * cores:
        loaded = f"; load avg {la[0]:.1f} at start"
    fig.suptitle(
        f"dlpack bench: batch {o.batch_size}, {o.workers} workers, prefetch {o.prefetch}{loaded}\n{report.machine_line()}",
        fontsize=10,
    )
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------- entry point


def _notes(
    report_cells: list[BenchCell],
    targets: list[_Target],
    options: BenchOptions,
    machine: dict[str, Any],
    before: list[float] | None,
    after: list[float] | None,
    scoped: bool,
) -> list[str]:
    notes: list[str] = []
    for t in targets:
        cold = [c for c in report_cells if c.target == t.name and c.cache == "cold"]
        warm = [c for c in report_cells if c.target == t.name and c.cache == "warm"]
        if cold:
            if not all(c.evicted for c in cold):
                notes.append(
                    f"{t.name}: cold runs were NOT cold: this platform cannot drop files from the page cache "
                    "(no posix_fadvise) - drop caches by hand or reboot between runs"
                )
            elif any(c.resident_at_start is None for c in cold):
                notes.append(
                    f"{t.name}: eviction could not be verified (no mincore here); cold figures may include cached data"
                )
            elif not all(c.eviction_verified for c in cold):
                worst = max(c.resident_at_start or 0.0 for c in cold)
                m = mount_of(t.path)
                why = (
                    f"its file system ({m['fstype']}) keeps files in memory"
                    if m and m["fstype"] in ("tmpfs", "ramfs")
                    else "another process maps or locks its files, or the file system ignores the advice"
                )
                notes.append(
                    f"{t.name}: {worst:.0%} of its pages stayed cached after eviction ({why}); cold figures are partly warm"
                )
        if warm:
            low = [
                c.resident_at_start for c in warm if c.resident_at_start is not None and c.resident_at_start < WARM_MIN
            ]
            if low:
                notes.append(
                    f"{t.name}: only {min(low):.0%} of its bytes stayed in the page cache (larger than free memory?); "
                    "warm figures are partly cold"
                )
        if cold and options.samples is not None and options.samples > t.count:
            notes.append(
                f"{t.name}: cold runs read one epoch ({t.count} images), not {options.samples}: after that the data is cached"
            )
    if any(c.cache == "cold" for c in report_cells) and machine.get("virtualized"):
        notes.append(
            "this OS runs in a VM: a page cache on the host is invisible from here, so 'cold' means not in this "
            "OS's cache; a truly cold disk may be slower"
        )
    cores = machine.get("cores") or 1
    busy = [la[0] for la in (before, after) if la]
    if busy and max(busy) > 0.5 * cores:
        notes.append(
            f"the machine was busy (load average {before[0] if before else '?'} before, {after[0] if after else '?'} after, "
            f"on {cores} cores): absolute figures are low and noisy, compare ratios"
        )
    if not scoped:
        notes.append("peak RSS is this process's peak so far (per-cell reset needs Linux)")
    if any(c.kind == "folder" for c in report_cells):
        notes.append(
            "folder targets are decoded and resized on the fly, as a training script would; stores are read as stored"
        )
    return notes


def run_bench(
    targets: Sequence[str | os.PathLike[str]], options: BenchOptions | None = None, **kwargs: Any
) -> BenchReport:
    """Measure read throughput of each target for every order and cache state in ``options``.

    Parameters
    ----------
    targets
        dlpack stores (Zarr folder, HDF5 file) and/or plain folders of images (the scattered
        baseline, decoded and resized on the fly to the first store's resolution or ``size``).
    options
        A :class:`BenchOptions`; keyword arguments override its fields
        (``run_bench(["train.zarr"], repeat=1, caches="warm")``).

    Returns
    -------
    BenchReport
        Every figure per cell, the machine, the options and notes on what could not be verified.

    Raises
    ------
    StoreNotFoundError
        A target does not exist.
    StoreError
        A target is a file that is not a dlpack store, or a store that cannot be read.
    OptionError
        Bad options, or a folder target with no resolution to resize to.
    """
    opts = replace(options or BenchOptions(), **kwargs) if kwargs else (options or BenchOptions())
    if not targets:
        raise OptionError("give at least one bench target (a dlpack store or a folder of images)")
    resolved = [_resolve(t) for t in targets]
    _unique_names(resolved)
    for t in resolved:
        if t.count == 0:
            raise StoreError(f"bench target {str(t.path)!r} holds no images")
    spec = _reference_spec(resolved, opts)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    before = load_average()
    machine = machine_info([t.path for t in resolved])
    t0 = time.perf_counter()
    per_cell = opts.repeat * (2 if opts.step_ms is not None else 1)
    total = len(resolved) * len(opts.caches) * len(opts.orders) * per_cell
    from tqdm import tqdm

    cells: list[BenchCell] = []
    scoped = True
    with tqdm(
        total=total,
        desc="bench",
        unit="run",
        file=sys.stderr,
        leave=False,
        disable=opts.quiet or not sys.stderr.isatty(),
    ) as bar:
        for t in resolved:
            for cache in opts.caches:
                for order in opts.orders:
                    bar.set_description(f"{t.name} {cache} {order}")
                    cell = _measure_cell(t, spec, order, cache, opts, lambda: bar.update(1))
                    cells.append(cell)
    scoped = _reset_peak_rss()
    cells = _with_ratios(cells, resolved)
    after = load_average()
    notes = _notes(cells, resolved, opts, machine, before, after, scoped)
    return BenchReport(
        options=opts,
        targets=tuple(t.info(spec) for t in resolved),
        cells=tuple(cells),
        machine=machine,
        load_average_before=before,
        load_average_after=after,
        started=started,
        seconds=time.perf_counter() - t0,
        notes=tuple(notes),
        peak_rss_scope="cell" if scoped else "process",
    )
