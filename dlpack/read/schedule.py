"""Which stored view of each image the loader serves in each epoch: pure, vectorised over samples.

A store with K variants holds K+1 views of every image (0 the original). In cycle ``c`` (epochs
``c(K+1) .. c(K+1)+K``) sample ``i`` is served a permutation of the K+1 views, so each view is used
once per cycle, and consecutive cycles are chained so that two uses of one view are never fewer than
``g = ceil((K+1)/2)`` epochs apart across a cycle boundary (inside a cycle they are K+1 apart).

The chaining: a view at position ``p`` of the previous cycle may take position ``q`` of the next only
if ``(K+1 - p) + q >= g``. Positions ``q = 0 .. K`` are filled in order, each with the allowed,
unused view of the smallest random key ``hash(seed, i, cycle, view)``. Allowed views at ``q`` are
those of positions ``<= K+1 - g + q`` of the previous cycle, at least ``K+2 - g`` of which are
still unused, so the fill never runs out of views. Keys come from a counter-based hash (splitmix64
of seed, tag, sample, cycle, view), so a sample's schedule depends only on (seed, i, epoch, K and
the options here): never on which other samples are asked for, the batch, workers, rank or resume.

``original_rate=p`` (HALCON's ``augmentation_percentage`` is ``1 - p``): in each epoch sample ``i``
is served its original with probability ``p`` (a hash of seed, i and the epoch), else the next view
of a schedule built the same way over the K augmented views ``1 .. K`` alone (gap ``ceil(K/2)``
augmented draws, so at least that many epochs).

``views_per_batch=m`` (repeated augmentation): epoch ``e`` serves positions ``e*m .. e*m+m-1`` of
each image's view sequence, m views at once; the gap is raised to ``m`` when ``m`` is larger, so the
m views of one epoch are always different. With ``original_rate``, an epoch that draws the original
serves it as the first of its m views and ``m - 1`` augmented ones.

Cost: the state of an epoch (each sample's position in its sequence and its current and next
cycle) is built by walking from epoch 0: without ``original_rate`` every sample moves together, so
reaching cycle ``c`` builds ``c`` cycles (``O(N (K+1)^2)`` each); with it, each epoch costs one hash
per sample (the originals drawn) plus the cycles samples move into. :class:`ViewSchedule` keeps the
last states, so a loader's next epoch costs one step and a batch one lookup.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from ..options import check_rate

__all__ = ["ViewSchedule", "view_gap", "view_schedule", "hash64"]

_M64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
#: Tags keep the schedule's random streams apart (views of the K+1 schedule, of the K augmented
#: views, and the original-or-not draws).
_TAG_VIEWS = 0x76696577
_TAG_AUGMENTED = 0x61756776
_TAG_ORIGINAL = 0x6F726967
#: Epochs a cached schedule keeps (their states and views): the one in use and a few before it.
_KEEP = 3


def _splitmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of ``x + golden``, as a new array (uint64 arithmetic wraps)."""
    z: np.ndarray = x + _GOLDEN
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def _chain(h: np.ndarray, part: np.ndarray | int) -> np.ndarray:
    """One more value into a running hash (broadcast)."""
    with np.errstate(over="ignore"):
        return _splitmix(h ^ np.asarray(part).astype(np.uint64))


def _seeded(seed: int, tag: int) -> np.ndarray:
    """The running hash of ``tag`` and the seed's 64-bit limbs (a seed of any size)."""
    with np.errstate(over="ignore"):
        h = _splitmix(np.array([tag & _M64], dtype=np.uint64))
        s = int(seed)
        while True:
            h = _splitmix(h ^ np.uint64(s & _M64))
            s >>= 64
            if not s:
                return h


def hash64(seed: int, tag: int, *parts: np.ndarray | int) -> np.ndarray:
    """A 64-bit hash of ``seed``, ``tag`` and ``parts`` (broadcast together), element by element.

    splitmix64 chained over the seed's 64-bit limbs and each part in turn: a pure function of the
    values, so any subset of samples hashes the same wherever it is computed.
    """
    h = _seeded(seed, tag)
    for p in parts:
        h = _chain(h, p)
    return h


def view_gap(k: int, original_rate: float | None = None, views_per_batch: int = 1) -> int:
    """The fewest uses between two uses of one view: ``max(ceil(V/2), views_per_batch)``, where V
    is K+1 views (``original_rate=None``) or the K augmented views."""
    views = k + 1 if original_rate is None else k
    return max(-(-views // 2), views_per_batch)


@dataclass
class _State:
    """Where every row's view sequence stands at the start of ``epoch``."""

    epoch: int
    draws: np.ndarray  # [n] int64: positions of the sequence already used by earlier epochs
    cycle: np.ndarray  # [n] int64: draws // V, the cycle ``cur`` is
    cur: np.ndarray  # [n, V]: the views of that cycle, by position (0-based view ids)
    nxt: np.ndarray  # [n, V]: the views of the cycle after it

    def copy(self) -> _State:
        return _State(self.epoch, self.draws.copy(), self.cycle.copy(), self.cur.copy(), self.nxt.copy())


class ViewSchedule:
    """The view schedule of one store's samples (see the module's notes).

    ``count`` (the store's sample count) turns on the cache: the state of the whole store is built
    once per epoch and a batch's views are a lookup. Without it every call builds the state of the
    samples it is given from epoch 0. Thread-safe.
    """

    def __init__(
        self,
        k: int,
        seed: int = 0,
        *,
        original_rate: float | None = None,
        views_per_batch: int = 1,
        count: int | None = None,
    ) -> None:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise OptionError(f"a view schedule needs K >= 1 variants, got {k!r}")
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise OptionError(f"seed must be an integer >= 0, got {seed!r}")
        self.k, self.seed = int(k), int(seed)
        self.original_rate = None if original_rate is None else check_rate(original_rate)
        #: Views the sequence permutes: 0..K, or the augmented 1..K with ``original_rate``.
        self.n_views = self.k + 1 if self.original_rate is None else self.k
        self._first = 0 if self.original_rate is None else 1
        self._tag = _TAG_VIEWS if self.original_rate is None else _TAG_AUGMENTED
        m = views_per_batch
        if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or not 1 <= m <= self.n_views:
            what = f"{self.k} variants and the original" if self.original_rate is None else f"{self.k} variants"
            raise OptionError(
                f"views_per_batch must be 1..{self.n_views} ({what} give that many different views), got {m!r}"
            )
        self.views_per_batch = int(m)
        self.gap = view_gap(self.k, self.original_rate, self.views_per_batch)
        self.count = count
        self._dtype = np.min_scalar_type(self.n_views)
        self._seeded = _seeded(self.seed, self._tag)
        self._orig_seeded = _seeded(self.seed, _TAG_ORIGINAL)
        self._all = np.arange(count if count is not None else 0, dtype=np.int64)
        self._orig_rows: np.ndarray | None = None  # the originals' hash prefix of every sample (cached)
        self._states: OrderedDict[int, _State] = OrderedDict()
        self._tables: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ cycles

    def _keys(self, rows: np.ndarray, cycle: np.ndarray, views: np.ndarray) -> np.ndarray:
        """Random keys of ``views`` (``[n, V]`` view ids) of each row in its cycle, below 2**63 (the
        top is the fill's sentinel): ``hash64(seed, tag, i, cycle, view) >> 1``."""
        prefix = _chain(_chain(self._seeded, rows), cycle)
        keys: np.ndarray = _chain(prefix[:, None], views) >> np.uint64(1)
        return keys

    def _first_cycle(self, rows: np.ndarray) -> np.ndarray:
        views = np.broadcast_to(np.arange(self.n_views, dtype=np.int64), (len(rows), self.n_views))
        keys = self._keys(rows, np.zeros(len(rows), dtype=np.int64), views)
        return np.argsort(keys, axis=1, kind="stable").astype(self._dtype)

    def _next_cycle(self, rows: np.ndarray, prev: np.ndarray, cycle: np.ndarray) -> np.ndarray:
        """Cycle ``cycle`` of each row, chained to ``prev`` (its cycle before) by the gap rule.

        Columns are the previous cycle's positions: the view used at position ``p`` becomes
        allowed at step ``q = p - (V - g)``, so step ``q`` picks the smallest unused key among the
        first ``V - g + q + 1`` columns."""
        n, views = len(rows), self.n_views
        keys = self._keys(rows, cycle, prev)  # keys[:, p]: the key of the view used at position p
        out = np.empty((n, views), dtype=self._dtype)
        at = np.arange(n)
        never = np.uint64(_M64)
        for q in range(views):
            pick = np.argmin(keys[:, : min(views, views - self.gap + q + 1)], axis=1)
            out[:, q] = prev[at, pick]
            keys[at, pick] = never
        return out

    # ------------------------------------------------------------------ states

    def _originals(self, rows: np.ndarray, epoch: int) -> np.ndarray:
        """Whether each row is served its original in ``epoch`` (always False without original_rate)."""
        if self.original_rate is None:
            return np.zeros(len(rows), dtype=bool)
        if rows is self._all:  # the whole store, walked epoch by epoch: its prefix is kept
            if self._orig_rows is None:
                self._orig_rows = _chain(self._orig_seeded, rows)
            prefix = self._orig_rows
        else:
            prefix = _chain(self._orig_seeded, rows)
        u = (_chain(prefix, epoch) >> np.uint64(11)).astype(np.float64) * 2.0**-53
        out: np.ndarray = u < self.original_rate
        return out

    def _start(self, rows: np.ndarray) -> _State:
        zeros = np.zeros(len(rows), dtype=np.int64)
        cur = self._first_cycle(rows)
        return _State(0, zeros, zeros.copy(), cur, self._next_cycle(rows, cur, zeros + 1))

    def _move(self, rows: np.ndarray, st: _State, draws: np.ndarray) -> None:
        """Advance ``st`` (in place) to ``draws`` used positions, building the cycles entered."""
        target = draws // self.n_views
        while True:
            behind = st.cycle < target
            if not behind.any():
                break
            if behind.all():  # every row enters its next cycle (always so without original_rate)
                st.cur = st.nxt
                st.cycle += 1
                st.nxt = self._next_cycle(rows, st.cur, st.cycle + 1)
                continue
            moving = np.flatnonzero(behind)
            st.cur[moving] = st.nxt[moving]
            st.cycle[moving] += 1
            st.nxt[moving] = self._next_cycle(rows[moving], st.cur[moving], st.cycle[moving] + 1)
        st.draws[:] = draws

    def _walk(self, rows: np.ndarray, st: _State | None, epoch: int) -> _State:
        """The state of ``rows`` at the start of ``epoch``, from ``st`` (an earlier state, not changed) or epoch 0."""
        st = self._start(rows) if st is None else st.copy()
        m = self.views_per_batch
        if self.original_rate is None:  # every row moves m positions an epoch: jump there
            self._move(rows, st, np.full(len(rows), epoch * m, dtype=np.int64))
        else:
            for e in range(st.epoch, epoch):
                self._move(rows, st, st.draws + m - self._originals(rows, e))
        st.epoch = epoch
        return st

    def _views(self, rows: np.ndarray, st: _State, epoch: int) -> np.ndarray:
        m = self.views_per_batch
        orig = self._originals(rows, epoch)
        # Position of each of the m views in the row's sequence; an original takes the first slot.
        pos = st.draws[:, None] + np.arange(m, dtype=np.int64)[None, :] - orig[:, None]
        local = pos - st.cycle[:, None] * self.n_views  # 0 .. 2V-1: this cycle or the next
        table = np.concatenate([st.cur, st.nxt], axis=1)
        views = np.take_along_axis(table, np.clip(local, 0, 2 * self.n_views - 1), axis=1).astype(np.int64)
        views += self._first
        views[orig, 0] = 0
        return views

    def table(self, epoch: int) -> np.ndarray:
        """``[count, m]`` views of every sample in ``epoch`` (small ints), built once per epoch and
        kept for a few (cached schedules only: ``count`` given)."""
        if self.count is None:
            raise OptionError("a view table needs the schedule's sample count (ViewSchedule(count=N))")
        table = self._tables.get(epoch)  # a dict lookup is atomic: readers of a built epoch take no lock
        if table is not None:
            return table
        with self._lock:
            table = self._tables.get(epoch)
            if table is None:
                before = [st for e, st in self._states.items() if e <= epoch]
                start = max(before, key=lambda st: st.epoch) if before else None
                st = self._walk(self._all, start, epoch)
                self._states[epoch] = st
                table = self._views(self._all, st, epoch).astype(np.min_scalar_type(self.k))
                self._tables[epoch] = table
                while len(self._states) > _KEEP:
                    oldest = next(iter(self._states))
                    del self._states[oldest]
                    self._tables.pop(oldest, None)
            return table

    def warm(self) -> None:
        """Build the first epoch's table where no table is kept yet, before reader threads ask for
        one; a schedule in use is left alone. (Building epoch 0 again each pass, once the last
        epochs' tables had replaced it, walked the whole store from its first cycle: 45-55 ms at
        160,000 samples every third epoch, 5-7 % of a 64x64 epoch of views.)"""
        if self.count is not None and not self._tables:
            self.table(0)

    def views(self, indices: Sequence[int] | np.ndarray, epoch: int) -> np.ndarray:
        """``[len(indices), views_per_batch]`` int64 views (0 the original, v the variant v) of
        samples ``indices`` in ``epoch``."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if not isinstance(epoch, (int, np.integer)) or isinstance(epoch, bool) or epoch < 0:
            raise OptionError(f"epoch must be an integer >= 0, got {epoch!r}")
        epoch = int(epoch)
        if idx.size and idx.min() < 0:
            raise OptionError(f"sample indices must be >= 0, got {int(idx.min())}")
        if self.count is None:
            return self._views(idx, self._walk(idx, None, epoch), epoch)
        if idx.size and idx.max() >= self.count:
            raise OptionError(f"sample index {int(idx.max())} is out of range for {self.count} samples")
        return self.table(epoch).take(idx, axis=0).astype(np.int64)


def view_schedule(
    seed: int,
    indices: Sequence[int] | np.ndarray,
    epoch: int,
    k: int,
    *,
    original_rate: float | None = None,
    views_per_batch: int = 1,
) -> np.ndarray:
    """The views of samples ``indices`` in ``epoch`` for a store with ``k`` variants:
    ``[len(indices), views_per_batch]`` int64, 0 the original; a pure function of its arguments."""
    sched = ViewSchedule(k, seed, original_rate=original_rate, views_per_batch=views_per_batch)
    return sched.views(indices, epoch)
