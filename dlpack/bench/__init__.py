"""``dlpack bench``: where does the time go? Random vs sequential, warm vs cold, packed vs scattered.

Each *cell* is one (target, cache, order) combination, measured ``repeat`` times through the
same loader a training script uses (``dlpack.Loader``: threads, read-ahead). A target is a dlpack
store or a plain folder of images, which is decoded and resized on the loader's threads to the
store's resolution, as a training script without dlpack would do, so the comparison is fair.

Cold runs evict every file of the target from the page cache first (``posix_fadvise``, no root
needed) and check with ``mincore`` that the pages are gone; see docs/bench.md for the limits.

The package, in the order data flows through it: :class:`BenchOptions` (in :mod:`dlpack.options`),
``targets`` (a path becomes a store or a ``folder`` reader), ``pagecache`` (evict, prime,
measure residency; POSIX), ``measure`` (timed runs through the Loader), ``results`` (runs
and cells), ``machine`` (facts about the machine), ``report`` (:class:`BenchReport`: table, JSON, notes), ``plot`` (matplotlib, on use),
and ``run`` (:func:`run_bench`, which drives them all).
"""

from __future__ import annotations

from ..options import CACHES, ORDERS, BenchOptions
from .report import BenchReport, check_outputs
from .results import BenchCell, BenchRun
from .run import run_bench

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
