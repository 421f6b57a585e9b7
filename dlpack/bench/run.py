"""``run_bench``: resolve the targets, measure every cell, and assemble the report."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..errors import OptionError, StoreError
from ..options import BenchOptions, with_keywords
from .machine import load_average, machine_info
from .measure import measure_cell, reset_peak_rss
from .report import BenchReport, report_notes
from .results import BenchCell, with_ratios
from .targets import reference_spec, resolve_target, unique_names

__all__ = ["run_bench"]


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
        A :class:`BenchOptions`.
    **kwargs
        Fields of :class:`BenchOptions` that override those of ``options``
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
    opts = with_keywords(options, BenchOptions, kwargs, "run_bench")
    if not targets:
        raise OptionError("give at least one bench target (a dlpack store or a folder of images)")
    resolved = [resolve_target(t) for t in targets]
    unique_names(resolved)
    for t in resolved:
        if t.count == 0:
            raise StoreError(f"bench target {str(t.path)!r} holds no images")
    spec = reference_spec(resolved, opts)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    before = load_average()
    machine = machine_info([t.path for t in resolved if not t.remote])  # a bucket has no local disk
    t0 = time.perf_counter()
    per_cell = opts.repeat * (2 if opts.step_ms is not None else 1)
    total = len(resolved) * len(opts.caches) * len(opts.orders) * per_cell
    from tqdm import tqdm

    cells: list[BenchCell] = []
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
                    cell = measure_cell(t, spec, order, cache, opts, lambda: bar.update(1))
                    cells.append(cell)
    scoped = reset_peak_rss()
    cells = with_ratios(cells, resolved)
    after = load_average()
    notes = report_notes(cells, resolved, opts, machine, before, after, scoped)
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
