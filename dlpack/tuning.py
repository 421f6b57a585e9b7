"""``dlpack tune`` (``dlpack.tune``): measure, change one thing, measure again, for the loader options of one store.

A training run whose GPU waits for data is fixed by measuring where the time goes, changing one
setting and measuring again. :func:`tune` does that for the loader: it runs a short grid of
reader threads (``workers``), read-ahead (``prefetch``) and ``order`` against a simulated training
step of ``step_ms`` per batch, reads each cell's busy share from ``loader.stats()``, and
recommends the cell that keeps the step busiest; with ``source=`` it also trial-builds a sample of
the source at smaller resolutions and with the build's codecs, and says what a rebuild would gain.

The simulated step (:func:`simulated_step`) spends half its time in pure Python, holding the GIL
as a real step's Python side (the optimizer loop, hooks, logging) does, and half asleep, releasing
it as a step does while its kernels run on the GPU. A CPU-only training run whose kernels use the
cores the reader threads need is harder on the loader than that (docs/tune.md).

The measuring function is a parameter (``measure=``), so the grid, the choice and the report
are tested with fixed measurements and no clock.
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._files import refuse_url
from .errors import OptionError
from .options import TUNE_ORDER_RANK, LoaderOptions, TuneOptions, check_int, check_number, check_step_ms, with_keywords
from .read.loader import BatchSource, Loader

__all__ = [
    "Budget",
    "Measurement",
    "TuneCell",
    "TuneResult",
    "TrialRow",
    "choose",
    "grid",
    "measure_loader",
    "simulated_step",
    "tune",
]

#: Cells whose busy share is within this of the best one count as tied (1 point of busy %).
TIE_MARGIN = 0.01
#: The default grid's axes. ``sequential`` is left out by default: it does not shuffle, which
#: changes what a model trains on, so it is a choice for evaluation loops, not a speed knob.
DEFAULT_WORKERS: tuple[int | str, ...] = (0, 1, 2, "auto")
#: Tie-break rank of the orders: the one that mixes best first.
RULE = (
    "the highest busy share; cells within 1 point of it count as tied, and of those random order wins over "
    "block over sequential (the better shuffle), then fewer reader threads (workers='auto' counts as the most), "
    "then less prefetch (less memory)"
)


def simulated_step(step_s: float) -> None:
    """A stand-in for one training step of ``step_s`` seconds: the first half spins in pure Python
    (holding the GIL, as a step's Python side does), the second half sleeps (releasing it, as a step
    does while its kernels run). 0 does nothing: ``sleep(0)`` would be a GIL hand-off, not a step."""
    if step_s <= 0:
        return
    end = time.perf_counter() + step_s / 2
    spins = 0
    while time.perf_counter() < end:
        spins += 1
    time.sleep(step_s / 2)


@dataclass(frozen=True)
class Budget:
    """How long one cell runs: at most ``batches`` batches and about ``seconds`` seconds (the batch
    in progress when the time is up is finished), over whole epochs when an epoch is shorter."""

    batches: int = 100
    seconds: float = 0.1

    def __post_init__(self) -> None:
        check_int("max_batches", self.batches, 1)
        check_number("max_seconds", self.seconds, wanted="a positive number of seconds")


@dataclass(frozen=True)
class Measurement:
    """What one cell measured, as ``loader.stats()`` summed over its passes gives it."""

    busy_share: float
    images_per_s: float
    wait_p99_ms: float
    batches: int
    seconds: float


#: ``measure(loader, step_s, budget) -> Measurement``: runs ``loader`` under a step of ``step_s``.
Measure = Callable[[Loader, float, Budget], Measurement]


def measure_loader(loader: Loader, step_s: float, budget: Budget) -> Measurement:
    """Run ``loader`` with :func:`simulated_step` after each batch until ``budget`` is spent, epoch
    after epoch, and sum what ``loader.stats()`` recorded. Each epoch starts with an empty read-ahead,
    as it does in training; an epoch longer than the budget is measured from its start only, where
    the first batch's wait weighs more than in the whole epoch (the figure is then a lower bound)."""
    done = 0
    epoch = 0
    end = time.perf_counter() + budget.seconds
    try:
        while done < budget.batches and time.perf_counter() < end:
            loader.set_epoch(epoch)
            batches = iter(loader)
            try:
                for batch in batches:
                    del batch  # its array goes back to the loader's pool
                    simulated_step(step_s)
                    done += 1
                    if done >= budget.batches or time.perf_counter() >= end:
                        break
            finally:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()  # records the pass's stats now, not at garbage collection
            epoch += 1
    finally:
        loader.close()
    stats = loader.stats()
    seconds = sum(s.seconds for s in stats)
    waited = sum(s.wait_seconds for s in stats)
    images = sum(s.images for s in stats)
    return Measurement(
        busy_share=1.0 - waited / seconds if seconds > 0 else 0.0,
        images_per_s=images / seconds if seconds > 0 else 0.0,
        wait_p99_ms=max((s.wait_p99_ms for s in stats), default=0.0),
        batches=sum(s.batches for s in stats),
        seconds=seconds,
    )


@dataclass(frozen=True)
class TuneCell:
    """One cell of the grid and what it measured (the median over repeats)."""

    workers: int | str
    prefetch: int
    order: str
    busy_share: float
    images_per_s: float
    wait_p99_ms: float
    batches: int
    seconds: float

    def options(self, batch_size: int) -> dict[str, Any]:
        """The LoaderOptions fields this cell sets."""
        return {"batch_size": batch_size, "workers": self.workers, "prefetch": self.prefetch, "order": self.order}


@dataclass(frozen=True)
class TrialRow:
    """One trial build of the source sample: its resolution (W, H; None: the source's sizes), codec,
    bytes per image, read rate with no step, busy share under the step, and the ratio of its read
    rate to the trial built as the store is (``baseline``). ``error`` says why a trial could not run."""

    size: tuple[int, int] | None
    codec: str
    baseline: bool
    bytes_per_image: float | None = None
    read_images_per_s: float | None = None
    busy_share: float | None = None
    read_ratio: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` found: the recommendation, the evidence and the facts it was measured on."""

    store: str
    count: int
    image: str
    step_ms: float
    batch_size: int
    budget: Budget
    repeat: int
    cells: tuple[TuneCell, ...]
    recommended: TuneCell
    default: TuneCell | None
    seconds: float
    machine: dict[str, Any] = field(default_factory=dict)
    trials: tuple[TrialRow, ...] = ()
    trial_note: str = ""
    source: str | None = None

    @property
    def predicted_busy(self) -> float:
        """The recommended cell's busy share: the share of a training step's time it would compute."""
        return self.recommended.busy_share

    def options(self) -> LoaderOptions:
        """The recommended options, as a :class:`~dlpack.LoaderOptions`."""
        return LoaderOptions(**self.recommended.options(self.batch_size))

    def snippet(self) -> str:
        """The recommendation as Python a user can paste (``ds`` is the opened store)."""
        kw = ", ".join(f"{k}={v!r}" for k, v in self.recommended.options(self.batch_size).items())
        return f"loader = ds.loader({kw})".replace("'", '"')

    def rebuild_advice(self) -> str | None:
        """What a rebuild would gain, from the trial builds (None without them)."""
        ok = [t for t in self.trials if t.busy_share is not None and t.read_images_per_s is not None]
        base = next((t for t in ok if t.baseline), None)
        if base is None or base.busy_share is None:
            return None if not self.trials else "no trial build at the store's settings could be measured"
        best_busy = max(t.busy_share for t in ok if t.busy_share is not None)
        if base.busy_share >= best_busy - TIE_MARGIN:
            return (
                f"a rebuild would gain nothing the step would notice: the store's own settings keep it "
                f"{100 * base.busy_share:.1f} % busy in the trial, within 1 point of the best"
            )
        tied = [t for t in ok if t.busy_share is not None and t.busy_share >= best_busy - TIE_MARGIN]
        # Of the tied trials, the largest images (a smaller size changes what the model sees), then no codec.
        pick = min(tied, key=lambda t: (-_pixels(t.size), t.codec != "none", t.codec))
        flags = []
        if pick.size is not None and pick.size != base.size:
            flags.append(f"--size {pick.size[0]}x{pick.size[1]}")
        if pick.codec != base.codec:
            flags.append(f"--compression {pick.codec}")
        ratio = f"read {pick.read_ratio:.2f}x as fast and " if pick.read_ratio is not None else ""
        return (
            f"a rebuild with {' '.join(flags)} would {ratio}keep the step {100 * (pick.busy_share or 0):.1f} % busy "
            f"against {100 * base.busy_share:.1f} % (dlpack build SRC OUT {' '.join(flags)})"
            + ("; a smaller size changes what the model sees" if "--size" in " ".join(flags) else "")
        )

    def busy_machine(self) -> str | None:
        """A warning when other work loaded the machine while it was measured (the figures are then noisy)."""
        load = self.machine.get("load_average")
        cores = self.machine.get("cores_usable") or self.machine.get("cores")
        if not load or not cores or load[0] <= cores:
            return None
        return (
            f"note: the machine was busy with other work (load average {load[0]:.1f} on {cores} cores): the "
            "figures are noisy; run again on a quiet machine, or with more --repeat"
        )

    def table(self) -> str:
        """The evidence, one row per cell; ``*`` marks the recommendation, ``d`` the defaults."""
        head = f"{'workers':>7}  {'prefetch':>8}  {'order':<10}  {'busy %':>6}  {'img/s':>10}  {'wait p99 ms':>11}  {'batches':>7}"
        lines = [head]
        for c in self.cells:
            mark = ("*" if c == self.recommended else " ") + ("d" if c == self.default else " ")
            lines.append(
                f"{c.workers!s:>7}  {c.prefetch:>8}  {c.order:<10}  {100 * c.busy_share:>6.1f}  "
                f"{c.images_per_s:>10,.0f}  {c.wait_p99_ms:>11.2f}  {c.batches:>7} {mark}".rstrip()
            )
        return "\n".join(lines)

    def trial_table(self) -> str:
        """The rebuild trials as a text table, one row per size and codec (unmeasured ones with the reason)."""
        lines = [f"{'size':<10}  {'codec':<5}  {'KB/image':>8}  {'read img/s':>10}  {'x store':>7}  {'busy %':>6}"]
        for t in self.trials:
            size = "source" if t.size is None else f"{t.size[0]}x{t.size[1]}"
            if t.error is not None:
                lines.append(f"{size:<10}  {t.codec:<5}  not measured: {t.error}")
                continue
            lines.append(
                f"{size:<10}  {t.codec:<5}  {_num(t.bytes_per_image, 1e-3, '.1f'):>8}  "
                f"{_num(t.read_images_per_s, 1, ',.0f'):>10}  {_num(t.read_ratio, 1, '.2f'):>7}  "
                f"{_num(t.busy_share, 100, '.1f'):>6}" + ("  (as the store is built)" if t.baseline else "")
            )
        return "\n".join(lines)

    def summary(self) -> str:
        """The whole text report: the recommendation, the evidence, and the rebuild trials."""
        o = self.recommended
        default = f"; the defaults: {100 * self.default.busy_share:.1f} %" if self.default and self.default != o else ""
        if self.default == o:
            default = " (the defaults)"
        out = [
            f"dlpack tune: {self.store}, {self.count:,} images of {self.image}, batch {self.batch_size}, "
            f"step {self.step_ms:g} ms (half GIL-holding Python, half sleep)",
            f"{len(self.cells)} cells, each run {self.repeat} time(s) interleaved (the median counts) for at most "
            f"{self.budget.batches} batches / {self.budget.seconds:g} s; took {self.seconds:.1f} s",
            "",
            f"recommended: {100 * o.busy_share:.1f} % busy predicted{default}",
            f"    {self.snippet()}",
            "",
            self.table(),
            *textwrap.wrap(f"* recommended, d the defaults; the rule: {RULE}", 100),
        ]
        busy = self.busy_machine()
        if busy:
            out += ["", busy]
        if self.trials or self.trial_note:
            out += ["", f"rebuild trials from {self.source}: {self.trial_note}", self.trial_table()]
            advice = self.rebuild_advice()
            if advice:
                out.append(advice)
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-ready: options, predicted busy, the table, the trials and the machine."""
        return {
            "store": self.store,
            "count": self.count,
            "image": self.image,
            "step_ms": self.step_ms,
            "step": "half GIL-holding pure Python, half sleep (docs/tune.md)",
            "batch_size": self.batch_size,
            "budget": asdict(self.budget),
            "repeat": self.repeat,
            "seconds": self.seconds,
            "recommended": self.recommended.options(self.batch_size),
            "snippet": self.snippet(),
            "predicted_busy": self.predicted_busy,
            "default_busy": None if self.default is None else self.default.busy_share,
            "rule": RULE,
            "cells": [asdict(c) for c in self.cells],
            "source": self.source,
            "trials": [asdict(t) for t in self.trials],
            "trial_note": self.trial_note,
            "rebuild": self.rebuild_advice(),
            "machine": self.machine,
        }


def _num(value: float | None, scale: float, fmt: str) -> str:
    return "-" if value is None else format(value * scale, fmt)


def _pixels(size: tuple[int, int] | None) -> int:
    return math.inf if size is None else size[0] * size[1]  # type: ignore[return-value]


def grid(
    workers: Sequence[int | str], prefetch: Sequence[int], orders: Sequence[str]
) -> list[tuple[int | str, int, str]]:
    """The cells (workers, prefetch, order): without reader threads nothing is read ahead, so
    ``workers=0`` is one cell per order, with ``prefetch=0``."""
    cells: list[tuple[int | str, int, str]] = []
    for order in orders:
        for w in workers:
            if w == 0:
                cells.append((0, 0, order))
            else:
                cells += [(w, p, order) for p in prefetch]
    return cells


def _threads_rank(workers: int | str) -> float:
    return float(workers) if isinstance(workers, int) else math.inf


def choose(cells: Sequence[TuneCell], margin: float = TIE_MARGIN) -> TuneCell:
    """The recommended cell (:data:`RULE`): the highest busy share; within ``margin`` of it, the
    better-mixing order (block order shuffles runs of samples: worth it only where it measurably reads
    faster, as from a cold disk), then fewer reader threads, then less prefetch (less memory)."""
    if not cells:
        raise OptionError("no cells to choose from")
    best = max(c.busy_share for c in cells)
    tied = [c for c in cells if c.busy_share >= best - margin]
    return min(
        tied, key=lambda c: (TUNE_ORDER_RANK.get(c.order, 9), _threads_rank(c.workers), c.prefetch, -c.busy_share)
    )


def tune(
    store: Any,
    step_ms: float | None = None,
    batch_size: int | None = None,
    *,
    options: TuneOptions | None = None,
    measure: Measure | None = None,
    progress: Callable[[str], None] | None = None,
    **keywords: Any,
) -> TuneResult:
    """Recommend loader options for ``store`` under a training step of ``step_ms`` per batch.

    Runs the grid of ``workers`` (0, 1, 2 and ``"auto"`` where the loader takes it) x ``prefetch``
    x ``orders``, each cell for at most ``max_batches`` batches and about ``max_seconds`` seconds
    (``repeat`` times, interleaved, and the median counts: a stall of the machine in one run of a
    cell does not decide it), after one untimed warm-up cell, and picks
    by :data:`RULE`. ``batch_size`` defaults to LoaderOptions' default; ``split`` tunes the loader
    of one split. With ``source`` (the folder the store was built from) it also trial-builds
    ``sample`` of its images (:func:`rebuild_trials`). ``measure`` replaces :func:`measure_loader`
    (tests pass fixed measurements).

    The settings are a :class:`~dlpack.options.TuneOptions` (``options``), with keywords (its
    field names; ``step_ms`` and ``batch_size`` may also be given by position) replacing fields.
    """
    refuse_url(store, "the store")
    t0 = time.perf_counter()
    given = {k: v for k, v in (("step_ms", step_ms), ("batch_size", batch_size)) if v is not None}
    opts = with_keywords(options, TuneOptions, {**given, **keywords}, "tune", also=("measure", "progress"))
    step_ms = check_step_ms(opts.step_ms)
    budget = Budget(opts.max_batches, opts.max_seconds)
    repeat, split, source, sample = opts.repeat, opts.split, opts.source, opts.sample
    workers = DEFAULT_WORKERS if opts.workers is None else opts.workers
    axes = (tuple(workers), opts.prefetch, opts.orders)
    batch_size = LoaderOptions().batch_size if opts.batch_size is None else opts.batch_size
    measure = measure or measure_loader
    say = progress or (lambda text: None)
    ds = _open(store)
    try:
        step_s = step_ms / 1e3
        cells = grid(*axes)

        def run(cell: tuple[int | str, int, str]) -> Measurement:
            w, p, order = cell
            return measure(
                ds.loader(batch_size=batch_size, workers=w, prefetch=p, order=order, split=split), step_s, budget
            )

        say(
            f"dlpack tune: {len(cells)} cells of at most {budget.batches} batches / {budget.seconds:g} s each"
            + (f", {repeat} times" if repeat > 1 else "")
        )
        defaults = LoaderOptions(batch_size=batch_size)
        default_cell = (defaults.workers, defaults.prefetch if defaults.workers != 0 else 0, defaults.effective_order)
        run(default_cell if default_cell in cells else cells[0])  # warm-up: page cache, lazy maps; not counted
        runs: dict[tuple[int | str, int, str], list[Measurement]] = {c: [] for c in cells}
        for _ in range(repeat):
            for c in cells:
                runs[c].append(run(c))
        measured = tuple(_median_cell(c, runs[c]) for c in cells)
        recommended = choose(measured)
        default = next((m for m in measured if (m.workers, m.prefetch, m.order) == default_cell), None)
        trials: tuple[TrialRow, ...] = ()
        note = ""
        if source is not None:
            best = LoaderOptions(**recommended.options(batch_size))
            trials, note = rebuild_trials(ds, source, best, step_s, budget, sample, measure, say, repeat)
        from .bench.machine import load_average, machine_info

        return TuneResult(
            store=str(getattr(ds, "path", store)),
            count=len(ds) if split is None else len(ds.indices(split)),
            image=_image_text(ds),
            step_ms=step_ms,
            batch_size=batch_size,
            budget=budget,
            repeat=repeat,
            cells=measured,
            recommended=recommended,
            default=default,
            seconds=time.perf_counter() - t0,
            machine={**machine_info([getattr(ds, "path", store)]), "load_average": load_average()},
            trials=trials,
            trial_note=note,
            source=None if source is None else os.fspath(source),
        )
    finally:
        if ds is not store:  # opened here: closed here
            close = getattr(ds, "close", None)
            if close is not None:
                close()


def _open(store: Any) -> Any:
    if hasattr(store, "loader") and isinstance(store, BatchSource):
        return store
    from .read.dataset import open as open_store

    return open_store(store)


def _image_text(ds: Any) -> str:
    layout = ds.image_layout()
    if layout is None:
        return "variable size"
    (h, w, c), dtype = layout
    return f"{w}x{h}x{c}" + ("" if np.dtype(dtype) == np.uint8 else f" {np.dtype(dtype).name}")


def _median_cell(cell: tuple[int | str, int, str], ms: list[Measurement]) -> TuneCell:
    w, p, order = cell
    return TuneCell(
        workers=w,
        prefetch=p,
        order=order,
        busy_share=statistics.median(m.busy_share for m in ms),
        images_per_s=statistics.median(m.images_per_s for m in ms),
        wait_p99_ms=statistics.median(m.wait_p99_ms for m in ms),
        batches=sum(m.batches for m in ms),
        seconds=sum(m.seconds for m in ms),
    )


# ---------------------------------------------------------------- rebuild trials


class Cycled:
    """A store's ``count``-sample view of a smaller store: sample ``i`` is ``i % len(inner)``, so a
    trial build of a sample is read as an epoch as long as the real store's."""

    def __init__(self, inner: Any, count: int) -> None:
        self.inner, self.count = inner, max(int(count), len(inner))
        self.path = getattr(inner, "path", None)
        # What the loader reads off a store to choose its threads and its grouped reads: the view
        # is read as its store is (a row depends only on its sample and epoch).
        self.manifest = getattr(inner, "manifest", None)
        self.batch_rows_independent = bool(getattr(inner, "batch_rows_independent", False))

    def __len__(self) -> int:
        return self.count

    def get_batch(self, indices: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        batch: dict[str, Any] = self.inner.get_batch(np.asarray(indices) % len(self.inner), epoch, out)
        return batch

    def warm(self) -> None:
        self.inner.warm()

    def fingerprint(self) -> str:
        return f"{self.inner.fingerprint()}x{self.count}"

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        layout: tuple[tuple[int, ...], str] | None = self.inner.image_layout()
        return layout


def _sample_files(source: Path, sample: int) -> list[str]:
    """``sample`` image paths of ``source`` (relative), spread evenly over its sorted listing so
    every class folder is in it; label folders and label images are left out."""
    from .sources import FolderSource
    from .sources.folder import label_path

    scan = FolderSource(source, labels="none", check_labels=False).scan()
    rels = [it.rel for it in scan.items if label_path(it.rel) is None]
    if not rels:
        raise OptionError(f"source {os.fspath(source)!r} holds no images outside label folders")
    if len(rels) <= sample:
        return rels
    picks = np.linspace(0, len(rels) - 1, sample).round().astype(int)
    return [rels[i] for i in sorted(set(picks.tolist()))]


def _trial_grid(ds: Any) -> tuple[list[tuple[tuple[int, int] | None, str]], str, tuple[int, int] | None]:
    """(size, codec) pairs: the store's own, its codec at 1/2 and 1/4 of its sides, and every
    other codec at its size; one thing changed at a time."""
    from typing import get_args

    from .options import Compression

    info = ds.info()
    own_codec = str(info.get("compression") or "none")
    res = info.get("resolution")
    own: tuple[int, int] | None = (int(res[0]), int(res[1])) if res else None
    pairs: list[tuple[tuple[int, int] | None, str]] = [(own, own_codec)]
    if own is not None:
        for k in (2, 4):
            w, h = own[0] // k, own[1] // k
            if min(w, h) >= 8:
                pairs.append(((w, h), own_codec))
    pairs += [(own, c) for c in get_args(Compression) if c != own_codec]
    return pairs, own_codec, own


def rebuild_trials(
    ds: Any,
    source: str | os.PathLike[str],
    options: LoaderOptions,
    step_s: float,
    budget: Budget,
    sample: int,
    measure: Measure,
    say: Callable[[str], None] = lambda text: None,
    repeat: int = 3,
) -> tuple[tuple[TrialRow, ...], str]:
    """Trial builds of ``sample`` images of ``source`` into a temporary folder (removed at the end):
    at the store's resolution and codec, at half and a quarter of its sides, and with each other
    codec the build offers. Each is read as an epoch as long as the store's (:class:`Cycled`) with
    ``options``: once untimed (a fresh store opens its shards and codecs), then ``repeat`` times,
    interleaved over the trials, with no step (the read rate) and under the step (the busy share);
    the medians count."""
    from .errors import DlpackError
    from .pack import build
    from .read.dataset import Dataset

    check_int("sample", sample, 1)
    src = Path(source)
    rels = _sample_files(src, sample)
    pairs, _, own = _trial_grid(ds)
    info = ds.info()
    backend = "hdf5" if info.get("backend") == "hdf5" else "zarr"
    channels = int(info["channels"]) if int(info["channels"]) in (1, 3) else "keep"
    say(f"dlpack tune: {len(pairs)} trial builds of {len(rels)} images of {os.fspath(src)}")
    rows: list[TrialRow] = []
    work = Path(tempfile.mkdtemp(prefix="dlpack-tune-"))
    try:
        picked = work / "sample"
        for rel in rels:
            dest = picked / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, dest)
        built: dict[int, Any] = {}
        errors: dict[int, str] = {}
        for n, (size, codec) in enumerate(pairs):
            out = work / f"trial-{n}{'.h5' if backend == 'hdf5' else '.zarr'}"
            try:
                build(
                    picked,
                    out,
                    compression=codec,
                    labels="none",
                    channels=channels,
                    jobs=1,
                    quiet=True,
                    on_error="skip",
                    **_resize_kwargs(ds, size),
                )
            except DlpackError as exc:  # a codec this install lacks (hdf5plugin), ...
                errors[n] = str(exc).splitlines()[0]
                continue
            built[n] = Dataset(out)
        try:
            views = {n: Cycled(trial, len(ds)) for n, trial in built.items()}
            for view in views.values():  # warm-up: a fresh store opens its shards and codecs
                measure(Loader(view, options), 0.0, budget)
            reads: dict[int, list[float]] = {n: [] for n in views}
            busy: dict[int, list[float]] = {n: [] for n in views}
            for _ in range(repeat):  # interleaved, as the grid: a stall hits one run of one trial
                for n, view in views.items():
                    reads[n].append(measure(Loader(view, options), 0.0, budget).images_per_s)
                    busy[n].append(measure(Loader(view, options), step_s, budget).busy_share)
            for n, (size, codec) in enumerate(pairs):
                if n in errors:
                    rows.append(TrialRow(size, codec, n == 0, error=errors[n]))
                    continue
                per_image = _bytes_on_disk(work / f"trial-{n}{'.h5' if backend == 'hdf5' else '.zarr'}") / len(built[n])
                rows.append(
                    TrialRow(size, codec, n == 0, per_image, statistics.median(reads[n]), statistics.median(busy[n]))
                )
        finally:
            for trial in built.values():
                trial.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0].read_images_per_s if rows and rows[0].read_images_per_s else None
    if base:
        rows = [
            TrialRow(**{**asdict(r), "read_ratio": r.read_images_per_s / base})
            if r.read_images_per_s is not None
            else r
            for r in rows
        ]
    note = (
        f"{len(rels)} images built at each setting ({'the source sizes' if own is None else 'stretched'}), "
        f"each read as an epoch of {len(ds):,} (the sample cycled) with the recommended options, "
        f"{repeat} time(s) interleaved (the medians count)"
    )
    return tuple(rows), note


def _resize_kwargs(ds: Any, size: tuple[int, int] | None) -> dict[str, Any]:
    """The build keywords that resize a trial as the store was resized (its manifest's ``resize``),
    at ``size``: the same mode (stretch or fit) and upscaling rule; a variable-size store's max_side."""
    resize = dict(getattr(ds.manifest, "resize", None) or {})
    mode = resize.get("mode")
    if size is None:
        max_side = resize.get("max_side")
        return {"max_side": int(max_side)} if max_side else {}
    out: dict[str, Any] = {"size": size, "allow_upscale": bool(resize.get("allow_upscale", False))}
    if mode in ("stretch", "fit"):
        out["resize"] = mode
    return out


def _bytes_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
