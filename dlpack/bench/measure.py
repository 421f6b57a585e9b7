"""Measuring: timed runs through the Loader, run budgets, the cache state of each cell, peak RSS.

A *run* reads batches as a training loop would until its budget is spent; a *cell* is one
(target, cache, order) combination: ``repeat`` runs of it, primed (warm) or evicted (cold) first.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..options import BenchOptions, LoaderOptions
from ..read.loader import Loader
from .folder import FolderReader, FolderSpec
from .pagecache import evict, prime, resident_fraction
from .results import BenchCell, BenchRun, summarise_cell
from .targets import Target

if TYPE_CHECKING:
    from ..read.dataset import Dataset

__all__ = ["measure_cell", "reset_peak_rss"]

# Without --samples/--seconds a run reads one epoch, capped at _MAX_S; warm runs keep reading for
# at least _MIN_S so that tiny, fast stores still give a stable rate.
_MIN_S = 1.0
_MAX_S = 10.0


# ---------------------------------------------------------------- peak RSS


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (Linux ``clear_refs``, no root needed), so each cell gets its own."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb(scoped: bool) -> float | None:
    """Peak RSS in MB since the last reset (``scoped``) or since the process started; None on Windows."""
    if scoped:
        try:
            with open("/proc/self/status", encoding="ascii", errors="replace") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024 / 1e6
        except (OSError, ValueError, IndexError):
            pass
    try:
        import resource  # POSIX only
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6  # bytes on macOS, KiB elsewhere


# ---------------------------------------------------------------- runs


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
    """How long one run reads: --samples, --seconds, or one epoch within [_MIN_S, _MAX_S]."""
    if options.samples is not None:
        return _Budget(options.samples, 0.0, None, cold)
    if options.seconds is not None:
        return _Budget(None, options.seconds, options.seconds, cold)
    return _Budget(count, 0.0 if cold or stepped else _MIN_S, _MAX_S, cold)


def _nbytes(images: Any) -> int:
    if isinstance(images, np.ndarray):
        return int(images.nbytes)
    return int(sum(np.asarray(i).nbytes for i in images))


def _loader(source: FolderReader | Dataset, lopts: LoaderOptions) -> Loader:
    """The training Loader over a store or a folder."""
    return Loader(source, lopts)


def _timed_run(
    target: Target,
    source: FolderReader | Dataset,
    lopts: LoaderOptions,
    first_epoch: int,
    budget: _Budget,
    step_s: float | None,
) -> tuple[BenchRun, int]:
    """Read batches as a training loop would until the budget is spent; returns the run and the next epoch.

    No read outlives the run: the next run may evict the files and read them cold, and a read made
    ahead for an epoch nobody asks for would bring pages back (``read_ahead_epochs`` is off and the
    reader threads stop when the run ends)."""
    loader = _loader(source, replace(lopts, read_ahead_epochs=False))
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
    loader.close()
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


def _fill_shard_cache(source: FolderReader | Dataset, lopts: LoaderOptions) -> None:
    """Warm a store on object storage: one untimed sequential epoch fetches every shard a batch
    reads into the reader's shard cache (what a later epoch of a training run finds there)."""
    loader = Loader(source, replace(lopts, order="sequential", shuffle=False, read_ahead_epochs=False))
    try:
        for _ in loader:
            pass
    finally:
        loader.close()


def _empty_shard_cache(source: FolderReader | Dataset) -> None:
    """Cold on object storage: a fresh reader's shard cache, emptied (nothing fetched before the run)."""
    cache = getattr(getattr(source, "reader", None), "cache", None)
    clear = getattr(cache, "clear", None)
    if callable(clear):
        clear()


def _close(source: FolderReader | Dataset) -> None:
    source.close()
    gc.collect()  # drop memory maps now: the kernel keeps mapped pages cached whatever we advise


def measure_cell(
    target: Target,
    spec: FolderSpec | None,
    order: str,
    cache: str,
    options: BenchOptions,
    tick: Callable[[], object],
) -> BenchCell:
    """Run one cell ``options.repeat`` times (plus the step runs), priming or evicting the target first."""
    lopts = options.loader_options(order)
    step_s = None if options.step_ms is None else options.step_ms / 1e3
    kinds = [None, step_s] if step_s is not None else [None]
    runs: list[BenchRun] = []
    step_runs: list[BenchRun] = []
    scoped = reset_peak_rss()
    epoch = 0
    if cache == "warm":
        if not target.remote:
            prime(target.files)
        source = target.open(spec)
        try:
            source.warm()  # open maps and indexes outside the timing, as after a first epoch
            if target.remote:
                _fill_shard_cache(source, lopts)
            resident = None if target.remote else resident_fraction(target.files)
            for _ in range(options.repeat):
                for s in kinds:
                    run, epoch = _timed_run(
                        target, source, lopts, epoch, _budget(options, target.count, False, s is not None), s
                    )
                    run = replace(run, resident_at_start=resident)
                    (runs if s is None else step_runs).append(run)
                    tick()
        finally:
            _close(source)
    else:
        for _ in range(options.repeat):
            for s in kinds:
                if target.remote:  # no page cache to evict: a fresh reader, its shard cache empty
                    advised, resident = True, 0.0
                else:
                    advised = evict(target.files)
                    resident = resident_fraction(target.files)
                source = target.open(spec)
                try:
                    if target.remote:
                        _empty_shard_cache(source)
                    run, epoch = _timed_run(
                        target, source, lopts, epoch, _budget(options, target.count, True, s is not None), s
                    )
                finally:
                    _close(source)
                run = replace(run, resident_at_start=resident, evicted=advised)
                (runs if s is None else step_runs).append(run)
                tick()
    return summarise_cell(target, order, cache, runs, step_runs, _peak_rss_mb(scoped))
