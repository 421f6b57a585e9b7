"""The store reader logic every backend shares: gather plans, digests, code checks, ragged
batches and source names, over the few template methods a backend implements (``_open_array``, ...)."""

from __future__ import annotations

import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from .. import schema
from ..errors import OptionError, StoreError
from ..manifest import ArraySpec, Manifest, sha256_hex, store_generation
from ..ragged import RaggedBatch
from .base import (
    _SMALL_SAMPLE,
    SHARD_DIGEST,
    ArrayAccess,
    Mode,
    changed_error,
    check_mode,
    checked_positions,
    digest_like,
    stored_dtype,
)
from .gather import MixSpan, RowSpan, _no_check, gather_rows

#: Small arrays (labels, boxes) up to this size are read whole once and indexed in memory.
_SMALL_ARRAY = 64 * 2**20
#: :meth:`StoreReader.read_into_from` over arrays it cannot read in one pass.
_NO_PLAN = object()


class StoreReader(ABC):
    """Read side of a store. Holds no open handle until first use and drops handles on pickling,
    so a reader can be sent to worker processes, which then open their own."""

    def __init__(self, path: str | os.PathLike[str], mode: Mode = "r") -> None:
        check_mode(mode, ("r",))
        self.path = Path(path)
        self.mode: Mode = mode
        self._access: dict[str, ArrayAccess] = {}
        self._whole: dict[str, np.ndarray] = {}
        self._offsets: dict[str, list[int]] = {}
        #: The same offsets as int64 arrays, for gathering a batch's rows in one step.
        self._offsets_np: dict[str, np.ndarray] = {}
        self._offsets_twin: dict[str, str] = {}
        self._row_sources: dict[str, tuple[ArrayAccess, Any, RowSpan | None, Any]] = {}
        #: The ``views_token()`` a streamed array's gather plan was made with.
        self._tokens: dict[str, Any] = {}
        self._mixes: dict[tuple[str, ...], Any] = {}
        #: Per fixed array, how :meth:`gather` reads it (looked up once: this runs for every batch).
        self._gathers: dict[str, tuple[str, Any, int]] = {}
        self._sources: tuple[bytes, list[int]] | None = None
        #: What :meth:`warm` last skipped (None: not warm): a loader warms at every pass, and a
        #: second warm over every array costs 0.1 ms, 3 % of a 32x32 epoch that fits the CPU cache.
        self._warmed: frozenset[str] | None = None
        #: SHA-256 of the manifest text this reader opened: every later (re)open must find the same.
        self._pin: str | None = None
        #: Refuse labels outside the classes (False only to repair such a store: ``add_array``, ``--update``).
        self.check_labels = True

    # ------------------------------------------------------------------ backend hooks

    @property
    @abstractmethod
    def manifest(self) -> Manifest:
        """The store's manifest, read once and pinned: a reader sees one generation of the store."""
        ...

    def _pin_manifest(self, text: str | bytes) -> None:
        """Record the manifest this reader sees, or refuse one that differs from what it pinned."""
        got = sha256_hex(text)
        if self._pin is not None and got != self._pin:
            raise changed_error(self.path, f"manifest {self._pin[:12]}, found {got[:12]}")
        self._pin = got

    def expected_digest(self, stored_name: str) -> str | None:
        """The SHA-256 the manifest records for stored array ``stored_name`` (None: not recorded)."""
        for spec in self.manifest.arrays.values():
            if stored_name in spec.stored_names():
                return spec.sha256.get(stored_name)
        return None

    def check_generation(self, stored_name: str, found: object) -> None:
        """Refuse a stored array whose metadata digest is not the one the opened manifest lists."""
        want = self.expected_digest(stored_name)
        if want is not None and found != want:
            shown = found[:12] if isinstance(found, str) and found else "none"
            raise changed_error(
                self.path, f"array {stored_name!r} is generation {shown}, the manifest opened lists {want[:12]}"
            )

    @abstractmethod
    def _open_array(self, stored_name: str) -> ArrayAccess:
        """Open one stored array (``NAME``, ``NAME_data`` or ``NAME_offsets``) for reading."""

    # ------------------------------------------------------------------ arrays

    @property
    def arrays(self) -> dict[str, ArraySpec]:
        """Every per-sample array of the store, by name."""
        return self.manifest.arrays

    def spec(self, name: str) -> ArraySpec:
        """The spec of array ``name``; a StoreError lists the arrays the store has."""
        try:
            return self.arrays[name]
        except KeyError:
            raise StoreError(
                f"store {self.path} has no array {name!r} (it has: {', '.join(sorted(self.arrays)) or 'none'})"
            ) from None

    def _stored(self, stored_name: str) -> ArrayAccess:
        acc = self._access.get(stored_name)
        if acc is None:
            acc = self._open_array(stored_name)
            self._check_layout(stored_name, acc)
            self._access[stored_name] = acc
        return acc

    def _check_layout(self, stored_name: str, acc: ArrayAccess) -> None:
        """The stored array's shape and dtype must be what the manifest says (checked once, at open)."""
        n = len(self)
        for spec in self.arrays.values():
            if stored_name not in spec.stored_names():
                continue
            if spec.ragged and stored_name.endswith("_offsets"):
                want: tuple[int, ...] | None = (n + 1,)
            elif spec.ragged:
                want = None  # any number of rows; the offsets bound them
            else:
                want = (n, *spec.shape)
            dtype = np.dtype(stored_dtype(spec, stored_name))
            shape_ok = tuple(acc.shape) == want if want is not None else tuple(acc.shape[1:]) == spec.shape
            if not shape_ok or len(acc.shape) < 1 or np.dtype(acc.dtype).newbyteorder("<") != dtype.newbyteorder("<"):
                expect = list(want) if want is not None else ["rows", *spec.shape]
                raise StoreError(
                    f"array {stored_name!r} of {self.path} is {acc.dtype} {list(acc.shape)}, the manifest says "
                    f"{dtype} {expect}; the store is damaged, rebuild it"
                )
            return

    def __len__(self) -> int:
        return self.manifest.count

    def _fixed(self, name: str) -> ArraySpec:
        spec = self.spec(name)
        if spec.ragged:
            raise StoreError(f"array {name!r} of {self.path} is ragged; read its samples with read(name, index)")
        return spec

    def _small(self, spec: ArraySpec) -> bool:
        return spec.item_nbytes <= _SMALL_SAMPLE and spec.item_nbytes * len(self) <= _SMALL_ARRAY

    def read_all(self, name: str) -> np.ndarray:
        """A whole fixed array ``[N, *shape]``, read once, checked against its checksum, and cached
        (for small per-sample arrays). Codes (``labels``, ``split``, ``defect``: :data:`dlpack.schema.CODED`)
        are also checked against the manifest list they index."""
        arr = self._whole.get(name)
        if arr is None:
            self._fixed(name)
            arr = self._stored(name).read_rows(0, len(self))
            if name in schema.CODED:
                self._check_codes(name, arr)
            self._check_digest(name, arr)
            self._whole[name] = arr
        return arr

    def _ragged_codes(self, name: str) -> np.ndarray:
        """All rows of ragged code array ``name`` (``box_labels``), read once, checked against the
        manifest list they index and the array's checksum, and cached."""
        stored = name + "_data"
        arr = self._whole.get(stored)
        if arr is None:
            off = self._ragged_offsets(name)
            arr = self._stored(stored).read_rows(0, off[-1])
            self._check_codes(name, arr, off)
            self._check_digest(stored, arr)
            self._whole[stored] = arr
        return arr

    def _check_digest(self, stored_name: str, arr: np.ndarray) -> None:
        want = self.expected_digest(stored_name)
        if want is None or stored_name in schema.PIXEL_ARRAYS:
            return  # pixels have per-image CRCs, which verify compares sample by sample
        if want.startswith(SHARD_DIGEST):  # taken shard by shard where they were written (object storage)
            per = getattr(self._stored(stored_name), "shard_rows", None)
            row = int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.dtype.itemsize
            got = digest_like(
                want, lambda a, b: arr[a:b], len(arr), row, arr.dtype.str, per if isinstance(per, int) else len(arr)
            )
        else:
            got = sha256_hex(np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes())
        if got != want:
            raise StoreError(
                f"array {stored_name!r} of {self.path} does not match its checksum (sha256 {got[:12]}..., "
                f"recorded {want[:12]}...); the store is damaged, rebuild it"
            )

    def _check_codes(self, name: str, codes: np.ndarray, offsets: list[int] | None = None) -> None:
        """Codes index a manifest list (``labels`` the classes, ``split`` the splits, ...; -1 means none
        where the schema allows it); any other value is damage. ``offsets`` are a ragged array's."""
        if not self.check_labels:
            return
        role = schema.CODED[name]
        assert role.codes is not None
        k = len(getattr(self.manifest, role.codes))
        bad = np.flatnonzero((codes < role.lowest) | (codes >= k))
        if len(bad):
            i = int(bad[0])
            where = f"sample {i}"
            if offsets is not None:
                sample = int(np.searchsorted(offsets, i, side="right")) - 1
                where = f"sample {sample} (row {i - offsets[sample]})"
            what = "rows" if offsets is not None else "samples"
            raise StoreError(
                f"array {name!r} of {self.path} holds {int(codes[i])} at {where}, outside {role.lowest}..{k - 1} "
                f"for {k} {role.codes} ({len(bad)} such {what}); the store is damaged, rebuild it"
            )

    def code_problems(self) -> list[tuple[str, str]]:
        """``(array, reason)`` for each array of codes outside the manifest list it indexes (or unreadable)."""
        problems = []
        for name in schema.CODED:
            spec = self.arrays.get(name)
            if spec is None:
                continue
            try:
                if spec.ragged:
                    self._ragged_codes(name)
                else:
                    self.read_all(name)
            except StoreError as exc:
                problems.append((name, str(exc)))
        return problems

    def meta(self, name: str) -> np.ndarray:
        """A whole per-sample array by its stored name (``labels``, ``checksum``, ``source_offsets`` ...)."""
        if name in self.arrays:
            return self.read_all(name)
        for spec in self.arrays.values():
            if spec.ragged and name in spec.stored_names():
                if name.endswith("_offsets"):
                    return np.asarray(self._ragged_offsets(spec.name), dtype=np.int64)
                acc = self._stored(name)
                return acc.read_rows(0, acc.shape[0])
        raise StoreError(f"store {self.path} has no array {name!r}")

    def read_into(
        self, name: str, indices: Sequence[int] | np.ndarray, out: np.ndarray, rows: Sequence[int] | None = None
    ) -> np.ndarray:
        """Gather samples ``indices`` of fixed array ``name`` into ``out[:len(indices)]``, or, with
        ``rows``, sample ``indices[k]`` into ``out[rows[k]]`` (how a batch of mixed views fills
        one batch array from several arrays without a copy)."""
        spec = self._fixed(name)
        if rows is not None and len(rows) != len(indices):
            raise OptionError(f"read_into got {len(indices)} indices but {len(rows)} rows of out to fill")
        picked = np.asarray(indices, dtype=np.int64).reshape(-1)
        checked_positions(picked, len(self), f"array {name!r} of {self.path}")
        if self._small(spec):
            if rows is None:
                np.take(self.read_all(name), picked, axis=0, out=out[: len(picked)], mode="clip")
            else:
                out[np.asarray(rows, dtype=np.int64)] = self.read_all(name).take(picked, axis=0, mode="clip")
            return out
        if rows is None:
            views = self._row_source(name)  # raw in-memory rows (uncompressed shards, a mapped dataset)
            if views is not None:
                self._map_check(name)(picked)
                return gather_rows(views[0], views[1], picked, out, self._row_span(name))
        positions = picked.tolist()
        return self._stored(name).read_into(positions, out, None if rows is None else list(rows))

    def gather(self, name: str, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
        """:meth:`read_into` for a batch: ``idx`` are int64 sample indices the caller has checked
        (``0 <= i < len``), gathered into ``out[:len(idx)]`` in their order.

        The way each array is read is found once: a small array from its in-memory copy and raw
        rows from their memory maps by :func:`gather_rows` (one ``np.take`` over every shard the
        batch touches, through the maps' :class:`RowSpan`); compressed arrays through the backend,
        image by image. ``idx`` may be of any length (several batches at once). A 32x32 batch of 256 takes a few microseconds,
        so the per-batch lookups and checks that :meth:`read_into` makes would double it.
        """
        plan = self._gathers.get(name)
        if plan is not None and name in self._tokens and self._tokens[name] != self._token_of(name):
            plan = None  # a streamed array's rows moved (warm now, or its cache was cleared): plan again
        if plan is None:
            spec = self._fixed(name)
            if self._small(spec):
                plan = ("whole", self.read_all(name), 0)
            else:
                views = self._row_source(name)
                plan = (
                    ("views", (views[0], self._row_span(name), self._map_check(name)), views[1])
                    if views is not None
                    else ("access", None, 0)
                )
            self._gathers[name] = plan
        kind, data, per = plan
        data = cast(Any, data)
        if kind == "whole":
            np.take(data, idx, axis=0, out=out[: len(idx)], mode="clip")
            return out
        if kind == "views":
            data[2](idx)  # the maps' files have not shrunk under them (a SIGBUS otherwise)
            return gather_rows(data[0], per, idx, out, data[1])
        return self.read_into(name, idx, out)

    def read_into_from(
        self,
        names: Sequence[str],
        which: Sequence[int] | np.ndarray,
        indices: Sequence[int] | np.ndarray,
        out: np.ndarray,
    ) -> np.ndarray:
        """Gather row ``k`` of ``out`` from sample ``indices[k]`` of fixed array ``names[which[k]]``
        (arrays of one sample shape and dtype): one pass over the batch, however many arrays it mixes.

        How cached augmentation views fill a batch of originals and variants in place at the cost
        of a batch of originals: one take through the arrays' :class:`MixSpan` where they have one,
        else row by row (rows in array, then sample order).
        """
        key = tuple(names)
        plan = self._mixes.get(key)
        if plan is not None and self._moved(key):
            plan = None  # a streamed array's rows moved: plan again
        if plan is None:  # checked and looked up once per list of arrays: this runs for every batch
            plan = self._mix_plan(names)
        src = np.asarray(which, dtype=np.int64).reshape(-1)
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(src) != len(idx):
            raise OptionError(f"read_into_from got {len(idx)} indices but {len(src)} array choices")
        if not len(idx):
            return out
        lo, hi = int(src.min()), int(src.max())
        if lo < 0 or hi >= len(names):
            raise OptionError(f"read_into_from: array choices must be 0..{len(names) - 1}")
        if lo == hi:
            return self.read_into(names[lo], idx, out)
        if plan is _NO_PLAN:
            for u in np.flatnonzero(np.bincount(src, minlength=len(names))).tolist():  # each into its rows of out
                rows = np.flatnonzero(src == u)
                self.read_into(names[u], idx[rows], out, rows=rows.tolist())
            return out
        checked_positions(idx, len(self), f"array {names[0]!r} of {self.path}")
        span, flat, first, per, checks, owner, quiet = plan
        step = per.take(src)
        view = first.take(src) + idx // step  # the view (shard) of each row in ``flat``
        if owner is None:
            for u in np.flatnonzero(np.bincount(src, minlength=len(names))).tolist():
                checks[u](idx[src == u])
        elif quiet():  # no file of any array had an event since it was mapped (inotify)
            pass
        else:  # the shards the batch touches, all arrays at once: one look at each (a stat)
            touched: dict[int, list[int]] = {}
            for f in np.flatnonzero(np.bincount(view, minlength=len(flat))).tolist():
                touched.setdefault(owner[f], []).append(f)
            for u, views in touched.items():
                checks[u]([f - int(first[u]) for f in views])
        if span is not None and span.gather(src, idx, out):
            return out
        at, within = view.tolist(), (idx % step).tolist()
        for k in np.argsort(src * (len(self) + 1) + idx, kind="stable").tolist():
            out[k] = flat[at[k]][within[k]]
        return out

    @staticmethod
    def _quiet(stored: Sequence[Any]) -> Callable[[], bool]:
        """Whether no file of any of ``stored`` can have changed since it was mapped: one look for
        all of them where their kind can tell at once (``all_unchanged``), else one each."""
        kind = type(stored[0])
        together = getattr(kind, "all_unchanged", None)
        if callable(together) and all(type(s) is kind for s in stored):
            return functools.partial(together, tuple(stored))
        each = [getattr(s, "unchanged", _never_quiet) for s in stored]
        return lambda: all(q() for q in each)

    def gather_from(self, names: Sequence[str], which: np.ndarray, idx: np.ndarray, out: np.ndarray) -> np.ndarray:
        """:meth:`read_into_from` for a batch the caller has checked, as :meth:`gather` is
        :meth:`read_into`'s: ``which`` and ``idx`` int64 arrays of one length, ``0 <= which <
        len(names)``, ``0 <= idx < len``. One take through the arrays' :class:`MixSpan` when none of
        their files had an event since it was mapped; anything else goes the checked way. A batch
        of 16 256x256x3 views spent 34 us in the checks and lookups that this skips, a tenth of
        its copy."""
        plan = self._mixes.get(tuple(names))
        if plan is not None and plan is not _NO_PLAN and not (self._tokens and self._moved(names)):
            span, quiet = plan[0], plan[6]
            if span is not None and plan[5] is not None and quiet() and span.gather(which, idx, out):
                return out
        return self.read_into_from(names, which, idx, out)

    def _moved(self, names: Sequence[str]) -> bool:
        """Whether the rows of a streamed array of ``names`` moved since they were planned."""
        return any(self._tokens.get(n) != self._token_of(n) for n in names if n in self._tokens)

    def _mix_plan(self, names: Sequence[str]) -> Any:
        """For :meth:`read_into_from`: the arrays' :class:`MixSpan` (None where one take would not
        pay) and every array's in-memory views in one list (row ``i`` of array ``u`` is
        ``flat[first[u] + i // per[u]][i % per[u]]``), or ``_NO_PLAN`` when some array has no such
        views (small arrays, read from a cached copy, or compressed ones)."""
        specs = [self._fixed(n) for n in names]
        if any((s.shape, np.dtype(s.dtype)) != (specs[0].shape, np.dtype(specs[0].dtype)) for s in specs):
            raise OptionError(f"read_into_from mixes arrays of different sample shapes or dtypes: {list(names)}")
        plan: Any = _NO_PLAN
        sources = [None if self._small(s) else self._row_source(n) for s, n in zip(specs, names, strict=True)]
        if all(src is not None for src in sources):
            flat: list[np.ndarray] = []
            first = np.zeros(len(names), dtype=np.int64)
            per = np.ones(len(names), dtype=np.int64)
            for u, (views, rows_per_view) in enumerate(sources):  # type: ignore[misc]
                first[u], per[u] = len(flat), rows_per_view
                flat.extend(views)
            span = MixSpan.of(cast(Any, sources), len(self))
            # Arrays whose views are their shards (``check_shards``) are checked by the shards a
            # batch touches, found for all arrays at once; others by their rows, array by array.
            shard_checks = [getattr(self._stored(n), "check_shards", None) for n in names]
            owner: list[int] | None = None
            if all(callable(c) for c in shard_checks):
                owner = [u for u, (views, _) in enumerate(sources) for _ in views]  # type: ignore[misc]
                plan = (span, flat, first, per, shard_checks, owner, self._quiet([self._stored(n) for n in names]))
            else:
                plan = (span, flat, first, per, [self._map_check(n) for n in names], None, _never_quiet)
        self._mixes[tuple(names)] = plan
        return plan

    def _token_of(self, name: str) -> Any:
        token = getattr(self._stored(name), "views_token", None)
        return None if token is None else token()

    def _row_source(self, name: str) -> Any:
        """The stored array's ``row_source()`` (None when it has none), kept while the array is open
        (asked again when the array's ``views_token()``, where it has one, changed)."""
        acc = self._stored(name)
        got = self._row_sources.get(name)
        token = self._token_of(name)
        if token is not None:
            self._tokens[name] = token
            if got is not None and got[0] is acc and got[3] != token:
                got = None
        if got is None or got[0] is not acc:
            src = getattr(acc, "row_source", lambda: None)()
            got = self._row_sources[name] = (acc, src, None if src is None else RowSpan.of(*src), token)
        return got[1]

    def _map_check(self, name: str) -> Callable[[np.ndarray], None]:
        """The stored array's ``check_rows(idx)``: before rows are copied out of its maps, it raises a
        StoreError where a file mapped shrank since (touching a page past its end is a SIGBUS)."""
        return getattr(self._stored(name), "check_rows", _no_check)

    def _row_span(self, name: str) -> RowSpan | None:
        """The :class:`RowSpan` of the array's row source (None where it has none), kept with it."""
        self._row_source(name)
        span: RowSpan | None = self._row_sources[name][2]
        return span

    def _ragged_offsets(self, name: str) -> list[int]:
        off = self._offsets.get(name)
        if off is None:
            acc = self._stored(name + "_offsets")
            raw = acc.read_rows(0, acc.shape[0])
            n = len(self)
            if len(raw) != n + 1 or raw[0] != 0 or np.any(np.diff(raw) < 0):
                raise StoreError(f"{name}_offsets of {self.path} is damaged (not {n + 1} rising offsets); rebuild it")
            if int(raw[-1]) != self._stored(name + "_data").shape[0]:
                raise StoreError(
                    f"{name}_offsets of {self.path} ends at {int(raw[-1])}, {name}_data has "
                    f"{self._stored(name + '_data').shape[0]} rows; the store is damaged, rebuild it"
                )
            self._check_digest(name + "_offsets", raw)
            arr = np.asarray(raw, dtype=np.int64)
            # The first array read with the same offsets: batches of both share one offsets lookup.
            self._offsets_twin[name] = next((k for k, v in self._offsets_np.items() if np.array_equal(v, arr)), name)
            self._offsets_np[name] = arr
            off = self._offsets[name] = raw.tolist()  # plain ints: indexing NumPy per item costs microseconds
        return off

    def _ragged_whole(self, name: str) -> np.ndarray | None:
        """All rows of ragged array ``name`` when they are small (boxes, box labels: at most
        ``_SMALL_ARRAY`` bytes), read once, checked and cached; None for larger ones (pixels)."""
        if name in schema.CODED:
            return self._ragged_codes(name)
        stored = name + "_data"
        arr = self._whole.get(stored)
        if arr is None:
            if stored in schema.PIXEL_ARRAYS:
                return None
            off = self._ragged_offsets(name)
            if off[-1] * self.spec(name).item_nbytes > _SMALL_ARRAY:
                return None
            arr = self._stored(stored).read_rows(0, off[-1])
            self._check_digest(stored, arr)
            self._whole[stored] = arr
        return arr

    def read_ragged(self, name: str, indices: Sequence[int] | np.ndarray) -> Sequence[np.ndarray]:
        """Samples ``indices`` of ragged array ``name``: one array of rows per sample, as :meth:`read`
        gives them (views of one copy, so changing one changes no other sample). See :meth:`read_ragged_batch`."""
        return self.read_ragged_batch((name,), indices)[name]

    def read_ragged_batch(
        self, names: Sequence[str], indices: Sequence[int] | np.ndarray
    ) -> dict[str, Sequence[np.ndarray]]:
        """:meth:`read_ragged` of several ragged arrays for one batch.

        A small array (:meth:`_ragged_whole`) is gathered for the whole batch at once: one offsets
        lookup, one take of the rows, then cut at the samples' bounds; arrays with the same offsets
        (``boxes`` and ``box_labels``) share the lookup. Reading sample by sample cost a few
        microseconds each, most of a batch's time at 64x64 (docs/benchmarks.md, "Labels")."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        plans: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        got: dict[str, Sequence[np.ndarray]] = {}
        for name in names:
            self.spec(name)
            off = self._ragged_offsets(name)
            data = self._ragged_whole(name)
            if data is None:
                acc = self._stored(name + "_data")
                got[name] = [acc.read_rows(off[j], off[j + 1]) for j in idx.tolist()]
                continue
            twin = self._offsets_twin.get(name, name)
            plan = plans.get(twin)
            if plan is None:
                offsets = self._offsets_np[name]
                starts = offsets.take(idx)
                counts = offsets.take(idx + 1) - starts
                bounds = np.zeros(len(idx) + 1, dtype=np.int64)
                np.cumsum(counts, out=bounds[1:])
                rows = np.repeat(starts - bounds[:-1], counts)  # each row's shift from its place in the batch
                rows += np.arange(len(rows), dtype=np.int64)
                plan = plans[twin] = (rows, bounds)
            rows, bounds = plan
            # One copy of the batch's rows; a sample's rows are cut out only when asked for.
            got[name] = RaggedBatch(data.take(rows, axis=0), bounds)
        return got

    def read(self, name: str, index: int) -> np.ndarray:
        """Sample ``index`` of any array: its trailing shape (fixed) or its rows (ragged)."""
        spec = self.spec(name)
        if not spec.ragged:
            if self._small(spec):
                return np.array(self.read_all(name)[index])
            out = np.empty((1, *spec.shape), dtype=spec.dtype)
            got: np.ndarray = self._stored(name).read_into([int(index)], out)[0]
            return got
        off = self._ragged_offsets(name)
        whole = self._ragged_whole(name)
        if whole is not None:
            return np.array(whole[off[index] : off[index + 1]])
        return self._stored(name + "_data").read_rows(off[index], off[index + 1])

    # ------------------------------------------------------------------ images and sources

    def read_image(self, index: int) -> np.ndarray:
        """One image as H x W x C; ``index`` is already validated (0 <= index < len)."""
        layout = self.manifest.image.layout
        if layout == "fixed":
            return self.read(schema.image_array(layout), index)
        shape = tuple(int(v) for v in self.read_all(schema.IMAGE_SHAPES)[index])
        return self.read(schema.image_array(layout), index).reshape(shape)

    def source(self, index: int) -> str:
        """The relative source path of sample ``index``."""
        if self._sources is None:
            off = self._ragged_offsets(schema.SOURCE)
            raw = self._stored(schema.SOURCE + "_data").read_rows(0, off[-1])
            self._check_digest(schema.SOURCE + "_data", raw)
            self._sources = (raw.tobytes(), off)
        data, off = self._sources
        return data[off[index] : off[index + 1]].decode("utf-8")

    def sources(self, indices: Sequence[int] | np.ndarray) -> list[str]:
        """The relative source paths of samples ``indices`` (validated), for a batch: the paths of
        :meth:`lazy_sources`, decoded now (one decoding path for both)."""
        return list(self.lazy_sources(np.asarray(indices, dtype=np.int64).reshape(-1)))

    def lazy_sources(self, indices: np.ndarray) -> SourceList:
        """:meth:`sources` made only when read: what a loader batch carries as ``source``."""
        if self._sources is None and len(indices):
            self.source(int(indices[0]))
        data, off = self._sources if self._sources is not None else (b"", [0])
        return SourceList(data, off, indices)

    #: Whether rows come from a store read over the network, where a whole shard costs about what
    #: one of its rows costs (an object store): the loader then reads in shard-sized runs
    #: (:attr:`dlpack.read.dataset.Dataset.block_hint`). False for stores on a local file system.
    streamed: bool = False

    def prefetch(self, positions: Sequence[int] | np.ndarray) -> None:
        """Start fetching the shards that samples ``positions`` touch, in that order, without waiting.

        A hint: it never changes what a read returns. A no-op here: a local store's reads are
        memory-mapped, so there is nothing to fetch ahead; a streamed store's reader queues
        whole-shard fetches into its cache, so the reads that follow find them there.
        """
        return None

    def shard_len(self, name: str) -> int | None:
        """Rows per shard of fixed array ``name`` as stored, or None where the backend has no shards
        (how ``build --update`` writes a carried array with its layout, so it can share its shards)."""
        rows = getattr(self._stored(self._fixed(name).name), "shard_rows", None)
        return int(rows) if isinstance(rows, int) else None

    def verify_arrays(self, skip: Sequence[str] = ()) -> list[str]:
        """Re-read every stored array (but those in ``skip``) and compare it with its recorded
        checksum and the manifest's count; returns one line per problem (empty: all intact)."""
        return [reason for _, reason in self.array_problems(skip)]

    def array_problems(self, skip: Sequence[str] = ()) -> list[tuple[str | None, str]]:
        """As :meth:`verify_arrays`, as ``(stored array, reason)`` pairs; the array is None for a
        problem of the store as a whole (its generation)."""
        problems: list[tuple[str | None, str]] = []
        n = len(self)
        for spec in self.arrays.values():
            for stored in spec.stored_names():
                if stored in skip:
                    continue
                want = spec.sha256.get(stored)
                try:
                    acc = self._stored(stored)
                    if spec.ragged and stored.endswith("_offsets"):
                        self._offsets.pop(spec.name, None)
                        self._ragged_offsets(spec.name)
                    if want is None:
                        continue
                    row = int(np.prod(acc.shape[1:], dtype=np.int64)) * np.dtype(acc.dtype).itemsize
                    per = getattr(acc, "shard_rows", None)
                    got = digest_like(
                        want, acc.read_rows, acc.shape[0], row, stored_dtype(spec, stored),
                        per if isinstance(per, int) else acc.shape[0],
                    )  # fmt: skip
                except StoreError as exc:
                    problems.append((stored, str(exc)))
                    continue
                if got != want:
                    problems.append(
                        (
                            stored,
                            f"array {stored!r} does not match its checksum (sha256 {got[:12]}..., recorded {want[:12]}...)",
                        )
                    )
        if self.manifest.generation and all(s.sha256 for s in self.arrays.values()):
            digests = {k: v for s in self.arrays.values() for k, v in s.sha256.items()}
            if store_generation(n, digests) != self.manifest.generation:
                problems.append((None, "the manifest's generation does not match its arrays' checksums"))
        elif self.manifest.generation:
            problems.append((None, "the manifest has a generation but not every array has a checksum"))
        return problems

    # ------------------------------------------------------------------ lifecycle

    def nbytes_on_disk(self) -> int:
        """Bytes the store takes on disk (every file of a folder store)."""
        if self.path.is_file():
            return self.path.stat().st_size
        return sum(p.stat().st_size for p in self.path.rglob("*") if p.is_file())

    def array_nbytes_on_disk(self, name: str) -> int:
        """Bytes the per-sample array ``name`` takes on disk (its data and offsets, if ragged)."""
        return sum(self._stored(stored).nbytes_on_disk() for stored in self.spec(name).stored_names())

    def warm(self, skip: Collection[str] = ()) -> None:
        """Open maps and read indexes now (thread-safe afterwards; the loader calls it before threads
        start), of every array but those named in ``skip``."""
        skipped = frozenset(skip)
        if self._warmed is not None and self._warmed <= skipped:
            return
        for name, spec in self.arrays.items():
            if name in skip:
                continue
            variant = schema.variant_of(name)
            if variant is not None and variant[0] == schema.AUGMENT:
                continue  # the records of what made each variant: read one by one, never by a loader
            if spec.ragged:
                self._ragged_offsets(name)
                self._stored(name + "_data").warm()
                self._ragged_whole(name)
            elif self._small(spec):
                self.read_all(name)
            else:
                self._stored(name).warm()
        if len(self) and schema.SOURCE in self.arrays:
            self.source(0)
        self._warmed = skipped

    def close(self) -> None:
        """Release open handles and maps; the reader reopens lazily if used again."""
        self._warmed = None
        self._row_sources.clear()  # they hold views of the maps closed next
        self._tokens.clear()
        self._mixes.clear()
        self._gathers.clear()
        for acc in self._access.values():
            acc.close()
        self._access.clear()
        self._whole.clear()
        self._offsets.clear()
        self._offsets_np.clear()
        self._offsets_twin.clear()
        self._sources = None

    @property
    def pin(self) -> str | None:
        """The SHA-256 of the manifest this reader reads (read now if not yet; None for a backend that
        does not pin): a reader pinned to it (:meth:`pin_to`) reads this very store generation or refuses."""
        if self._pin is None:
            _ = self.manifest
        return self._pin

    def pin_to(self, digest: str | None) -> None:
        """Read only the store generation whose manifest has SHA-256 ``digest`` (None: any)."""
        self._pin = digest

    def __getstate__(self) -> dict[str, Any]:
        # The copy reads the same store generation or refuses.
        return {"path": self.path, "mode": self.mode, "pin": self.pin}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["mode"])  # type: ignore[misc]
        self.pin_to(state.get("pin"))

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SourceList(Sequence[str]):
    """The ``source`` paths of a batch, decoded only when read.

    Decoding 256 paths took a fifth of a 32x32 batch's time, for a key most training steps never
    read. It is a read-only sequence of str: ``len``, indexing, slicing (a list), iteration, and
    ``==`` with a list or tuple of the same paths; ``list(batch["source"])`` gives a plain list
    (for ``json.dumps``, ``+``).
    """

    __slots__ = ("_data", "_off", "_idx", "_list")

    def __init__(self, data: bytes, offsets: list[int], indices: np.ndarray) -> None:
        self._data, self._off, self._idx = data, offsets, indices
        self._list: list[str] | None = None

    def _paths(self) -> list[str]:
        if self._list is None:
            data, off = self._data, self._off
            self._list = [data[off[j] : off[j + 1]].decode("utf-8") for j in self._idx.tolist()]
        return self._list

    def __len__(self) -> int:
        return len(self._idx)

    def take_rows(self, start: int, stop: int) -> SourceList:
        """The paths of samples ``start..stop``, still undecoded (how the loader cuts a batch out
        of several read at once)."""
        return SourceList(self._data, self._off, self._idx[start:stop])

    def __getitem__(self, i: Any) -> Any:
        return self._paths()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SourceList):
            return self._paths() == other._paths()
        if isinstance(other, (list, tuple)):
            return self._paths() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # like a list

    def __repr__(self) -> str:
        return repr(self._paths())


def _never_quiet() -> bool:
    """An array that cannot tell its files are unchanged: the shards a batch touches are looked at."""
    return False
