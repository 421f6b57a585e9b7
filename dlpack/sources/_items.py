"""A scan's items as columns: one bytes blob of relative paths, and integer codes for labels and splits.

A folder of a million small images listed as :class:`~dlpack.sources.base.SourceItem` objects
costs about 190 bytes per image (the object, its ``__dict__`` and the path string) for the whole
build; as columns it costs the path's UTF-8 bytes, an 8-byte offset and 6 bytes of codes, and a
large table keeps even those in files (:mod:`dlpack.storage.spill`), so what stays in memory does not
grow with the count. Items are made only when asked for, one at a time, from a cached part of
each column: reading them in order reads each column once.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, overload

import numpy as np

from ..ragged import RaggedBatch
from ..storage.spill import PART, Column
from .base import SourceItem

__all__ = ["ItemTable", "Paths", "SourceColumn"]


class Paths(Sequence[str]):
    """Relative paths in order, as one blob of their UTF-8 bytes and each one's end offset, read
    back a part of :data:`~dlpack.storage.spill.PART` paths at a time (``spill``: in files from the start)."""

    __slots__ = ("_blob", "_ends", "_cache")

    def __init__(self, rels: Iterable[str], *, spill: bool = False) -> None:
        self._blob, self._ends = Column(np.uint8, spill=spill), Column(np.int64, spill=spill)
        self._cache: tuple[int, int, np.ndarray, bytes] | None = None
        it = iter(rels)
        end = 0
        while part := list(islice(it, PART)):
            # No second object per path: the byte lengths counted, then one join and one encode.
            lengths = np.fromiter(
                (len(r) if r.isascii() else len(r.encode("utf-8")) for r in part), dtype=np.int64, count=len(part)
            )
            cum = np.cumsum(lengths) + end
            self._ends.append(cum)
            self._blob.append(np.frombuffer("".join(part).encode("utf-8"), dtype=np.uint8))
            end = int(cum[-1])

    @property
    def spilled(self) -> bool:
        """Whether the paths are kept in a file."""
        return self._blob.spilled

    def __len__(self) -> int:
        return len(self._ends)

    def _part(self, first: int) -> tuple[int, int, np.ndarray, bytes]:
        """Paths ``first .. first + PART``: (first, offset of the first path's bytes, ends, bytes)."""
        if self._cache is None or self._cache[0] != first:
            base = int(self._ends.at(first - 1)) if first else 0
            ends = self._ends.read(first, first + PART)
            data = self._blob.read(base, int(ends[-1])).tobytes() if len(ends) else b""
            self._cache = (first, base, ends, data)
        return self._cache

    def rel(self, k: int) -> str:
        """Path ``k`` (``0 <= k < len``)."""
        first = k - k % PART
        _, base, ends, data = self._part(first)
        j = k - first
        start = int(ends[j - 1]) - base if j else 0
        return data[start : int(ends[j]) - base].decode("utf-8")

    @overload
    def __getitem__(self, k: int) -> str: ...

    @overload
    def __getitem__(self, k: slice) -> list[str]: ...

    def __getitem__(self, k: int | slice) -> str | list[str]:
        if isinstance(k, slice):
            return [self.rel(j) for j in range(*k.indices(len(self)))]
        n = len(self)
        j = k + n if k < 0 else k
        if not 0 <= j < n:
            raise IndexError(f"path {k} of {n}")
        return self.rel(j)

    def __iter__(self) -> Iterator[str]:
        return self.rels()

    def rels(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        """Paths ``start .. stop``, in order."""
        stop = len(self) if stop is None else min(stop, len(self))
        for first in range(start - start % PART, stop, PART):
            _, base, ends, data = self._part(first)
            bounds = [0, *(ends - base).tolist()]
            for j in range(max(start, first) - first, min(stop, first + PART) - first):
                yield data[bounds[j] : bounds[j + 1]].decode("utf-8")

    def utf8(self, keep: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The UTF-8 bytes of paths ``keep`` (ascending), as one ``uint8`` array and ``len(keep) + 1``
        offsets into it."""
        if isinstance(keep, range) and keep.step == 1:
            a = max(0, keep.start)
            b = max(a, min(len(self), keep.stop))
            base = int(self._ends.at(a - 1)) if a else 0
            ends = np.array(self._ends.read(a, b))
            data = np.array(self._blob.read(base, int(ends[-1]) if len(ends) else base))
            return data, np.concatenate((np.zeros(1, dtype=np.int64), ends - base))
        idx = np.asarray(keep, dtype=np.int64).reshape(-1)
        ends = self._ends.take(idx)
        starts = np.zeros(len(idx), dtype=np.int64)
        after = idx > 0
        starts[after] = self._ends.take(idx[after] - 1)
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(ends - starts, out=offsets[1:])
        if not len(idx):
            return np.zeros(0, dtype=np.uint8), offsets
        # Runs of consecutive paths are contiguous in the blob: one read each, no per-byte index.
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        firsts = np.concatenate(([0], breaks))
        lasts = np.concatenate((breaks, [len(idx)])) - 1
        parts = [
            self._blob.read(int(starts[a]), int(ends[b])) for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True)
        ]
        return np.concatenate(parts), offsets


def _codes(values: Sequence[int] | np.ndarray | Column, dtype: str) -> Column:
    if isinstance(values, Column):
        return values
    return Column.of(np.asarray(values, dtype=dtype).reshape(-1), dtype)


class ItemTable(Sequence[SourceItem]):
    """Items without annotations, as columns; a read-only sequence of :class:`SourceItem`.

    Parameters
    ----------
    rels : iterable of str, or Paths
        The items' relative paths, in item order (read once, a part at a time).
    labels, splits : sequence of int, numpy.ndarray or Column
        Per item, the index into ``label_names`` / ``split_names``, or -1 for none.
    label_names, split_names : tuple of str
        The names the codes index.
    """

    __slots__ = ("_paths", "_labels", "_label_names", "_splits", "_split_names")

    def __init__(
        self,
        rels: Iterable[str] | Paths,
        labels: Sequence[int] | np.ndarray | Column,
        label_names: tuple[str, ...],
        splits: Sequence[int] | np.ndarray | Column,
        split_names: tuple[str, ...],
    ) -> None:
        self._paths = rels if isinstance(rels, Paths) else Paths(rels)
        self._labels = _codes(labels, "<i4")
        self._splits = _codes(splits, "<i2")
        self._label_names = tuple(label_names)
        self._split_names = tuple(split_names)
        n = len(self._paths)
        if len(self._labels) != n or len(self._splits) != n:
            raise ValueError(f"{n} paths but {len(self._labels)} labels and {len(self._splits)} splits")

    @property
    def spilled(self) -> bool:
        """Whether the paths are kept in a file (a large table)."""
        return self._paths.spilled

    @property
    def paths(self) -> Paths:
        return self._paths

    def __len__(self) -> int:
        return len(self._paths)

    def rel(self, k: int) -> str:
        """Item ``k``'s relative path, without making the item."""
        return self._paths.rel(k)

    def rels(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        """The relative paths of items ``start .. stop``, in order."""
        return self._paths.rels(start, stop)

    def _item(self, k: int) -> SourceItem:
        lab, spl = int(self._labels.at(k)), int(self._splits.at(k))
        return SourceItem(
            self.rel(k),
            self._label_names[lab] if lab >= 0 else None,
            split=self._split_names[spl] if spl >= 0 else None,
        )

    @overload
    def __getitem__(self, k: int) -> SourceItem: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[SourceItem, ...]: ...

    def __getitem__(self, k: int | slice) -> SourceItem | tuple[SourceItem, ...]:
        if isinstance(k, slice):
            return tuple(self._item(j) for j in range(*k.indices(len(self))))
        n = len(self)
        j = k + n if k < 0 else k
        if not 0 <= j < n:
            raise IndexError(f"item {k} of {n}")
        return self._item(j)

    def __iter__(self) -> Iterator[SourceItem]:
        for k in range(len(self)):
            yield self._item(k)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ItemTable({len(self)} items)"

    @property
    def label_names(self) -> tuple[str, ...]:
        return self._label_names

    @property
    def split_names(self) -> tuple[str, ...]:
        return self._split_names

    @property
    def label_codes(self) -> Column:
        """Per item, the index into the label names (-1: none)."""
        return self._labels

    @property
    def split_codes(self) -> Column:
        """Per item, the index into the split names (-1: none)."""
        return self._splits

    def source_bytes(self, keep: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The UTF-8 paths of items ``keep`` (ascending), as one ``uint8`` array and ``len(keep) + 1``
        offsets into it: the ``source`` array of a store, without one object per sample."""
        return self._paths.utf8(keep)

    def source_column(self, keep: Sequence[int]) -> SourceColumn:
        """The ``source`` array of items ``keep``, read a slice at a time as the store writes it."""
        return SourceColumn(self, keep)

    def with_splits(self, splits: Sequence[str | None]) -> ItemTable:
        """The same items with the splits ``splits`` (one name or None per item)."""
        names = tuple(sorted({s for s in splits if s is not None}))
        code = {s: i for i, s in enumerate(names)}
        out = ItemTable.__new__(ItemTable)
        out._paths, out._labels, out._label_names = self._paths, self._labels, self._label_names
        out._splits = Column.of(
            np.fromiter((code[s] if s is not None else -1 for s in splits), dtype=np.int16, count=len(self)), "<i2"
        )
        out._split_names = names
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (ItemTable, (list(self.rels()), np.asarray(self._labels), self._label_names,
                            np.asarray(self._splits), self._split_names))  # fmt: skip


class SourceColumn:
    """The ``source`` values (UTF-8 paths) of an item table's items ``keep``: ``len`` and plain
    slices, each a :class:`~dlpack.ragged.RaggedBatch` read when asked for."""

    __slots__ = ("_items", "_keep")

    def __init__(self, items: ItemTable, keep: Sequence[int]) -> None:
        self._items, self._keep = items, keep

    def __len__(self) -> int:
        return len(self._keep)

    def __getitem__(self, k: slice) -> RaggedBatch:
        if not isinstance(k, slice) or k.step not in (None, 1):
            raise TypeError(f"the source column is read by a plain slice, got {k!r}")
        return RaggedBatch(*self._items.source_bytes(self._keep[k]))
