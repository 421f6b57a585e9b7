"""``CachedViews``: the batch source of ``loader(augment="cached")``, serving each sample the view
its schedule picks for the epoch (:mod:`dlpack.read.schedule`), straight from the stored arrays.

Each row of a batch is one read of one stored image, the original (``images``) or a variant
(``images_v{v}``), gathered into the loader's batch array in place: an epoch of cached views costs
what an epoch of originals costs. The labels that follow geometry (``mask``, ``boxes``,
``box_labels``, ``box_crowd``) come from the same variant's arrays; every other keyed array (split,
defect, arrays added with ``add_array``) is the sample's own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import schema
from ..errors import OptionError, StoreError
from ..ragged import RaggedBatch
from .schedule import ViewSchedule

if TYPE_CHECKING:
    from .dataset import Dataset

__all__ = ["CachedViews", "FOLLOW_VIEW"]

#: Keyed arrays whose values follow the served view (they have a ``NAME_v{v}`` per variant).
FOLLOW_VIEW = (schema.MASK, schema.BOXES, "box_labels", "box_crowd")


class CachedViews:
    """A :class:`~dlpack.read.loader.BatchSource` over a store with variants: row ``r`` of a batch is
    the view of its sample the schedule picks for the epoch, and ``batch["variant"]`` says which
    (0 the original, v the variant v).

    With ``views_per_batch=m`` a batch lists each sample ``m`` times in a row (the loader does so),
    and the m rows get the m views of that sample's epoch, all different.
    """

    def __init__(
        self,
        ds: Dataset,
        seed: int = 0,
        *,
        original_rate: float | None = None,
        views_per_batch: int = 1,
    ) -> None:
        if not (hasattr(ds, "manifest") and hasattr(ds, "reader") and hasattr(ds, "_batch_indices")):
            where = getattr(ds, "path", type(ds).__name__)
            raise OptionError(
                f"augment='cached' reads the variants of a dlpack store; {where} is not one "
                "(open a store with dlpack.open)"
            )
        m = ds.manifest
        k = m.variants
        if not k:
            raise OptionError(
                f"store {ds.path} has no augmentation variants, which augment='cached' serves; add them with "
                f"`dlpack augment {ds.path} --augment K --augment-config FILE` (or build with --augment K)"
            )
        if m.image.shape is None:
            raise StoreError(f"store {ds.path} is a variable-size store but lists variants; rebuild it with --size")
        bases = [schema.IMAGES, *(name for name in FOLLOW_VIEW if name in m.arrays)]
        missing = [schema.variant_array(b, v) for v in range(1, k + 1) for b in bases]
        missing = [name for name in missing if name not in m.arrays]
        if missing:
            raise StoreError(
                f"store {ds.path} lists {k} variants but lacks {', '.join(missing[:4])}"
                + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
                + f"; rerun `dlpack augment {ds.path}` to rewrite them"
            )
        self.ds = ds
        self.k = k
        self.views_per_batch = int(views_per_batch)
        self.schedule = ViewSchedule(
            k, seed, original_rate=original_rate, views_per_batch=views_per_batch, count=len(ds)
        )
        #: (key, spec, follows the view) of each keyed array a batch carries.
        self._keyed = [(key, spec, spec.name in FOLLOW_VIEW) for key, spec, _ in ds._keyed]
        self._fingerprint: str | None = None
        #: Per array that follows the view, its stored array of each view 0..K.
        self._names = {b: [_stored_name(b, v) for v in range(k + 1)] for b in (schema.IMAGES, *FOLLOW_VIEW)}

    @property
    def path(self) -> Any:
        """The store's path (for messages)."""
        return self.ds.path

    @property
    def manifest(self) -> Any:
        """The store's manifest."""
        return self.ds.manifest

    def __len__(self) -> int:
        return len(self.ds)

    def views(self, indices: Sequence[int] | np.ndarray, epoch: int) -> np.ndarray:
        """The view each row of a batch of ``indices`` gets in ``epoch`` (``[len(indices)]`` int64)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self.ds)
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise OptionError(f"sample indices must be in 0..{n - 1}, got {idx.tolist()[:8]}...")
        return self._views(idx, epoch)

    def _views(self, idx: np.ndarray, epoch: int) -> np.ndarray:
        """:meth:`views` of valid ``idx`` (a table lookup: this runs for every batch)."""
        if not isinstance(epoch, (int, np.integer)) or isinstance(epoch, bool) or epoch < 0:
            raise OptionError(f"epoch must be an integer >= 0, got {epoch!r}")
        table = self.schedule.table(int(epoch))
        m = self.views_per_batch
        if m == 1:
            one: np.ndarray = table.reshape(-1).take(idx).astype(np.int64)
            return one
        rows = idx.reshape(-1, m) if len(idx) % m == 0 else None
        if rows is None or not np.all(rows == rows[:, :1]):
            raise OptionError(
                f"with views_per_batch={m} a batch lists each sample {m} times in a row "
                f"(the loader does so); got indices {idx[: 2 * m].tolist()}..."
            )
        many: np.ndarray = table[rows[:, 0]].reshape(-1).astype(np.int64)
        return many

    #: A row's view depends only on (index, epoch) and each sample's rows of a batch come together,
    #: so the loader may read several batches in one call and cut them apart.
    batch_rows_independent = True

    def get_batch(
        self, indices: Sequence[int] | np.ndarray, epoch: int = 0, out: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Samples ``indices`` as served in ``epoch``: a store's batch plus ``variant`` (``[B]`` int64)."""
        return self.get_valid_batch(self.ds._batch_indices(indices), epoch, out)

    def get_valid_batch(self, idx: np.ndarray, epoch: int = 0, out: np.ndarray | None = None) -> dict[str, Any]:
        """:meth:`get_batch` of int64 indices already in range (the loader's), read as the store's
        :meth:`~dlpack.read.dataset.Dataset.get_valid_batch` reads originals: every per-batch step
        of a batch of originals costs the same here, and the rows of mixed views come in one take
        (:meth:`~dlpack.backends.reader.StoreReader.read_into_from`)."""
        ds = self.ds
        views = self._views(idx, epoch)
        r = ds.reader
        shape = ds.manifest.image.shape
        assert shape is not None
        if out is None:
            out = np.empty((len(idx), *shape), dtype=ds.manifest.image.dtype)
        one = int(views[0]) if len(views) and int(views.min()) == int(views.max()) else None
        self._gather(schema.IMAGES, one, views, idx, out)
        batch: dict[str, Any] = {
            "image": out,
            "label": r.read_all(schema.LABELS).take(idx, axis=0, mode="clip"),
            "index": idx,
            "source": r.lazy_sources(idx),  # decoded when read, as a store's batch
            "variant": views,
        }
        if not self._keyed:
            return batch
        own = [spec.name for _, spec, follows in self._keyed if spec.ragged and not follows]
        ragged: dict[str, Sequence[np.ndarray]] = r.read_ragged_batch(own, idx) if own else {}
        follow = [spec.name for _, spec, follows in self._keyed if spec.ragged and follows]
        groups = _groups(views, np.bincount(views, minlength=self.k + 1)) if follow else []
        if follow:
            parts: dict[str, list[tuple[np.ndarray, Sequence[np.ndarray]]]] = {name: [] for name in follow}
            for v, rows in groups:
                names = [_stored_name(name, v) for name in follow]
                got = r.read_ragged_batch(names, idx if rows is None else idx[rows])
                for name, stored in zip(follow, names, strict=True):
                    parts[name].append((rows if rows is not None else np.arange(len(idx)), got[stored]))
            for name in follow:
                ragged[name] = parts[name][0][1] if len(groups) == 1 else _merge(parts[name], len(idx))
        for key, spec, follows in self._keyed:
            if spec.ragged:
                batch[key] = ragged[spec.name]
            elif follows:
                arr = np.empty((len(idx), *spec.shape), dtype=spec.dtype)
                batch[key] = self._gather(spec.name, one, views, idx, arr)
            else:
                batch[key] = r.gather(spec.name, idx, np.empty((len(idx), *spec.shape), dtype=spec.dtype))
        return batch

    def _gather(self, base: str, one: int | None, views: np.ndarray, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out``'s rows from array ``base`` of each row's view, in place (``one``: the view of every
        row, when they share one: the originals' gather)."""
        r = self.ds.reader
        if one is not None or not len(idx):
            return r.gather(_stored_name(base, one or 0), idx, out)
        return r.gather_from(self._names[base], views, idx, out)

    def warm(self) -> None:
        """Warm every array, the variants' included, and the view schedule."""
        # Every array, the variants' included (Dataset.warm leaves those out): the reader threads
        # then never open an array themselves.
        self.ds.reader.warm()
        self.schedule.warm()

    def fingerprint(self) -> str:
        """The store's fingerprint, its augmentation record and the checksums of its variant
        arrays: a state is never restored onto other variants of the same originals."""
        if self._fingerprint is None:
            m = self.ds.manifest
            h = hashlib.sha256(self.ds.fingerprint().encode())
            h.update(json.dumps(m.augment, sort_keys=True, default=str).encode())
            for name in sorted(n for n in m.arrays if schema.variant_of(n) is not None):
                h.update(name.encode() + json.dumps(m.arrays[name].sha256, sort_keys=True).encode())
            self._fingerprint = h.hexdigest()[:16]
        return self._fingerprint

    def image_layout(self) -> tuple[tuple[int, ...], str] | None:
        """The store's layout: a variant has its original's shape."""
        return self.ds.image_layout()

    def cached_views(
        self, seed: int = 0, *, original_rate: float | None = None, views_per_batch: int = 1
    ) -> CachedViews:
        """The same store's views with these options (what a loader asks its source for)."""
        return CachedViews(self.ds, seed, original_rate=original_rate, views_per_batch=views_per_batch)

    def __repr__(self) -> str:
        s = self.schedule
        rate = "" if s.original_rate is None else f" original_rate={s.original_rate:g}"
        return f"<dlpack CachedViews {str(self.ds.path)!r}: K={self.k}{rate} views_per_batch={s.views_per_batch}>"


def _stored_name(base: str, v: int) -> str:
    return base if v == 0 else schema.variant_array(base, v)


def _groups(views: np.ndarray, counts: np.ndarray) -> list[tuple[int, np.ndarray | None]]:
    """``(view, rows)`` for each view in ``views`` (``counts``: its bincount); rows None when every
    row has that view."""
    kinds = np.flatnonzero(counts)
    if len(kinds) == 1:
        return [(int(kinds[0]), None)]
    order = np.argsort(views, kind="stable")
    ends = np.cumsum(counts).tolist()
    return [(v, order[ends[v] - int(counts[v]) : ends[v]]) for v in kinds.tolist()]


def _ragged(value: Sequence[np.ndarray]) -> RaggedBatch:
    if isinstance(value, RaggedBatch):
        return value
    parts = [np.asarray(p) for p in value]
    bounds = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=bounds[1:])
    return RaggedBatch(np.concatenate(parts) if parts else np.zeros(0), bounds)


def _merge(parts: list[tuple[np.ndarray, Sequence[np.ndarray]]], n: int) -> RaggedBatch:
    """One ragged batch of ``n`` rows from groups ``(rows, their samples' rows)``."""
    groups = [(rows, _ragged(value)) for rows, value in parts]
    counts = np.zeros(n, dtype=np.int64)
    for rows, rb in groups:
        counts[rows] = rb.counts()
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    first = next((rb.data for _, rb in groups if rb.data.size), groups[0][1].data)
    data = np.empty((int(bounds[-1]), *first.shape[1:]), dtype=first.dtype)
    for rows, rb in groups:
        c = rb.counts()
        dest = np.repeat(bounds[rows] - rb.offsets[:-1], c) + np.arange(len(rb.data), dtype=np.int64)
        data[dest] = rb.data
    return RaggedBatch(data, bounds)
